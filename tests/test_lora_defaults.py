"""LoRA without target modules: the native models get PEFT-style defaults, a model PEFT knows keeps PEFT's, any other
is refused naming the field; the README's CPU LoRA command runs, and its adapter loads from another folder."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from stabledrl_trl.lora_defaults import LORA_DEFAULT_TARGETS, with_default_lora_targets

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.mark.parametrize(
    "fixture, targets",
    [("llada-tiny", {"q_proj", "v_proj"}), ("dream-tiny", {"q_proj", "v_proj"}), ("sdar-tiny", {"q_proj", "v_proj"}),
     ("llada2-tiny", {"query_key_value"})],
)  # fmt: skip
def test_native_models_get_default_targets_from_their_path(fixture, targets):
    given = LoraConfig(r=4)
    filled = with_default_lora_targets(given, str(FIXTURES / fixture))
    assert filled.target_modules == targets and filled.r == 4
    assert given.target_modules is None  # the caller's config is left as it was


def test_the_default_targets_exist_in_each_native_model():
    from transformers import AutoModelForCausalLM

    import stabledrl_trl  # noqa: F401

    types = {}
    for fixture in ("llada-tiny", "dream-tiny", "sdar-tiny", "llada2-tiny"):
        model = AutoModelForCausalLM.from_pretrained(FIXTURES / fixture)
        names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        types[model.config.model_type] = names
    assert set(types) == set(LORA_DEFAULT_TARGETS)
    for model_type, targets in LORA_DEFAULT_TARGETS.items():
        assert set(targets) <= types[model_type], model_type


def test_set_targets_a_known_architecture_and_other_peft_configs_are_left_alone(tiny_llama, tiny_llada):
    explicit = LoraConfig(target_modules=["o_proj"])
    assert with_default_lora_targets(explicit, tiny_llada) is explicit
    assert with_default_lora_targets(LoraConfig(target_parameters=["w"]), tiny_llada).target_modules is None
    llama = LoraConfig()  # PEFT has a default for llama: PEFT applies it
    assert with_default_lora_targets(llama, tiny_llama) is llama and llama.target_modules is None
    filled = with_default_lora_targets(LoraConfig(), tiny_llada)  # a model object works as a path does
    assert filled.target_modules == {"q_proj", "v_proj"}


def test_a_model_without_any_default_is_refused_naming_the_field_and_its_layers():
    class Mystery(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = type("Config", (), {"model_type": "mystery"})()
            self.alpha, self.beta = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match=r"lora_target_modules .*model_type 'mystery'.*\['alpha', 'beta'\]"):
        with_default_lora_targets(LoraConfig(), Mystery())


def test_trainer_applies_the_default_targets(tmp_path, tiny_llada, tiny_tokenizer):
    from datasets import Dataset

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer

    args = StableDRLConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                           num_generations=4, max_completion_length=8, max_steps=1, save_strategy="no")  # fmt: skip
    trainer = StableDRLTrainer(
        model=tiny_llada,
        reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["sort 21"] * 4}),
        processing_class=tiny_tokenizer,
        peft_config=LoraConfig(r=4),
    )
    adapted = {m.group(1) for n, _ in trainer.model.named_parameters() if (m := re.search(r"\.(\w+)\.lora_A\.", n))}
    assert adapted == {"q_proj", "v_proj"}


README_LORA = re.compile(r"^python scripts/train\.py [^\n]*--use_peft true[^\n]*\\\n[^\n]*$", re.M)


@pytest.mark.slow
def test_readme_cpu_lora_command_runs_and_its_adapter_loads_from_another_folder(tmp_path, monkeypatch, load_script):
    """The README's command (shortened only in steps and evaluation rows), run from a folder with the README's
    relative paths; the adapter records an absolute base model path, so it loads from anywhere."""
    from peft import PeftConfig, PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    command = README_LORA.search((ROOT / "README.md").read_text())
    assert command, "README.md has no CPU LoRA command (python scripts/train.py ... --use_peft true ...)"
    argv = shlex.split(command.group(0).replace("\\\n", " "))[2:]
    argv[argv.index("--config") + 1] = str(ROOT / "configs" / "tiny.yaml")
    argv += ["--sft_max_steps", "3", "--sft_num_samples", "64", "--max_steps", "2", "--num_eval_samples", "8",
             "--eval_batch_size", "8", "--logging_steps", "1"]  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    trainer, _ = load_script("train").main(argv=argv)
    out = work / argv[argv.index("--output_dir") + 1]
    config = json.loads((out / "adapter_config.json").read_text())
    assert os.path.isabs(config["base_model_name_or_path"]) and config["r"] == 16
    assert set(config["target_modules"]) == {"q_proj", "v_proj"}
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert saved and all("q_proj" in k or "v_proj" in k for k in saved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the README's relative paths mean nothing here
    base = AutoModelForCausalLM.from_pretrained(PeftConfig.from_pretrained(str(out)).base_model_name_or_path)
    loaded = PeftModel.from_pretrained(base, str(out))
    trained = {k: v for k, v in trainer.model.state_dict().items() if "lora_" in k}
    got = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
    assert trained.keys() == got.keys() and all(torch.equal(trained[k], got[k]) for k in trained)
    assert any(v.abs().sum() > 0 for v in got.values())  # lora_A's random start: the saved adapter, not a fresh one
    # scripts/evaluate.py, as the README says, from this other folder
    result = load_script("evaluate").main(argv=[
        "--model_name_or_path", str(out), "--task", "digit_sort", "--num_samples", "8", "--batch_size", "8",
        "--training_config", str(ROOT / "configs" / "tiny.yaml"), "--output_file", str(elsewhere / "eval.json"),
    ])  # fmt: skip
    assert result["n"] == 8 and (elsewhere / "eval.json").is_file()
