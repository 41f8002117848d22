"""The scripts' help: train.py's `--help` starts with the description and a usage naming `--config`, lists the
project's own fields grouped (TrainingArguments' inherited ones only behind `--help-all`), imports no torch, and
lists exactly the fields the real parser accepts; no arguments print the usage; evaluate.py and sft.py start with
their description too."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stabledrl_trl import cli_help

ROOT = Path(__file__).resolve().parents[2]

RUN_AND_REPORT_IMPORTS = """
import runpy, sys
sys.argv = ["scripts/train.py", *sys.argv[1:]]
code = 0
try:
    runpy.run_path("scripts/train.py", run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "trl", "stabledrl_trl") if m in sys.modules)
print("HEAVY-IMPORTS", heavy, "EXIT", code)
"""


def run_train(*args: str, clean_env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUN_AND_REPORT_IMPORTS, *args], cwd=ROOT, env=clean_env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def listed_fields(text: str) -> list[str]:
    return re.findall(r"^  --(\w+) ", text, flags=re.M)


@pytest.fixture(scope="module")
def real_fields():
    from trl import ModelConfig

    from stabledrl_trl import StableDRLConfig

    train = _load_train()
    return {cls.__name__: [f.name for f in dataclasses.fields(cls)]
            for cls in (train.TrainScriptArguments, StableDRLConfig, ModelConfig)}  # fmt: skip


def _load_train():
    import importlib.util

    if "scripts_train" not in sys.modules:
        spec = importlib.util.spec_from_file_location("scripts_train", ROOT / "scripts" / "train.py")
        sys.modules["scripts_train"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["scripts_train"])
    return sys.modules["scripts_train"]


def test_help_starts_with_description_and_usage_and_imports_nothing_heavy(clean_env):
    done = run_train("--help", clean_env=clean_env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("Train a (diffusion) language model with StableDRL from a YAML config.\n\nusage: ")
    usage = out.split("usage: ", 1)[1].split("\n\n", 1)[0]
    assert "python scripts/train.py --config CONFIG.yaml" in usage and "accelerate launch" in usage
    assert "HEAVY-IMPORTS [] EXIT 0" in out  # no torch, transformers, TRL or the package: the help is instant
    titles = re.findall(r"^(\S[^\n]*):$", out, flags=re.M)
    assert titles[0] == "options" and titles[1] == "scripts/train.py: Task and data"
    assert "StableDRLConfig: Likelihood estimation" in titles and titles[-1] == "TRL ModelConfig (model, dtype, LoRA)"
    fields = listed_fields(out)
    assert fields[0] == "config"
    assert {"task", "loss_type", "likelihood_estimator", "clip_c", "model_name_or_path", "use_peft"} <= set(fields)
    assert "adam_beta1" not in fields and "epsilon_high" not in fields  # inherited: named at the end, listed by --all
    assert "--help-all" in out.split("\n\n")[-1] and "--learning_rate" in out
    assert len(out.splitlines()) < 400  # was 1,634 lines, TrainingArguments' first


def test_help_all_lists_every_field_the_parser_accepts_once_inherited_last(clean_env, real_fields):
    done = run_train("--help-all", clean_env=clean_env)
    assert done.returncode == 0 and "HEAVY-IMPORTS [] EXIT 0" in done.stdout, done.stderr
    config, *fields = listed_fields(done.stdout)
    assert config == "config" and len(fields) == len(set(fields)), "a field is listed twice"
    expected = {name for names in real_fields.values() for name in names}
    assert set(fields) == expected, (sorted(expected - set(fields)), sorted(set(fields) - expected))
    titles = re.findall(r"^(\S[^\n]*):$", done.stdout, flags=re.M)
    assert titles[-1] == "Inherited from transformers' TrainingArguments"
    assert fields.index("adam_beta1") > fields.index("lora_r") > fields.index("clip_c") > fields.index("task")


def test_help_reads_the_project_fields_as_the_dataclasses_define_them(real_fields):
    from stabledrl_trl import StableDRLConfig

    read = cli_help.source_fields(str(ROOT / "stabledrl_trl" / "stabledrl_config.py"), "StableDRLConfig")
    real = {f.name: f for f in dataclasses.fields(StableDRLConfig)}
    assert [f.name for f in read] == [n for n in vars(StableDRLConfig)["__annotations__"]]
    for f in read:  # help text and default as the imported class has them (constants and f-strings resolved)
        assert f.help == " ".join(real[f.name].metadata.get("help", "").split()), f.name
        assert f.default == repr(real[f.name].default), f.name
    groups = {f.name: f.group for f in read}
    assert groups["loss_type"] == "Objective" and groups["likelihood_estimator"] == "Likelihood estimation"
    assert groups["block_denoising_steps"] == "Block diffusion"  # the first line of a two-line section comment


def test_source_fields_on_a_hand_written_class(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        'from dataclasses import dataclass, field\nNAMES = ("a", "b")\nclass W(int):\n    pass\nN = W(7)\n\n'
        "@dataclass\nclass C:\n    # ---- First: part ----\n    x: int = 3\n"
        '    y: str | None = field(default=None, metadata={"help": f"one of {list(NAMES)}."})\n'
        "    # Second section\n    # (continued)\n"
        '    z: list = field(default_factory=list, metadata={"help": "multi "\n        "line"})\n'
        "    n: int = field(default=N)\n    r: float = field(metadata={})\n"
    )
    assert cli_help.source_fields(str(path), "C", "Top") == [
        cli_help.SourceField("First", "x", "int", "3", ""),
        cli_help.SourceField("First", "y", "str | None", "None", "one of ['a', 'b']."),
        cli_help.SourceField("Second section", "z", "list", "list()", "multi line"),
        cli_help.SourceField("Second section", "n", "int", "7", ""),
        cli_help.SourceField("Second section", "r", "float", "required", ""),
    ]


def test_no_arguments_print_the_usage_not_a_traceback(clean_env):
    done = run_train(clean_env=clean_env)
    assert "HEAVY-IMPORTS [] EXIT 2" in done.stdout
    assert done.stderr.startswith("usage: python scripts/train.py --config CONFIG.yaml")
    assert "Traceback" not in done.stderr and "bf16" not in done.stderr


@pytest.mark.parametrize(
    "script, first_line",
    [
        ("evaluate", "Held-out accuracy of a masked diffusion LM checkpoint (full model or LoRA adapter) on a task."),
        ("sft", "Masked-diffusion SFT (LLaDA's objective) of a diffusion LM on a task's answers, then an optional"),
    ],
)
def test_evaluate_and_sft_help_start_with_usage_naming_config_and_the_description(load_script, script, first_line):
    text = load_script(script).make_parser().format_help()
    assert text.startswith(f"usage: python scripts/{script}.py [--config CONFIG.yaml]")
    assert text.split("\n\n")[1].startswith(first_line)
    assert "(default: " in text  # the defaults are still shown


def test_estimator_help_names_every_built_in_estimator():
    """The likelihood_estimator help is written out (the help reads the source without importing the registry): every
    built-in estimator must be named in it."""
    from stabledrl_trl.diffusion.estimators import ESTIMATOR_SPECS
    from stabledrl_trl.stabledrl_config import StableDRLConfig

    text = StableDRLConfig.__dataclass_fields__["likelihood_estimator"].metadata["help"]
    assert all(f"'{name}'" in text for name in ESTIMATOR_SPECS), [n for n in ESTIMATOR_SPECS if f"'{n}'" not in text]
