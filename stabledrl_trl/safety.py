"""Checks that turn silent failures into clear errors: the dataset, the mask id, the output folder, checkpoints.

Each function raises a `ValueError` (or `RuntimeError` for a failed run) naming the field or file, the value and
the fix. `StableDRLTrainer` calls them when it is built, before a resume, and around saving; they are plain
functions so that scripts can call them too.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil

import torch

from .checks import short_repr

logger = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
# A reward or advantage whose square overflows float32 (|x| > ~1.8e19) cannot enter the loss safely: the optimiser's
# second moment (and TRL's reward std) square it. Such values are treated like inf: the sample is dropped, counted.
OVERFLOW_LIMIT = float(torch.finfo(torch.float32).max) ** 0.5
PICKLE_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


# --------------------------------------------------------------------------------------------- special ids


def check_mask_token_id(explicit: int | None, resolved: int, config_mask, tokenizer_mask, vocab_size: int | None):
    """An explicit `mask_token_id` must agree with the model config or the tokenizer when either defines one, and
    every mask id must index the embedding matrix."""
    known = {"model config": config_mask, "tokenizer": tokenizer_mask}
    known = {k: v for k, v in known.items() if v is not None}
    if explicit is not None and known and explicit not in known.values():
        found = ", ".join(f"the {k} says {v}" for k, v in known.items())
        raise ValueError(
            f"mask_token_id={explicit} (a StableDRLConfig field) disagrees with the model: {found}. A wrong mask id "
            "gives garbage rollouts and zero rewards without any other error. Remove mask_token_id to use the "
            "model's, or set it to one of those values."
        )
    if vocab_size is not None and not 0 <= resolved < vocab_size:
        raise ValueError(
            f"mask_token_id={resolved} is outside the model's vocabulary (embedding rows 0..{vocab_size - 1}). Set "
            "the StableDRLConfig field mask_token_id to the model's mask token (LLaDA-8B: 126336), or remove it."
        )


# --------------------------------------------------------------------------------------------- datasets


def check_prompt_dataset(
    dataset, name: str, tokenizer, mask_token_id: int | None, max_positions: int | None, completion_length: int | None
) -> None:
    """Problems a dataset shows before training: no rows, no `prompt` column, empty prompts, prompts holding the
    mask token (every row is checked), prompts that with the completion exceed the model's positions."""
    if dataset is None or not hasattr(dataset, "__len__"):
        return  # an IterableDataset is checked row by row by TRL as it streams
    if len(dataset) == 0:
        raise ValueError(f"{name} has no rows: nothing would be trained or evaluated. Check the data file / split.")
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {columns}); GRPO datasets are prompt-only: rename the "
            "question column to 'prompt' (dataset.rename_column(...))."
        )
    mask_text = None
    if mask_token_id is not None and tokenizer is not None:
        mask_text = tokenizer.convert_ids_to_tokens(int(mask_token_id))
    longest, longest_row = 0, None
    for i, prompt in enumerate(dataset["prompt"]):
        check_prompt_type(prompt, name, i)
        text = _prompt_text(prompt)
        if not text.strip():
            raise ValueError(f"{name} row {i} has an empty prompt ({prompt!r}); remove or fill such rows.")
        if mask_text and mask_text in text:
            raise ValueError(
                f"{name} row {i}: the prompt contains the mask token {mask_text!r} (id {mask_token_id}); the diffusion "
                "sampler would treat it as a position to fill. Remove it from the data."
            )
        if (
            max_positions is not None
            and tokenizer is not None
            and len(text) + (completion_length or 0) > max_positions
        ):
            # characters bound tokens from above for every tokenizer; tokenize only the rows that could be too long
            n = _prompt_tokens(tokenizer, prompt)
            if n > longest:
                longest, longest_row = n, i
    if max_positions is not None and longest_row is not None and longest + (completion_length or 0) > max_positions:
        raise ValueError(
            f"{name} row {longest_row}: the prompt has {longest} tokens; with max_completion_length="
            f"{completion_length} that is {longest + (completion_length or 0)} positions, more than the model's "
            f"max_position_embeddings={max_positions}. Drop or shorten long prompts (e.g. dataset.filter on the "
            "prompt's token count) or lower max_completion_length."
        )


