"""Reliability against hostile inputs: non-finite numbers, string bools, YAML tricks, runs that would train nothing,
damaged checkpoints, bad data, bad model folders. Each test is one row of the reliability table (docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os

import pytest
import torch
from datasets import Dataset
from test_reliability import digit_reward, fake_checkpoint, make_args, make_dataset, make_llada, make_trainer
from transformers import TrainerCallback

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.stabledrl_config import _type_hints
from stabledrl_trl.stabledrl_trainer import (
    CheckpointError,
    NonFiniteGradientError,
    NonFiniteRewardError,
    RewardFunctionError,
)
from stabledrl_trl.validation import FLOAT_RANGES, REPR_LIMIT, _hint_kinds, load_yaml_checked, short_repr

BASE = dict(report_to="none", use_cpu=True, bf16=False)


def config(tmp_path, **kw):
    return StableDRLConfig(output_dir=str(tmp_path / "out"), **{**BASE, **kw})


def fields_of_kind(kind) -> list[str]:
    hints = _type_hints(StableDRLConfig)
    return [f.name for f in dataclasses.fields(StableDRLConfig) if f.init and _hint_kinds(hints[f.name]) == {kind}]


# --------------------------------------------------------------------------- non-finite and out-of-range numbers


FLOAT_FIELDS = fields_of_kind(float)


def test_every_float_field_is_covered_and_the_trainers_fields_have_ranges():
    # inherited ones included: TrainingArguments' optimiser fields and GRPOConfig's sampling / objective fields
    for name in ("learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm"):
        assert name in FLOAT_FIELDS and name in FLOAT_RANGES
    for name in ("temperature", "top_p", "beta", "epsilon", "epsilon_high", "delta", "clip_c", "dgpo_n", "dgpo_m"):
        assert name in FLOAT_FIELDS and name in FLOAT_RANGES
    assert not set(FLOAT_RANGES) - set(FLOAT_FIELDS)  # no range for a field that does not exist
    assert len(FLOAT_FIELDS) > 40


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("name", FLOAT_FIELDS)
def test_non_finite_float_fields_are_refused_from_python(tmp_path, name, value):
    with pytest.raises(ValueError) as info:
        config(tmp_path, **{name: value})
    message = str(info.value)
    assert f"{name}={value}" in message and "finite" in message, message


@pytest.mark.parametrize(
    "name, value, shown",
    [
        ("learning_rate", -1e-3, "[0, inf)"),
        ("weight_decay", -0.1, "[0, inf)"),
        ("adam_beta1", 1.0, "[0, 1)"),
        ("adam_beta2", -0.5, "[0, 1)"),
        ("adam_epsilon", 0.0, "(0, inf)"),
        ("max_grad_norm", -1.0, "[0, inf)"),
        ("temperature", -0.5, "[0, inf)"),
        ("top_p", 2.0, "(0, 1]"),
        ("beta", -0.1, "[0, inf)"),
        ("delta", 0.0, "(0, inf)"),
        ("clip_c", 0.5, "(1, inf)"),
        ("dgpo_m", -2.0, "(0, inf)"),
    ],
)
def test_out_of_range_numbers_name_the_field_value_and_range(tmp_path, name, value, shown):
    with pytest.raises(ValueError) as info:
        config(tmp_path, **{name: value})
    assert f"{name}={value}" in str(info.value) and shown in str(info.value), str(info.value)


def test_non_finite_reward_weights_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"reward_weights\[1\]=nan is not finite"):
        config(tmp_path, reward_weights=[1.0, float("nan")])
    with pytest.raises(TypeError, match=r"reward_weights\[0\]='1' \(str\) must be a number"):
        config(tmp_path, reward_weights=["1"])
    assert config(tmp_path, reward_weights=[1.0, -0.5]).reward_weights == [1.0, -0.5]


def test_non_finite_numbers_are_refused_from_yaml_and_the_command_line(tmp_path, load_script):
    train = load_script("train")
    path = tmp_path / "run.yaml"
    path.write_text(f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\nclip_c: .nan\n")
    with pytest.raises(ValueError, match="clip_c=nan is not finite"):
        train.make_parser().parse_args_and_config(["--config", str(path)])
    path.write_text(f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\n")
    with pytest.raises(ValueError, match="weight_decay=inf is not finite"):
        train.make_parser().parse_args_and_config(["--config", str(path), "--weight_decay", "inf"])
    with pytest.raises(ValueError, match="dgpo_n=nan is not finite"):
        train.make_parser().parse_args_and_config(["--config", str(path), "--dgpo_n", "nan"])


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("gradient_accumulation_steps", 0, ["gradient_accumulation_steps=0", ">= 1"]),
        ("steps_per_generation", 0, ["steps_per_generation=0", ">= 1"]),
        ("per_device_train_batch_size", 0, ["per_device_train_batch_size=0", ">= 1"]),
        ("max_nonfinite_reward_steps", 0, ["max_nonfinite_reward_steps=0", ">= 1"]),
    ],
)
def test_zero_step_counts_name_the_field(tmp_path, name, value, words):
    with pytest.raises(ValueError) as info:
        config(tmp_path, **{name: value})
    for word in words:
        assert word in str(info.value), str(info.value)


# --------------------------------------------------------------------------- bool fields given strings

BOOL_FIELDS = fields_of_kind(bool)


def test_every_bool_field_is_checked():
    for name in ("overwrite_output_dir", "allow_pickle_checkpoints", "sandwich", "diffusion", "use_cpu", "use_vllm"):
        assert name in BOOL_FIELDS
    assert len(BOOL_FIELDS) > 50


@pytest.mark.parametrize("name", BOOL_FIELDS)
def test_bool_fields_given_a_string_are_refused(tmp_path, name):
    with pytest.raises(TypeError) as info:
        config(tmp_path, **{name: "false"})
    assert f"{name}='false' (str) must be True or False (write False, without quotes)" in str(info.value)


def test_real_bools_are_accepted(tmp_path):
    args = config(tmp_path, overwrite_output_dir=True, allow_pickle_checkpoints=False, log_completions=True)
    assert args.overwrite_output_dir is True and args.allow_pickle_checkpoints is False


# --------------------------------------------------------------------------- YAML: duplicate keys, alias bombs


def test_yaml_duplicate_keys_name_the_key_and_line(tmp_path, load_script):
    path = tmp_path / "dup.yaml"
    path.write_text(f"output_dir: {tmp_path}\nlearning_rate: 1.0e-5\nseed: 3\nlearning_rate: 2.0e-5\n")
    with pytest.raises(ValueError, match=r"duplicate key 'learning_rate' on line 4 \(first on line 2\)"):
        load_script("train").make_parser().parse_args_and_config(["--config", str(path)])
    nested = tmp_path / "nested.yaml"
    nested.write_text("model_init_kwargs:\n  dtype: float32\n  dtype: bfloat16\n")
    with pytest.raises(ValueError, match=r"duplicate key 'dtype' on line 3"):
        load_yaml_checked(str(nested))


def alias_bomb(levels: int, key: str) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines.append(f"{key}: *a{levels - 1}")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_before_anything_prints_it(tmp_path, load_script):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(30, "num_generations"))  # 10**30 leaves if expanded
    # expanded, it would not fit in memory: the check counts nodes without expanding them
    with pytest.raises(ValueError, match=r"the value of 'a\d+' \(line \d+\) expands to \d+ YAML nodes"):
        load_script("train").make_parser().parse_args_and_config(["--config", str(path)])


def test_error_messages_print_a_bounded_repr(tmp_path):
    # a shared structure that is 8**12 leaves when printed in full, given from Python (no YAML check on the way)
    value = ["x"] * 8
    for _ in range(12):
        value = [value] * 8
    for name in ("num_generations", "loss_type", "temperature", "overwrite_output_dir"):
        with pytest.raises(TypeError) as info:
            config(tmp_path, **{name: value})
        assert len(str(info.value)) < REPR_LIMIT + 150 and name in str(info.value)
    loop = []
    loop.append(loop)
    assert len(short_repr(loop)) <= REPR_LIMIT and len(short_repr("y" * 10**6)) <= REPR_LIMIT


# --------------------------------------------------------------------------- runs that would train nothing


def test_fewer_prompts_than_one_generation_batch_needs_is_refused(tmp_path):
    args = make_args(tmp_path, per_device_train_batch_size=8, num_generations=4, gradient_accumulation_steps=2)
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, args=args, dataset=make_dataset(3))
    message = str(info.value)
    for word in ["3 prompt(s)", "the 4 one generation batch needs", "generation_batch_size=16", "num_generations=4"]:
        assert word in message, message
    make_trainer(tmp_path, args=args, dataset=make_dataset(4))  # exactly one batch's worth is fine


def test_all_rewards_non_finite_warn_each_step_and_stop(tmp_path, caplog):
    def broken_scorer(prompts, completions, **kw):
        return [float("nan")] * len(completions)

    args = make_args(tmp_path, max_steps=2, max_nonfinite_reward_steps=2)
    trainer = make_trainer(tmp_path, reward=[digit_reward, broken_scorer], args=args)
    with caplog.at_level("WARNING"):
        trainer.train()  # digit_reward scores every sample: a NaN from one function alone is "unscorable"
    assert "non-finite reward" not in caplog.text

    def none_scorer(prompts, completions, **kw):
        return [None] * len(completions)

    args = make_args(tmp_path / "b", max_steps=5, max_nonfinite_reward_steps=2)
    trainer = make_trainer(tmp_path, reward=[broken_scorer, none_scorer], args=args)
    with caplog.at_level("WARNING"), pytest.raises(NonFiniteRewardError) as info:
        trainer.train()
    assert "['broken_scorer', 'none_scorer'] returned no finite reward" in str(info.value)
    assert "2 in a row" in str(info.value) and trainer.state.global_step == 1
    assert caplog.text.count("every one of the 4 samples has a non-finite reward") >= 2


@pytest.mark.parametrize("code", [0, 3])
def test_reward_function_calling_sys_exit_is_an_error_naming_it(tmp_path, code):
    import sys

    def quitter(prompts, completions, **kw):
        sys.exit(code)

    trainer = make_trainer(tmp_path, reward=quitter, args=make_args(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=rf"'quitter' called sys.exit\({code}\)"):
        trainer.train()


def test_async_reward_function_calling_sys_exit_is_an_error_naming_it(tmp_path):
    async def async_quitter(prompts, completions, **kw):
        raise SystemExit(1)

    trainer = make_trainer(tmp_path, reward=async_quitter, args=make_args(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError, match=r"'async_quitter' called sys.exit\(1\)"):
        trainer.train()


def test_sft_max_steps_zero_skips_the_warm_up_and_negative_is_refused(tmp_path, load_script):
    from transformers import AutoModelForCausalLM

    from stabledrl_trl.sft import TINY_SFT_MODEL, build_tiny_model, prepare_sft_model
    from stabledrl_trl.tiny import build_tiny_tokenizer

    path = prepare_sft_model(str(tmp_path / "cache"), task="digit_sort", seed=5, max_steps=0, num_samples=16)
    with open(os.path.join(path, "sft_settings.json")) as f:
        assert json.load(f)["metrics"] == {"skipped": True, "train_steps": 0}
    saved = AutoModelForCausalLM.from_pretrained(path).state_dict()
    fresh = build_tiny_model(build_tiny_tokenizer(), seed=5, architecture="llada", **TINY_SFT_MODEL).state_dict()
    assert saved.keys() == fresh.keys() and all(torch.equal(saved[k], fresh[k]) for k in saved)  # untrained
    with pytest.raises(ValueError, match="sft_max_steps=-1 must be an integer >= 0"):
        prepare_sft_model(str(tmp_path / "cache"), max_steps=-1)
    with pytest.raises(ValueError, match=r"^SFT warm-up \(sft_num_samples=5000\): num_samples: asked for 5000 rows "
                       r"but the split has only 1382.*null in a YAML config"):  # fmt: skip
        prepare_sft_model(str(tmp_path / "cache"), "tiny_code", num_samples=5000, max_steps=1)
    train = load_script("train")
    with pytest.raises(ValueError, match="sft_max_steps=-1 must be >= 0"):
        train.check_script_args(train.TrainScriptArguments(sft_max_steps=-1))
    with pytest.raises(TypeError, match="tiny_model='yes' \\(str\\) must be True or False"):
        train.check_script_args(train.TrainScriptArguments(tiny_model="yes"))
    train.check_script_args(train.TrainScriptArguments(sft_num_samples=None))  # null: every train row (its help)
    with pytest.raises(TypeError, match="sft_max_steps=None: this field needs an integer"):
        train.check_script_args(train.TrainScriptArguments(sft_max_steps=None))


# --------------------------------------------------------------------------- non-finite weights after a step


class PoisonWeightDecay(TrainerCallback):
    """A callback setting the optimiser's weight decay to NaN before the step after `after_step`: the gradient norm
    stays finite, the parameters become NaN (what `weight_decay=nan` did before the config refused it)."""

    def __init__(self, after_step: int):
        self.after_step = after_step

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
        if state.global_step == self.after_step:
            for group in optimizer.param_groups:
                group["weight_decay"] = float("nan")


def test_non_finite_parameters_after_an_optimiser_step_stop_the_run(tmp_path):
    args = make_args(tmp_path, max_steps=3, save_strategy="steps", save_steps=1)
    trainer = make_trainer(tmp_path, args=args, callbacks=[PoisonWeightDecay(after_step=1)])
    with pytest.raises(NonFiniteGradientError) as info:
        trainer.train()
    message = str(info.value)
    assert "Step 2: after the optimiser step, parameters hold inf/NaN" in message, message
    assert f"The newest complete checkpoint, {tmp_path / 'out' / 'checkpoint-1'}, holds finite weights" in message
    assert not (tmp_path / "out" / "checkpoint-2").exists()

    # no checkpoint at all: the message says so instead of pointing at one
    trainer = make_trainer(tmp_path / "b", callbacks=[PoisonWeightDecay(after_step=0)])
    with pytest.raises(NonFiniteGradientError, match="Step 1: .*No complete checkpoint was saved"):
        trainer.train()


def test_nan_weights_save_message_is_true_when_no_checkpoint_exists(tmp_path):
    trainer = make_trainer(tmp_path)
    with torch.no_grad():
        trainer.model.get_input_embeddings().weight[3, 0] = float("nan")
    with pytest.raises(NonFiniteGradientError) as info:
        trainer.save_model(str(tmp_path / "saved"))
    assert "No complete checkpoint was saved" in str(info.value)
    assert "last checkpoint holds the last good weights" not in str(info.value)


# --------------------------------------------------------------------------- data


@pytest.mark.parametrize(
    "prompts, words",
    [
        (["1+2=", "3+4=", None, "5+6="], ["row 2", "NoneType", "a string or a list of messages"]),
        ([1, 2, 3, 4], ["row 0", "int 1", "a string or a list of messages"]),
        ([{"role": "user", "content": f"{i}+1="} for i in range(4)], ["row 0", "dict", "list of messages"]),
        ([["1+2=", "think"]] * 4, ["row 0", "list of strings", "Join it into one string"]),
        ([[{"text": "1+2="}]] * 4, ["row 0", "message 0", "['text'] and no 'role'"]),
    ],
)
def test_malformed_prompts_are_refused_naming_the_row(tmp_path, prompts, words):
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, dataset=Dataset.from_dict({"prompt": prompts}))
    for word in ["train_dataset", *words]:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("broken.jsonl", '{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answ', ["could not be read"]),
        ("broken.json", '[{"question": "1+1",', ["could not be read"]),
        ("empty.jsonl", "", ["is empty (0 bytes)"]),
        ("nothing.json", "[]", ["could not be read", "no data"]),
    ],
)
def test_corrupt_or_empty_data_files_name_the_file(tmp_path, name, text, words):
    from stabledrl_trl.tasks import load_task_dataset

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_task_dataset("gsm8k", "train", data_files=str(path))
    for word in [str(path), *words]:
        assert word in str(info.value), str(info.value)


def test_long_prompt_error_gives_a_fix_that_exists(tmp_path):
    model = make_llada(max_sequence_length=16)
    dataset = Dataset.from_list([{"prompt": "1+2=" * 10}] * 4)
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, model=model, dataset=dataset)
    message = str(info.value)
    assert "max_prompt_length" not in message and "dataset.filter" in message and "max_completion_length" in message
    assert "max_prompt_length" not in {f.name for f in dataclasses.fields(StableDRLConfig)}


# --------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A 2-step run saving checkpoint-1 and checkpoint-2 (weights, optimiser, scheduler, trainer state)."""
    root = tmp_path_factory.mktemp("run")
    trainer = make_trainer(root, args=make_args(root, max_steps=2, save_strategy="steps", save_steps=1))
    trainer.train()
    return root / "out"


