"""Saved checkpoints that the model family's original code loads too (LLaDA's and Dream's hub `trust_remote_code`).

A model published after training should load with `AutoModel.from_pretrained(path, trust_remote_code=True)` in the
family's own environment and give the same logits. That needs, besides the original weight names and config keys
(handled by each config's `to_dict` and model's `save_pretrained`), the `auto_map` that points at the remote code,
and the code itself:
- the `auto_map` read from the source checkpoint is written back;
- when the source was a hub repository (`_name_or_path` is a repo id, not a folder), each entry is qualified as
  "repo--module.Class", the form transformers resolves from that repository, so the saved folder needs no code;
- when the source was a local folder holding the code files, `copy_remote_code` copies them (the modules `auto_map`
  names and the files they import relatively) next to the saved config. Nothing is imported or run here.
This package's own loading never uses `auto_map`: the registered native classes take precedence.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil

logger = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _is_hub_id(name_or_path: str | None) -> bool:
    return bool(name_or_path) and not os.path.isdir(name_or_path) and bool(_HUB_ID.match(str(name_or_path)))


def publishable_auto_map(auto_map: dict | None, name_or_path: str | None) -> dict | None:
    """The `auto_map` to save: as read, with entries qualified by the source repo id when it came from the hub.

    >>> publishable_auto_map({"AutoModel": "modeling_dream.DreamModel"}, "Dream-org/Dream-v0-Instruct-7B")
    {'AutoModel': 'Dream-org/Dream-v0-Instruct-7B--modeling_dream.DreamModel'}
    """
    if not auto_map:
        return None
    if not _is_hub_id(name_or_path):
        return dict(auto_map)
    qualify = lambda ref: ref if "--" in ref else f"{name_or_path}--{ref}"  # noqa: E731
    return {
        key: [qualify(r) if isinstance(r, str) else r for r in ref] if isinstance(ref, (list, tuple)) else qualify(ref)
        for key, ref in auto_map.items()
    }


def remote_code_files(auto_map: dict | None, folder: str) -> list[str]:
    """Names of the code files in `folder` that `auto_map`'s unqualified entries need (with relative imports)."""
    from transformers.dynamic_module_utils import get_relative_import_files

    if not auto_map or not os.path.isdir(folder):
        return []
    refs = [r for v in auto_map.values() for r in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(r, str)]
    files = set()
    for ref in refs:
        if "--" in ref:
            continue
        module_file = os.path.join(folder, ref.rsplit(".", 1)[0] + ".py")
        if os.path.isfile(module_file):
            files.add(module_file)
            files.update(get_relative_import_files(module_file))  # parses imports, does not execute
    return sorted(os.path.basename(f) for f in files if os.path.isfile(f))


def copy_remote_code(auto_map: dict | None, name_or_path: str | None, save_directory: str) -> list[str]:
    """Copy the source folder's remote code files that `auto_map` needs into `save_directory`; return their names.

    Logs a warning when `auto_map` names local modules that the source folder does not have: the saved folder then
    loads here but not with the original code until those files are added.
    """
    if not auto_map or _is_hub_id(name_or_path) or not name_or_path:
        return []
    source = str(name_or_path)
    if os.path.abspath(source) == os.path.abspath(save_directory):
        return []
    names = remote_code_files(auto_map, source)
    for name in names:
        shutil.copyfile(os.path.join(source, name), os.path.join(save_directory, name))
    wanted = {
        r.rsplit(".", 1)[0] + ".py"
        for v in auto_map.values()
        for r in (v if isinstance(v, (list, tuple)) else [v])
        if isinstance(r, str) and "--" not in r
    }
    missing = sorted(wanted - set(names))
    if missing:
        logger.warning(
            "%s: config.json's auto_map names %s, which %s does not hold; add the family's remote code files next "
            "to config.json to load this folder with its original code (trust_remote_code=True).",
            save_directory,
            ", ".join(missing),
            source,
        )
    return names


def config_json_string(config, use_diff: bool = True) -> str:
    """`PreTrainedConfig.to_json_string` plus `torch_dtype` next to `dtype`: transformers 4, which the original
    remote code runs on, reads the dtype of a checkpoint from `torch_dtype` only."""
    config_dict = config.to_diff_dict() if use_diff else config.to_dict()
    if config_dict.get("dtype") is not None:
        config_dict["torch_dtype"] = config_dict["dtype"]
    config_dict = config._encode_special_floats(config_dict)
    return json.dumps(config_dict, indent=2, sort_keys=True) + "\n"
