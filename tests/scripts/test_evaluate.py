"""scripts/evaluate.py: full models and LoRA adapters (loaded without merging), sampler settings, the JSON output."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORD_KEYS = {"prompt", "completion", "answer", "reward"}
OUTPUT_KEYS = {
    "model", "adapter", "task", "split", "accuracy", "n", "num_rows", "grading", "grading_rule", "full_score",
    "sampler", "seed", "records",
}  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


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
    assert written["sampler"] == {  # the SamplerSettings, under StableDRLConfig's field names
        "max_completion_length": 8, "block_length": 4, "diffusion_steps": 4, "temperature": 0.0,
        "remasking": "low_confidence", "cfg_scale": 0.0, "diffusion_sampler": "auto", "dream_alg": "entropy",
        "dream_alg_temp": 0.0, "dream_eps": 1e-3, "top_p": 1.0, "top_k": 0, "block_denoising_steps": None,
        "block_remasking": "low_confidence_dynamic", "block_confidence_threshold": 0.9, "rollout_cache": "none",
        "parallel_threshold": None, "max_tokens_per_step": None, "reward_text": "completion",
    }  # fmt: skip
    rewards = [r["reward"] for r in written["records"]]
    assert written["accuracy"] == pytest.approx(sum(rewards) / 6)
    assert (written["grading"], written["full_score"]) == ("tagged", None)


def test_lora_adapter_is_loaded_without_merging(evaluate_script, checkpoints, tmp_path, monkeypatch):
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer, LoraModel
    from peft.tuners.lora.layer import Linear as LoraLinear
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
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
        settings=SamplerSettings.from_fields(
            max_completion_length=8, block_length=4, diffusion_steps=4, temperature=0.0
        ),
        batch_size=6,
        progress=False,
    )
    assert adapter_result["records"] == expected["records"]


def test_sampler_settings_precedence(evaluate_script, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text(
        "max_completion_length: 16\nblock_length: 16\ndiffusion_steps: 16\ntemperature: 0.7\n"
        "diffusion_sampler: dream\ndream_alg: maskgit_plus\ntop_p: 0.9\n"
    )
    (args,) = evaluate_script.make_parser().parse_args_and_config(
        ["--model_name_or_path", "m", "--training_config", str(config), "--steps", "8", "--top_p", "0.95"]
    )
    assert evaluate_script.sampler_settings(args).to_dict() == {
        "max_completion_length": 16, "block_length": 16, "diffusion_steps": 8, "temperature": 0.7,
        "remasking": "low_confidence", "cfg_scale": 0.0, "diffusion_sampler": "dream", "dream_alg": "maskgit_plus",
        "dream_alg_temp": 0.0, "dream_eps": 1e-3, "top_p": 0.95, "top_k": 0, "block_denoising_steps": None,
        "block_remasking": "low_confidence_dynamic", "block_confidence_threshold": 0.9, "rollout_cache": "none",
        "parallel_threshold": None, "max_tokens_per_step": None, "reward_text": "completion",
    }  # fmt: skip
    from stabledrl_trl.stabledrl_config import StableDRLConfig

    (args,) = evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", "m"])
    fields = StableDRLConfig.__dataclass_fields__
    settings = evaluate_script.sampler_settings(args)
    assert settings.max_completion_length == fields["max_completion_length"].default
    # unset block_length / diffusion_steps: StableDRLConfig's length-derived defaults (256 positions: 32, 128)
    assert (settings.block_length, settings.diffusion_steps) == (32, 128)
    assert settings.temperature == fields["temperature"].default


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


def test_pickle_checkpoints_are_refused_unless_allowed(evaluate_script, checkpoints, tmp_path):
    from safetensors.torch import load_file

    base_dir, adapter_dir = checkpoints
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in os.listdir(base_dir):
        if name != "model.safetensors":
            (pickled / name).write_bytes((open(os.path.join(base_dir, name), "rb")).read())
    torch.save(load_file(os.path.join(base_dir, "model.safetensors")), pickled / "pytorch_model.bin")
    (args,) = evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", str(pickled)])
    with pytest.raises(ValueError, match="only pickle weights"):
        evaluate_script.load_model(args)
    (args,) = evaluate_script.make_parser().parse_args_and_config(
        ["--model_name_or_path", str(pickled), "--allow_pickle_checkpoints"]
    )
    model, _, _ = evaluate_script.load_model(args)
    assert type(model).__name__ == "LLaDAModelLM"
    # a pickle-only LoRA adapter is refused too
    adapter = tmp_path / "adapter_bin"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(open(os.path.join(adapter_dir, "adapter_config.json")).read())
    torch.save(load_file(os.path.join(adapter_dir, "adapter_model.safetensors")), adapter / "adapter_model.bin")
    (args,) = evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", str(adapter)])
    with pytest.raises(ValueError, match="only pickle weights"):
        evaluate_script.load_model(args)


def test_missing_local_model_path_fails_at_once(evaluate_script, tmp_path):
    (args,) = evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", str(tmp_path / "nope")])
    with pytest.raises(FileNotFoundError, match="does not exist") as error:
        evaluate_script.load_model(args)
    assert str(error.value).startswith(f"model_name_or_path={str(tmp_path / 'nope')!r} ")


def test_unwritable_output_fails_before_evaluating_and_records_survive_a_late_failure(
    evaluate_script, checkpoints, tmp_path, monkeypatch
):
    base_dir, _ = checkpoints
    blocked = tmp_path / "file_not_folder"
    blocked.write_text("x")
    calls = []
    monkeypatch.setattr(evaluate_script, "load_model", lambda args: calls.append(1))
    with pytest.raises(OSError, match="cannot create its folder"):
        evaluate_script.main(argv=_argv(base_dir, blocked / "eval.json"))
    assert calls == []  # refused before loading the model or evaluating anything
    # A failure at write time keeps the per-sample records in a temporary file.
    output = {"accuracy": 0.5, "records": [{"prompt": "p", "completion": "c", "answer": "a", "reward": 1.0}]}

    def failing_open(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("builtins.open", failing_open)
    with pytest.raises(OSError, match="the results are saved in") as info:
        evaluate_script.write_output(output, str(tmp_path / "eval.json"))
    monkeypatch.undo()
    fallback = str(info.value).rsplit("saved in ", 1)[1].rstrip(".")
    with open(fallback) as f:
        assert json.load(f)["records"] == output["records"]
    os.remove(fallback)


def test_misspelt_key_suggests_the_field(evaluate_script, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model_name_or_path: m\nbatch_sise: 5\n")
    with pytest.raises(ValueError, match="did you mean 'batch_size'"):
        evaluate_script.make_parser().parse_args_and_config(["--config", str(bad)])
    with pytest.raises(ValueError, match="did you mean 'num_samples'"):
        evaluate_script.make_parser().parse_args_and_config(["--model_name_or_path", "m", "--num_smaples", "3"])


def test_missing_training_config_names_the_flag_before_loading(evaluate_script, tmp_path):
    missing = tmp_path / "configs" / "tinyy.yaml"
    argv = ["--model_name_or_path", str(tmp_path / "never-loaded"), "--training_config", str(missing)]
    with pytest.raises(FileNotFoundError, match=r"training_config='.*tinyy\.yaml' is not a file") as error:
        evaluate_script.main(argv=argv)  # the model path does not exist either: the config is checked first
    assert "leave --training_config out" in str(error.value)


def test_block_diffusion_checkpoint_with_its_training_config(evaluate_script, tmp_path):
    """A saved tiny SDAR evaluated with configs/tiny_block.yaml's sampler settings (its block sampler)."""
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.sft import build_tiny_model
    from stabledrl_trl.tasks import get_task, load_task_dataset
    from stabledrl_trl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=0, architecture="sdar")
    model.save_pretrained(tmp_path / "sdar")
    tokenizer.save_pretrained(tmp_path / "sdar")
    config = os.path.join(ROOT, "configs", "tiny_block.yaml")
    argv = ["--model_name_or_path", str(tmp_path / "sdar"), "--task", "digit_sort", "--num_samples", "4",
            "--training_config", config, "--temperature", "0", "--no_progress"]  # fmt: skip
    result = evaluate_script.main(argv=argv)
    assert result["sampler"]["block_remasking"] == "low_confidence_dynamic" and result["n"] == 4
    rows = load_task_dataset("digit_sort", "test", num_samples=4, seed=0)
    settings = SamplerSettings.from_fields(max_completion_length=8, temperature=0.0)
    direct = evaluate_model(model.eval(), tokenizer, rows, get_task("digit_sort"), settings=settings, progress=False)
    assert [r["completion"] for r in result["records"]] == [r["completion"] for r in direct["records"]]


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