def check_prompt_type(prompt, name: str, row: int) -> None:
    """A prompt is a string (standard) or a list of {"role", "content"} messages (conversational), as TRL's GRPO
    datasets are; anything else (None, a number, one dict, a list of strings) is refused naming the row."""
    if isinstance(prompt, str):
        return
    fix = (
        'Give each row a string ("What is 2+3?") or a list of messages ([{"role": "user", "content": "What is '
        '2+3?"}]).'
    )
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        for j, message in enumerate(prompt):
            if "role" not in message:
                raise ValueError(
                    f"{name} row {row}: message {j} of the prompt has keys {short_repr(sorted(map(str, message)))} "
                    f"and no 'role'. {fix}"
                )
        return
    if isinstance(prompt, list) and prompt and all(isinstance(m, str) for m in prompt):
        raise ValueError(
            f"{name} row {row}: the prompt is a list of strings ({short_repr(prompt)}); it would be joined silently "
            f"or read as chat messages. Join it into one string yourself, or make each part a message. {fix}"
        )
    raise ValueError(
        f"{name} row {row}: the prompt is {type(prompt).__name__} {short_repr(prompt)}, not a string or a list of "
        f"messages. {fix}"
    )


def _prompt_text(prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        parts = []
        for message in prompt:
            content = message.get("content", "") if isinstance(message, dict) else message
            if isinstance(content, list):  # content blocks
                content = " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
            parts.append(str(content))
        return "\n".join(parts)
    return str(prompt)


def _prompt_tokens(tokenizer, prompt) -> int:
    if isinstance(prompt, list):
        ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        return len(ids)
    return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------------------------- weights


def check_safetensors_only(path: str, what: str = "model") -> None:
    """Refuse a local folder or file whose weights are pickles only (unpickling can run arbitrary code)."""
    if not os.path.exists(path):
        return
    files = os.listdir(path) if os.path.isdir(path) else [os.path.basename(path)]
    weights = [f for f in files if f.endswith(PICKLE_WEIGHT_SUFFIXES) or f.endswith(".safetensors")]
    if weights and not any(f.endswith(".safetensors") for f in weights):
        raise ValueError(
            f"{what} at {path!r} has only pickle weights ({sorted(weights)}); this project loads safetensors only, "
            "because unpickling a file can run arbitrary code. Convert it (load it once yourself, then "
            "save_pretrained(..., safe_serialization=True)), or, for a file you trust, set "
            "allow_pickle_checkpoints=True."
        )


def check_local_model_path(name, field: str = "model") -> None:
    """A model name meant as a local path that does not exist: fail at once naming `field`, the path and the folder
    it resolves to, instead of retrying the hub with it (about 50 s) and reporting a hub error.

    Meant as local: absolute, `./`, `../`, `~`, a trailing separator, more than one `/`, or a first component that
    is an existing local folder (`checkpoints/sft` when `checkpoints/` exists).
    """
    if not isinstance(name, str) or os.path.exists(os.path.expanduser(name)):
        return
    first = name.split("/", 1)[0]
    looks_local = (
        name.startswith(("/", "./", "../", "~"))
        or name.endswith(("/", os.sep))
        or name.count("/") > 1
        or ("/" in name and os.path.isdir(first))
    )
    if looks_local:
        resolved = os.path.abspath(os.path.expanduser(name))
        raise FileNotFoundError(
            f"{field}={name!r} looks like a local path but does not exist ({resolved}; relative paths are read from "
            f"the working folder {os.getcwd()}), and it is not a hub id. Give the folder a model was saved to with "
            "save_pretrained (config.json and *.safetensors), or a hub id such as 'GSAI-ML/LLaDA-8B-Instruct'."
        )


def nonfinite_parameters(model) -> list[str]:
    """Names of parameters holding inf / NaN (the local shard of a sharded parameter)."""
    bad = []
    for name, p in model.named_parameters():
        t = p.detach()
        t = t.to_local() if hasattr(t, "to_local") else t
        if t.numel() and not bool(torch.isfinite(t).all()):
            bad.append(name)
    return bad


# --------------------------------------------------------------------------------------------- checkpoints


def list_checkpoints(output_dir: str) -> list[str]:
    """checkpoint-N folders of output_dir, oldest first."""
    if not output_dir or not os.path.isdir(output_dir):
        return []
    found = [
        d for d in os.listdir(output_dir) if CHECKPOINT_RE.match(d) and os.path.isdir(os.path.join(output_dir, d))
    ]
    return [os.path.join(output_dir, d) for d in sorted(found, key=lambda d: int(CHECKPOINT_RE.match(d).group(1)))]


def checkpoint_missing(path: str, needs_optimizer: bool = True) -> list[str]:
    """What a checkpoint folder lacks to resume exactly: the trainer state (written last, so its absence marks a
    save interrupted by a kill), the weights, the optimiser and scheduler state."""
    files = set(os.listdir(path)) if os.path.isdir(path) else set()
    missing = []
    if "trainer_state.json" not in files:
        missing.append("trainer_state.json")
    weight_names = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors")
    if not any(f in files for f in weight_names) and not any(
        f.startswith(("pytorch_model_fsdp", "global_step")) for f in files
    ):
        missing.append("model weights (model.safetensors)")
    if needs_optimizer:
        if not any(f.startswith("optimizer") for f in files) and not any(f.startswith("global_step") for f in files):
            missing.append("optimizer.pt")
        if "scheduler.pt" not in files:
            missing.append("scheduler.pt")
    return missing


def _safetensors_damage(path: str) -> str | None:
    """Why a safetensors file cannot be read (header unreadable, or shorter than its header says), else None."""
    import json
    import struct

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                return "truncated (no header)"
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8:
                return f"truncated (header of {n} bytes, file of {size})"
            header = json.loads(f.read(n))
    except (OSError, ValueError) as error:
        return f"unreadable header ({error})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        return f"truncated ({size} bytes, the header needs {8 + n + end})"
    return None


def _safetensors_keys(path: str) -> list[str]:
    import json
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(n)) if k != "__metadata__"]


