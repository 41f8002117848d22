"""scripts/evaluate.py: full models and LoRA adapters (loaded without merging), sampler settings, the JSON output."""

from __future__ import annotations

import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORD_KEYS = {"prompt", "completion", "answer", "reward"}
OUTPUT_KEYS = {"model", "adapter", "task", "split", "accuracy", "n", "num_rows", "sampler", "seed", "records"}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and spinning threads slow down badly on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def evaluate_script(load_script):
    return load_script("evaluate")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A tiny random LLaDA saved with its tokenizer, and a LoRA adapter on it with nonzero (random) weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from stabledrl_trl.sft import build_tiny_model
    from stabledrl_trl.tiny import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("ckpt")
    base_dir, adapter_dir = str(root / "base"), str(root / "adapter")
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        peft_model = get_peft_model(base, config)
    peft_model.save_pretrained(adapter_dir)
    return base_dir, adapter_dir


def _argv(model_dir, out_file, *extra):
    return [
        "--model_name_or_path", model_dir,
        "--task", "digit_sort",
        "--num_samples", "6",
        "--gen_length", "8",
        "--block_length", "4",
        "--steps", "4",
        "--temperature", "0",
        "--batch_size", "3",
        "--output_file", str(out_file),
        "--no_progress",
        *extra,
    ]  # fmt: skip


def test_full_model_writes_json(evaluate_script, checkpoints, tmp_path):
    base_dir, _ = checkpoints
    out_file = tmp_path / "sub" / "eval.json"
    result = evaluate_script.main(argv=_argv(base_dir, out_file))
    with open(out_file) as f:
        written = json.load(f)
    assert set(written) == OUTPUT_KEYS
    assert written == json.loads(json.dumps(result))
    assert written["adapter"] is False and written["task"] == "digit_sort" and written["split"] == "test"
    assert written["n"] == written["num_rows"] == len(written["records"]) == 6
    assert all(set(r) == RECORD_KEYS for r in written["records"])
    assert written["sampler"] == {
        "gen_length": 8, "block_length": 4, "steps": 4, "temperature": 0.0, "remasking": "low_confidence",
        "cfg_scale": 0.0,
    }  # fmt: skip
    rewards = [r["reward"] for r in written["records"]]
    assert written["accuracy"] == pytest.approx(sum(rewards) / 6)


def test_lora_adapter_is_loaded_without_merging(evaluate_script, checkpoints, tmp_path, monkeypatch):
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer, LoraModel
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.tasks import load_task_dataset

    base_dir, adapter_dir = checkpoints

    def no_merge(*args, **kwargs):
        raise AssertionError("the adapter must not be merged for evaluation")

    monkeypatch.setattr(LoraModel, "merge_and_unload", no_merge)
    monkeypatch.setattr(LoraLinear, "merge", no_merge)

    (args,) = evaluate_script.make_parser().parse_args_and_config(_argv(adapter_dir, tmp_path / "a.json"))
    model, tokenizer, is_adapter = evaluate_script.load_model(args)
    assert is_adapter and isinstance(model, PeftModel)
    lora_layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert len(lora_layers) == 3 * 2  # q, v, up in each of the 2 layers, kept as separate LoRA modules
    assert not any(m.merged for m in lora_layers)

    adapter_result = evaluate_script.main(argv=_argv(adapter_dir, tmp_path / "a.json"))
    base_result = evaluate_script.main(argv=_argv(base_dir, tmp_path / "b.json"))
    assert adapter_result["adapter"] is True
    adapter_completions = [r["completion"] for r in adapter_result["records"]]
    assert adapter_completions != [r["completion"] for r in base_result["records"]]

    # The same adapter applied in memory gives the same samples.
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir)
    rows = load_task_dataset("digit_sort", "test", num_samples=6, seed=0)
    expected = evaluate_model(
        reference,
        AutoTokenizer.from_pretrained(base_dir),
        rows,
        "digit_sort",
        gen_length=8,
        block_length=4,
        steps=4,
        temperature=0.0,
        batch_size=6,
        progress=False,
    )
    assert adapter_result["records"] == expected["records"]


def test_sampler_settings_precedence(evaluate_script, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("max_completion_length: 16\nblock_length: 8\ndiffusion_steps: 16\ntemperature: 0.7\n")
    (args,) = evaluate_script.make_parser().parse_args_and_config(
        ["--model_name_or_path", "m", "--training_config", str(config), "--steps", "8"]
    )
    assert evaluate_script.sampler_settings(args) == {
        "gen_length": 16, "block_length": 8, "steps": 8, "temperature": 0.7, "remasking": "low_confidence",
        "cfg_scale": 0.0,
    }  # fmt: skip
    from stabledrl_trl.stabledrl_config import StableDRLConfig

    (args,) = evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", "m"])
    fields = StableDRLConfig.__dataclass_fields__
    settings = evaluate_script.sampler_settings(args)
    assert settings["gen_length"] == fields["max_completion_length"].default
    assert settings["steps"] == fields["diffusion_steps"].default
    assert settings["temperature"] == fields["temperature"].default


def test_yaml_config_and_unknown_keys(evaluate_script, tmp_path):
    good = tmp_path / "eval.yaml"
    good.write_text("model_name_or_path: m\nbatch_size: 5\n")
    (args,) = evaluate_script.make_parser().parse_args_and_config(["--config", str(good)])
    assert args.model_name_or_path == "m" and args.batch_size == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: m\nbatch_sise: 5\n")
    with pytest.raises(ValueError, match="batch_sise"):
        evaluate_script.make_parser().parse_args_and_config(["--config", str(bad)])


def test_missing_model_and_bad_dtype(evaluate_script):
    (args,) = evaluate_script.make_parser().parse_args_and_config([])
    with pytest.raises(ValueError, match="model_name_or_path"):
        evaluate_script.load_model(args)
    (args,) = evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", "m", "--dtype", "float9"])
    with pytest.raises(ValueError, match="float9"):
        evaluate_script.load_model(args)
    with pytest.raises(ValueError, match="num_threads"):
        evaluate_script.main(argv=["--model_name_or_path", "m", "--num_threads", "0"])


def test_prompt_style_precedence(evaluate_script, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("task: countdown\nprompt_style: official\n")
    parse = evaluate_script.make_parser().parse_args_and_config
    (args,) = parse(["--model_name_or_path", "m", "--training_config", str(config)])
    assert evaluate_script.prompt_style(args) == "official"  # from the training run
    (args,) = parse(["--model_name_or_path", "m", "--training_config", str(config), "--prompt_style", "tagged"])
    assert evaluate_script.prompt_style(args) == "tagged"  # an explicit flag wins
    (args,) = parse(["--model_name_or_path", "m"])
    assert evaluate_script.prompt_style(args) == "tagged"  # the default