def test_reward_style_precedence(evaluate_script, tmp_path):
    config = tmp_path / "train.yaml"
    config.write_text("task: countdown\nprompt_style: official\n")
    parse = evaluate_script.make_parser().parse_args_and_config
    (args,) = parse(["--model_name_or_path", "m", "--training_config", str(config)])
    assert evaluate_script.reward_style(args) == "official"  # follows the prompt style, as in training
    config.write_text("task: countdown\nprompt_style: official\nreward_style: tagged\n")
    assert evaluate_script.reward_style(args) == "tagged"  # the training run's reward_style
    (args,) = parse(["--model_name_or_path", "m", "--training_config", str(config), "--reward_style", "official"])
    assert evaluate_script.reward_style(args) == "official"  # an explicit flag wins
    (args,) = parse(["--model_name_or_path", "m", "--prompt_style", "official"])
    assert evaluate_script.reward_style(args) == "official"
    (args,) = parse(["--model_name_or_path", "m"])
    assert evaluate_script.reward_style(args) == "tagged"  # the default
    with pytest.raises(ValueError, match="task 'digit_sort' has no official") as error:
        evaluate_script.main(argv=["--model_name_or_path", "m", "--reward_style", "official"])  # before loading
    assert "--reward_style='official'" in str(error.value) and "pass --reward_style tagged " in str(error.value)
    assert "prompt_style" not in str(error.value)  # the prompt style (tagged) is fine: only the flag at fault