def check_weight_index(folder: str) -> None:
    """A sharded safetensors folder whose index does not cover its shards would load with the uncovered weights
    randomly initialised and no error: refuse an index naming a missing file, and shard files (or tensors in them)
    the index leaves out."""
    import json

    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.isfile(index):
        return
    try:
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{index} is damaged ({short_repr(str(error))}); restore it from the original model."
        ) from None
    files = set(weight_map.values())
    absent = sorted(f for f in files if not os.path.isfile(os.path.join(folder, f)))
    if absent:
        raise FileNotFoundError(f"{index} names shard(s) {absent[:3]} that are not in {folder}; restore them.")
    shards = sorted(f for f in os.listdir(folder) if re.match(r"^model-\d+-of-\d+\.safetensors$", f))
    uncovered = []
    for shard in shards:
        damage = _safetensors_damage(os.path.join(folder, shard))
        if damage:
            raise ValueError(f"weight file {os.path.join(folder, shard)} is {damage}; restore it.")
        uncovered += [k for k in _safetensors_keys(os.path.join(folder, shard)) if k not in weight_map]
    if uncovered:
        raise ValueError(
            f"{index} leaves out {len(uncovered)} weight(s) stored in the folder's shards (e.g. {uncovered[:3]}): "
            "loading would leave them randomly initialised. Restore the index from the original model (its "
            "weight_map must name every tensor of every shard)."
        )


