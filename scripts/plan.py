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

The config is first parsed and checked exactly as scripts/train.py does (TRL's parser with StableDRLConfig and
ModelConfig, for --gpus processes), so a value training would refuse is refused here too, naming the field; the
rollout rows per process are TRL's (generation_batch_size or steps_per_generation). Errors end the script with
exit status 2 and one message, and --write-comment never writes a config it cannot read back unchanged.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
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


class PlanError(ValueError):
    """A config, model or flag the planner cannot plan for; the message names it and the fix."""


def read_config(path: str) -> dict:
    """The config file as a mapping, with duplicate keys and unreadable files refused (as train.py refuses them)."""
    from stabledrl_trl.validation import load_yaml_checked

    if not Path(path).is_file():
        raise PlanError(f"--config {path}: no such file.")
    try:
        cfg = load_yaml_checked(path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise PlanError(f"--config {path} is not a readable YAML file: {error}") from None
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        raise PlanError(f"--config {path} holds a YAML {type(cfg).__name__}, not a mapping of settings.")
    return cfg


def _train_script():
    spec = importlib.util.spec_from_file_location("_stabledrl_train_script", Path(__file__).with_name("train.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def check_as_training(path: str, gpus: int) -> None:
    """Parse and check the config as scripts/train.py does, with the generation batch derived for `gpus` processes
    (bf16 is checked as a value only: no GPU is needed to plan)."""
    from stabledrl_trl import StableDRLConfig

    train = _train_script()

    class PlannedConfig(StableDRLConfig):  # the fields and checks of StableDRLConfig, for `gpus` processes
        @property
        def world_size(self) -> int:
            return gpus

    from trl import ModelConfig

    from stabledrl_trl.safety import make_trl_parser

    parser = make_trl_parser((train.TrainScriptArguments, PlannedConfig, ModelConfig))
    argv = ["--config", path]
    bf16 = read_config(path).get("bf16")
    if isinstance(bf16, bool) or bf16 is None:  # a wrong type is left for StableDRLConfig's own message
        argv += ["--bf16", "false", "--use_cpu", "true"]
    try:
        script_args, _, model_args = parser.parse_args_and_config(argv)
        train.check_script_args(script_args)
        train.check_model_args(model_args)
    except SystemExit as error:  # argparse's own exit for a value it cannot convert
        raise PlanError(f"--config {path}: a value cannot be read (see the message above); exit {error.code}.") from None


def config_with_defaults(path: str) -> dict:
    """The config's keys over StableDRLConfig's defaults (the values as written; check_as_training checks them)."""
    from stabledrl_trl import StableDRLConfig

    defaults = {}
    for f in dataclasses.fields(StableDRLConfig):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
    return {**defaults, **read_config(path)}


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
    if isinstance(a.gpus, bool) or not isinstance(a.gpus, int) or a.gpus < 1:
        raise PlanError(f"--gpus {a.gpus} must be an integer >= 1.")
    if not (isinstance(a.gpu_memory, (int, float)) and 0 < a.gpu_memory < float("inf")):
        raise PlanError(f"--gpu-memory {a.gpu_memory} must be a finite number of GiB > 0.")
    if a.prompt_length < 0:
        raise PlanError(f"--prompt-length {a.prompt_length} must be >= 0.")
    cfg = config_with_defaults(a.config)
    model = a.model or cfg.get("model_name_or_path")
    if not model:
        raise ValueError(f"{a.config} has no model_name_or_path; give --model (hub id or local folder).")
    if not isinstance(model, str):
        raise PlanError(f"model_name_or_path={model!r} in {a.config} must be a hub id or a folder path (a string).")
    check_as_training(a.config, a.gpus)
    shape = resolve_shape(model)
    cfg.setdefault("max_prompt_length", a.prompt_length)
    if cfg.get("max_prompt_length") is None:
        cfg["max_prompt_length"] = a.prompt_length
    settings = settings_from_config(cfg, a.gpus, a.sharding)
    components = estimate(shape, settings)
    text = format_plan(model, shape, settings, components, a.gpu_memory)
    return f"{command_line(a)} --write-comment\n{text}", components


def replace_comment(path: str, block: list[str]) -> None:
    """Replace the config's plan block (or append one). Refused, the file untouched, when its markers are broken (one
    without the other, repeated, in the wrong order, or a non-comment line between them) or when the result would
    not read back as the same settings."""
    text = Path(path).read_text()
    lines = text.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == COMMENT_BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == COMMENT_END]
    fix = f"Repair or delete the block between {COMMENT_BEGIN!r} and {COMMENT_END!r} in {path}, then run again."
    if begins or ends:
        if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
            raise PlanError(
                f"{path}: the plan block's markers are broken ({len(begins)} begin and {len(ends)} end marker(s)"
                f"{', end before begin' if len(begins) == len(ends) == 1 else ''}); not writing. {fix}"
            )
        start, end = begins[0], ends[0]
        inside = [line for line in lines[start + 1 : end] if line.strip() and not line.lstrip().startswith("#")]
        if inside:
            raise PlanError(f"{path}: the plan block holds settings ({inside[0].strip()!r}); not writing. {fix}")
        lines = lines[:start] + lines[end + 1 :]
    while lines and not lines[-1].strip():
        lines.pop()
    new = "\n".join([*lines, *block]) + "\n"
    if yaml.safe_load(new) != yaml.safe_load(text):
        raise PlanError(f"{path}: writing the plan block would change the settings it reads as; not writing. {fix}")
    Path(path).write_text(new)


def _fail(error: BaseException):
    """One message on stderr and exit status 2 (argparse's for a usage error), no traceback."""
    print(f"plan.py: error: {error}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> dict:
    a = make_parser().parse_args(argv)
    try:
        text, components = plan(a)
    except (PlanError, ValueError, TypeError) as error:
        _fail(error)
    print(text)
    if a.json:
        Path(a.json).write_text(json.dumps({**components, "gpu_bytes": a.gpu_memory * GIB}, indent=2) + "\n")
    if a.write_comment:
        try:
            replace_comment(a.config, comment_block(text))
        except PlanError as error:
            _fail(error)
    return components


if __name__ == "__main__":
    main()
