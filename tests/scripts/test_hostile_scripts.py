"""The scripts against hostile settings: missing or wrong model paths, misspelt dtypes, zero LoRA ranks, evaluation
settings training would refuse, misspelt training-config keys, pickle-only folders for SFT."""

import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "configs", "tiny.yaml")


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """A tiny random LLaDA folder with its tokenizer (safetensors)."""
    from stabledrl_trl.sft import build_tiny_model
    from stabledrl_trl.tiny import build_tiny_tokenizer

    path = tmp_path_factory.mktemp("models") / "tiny"
    tokenizer = build_tiny_tokenizer()
    build_tiny_model(
        tokenizer, seed=0, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, mlp_hidden_size=64
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train_argv(tmp_path, *extra):
    return ["--config", TINY, "--tiny_model", "false", "--output_dir", str(tmp_path / "out"), *extra]


def test_train_script_missing_local_model_path_is_file_not_found(tmp_path, load_script):
    train = load_script("train")
    missing = tmp_path / "no" / "such-model"
    with pytest.raises(FileNotFoundError, match="looks like a local path but does not exist") as error:
        train.main(argv=train_argv(tmp_path, "--model_name_or_path", str(missing)))
    assert str(error.value).startswith(f"model_name_or_path={str(missing)!r} ")  # the field the user set


def test_train_script_model_path_that_is_a_file_or_lacks_model_type(tmp_path, load_script, saved_model):
    import shutil

    train = load_script("train")
    with pytest.raises(ValueError, match="is a file; give the folder"):
        train.main(argv=train_argv(tmp_path, "--model_name_or_path", str(saved_model / "config.json")))
    broken = tmp_path / "broken"
    shutil.copytree(saved_model, broken)
    config = json.loads((broken / "config.json").read_text())
    del config["model_type"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no model_type"):
        train.main(argv=train_argv(tmp_path, "--model_name_or_path", str(broken)))


@pytest.mark.parametrize(
    "yaml_extra, flags, words",
    [
        ("dtype: bfloat61\n", [], ["dtype='bfloat61' is not known", "bfloat16"]),  # YAML skips argparse's choices
        ("", ["--use_peft", "true", "--lora_r", "0"], ["lora_r=0 must be an integer >= 1"]),
        ("", ["--use_peft", "true", "--lora_dropout", "nan"], ["lora_dropout=nan is not finite"]),
        ("", ["--eval_temperature", "-1"], ["eval_temperature=-1.0: temperature=-1.0 is out of range"]),
        # datasets' shuffle would refuse it deep in the loader ("expected non-negative integer"), unnamed
        ("", ["--seed", "-1"], ["seed=-1 is not a valid seed", "e.g. 42"]),
        ("", ["--num_threads", "0"], ["num_threads=0 must be a positive integer"]),  # torch's own error: unnamed
    ],
)
def test_train_script_model_settings_name_the_field_before_any_work(tmp_path, load_script, yaml_extra, flags, words):
    train = load_script("train")
    config = tmp_path / "run.yaml"
    config.write_text(open(TINY).read() + yaml_extra)
    # tiny_model stays on: the check must come before the SFT warm-up (no cache folder is created)
    argv = ["--config", str(config), "--output_dir", str(tmp_path / "out"), "--sft_cache_dir", str(tmp_path / "c")]
    with pytest.raises(ValueError) as info:
        train.main(argv=argv + flags)
    for word in words:
        assert word in str(info.value), str(info.value)
    assert not (tmp_path / "c").exists()


def test_evaluate_validates_sampler_settings_as_training_does(load_script, tmp_path):
    evaluate = load_script("evaluate")
    for flags, words in [
        (["--top_p", "2"], ["top_p=2.0 is out of range", "(0, 1]"]),
        (["--temperature", "nan"], ["temperature=nan is not finite"]),
        (["--dream_eps", "1.5"], ["1.5"]),
        (["--block_confidence_threshold", "-1"], ["block_confidence_threshold=-1.0"]),
    ]:
        (args,) = evaluate.make_parser().parse_args_and_config(["--model_name_or_path", "m", *flags])
        with pytest.raises(ValueError) as info:
            evaluate.sampler_settings(args)
        for word in ["sampler settings", *words]:
            assert word in str(info.value), str(info.value)
    config = tmp_path / "train.yaml"
    config.write_text("max_completion_length: 16\ntop_p: 2.0\n")
    (args,) = evaluate.make_parser().parse_args_and_config(
        ["--model_name_or_path", "m", "--training_config", str(config)]
    )
    with pytest.raises(ValueError, match="top_p=2.0 is out of range"):
        evaluate.sampler_settings(args)


def test_evaluate_refuses_misspelt_and_duplicate_training_config_keys(load_script, tmp_path):
    evaluate = load_script("evaluate")
    config = tmp_path / "train.yaml"
    config.write_text("max_completion_length: 16\ntemprature: 0.2\n")
    (args,) = evaluate.make_parser().parse_args_and_config(
        ["--model_name_or_path", "m", "--training_config", str(config)]
    )
    with pytest.raises(ValueError, match="unknown key.*--temprature.*did you mean 'temperature'"):
        evaluate.sampler_settings(args)
    config.write_text("temperature: 0.2\ntemperature: 0.5\n")
    with pytest.raises(ValueError, match="duplicate key 'temperature' on line 2"):
        evaluate.sampler_settings(args)
    # every key of the shipped training configs is known
    for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
        if name.endswith(".yaml"):
            evaluate.load_training_config(os.path.join(ROOT, "configs", name))


def test_sft_script_requires_the_pickle_opt_in(load_script, saved_model, tmp_path):
    from safetensors.torch import load_file

    sft = load_script("sft")
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    for name in os.listdir(saved_model):
        if name != "model.safetensors":
            (pickled / name).write_bytes((saved_model / name).read_bytes())
    torch.save(load_file(str(saved_model / "model.safetensors")), pickled / "pytorch_model.bin")
    argv = [
        "--model_name_or_path", str(pickled), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
        "--per_device_train_batch_size", "2", "--num_train_samples", "4", "--use_cpu", "true", "--report_to", "none",
        "--disable_tqdm", "true",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="only pickle weights.*allow_pickle_checkpoints=True"):
        sft.main(argv=argv)
    results = sft.main(argv=argv + ["--allow_pickle_checkpoints", "true"])
    assert results["train"]["epoch"] > 0 and (tmp_path / "out" / "model.safetensors").is_file()


def test_sft_script_config_refuses_string_bools_and_non_finite_numbers(load_script):
    from stabledrl_trl.sft import MaskedDiffusionSFTConfig

    with pytest.raises(TypeError, match="save_only_model='no'"):
        MaskedDiffusionSFTConfig(output_dir="unused", use_cpu=True, save_only_model="no")
    with pytest.raises(ValueError, match="weight_decay=nan is not finite"):
        MaskedDiffusionSFTConfig(output_dir="unused", use_cpu=True, weight_decay=float("nan"))
    sft = load_script("sft")
    with pytest.raises(TypeError, match="allow_pickle_checkpoints='false'"):
        sft.SFTScriptArguments(allow_pickle_checkpoints="false")
    with pytest.raises(ValueError, match="num_threads=0 must be a positive integer"):  # the check train.py runs
        sft.main(argv=["--output_dir", "unused", "--use_cpu", "true", "--num_threads", "0"])