def checkpoint_damage(path: str, needs_optimizer: bool = True) -> tuple[str, str] | None:
    """(file, what is wrong) for the first damaged file of a complete checkpoint (a truncated trainer state,
    weights, optimiser or scheduler file), else None. Reads headers and archive directories only."""
    import json
    import zipfile

    state = os.path.join(path, "trainer_state.json")
    try:
        with open(state) as f:
            json.load(f)
    except (OSError, ValueError) as error:
        return state, f"not valid JSON ({short_repr(str(error))})"
    for name in sorted(os.listdir(path)):
        file = os.path.join(path, name)
        if name.endswith(".safetensors"):
            damage = _safetensors_damage(file)
            if damage:
                return file, damage
        elif name == "model.safetensors.index.json":
            try:
                check_weight_index(path)
            except (ValueError, FileNotFoundError) as error:
                return file, short_repr(str(error), 400)
        elif needs_optimizer and name.endswith(".pt") and (name.startswith(("optimizer", "scheduler"))):
            try:
                with zipfile.ZipFile(file) as archive:  # torch.save writes a zip archive; a truncated one has no
                    archive.infolist()  # central directory
            except (OSError, zipfile.BadZipFile) as error:
                return file, f"truncated or not a torch.save archive ({error})"
    return None


def resolve_resume(resume_from_checkpoint, output_dir: str, needs_optimizer: bool = True):
    """Map `resume_from_checkpoint` to a checkpoint folder (or None for a fresh run), refusing unsafe cases.

    True / "true" / "latest": the newest *complete* checkpoint of output_dir; incomplete ones (a kill during saving)
    are skipped with a warning. A path: it must be complete, or the resume would silently start a fresh optimiser.
    """
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() in ("true", "latest"):
        resume_from_checkpoint = True
    if isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() in ("false", "none", ""):
        resume_from_checkpoint = None
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        checkpoints = list_checkpoints(output_dir)
        for path in reversed(checkpoints):
            missing = checkpoint_missing(path, needs_optimizer)
            damage = None if missing else checkpoint_damage(path, needs_optimizer)
            if not missing and not damage:
                return path
            if missing:
                logger.warning(f"Skipping incomplete checkpoint {path} (missing {', '.join(missing)}).")
            else:
                logger.warning(f"Skipping damaged checkpoint {path}: {damage[0]} is {damage[1]}.")
        raise ValueError(
            f"resume_from_checkpoint=True but output_dir={output_dir!r} holds no complete checkpoint "
            f"({len(checkpoints)} checkpoint folder(s) found). Start a fresh run without resume_from_checkpoint."
        )
    path = str(resume_from_checkpoint)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"resume_from_checkpoint={path!r} is not a folder.")
    missing = checkpoint_missing(path, needs_optimizer)
    if missing:
        raise ValueError(
            f"resume_from_checkpoint={path!r} lacks {', '.join(missing)}: resuming would start a fresh optimiser / "
            "schedule silently instead of continuing the run. Resume from a complete checkpoint."
        )
    damage = checkpoint_damage(path, needs_optimizer)
    if damage:
        raise ValueError(
            f"resume_from_checkpoint={path!r}: {damage[0]} is {damage[1]}. Resume from another checkpoint "
            "(resume_from_checkpoint=True picks the newest undamaged one)."
        )
    return path


def check_fresh_output_dir(output_dir: str, overwrite: bool, is_main_process: bool = True) -> None:
    """A fresh run in a folder holding another run's checkpoints would mix them (a later resume picks the other
    run's newest): refuse, unless `overwrite_output_dir`, which deletes them."""
    checkpoints = list_checkpoints(output_dir)
    if not checkpoints:
        return
    if not overwrite:
        names = [os.path.basename(c) for c in checkpoints]
        raise ValueError(
            f"output_dir={output_dir!r} already holds checkpoints of another run ({', '.join(names[-3:])}). Fix: "
            "resume it with resume_from_checkpoint=True, choose another output_dir, or delete those checkpoint-* "
            "folders (StableDRLConfig's overwrite_output_dir=True deletes them for you; GRPOConfig has no such field)."
        )
    if is_main_process:
        for path in checkpoints:
            shutil.rmtree(path)