def copy_run(run, tmp_path):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(run, out)
    return out


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("name", ["trainer_state.json", "optimizer.pt", "model.safetensors", "scheduler.pt"])
def test_damaged_newest_checkpoint_names_the_file_and_resume_falls_back(trained_run, tmp_path, caplog, name):
    from stabledrl_trl.safety import resolve_resume

    out = copy_run(trained_run, tmp_path)
    damaged = out / "checkpoint-2" / name
    truncate(damaged)
    with caplog.at_level("WARNING"):
        assert resolve_resume(True, str(out)) == str(out / "checkpoint-1")
    assert f"Skipping damaged checkpoint {out / 'checkpoint-2'}: {damaged} is" in caplog.text
    with pytest.raises(ValueError, match=f"{damaged} is"):
        resolve_resume(str(out / "checkpoint-2"), str(out))


def test_resume_with_a_damaged_newest_checkpoint_continues_from_the_older_one(trained_run, tmp_path):
    out = copy_run(trained_run, tmp_path)
    truncate(out / "checkpoint-2" / "optimizer.pt")
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=2, save_strategy="no"))
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 2


def test_damage_that_only_shows_when_loading_names_the_checkpoint(trained_run, tmp_path, monkeypatch):
    out = copy_run(trained_run, tmp_path)
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=2, save_strategy="no"))

    def unreadable(*a, **k):
        raise RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory")

    monkeypatch.setattr(torch, "load", unreadable)
    with pytest.raises(CheckpointError, match=f"Cannot resume from {out / 'checkpoint-2'}: its optimiser"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_nan_weights_are_refused_on_resume(trained_run, tmp_path):
    from safetensors.torch import load_file, save_file

    out = copy_run(trained_run, tmp_path)
    weights = out / "checkpoint-2" / "model.safetensors"
    state = load_file(str(weights))
    name = sorted(state)[0]
    state[name].view(-1)[0] = float("nan")
    save_file(state, str(weights), metadata={"format": "pt"})
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=3, save_strategy="no"))
    with pytest.raises(CheckpointError, match=r"checkpoint-2: its weights hold inf/NaN \(model\."):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def test_missing_keys_on_resume_are_an_error(trained_run, tmp_path):
    from safetensors.torch import load_file, save_file

    out = copy_run(trained_run, tmp_path)
    weights = out / "checkpoint-2" / "model.safetensors"
    state = load_file(str(weights))
    dropped = sorted(state)[-1]
    del state[dropped]
    save_file(state, str(weights), metadata={"format": "pt"})
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=3, save_strategy="no"))
    with pytest.raises(CheckpointError, match=r"checkpoint-2: 1 weight\(s\) of the model are not in it"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-2"))


def sharded_model(tmp_path):
    from stabledrl_trl.tiny import build_tiny_tokenizer

    path = tmp_path / "sharded"
    make_llada().save_pretrained(path, max_shard_size="100KB")
    build_tiny_tokenizer().save_pretrained(path)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    return path, index


def test_a_shard_missing_from_the_index_is_an_error(tmp_path):
    path, index = sharded_model(tmp_path)
    make_trainer(tmp_path, model=str(path))  # the intact folder loads
    shard = sorted(set(index["weight_map"].values()))[-1]
    left_out = sorted(k for k, v in index["weight_map"].items() if v == shard)
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=rf"leaves out {len(left_out)} weight\(s\) .*randomly initialised"):
        make_trainer(tmp_path, model=str(path))
    os.remove(path / shard)  # the shard gone too: the index now names every file it has, but not every weight
    index["weight_map"][left_out[0]] = shard
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match=f"names shard\\(s\\) \\['{shard}'\\]"):
        make_trainer(tmp_path, model=str(path))


