"""Peak GPU memory of a training config before renting a GPU: the estimate per component, whether it fits, and what
to change if it does not (`stabledrl_trl.memory_plan`; formulas and assumptions in its docstring).

    python scripts/plan.py --config configs/llada_math_full.yaml --gpus 8 --gpu-memory 80
    python scripts/plan.py --config configs/llada_gsm8k_lora.yaml --gpus 1 --gpu-memory 80 --write-comment

The model shape comes from the config's `model_name_or_path`: a known hub id (memory_plan.KNOWN_MODELS: LLaDA-8B,
Dream-7B, SDAR / TraDo 4B and 8B, LLaDA2.0-mini) or a local folder with a config.json (or --model). Settings missing
from the config take StableDRLConfig's defaults. Prompts have no length limit in TRL; --prompt-length is the longest
prompt to plan for. --write-comment stores the plan in the config as a comment block (at its end, replaced on each
run) that starts with the command that reproduces it; tests/scripts/test_plan.py checks that every GPU config's block
equals the planner's current output.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

import yaml

try:
    import stabledrl_trl  # noqa: F401
except ImportError:  # run from a checkout without installing: the package sits next to scripts/
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stabledrl_trl.memory_plan import (
    COMMENT_BEGIN,
    COMMENT_END,
    GIB,
    SHARDINGS,
    comment_block,
    estimate,
    format_plan,
    resolve_shape,
    settings_from_config,
)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="a training config (configs/*.yaml)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs in all (processes); default 1")
    p.add_argument("--gpu-memory", type=float, default=80.0, help="memory per GPU in GiB; default 80")
    p.add_argument("--sharding", choices=SHARDINGS, default=None,
                   help="ddp, zero2, zero3 or fsdp; default ddp on one GPU, fsdp on several")  # fmt: skip
    p.add_argument("--prompt-length", type=int, default=512, help="longest prompt in tokens; default 512")
    p.add_argument("--model", default=None, help="hub id or local folder instead of the config's model")
    p.add_argument("--json", default=None, help="also write the components (bytes) as JSON here")
    p.add_argument("--write-comment", action="store_true", help="store the plan as a comment block in --config")
    return p


def config_with_defaults(path: str) -> dict:
    """The config's keys over StableDRLConfig's defaults (without building the config: no GPU needed)."""
    from stabledrl_trl import StableDRLConfig

    defaults = {}
    for f in dataclasses.fields(StableDRLConfig):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
    with open(path) as fh:
        cfg = yaml.safe_load(fh) or {}
    return {**defaults, **cfg}


def command_line(a: argparse.Namespace) -> str:
    parts = [
        "python scripts/plan.py",
        "--config",
        a.config,
        "--gpus",
        str(a.gpus),
        "--gpu-memory",
        f"{a.gpu_memory:g}",
    ]
    if a.sharding:
        parts += ["--sharding", a.sharding]
    if a.prompt_length != 512:
        parts += ["--prompt-length", str(a.prompt_length)]
    if a.model:
        parts += ["--model", a.model]
    return " ".join(shlex.quote(x) if i else x for i, x in enumerate(parts))


def plan(a: argparse.Namespace) -> tuple[str, dict]:
    cfg = config_with_defaults(a.config)
    model = a.model or cfg.get("model_name_or_path")
    if not model:
        raise ValueError(f"{a.config} has no model_name_or_path; give --model (hub id or local folder).")
    shape = resolve_shape(model)
    cfg.setdefault("max_prompt_length", a.prompt_length)
    if cfg.get("max_prompt_length") is None:
        cfg["max_prompt_length"] = a.prompt_length
    settings = settings_from_config(cfg, a.gpus, a.sharding)
    components = estimate(shape, settings)
    text = format_plan(model, shape, settings, components, a.gpu_memory)
    return f"{command_line(a)} --write-comment\n{text}", components


def replace_comment(path: str, block: list[str]) -> None:
    lines = Path(path).read_text().splitlines()
    if COMMENT_BEGIN in lines:
        start, end = lines.index(COMMENT_BEGIN), lines.index(COMMENT_END)
        lines = lines[:start] + lines[end + 1 :]
    while lines and not lines[-1].strip():
        lines.pop()
    Path(path).write_text("\n".join([*lines, *block]) + "\n")


def main(argv: list[str] | None = None) -> dict:
    a = make_parser().parse_args(argv)
    if a.gpus < 1 or a.gpu_memory <= 0:
        raise SystemExit(f"--gpus ({a.gpus}) must be >= 1 and --gpu-memory ({a.gpu_memory}) > 0 GiB")
    text, components = plan(a)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps({**components, "gpu_bytes": a.gpu_memory * GIB}, indent=2) + "\n")
    if a.write_comment:
        replace_comment(a.config, comment_block(text))
    return components


if __name__ == "__main__":
    main()