# How a full disk reads in the errors of writers that do not raise OSError: torch.save's zip writer (RuntimeError
# "... file write failed"), safetensors (SafetensorError "... No space left on device (os error 28)").
_DISK_FULL_TEXTS = (
    "no space left on device",
    "disk quota exceeded",
    "os error 28",
    "os error 122",
    "file write failed",
)


def is_disk_full(error: BaseException) -> bool:
    """True for a write that failed for lack of space, whichever writer raised it (an OSError with ENOSPC / EDQUOT,
    or torch.save's and safetensors' own errors, whose text carries it), also when wrapped as the cause."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if not isinstance(error, OSError) and any(t in str(error).lower() for t in _DISK_FULL_TEXTS):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


# --------------------------------------------------------------------------------------------- command line


def suggest_fields(message: str, known: list[str]) -> str:
    """`message` (an unknown-argument error) with a "did you mean" for each `--name` in it close to a known field."""
    names = list(dict.fromkeys(re.findall(r"--([A-Za-z][A-Za-z0-9_-]*)", message)))
    if len(message) > 1000:  # the values are printed too: keep the names only (bounded, whatever the values hold)
        message = f"{message.split(':', 1)[0]}: {', '.join('--' + n for n in names)} (values not shown)"
    hints = [hint for hint in (_did_you_mean(name, known) for name in names) if hint]
    return message if not hints else f"{message} ({'; '.join(hints)})"


def _did_you_mean(name: str, known: list[str]) -> str:
    """"'name': did you mean 'field'?" for the known field closest to `name` ('-' read as '_'), else ""."""
    import difflib

    close = difflib.get_close_matches(name.replace("-", "_"), known, n=1, cutoff=0.75)
    return f"{name!r}: did you mean {close[0]!r}?" if close else ""


def make_trl_parser(dataclass_types, description: str | None = None, prog: str | None = None):
    """TRL's `TrlParser` whose unknown-key errors (YAML or command line) suggest the closest known field; its help
    starts with `description` and a usage line naming `--config` (TRL reads it before argparse, so argparse alone
    would never list it)."""
    import argparse
    import dataclasses

    from trl import TrlParser

    class SuggestingParser(TrlParser):
        def parse_args_and_config(self, args=None, *a, **k):
            import sys

            from .checks import load_yaml_checked

            argv = list(args) if args is not None else sys.argv[1:]
            if "--config" in argv and argv.index("--config") + 1 < len(argv):
                load_yaml_checked(argv[argv.index("--config") + 1])  # duplicate keys, alias bombs: refused first
            try:
                return super().parse_args_and_config(args, *a, **k)
            except ValueError as error:
                text = str(error)
                if "Unknown arguments" not in text and "not used by the HfArgumentParser" not in text:
                    raise
                known = [f.name for t in dataclass_types for f in dataclasses.fields(t)]
                names = list(dict.fromkeys(re.findall(r"--([A-Za-z][A-Za-z0-9_-]*)", text)))
                in_file = "config file" in text
                shown = ", ".join(n if in_file else f"--{n}" for n in names)
                hints = "".join(f" {hint}" for hint in (_did_you_mean(n, known) for n in names) if hint)
                raise ValueError(
                    f"Unknown {'key(s) in the config file' if in_file else 'command-line flag(s)'}: {shown}.{hints} "
                    "Fix the spelling or remove them (`--help` lists every field; an unknown key is never ignored)."
                ) from None

    # allow_abbrev=False: argparse would otherwise take a misspelt prefix (--learning_rat) for the field it starts
    extra = {}
    if description is not None:
        usage = f"{prog or '%(prog)s'} [--config CONFIG.yaml] [--FIELD VALUE ...]"
        bases = (argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter)
        formatter = type("HelpFormatter", bases, {})
        extra = dict(description=description, usage=usage, formatter_class=formatter)
    return SuggestingParser(dataclass_types, allow_abbrev=False, **extra)