def test_official_grading_is_written_to_the_json(evaluate_script, checkpoints, tmp_path):
    base_dir, _ = checkpoints
    out_file = tmp_path / "eval.json"
    argv = _argv(base_dir, out_file, "--task", "sudoku", "--prompt_style", "official", "--reward_style", "official")
    evaluate_script.main(argv=argv)
    written = json.loads(out_file.read_text())
    assert (written["task"], written["grading"], written["full_score"]) == ("sudoku", "official", 1.0)
    assert "full score" in written["grading_rule"]
    records = written["records"]
    assert all(r["correct"] == (r["reward"] >= 1.0) and 0.0 <= r["reward"] <= 1.0 for r in records)
    assert written["accuracy"] == sum(r["correct"] for r in records) / len(records)


def test_every_sampler_setting_is_a_flag_that_reaches_the_settings(evaluate_script, tmp_path):
    """The flags are built from `SamplerSettings` (no second list): each field has one flag, and a value given on the
    command line arrives in the evaluation's settings under the field's name."""
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings

    flags = {f.name for f in dataclasses.fields(evaluate_script.SamplerFlags)}
    renamed = evaluate_script.RENAMED_FLAGS
    assert {renamed.get(flag, flag) for flag in flags} == set(SamplerSettings.field_names())
    given = {"gen_length": "12", "steps": "6", "block_length": "4", "temperature": "0.5", "rollout_cache": "dual",
             "parallel_threshold": "0.8", "top_k": "5", "reward_text": "canvas"}  # fmt: skip
    argv = [f"--{k}={v}" for k, v in given.items()]
    (args,) = evaluate_script.make_parser().parse_args_and_config(argv)
    settings = evaluate_script.sampler_settings(args)
    assert (settings.max_completion_length, settings.diffusion_steps, settings.block_length) == (12, 6, 4)
    assert (settings.temperature, settings.rollout_cache, settings.parallel_threshold) == (0.5, "dual", 0.8)
    assert (settings.top_k, settings.reward_text) == (5, "canvas")
    with pytest.raises(ValueError, match="rollout_cache"):
        evaluate_script.sampler_settings(evaluate_script.make_parser().parse_args_and_config(["--rollout_cache=x"])[0])


@pytest.fixture
def no_model_load(evaluate_script, monkeypatch):
    """load_model replaced by a failure: a test using this fixture proves its error comes before the weights load."""

    def refuse(args):
        raise AssertionError("the model was loaded before the bad value was refused")

    monkeypatch.setattr(evaluate_script, "load_model", refuse)


@pytest.mark.parametrize(
    "extra, kind, words",
    [
        (["--batch_size", "0"], ValueError, ["--batch_size=0 must be a positive integer"]),
        (["--num_samples", "0"], ValueError, ["--num_samples=0 must be a positive integer", "leave --num_samples"]),
        (["--num_samples", "-3"], ValueError, ["--num_samples=-3 must be a positive integer"]),
        (["--num_threads", "0"], ValueError, ["--num_threads=0 must be a positive integer"]),
        (["--dtype", "float9"], ValueError, ["--dtype='float9' is not a torch dtype", "bfloat16"]),
        (["--device", "gpu"], ValueError, ["--device='gpu' is not a torch device", "use cpu, cuda"]),
        (["--dataset_seed", "-1"], ValueError, ["--dataset_seed=-1 is not a valid seed"]),
        (["--split", "nosuch"], ValueError, ["split", "'nosuch'"]),
        (["--num_samples", "100000"], ValueError, ["num_samples", "100000"]),  # more rows than the split holds
        (
            ["--dataset_path", "data/missing.jsonl"],
            FileNotFoundError,
            ["--dataset_path='data/missing.jsonl' does not"],
        ),
        (["--data_files", "missing.jsonl"], FileNotFoundError, ["--data_files='missing.jsonl' does not exist"]),
    ],
)
def test_bad_values_fail_before_the_model_loads(evaluate_script, no_model_load, tmp_path, extra, kind, words):
    argv = ["--model_name_or_path", "m", "--task", "digit_sort", "--num_samples", "6", "--no_progress", *extra]
    with pytest.raises(kind) as error:
        evaluate_script.main(argv=argv)
    for word in words:
        assert word in str(error.value), str(error.value)