class FailingZipWriter:
    """torch.save's archive writer on a full disk: every record write fails with ENOSPC."""

    def __init__(self, *a, **k):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @property
    def file_like(self):
        return self

    def write_record(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    def write_end_of_file(self):
        pass


def enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def torch_zip_failure(*a, **k):
    # what torch.save raises when the C++ writer's write fails (the OSError is not what reaches the caller)
    raise RuntimeError(
        "[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: file write failed"
    )


@pytest.mark.parametrize("writer", ["safetensors", "torch_save", "torch_zip_runtime_error"])
def test_disk_full_inside_the_writers_gives_the_documented_message(tmp_path, monkeypatch, writer):
    import transformers.modeling_utils

    args = make_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    trainer = make_trainer(tmp_path, args=args)
    if writer == "safetensors":
        monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", enospc)
    elif writer == "torch_save":
        monkeypatch.setattr(torch.serialization, "_open_zipfile_writer", FailingZipWriter)
    else:
        monkeypatch.setattr(torch.serialization, "_open_zipfile_writer", torch_zip_failure)
    with pytest.raises(OSError, match="Disk full while saving checkpoint-1") as info:
        trainer.train()
    assert info.value.errno == errno.ENOSPC and "resume skips it" in str(info.value)
    from stabledrl_trl.safety import resolve_resume

    with pytest.raises(ValueError, match="holds no complete checkpoint"):
        resolve_resume(True, str(tmp_path / "out"))  # the half-written checkpoint is never resumed from


def test_disk_full_in_the_final_save_gives_the_documented_message(tmp_path, monkeypatch):
    import transformers.modeling_utils

    trainer = make_trainer(tmp_path)
    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", enospc)
    with pytest.raises(OSError, match="Disk full while saving the model to .*No complete checkpoint was saved"):
        trainer.save_model(str(tmp_path / "final"))


def test_disk_full_recognised_in_writer_errors():
    from stabledrl_trl.safety import is_disk_full

    assert is_disk_full(OSError(errno.ENOSPC, "x")) and is_disk_full(OSError(errno.EDQUOT, "x"))
    assert is_disk_full(RuntimeError("Error while serializing: IoError(No space left on device (os error 28))"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("CUDA out of memory"))


def test_fake_checkpoints_of_the_suite_are_readable(tmp_path):
    from stabledrl_trl.safety import checkpoint_damage

    fake_checkpoint(tmp_path / "checkpoint-1")
    assert checkpoint_damage(str(tmp_path / "checkpoint-1")) is None


# --------------------------------------------------------------------------- model paths and vocabularies


def test_model_path_that_is_a_file_is_refused(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="is a file; give the folder that holds config.json"):
        make_trainer(tmp_path, model=str(file))


def test_config_without_model_type_is_refused(tmp_path):
    path = tmp_path / "model"
    make_llada().save_pretrained(path)
    config_file = path / "config.json"
    data = json.loads(config_file.read_text())
    del data["model_type"]
    config_file.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"config.json has no model_type"):
        make_trainer(tmp_path, model=str(path))


def test_vocabulary_smaller_than_the_tokenizers_is_refused(tmp_path):
    from stabledrl_trl.tiny import build_tiny_tokenizer

    n = len(build_tiny_tokenizer())
    with pytest.raises(ValueError, match=rf"tokenizer has {n} tokens but the model's embedding matrix only 50 rows"):
        make_trainer(tmp_path, model=make_llada(vocab_size=50, embedding_size=50))


def test_pad_id_outside_the_vocabulary_is_refused(tmp_path):
    from stabledrl_trl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_special_tokens({"pad_token": "<pad-added>"})  # a new pad token the model has no row for
    with pytest.raises(ValueError, match=r"pad_token_id=101 \(tokenizer\) is outside the model's vocabulary"):
        StableDRLTrainer(
            model=make_llada(), reward_funcs=digit_reward, args=make_args(tmp_path), train_dataset=make_dataset(),
            processing_class=tokenizer,
        )  # fmt: skip


def test_diffusion_true_on_an_autoregressive_model_names_the_field(tmp_path, tiny_llama):
    with pytest.raises(ValueError, match=r"diffusion=True, but LlamaForCausalLM \(model_type='llama'\)"):
        make_trainer(tmp_path, model=tiny_llama, args=make_args(tmp_path, diffusion=True))


def test_huge_mc_samples_is_refused_with_the_memory_it_needs(tmp_path):
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, args=make_args(tmp_path, mc_samples=10**9))
    message = str(info.value)
    rows = 4 * 10**9
    need = rows * 8 * 101 * 8 + rows * 8 * 12  # logits + log-probs, float32, and the (rows, C) outputs
    assert f"mc_samples={10**9}" in message and f"{rows} rows" in message, message
    assert f"at least {need / 2**30:.1f} GiB" in message and "lower mc_samples" in message
    make_trainer(tmp_path, args=make_args(tmp_path, mc_samples=64))  # large but fits


