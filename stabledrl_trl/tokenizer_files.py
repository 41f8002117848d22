"""A local model folder must hold its tokenizer's files before anything asks transformers to load the tokenizer.

Without them `AutoTokenizer.from_pretrained` falls back to converting a slow tokenizer and reports a missing
`sentencepiece` (or TRL's `AutoProcessor` an "unrecognized processing class"), neither of which says that the
folder simply has no tokenizer. `check_tokenizer_files` says so, naming the folder and the two fixes.
"""

from __future__ import annotations

import os

# Files any transformers tokenizer (fast or slow) or processor is loaded from; one is enough.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "processor_config.json",
    "preprocessor_config.json",
)


def has_tokenizer_files(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES)


def check_tokenizer_files(path, field: str = "model") -> None:
    """Raise ValueError when `path` is a local folder without tokenizer files (a hub id or a non-folder is left to
    the loaders)."""
    if not isinstance(path, str) or not os.path.isdir(os.path.expanduser(path)):
        return
    folder = os.path.expanduser(path)
    if has_tokenizer_files(folder):
        return
    raise ValueError(
        f"{field}={path!r} has no tokenizer files (none of {', '.join(TOKENIZER_FILES[:3])}, ...): the folder holds "
        "the model only. Save the tokenizer next to it (tokenizer.save_pretrained(folder)), or load it yourself and "
        "pass it (StableDRLTrainer(..., processing_class=tokenizer))."
    )