def test_unreachable_device_fails_before_the_model_loads(evaluate_script, no_model_load, monkeypatch):
    """A CPU-only torch asked for --device cuda: the flag named, not torch's bare AssertionError after loading."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["--model_name_or_path", "m", "--task", "digit_sort", "--device", "cuda"]
    with pytest.raises(ValueError, match=r"--device='cuda': no cuda device is available.*use --device cpu"):
        evaluate_script.main(argv=argv)
    # two visible GPUs: cuda:1 is accepted, cuda:2 is refused with the indices there are
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    parse = evaluate_script.make_parser().parse_args_and_config
    assert evaluate_script.resolve_device(parse(["--device", "cuda:1"])[0]) == "cuda:1"
    assert evaluate_script.resolve_device(parse([])[0]) == "cuda"
    with pytest.raises(ValueError, match=r"--device='cuda:2': this machine has 2 CUDA device\(s\) \(indices 0 to 1\)"):
        evaluate_script.resolve_device(parse(["--device", "cuda:2"])[0])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert evaluate_script.resolve_device(parse([])[0]) == "cpu"


def test_style_errors_name_this_scripts_flags(evaluate_script, no_model_load):
    """Unknown styles, and a training config whose official styles the task lacks: --prompt_style / --reward_style
    and where their value came from, never evaluation.py's `grading=` argument."""
    base = ["--model_name_or_path", "m", "--task", "digit_sort"]
    with pytest.raises(ValueError) as error:
        evaluate_script.main(argv=[*base, "--prompt_style", "foo"])
    assert str(error.value) == "--prompt_style='foo' is not a style; choose one of tagged, official."
    with pytest.raises(ValueError) as error:
        evaluate_script.main(argv=[*base, "--reward_style", "bar"])
    assert str(error.value) == "--reward_style='bar' is not a style; choose one of tagged, official."
    config = os.path.join(ROOT, "configs", "llada_gsm8k_lora.yaml")  # official prompts and grading, GSM8K
    with pytest.raises(ValueError) as error:
        evaluate_script.main(argv=[*base, "--training_config", config])
    message = str(error.value)
    for words in (
        f"--prompt_style='official' (the prompt_style of --training_config {config})",
        f"--reward_style='official' (the reward_style of --training_config {config})",
        "pass --prompt_style tagged --reward_style tagged",
        "official forms exist for gsm8k, math, countdown, sudoku",
    ):
        assert words in message, message
    assert "grading=" not in message
    # explicit flags override the training config's styles: the check passes and returns them
    (args,) = evaluate_script.make_parser().parse_args_and_config(
        [*base, "--training_config", config, "--prompt_style", "tagged", "--reward_style", "tagged"]
    )
    from stabledrl_trl.tasks import get_task

    assert evaluate_script.check_styles(args, get_task("digit_sort")) == ("tagged", "tagged")


def test_help_lists_the_sampler_flags_after_the_options_and_training_config(evaluate_script):
    """--training_config's help points at the flags it sets; the sampler flags come last in --help, and the
    arguments still build by keyword (sampler flags and options alike)."""
    help_text = evaluate_script.make_parser().format_help()
    position = {
        f.name: help_text.index(f"  --{f.name} ") for f in dataclasses.fields(evaluate_script.EvaluateArguments)
    }
    sampler = [f.name for f in dataclasses.fields(evaluate_script.SamplerFlags)]
    options = [f.name for f in dataclasses.fields(evaluate_script.EvaluateOptions)]
    assert set(position) == set(sampler) | set(options) and not set(sampler) & set(options)
    assert max(position[name] for name in options) < min(position[name] for name in sampler)
    training_help = " ".join(help_text[position["training_config"] : position["batch_size"]].split())
    assert "--prompt_style, --reward_style and the [sampler: ...] flags (listed last)" in training_help
    args = evaluate_script.EvaluateArguments(model_name_or_path="m", gen_length=12, steps=6, batch_size=3)
    settings = evaluate_script.sampler_settings(args)
    assert (settings.max_completion_length, settings.diffusion_steps, args.batch_size) == (12, 6, 3)