def test_estimator_memory_estimate_counts_chunks():
    from types import SimpleNamespace

    from stabledrl_trl.validation import check_estimator_memory

    family = SimpleNamespace(estimator_passes=lambda args: args.mc_samples)
    args = SimpleNamespace(
        per_device_train_batch_size=2, mc_samples=10**4, estimator_chunk_size=None, max_completion_length=256,
        likelihood_estimator="block_random",
    )  # fmt: skip
    with pytest.raises(ValueError, match="estimator_chunk_size"):
        check_estimator_memory(args, family, 32000, torch.device("cpu"))
    args.estimator_chunk_size = 4  # 4 rows per pass: only the (rows, C) outputs grow with mc_samples
    check_estimator_memory(args, family, 32000, torch.device("cpu"))


def test_overlong_string_fields_and_huge_reward_outputs_print_bounded(tmp_path):
    with pytest.raises(ValueError) as info:
        config(tmp_path, loss_type="x" * 10**6)
    assert "loss_type=" in str(info.value) and "1000000 characters long" in str(info.value)
    assert len(str(info.value)) < REPR_LIMIT + 150
    from stabledrl_trl.stabledrl_trainer import _check_reward_output

    with pytest.raises(RewardFunctionError) as info:
        _check_reward_output("scorer", "y" * 10**6, 4)
    assert len(str(info.value)) < REPR_LIMIT + 200


def test_misspelt_dtype_in_model_init_kwargs_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"model_init_kwargs\['dtype'\]='bfloat61' is not a torch dtype"):
        config(tmp_path, model_init_kwargs={"dtype": "bfloat61"})
    assert config(tmp_path, model_init_kwargs={"dtype": "bfloat16"}).model_init_kwargs["dtype"] == "bfloat16"
