"""Reliability: bad inputs and faults end in a clear error at the earliest point, never in a silent wrong result.

Each test here is one row of the reliability table (docs/reliability.md).
"""

from __future__ import annotations

import os

import pytest
import torch
from datasets import Dataset
from tiny_run import digit_reward, make_dataset, make_llada, params_copy, tiny_args  # noqa: F401  (imported from here too)

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.stabledrl_trainer import NonFiniteGradientError, RewardFunctionError
from stabledrl_trl.tiny import build_tiny_tokenizer


def make_args(tmp_path, **kw):
    base = dict(
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        gradient_checkpointing=False,
        seed=7,
        temperature=1.0,
    )
    return tiny_args(tmp_path, **{**base, **kw})


def make_trainer(tmp_path, model=None, reward=digit_reward, dataset=None, args=None, **kw):
    return StableDRLTrainer(
        model=make_llada() if model is None else model,
        reward_funcs=reward,
        args=make_args(tmp_path) if args is None else args,
        train_dataset=make_dataset() if dataset is None else dataset,
        processing_class=build_tiny_tokenizer(),
        **kw,
    )


# --------------------------------------------------------------------------- non-finite steps


@pytest.mark.parametrize("huge", [1e30, 1e37, float("inf")])
def test_huge_reward_is_dropped_counted_and_training_stays_finite(tmp_path, huge):
    def reward(prompts, completions, **kw):
        r = digit_reward(prompts, completions)
        r[0] = huge  # one sample of the first group per batch
        return r

    trainer = make_trainer(tmp_path, reward=reward)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["stabledrl/nonfinite_rewards"] for h in logs] == [1.0, 1.0]
    assert all(h["stabledrl/nonfinite_grad_steps"] == 0.0 for h in logs)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert all(torch.isfinite(torch.tensor(h["grad_norm"])) for h in logs)


def test_nonfinite_gradient_skips_the_step_then_training_continues(tmp_path):
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, max_steps=2))
    poisoned = {"calls": 0}
    param = trainer.model.get_input_embeddings().weight

    def poison_first_step(grad):
        poisoned["calls"] += 1
        return grad * float("inf") if trainer.state.global_step == 0 else grad

    param.register_hook(poison_first_step)
    before = params_copy(trainer.model)
    states_after_first = {}

    from transformers import TrainerCallback

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                states_after_first["params"] = params_copy(trainer.model)
                states_after_first["opt"] = len(trainer.optimizer.state)

    trainer.add_callback(Snapshot())
    trainer.train()
    assert poisoned["calls"] >= 2
    # step 1: skipped: every parameter exactly as before, and the optimiser holds no moments yet
    for name, value in states_after_first["params"].items():
        assert torch.equal(value, before[name]), name
    assert states_after_first["opt"] == 0
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["stabledrl/nonfinite_grad_steps"] for h in logs] == [1.0, 0.0]
    # step 2 is a normal step
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_repeated_nonfinite_gradients_stop_with_an_error_and_no_nan_checkpoint(tmp_path):
    args = make_args(tmp_path, max_steps=6, max_nonfinite_grad_steps=2, save_strategy="steps", save_steps=1)
    trainer = make_trainer(tmp_path, args=args)
    trainer.model.get_input_embeddings().weight.register_hook(lambda g: g * float("nan"))
    before = params_copy(trainer.model)
    with pytest.raises(NonFiniteGradientError, match="2 optimiser steps in a row"):
        trainer.train()
    for name, p in trainer.model.named_parameters():
        assert torch.equal(p.detach(), before[name]), name
    from safetensors.torch import load_file

    checkpoints = sorted(p for p in os.listdir(tmp_path / "out") if p.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-1"]  # saved after the first (skipped) step, before the second stopped the run
    saved = load_file(tmp_path / "out" / "checkpoint-1" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())


def test_weights_holding_nan_are_never_saved(tmp_path):
    trainer = make_trainer(tmp_path)
    with torch.no_grad():
        trainer.model.get_input_embeddings().weight[3, 0] = float("nan")
    target = tmp_path / "saved"
    with pytest.raises(NonFiniteGradientError, match="inf/NaN"):
        trainer.save_model(str(target))
    assert not target.exists()


# --------------------------------------------------------------------------- mask id and sampling options


def test_explicit_mask_token_id_disagreeing_with_model_and_tokenizer_is_refused(tmp_path):
    # model config and tokenizer both say 1
    with pytest.raises(ValueError, match=r"mask_token_id=7 \(a StableDRLConfig field\) disagrees"):
        make_trainer(tmp_path, args=make_args(tmp_path, mask_token_id=7))
    agreeing = make_trainer(tmp_path, args=make_args(tmp_path, mask_token_id=1))
    assert agreeing._mask_token_id == 1


def test_mask_token_id_outside_the_vocabulary_is_refused(tmp_path):
    tok = build_tiny_tokenizer()
    tok.mask_token = None  # neither the model config nor the tokenizer names a mask token: the explicit id is used
    trainer_kwargs = dict(reward_funcs=digit_reward, train_dataset=make_dataset(), processing_class=tok)
    with pytest.raises(ValueError, match="mask_token_id=500 is outside the model's vocabulary"):
        StableDRLTrainer(
            model=make_llada(mask_token_id=None), args=make_args(tmp_path, mask_token_id=500), **trainer_kwargs
        )


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(min_p=0.1), "min_p"),
        (dict(repetition_penalty=1.2), "repetition_penalty"),
        (dict(generation_kwargs={"no_repeat_ngram_size": 2}), "generation_kwargs"),
    ],
)
def test_autoregressive_only_sampling_options_are_refused_for_diffusion(tmp_path, kwargs, field, tiny_llama):
    with pytest.raises(ValueError, match=f"{field}=.*masked-diffusion samplers have no equivalent"):
        make_trainer(tmp_path, args=make_args(tmp_path, **kwargs))
    # an autoregressive model uses them: accepted
    trainer = make_trainer(tmp_path, model=tiny_llama, args=make_args(tmp_path, **kwargs))
    assert not trainer.is_diffusion


def test_top_k_top_p_reach_llada_sampler_not_ignored(tmp_path):
    # TRL's top_k / top_p restrict LLaDA's candidate draw (Dream's and SDAR's samplers read the same fields): with
    # top_k=1 a draw at temperature 0.9 is the argmax, so the rollout equals the greedy one; without it, it does not.
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, top_k=1, temperature=0.9))
    adapter = trainer._adapter(trainer.model)
    prompt = torch.tensor([[5, 6, 7, 8]] * 4)
    mask = torch.ones_like(prompt)

    def rollout(args):
        return trainer._diffusion_family.generate(
            adapter,
            prompt,
            mask,
            args,
            eos_token_ids=adapter.eos_token_ids,
            generator=torch.Generator().manual_seed(0),
        ).completion_ids

    greedy = rollout(make_args(tmp_path, temperature=0.0, num_generations=2, per_device_train_batch_size=2))
    assert torch.equal(rollout(trainer.args), greedy)
    assert not torch.equal(rollout(make_args(tmp_path, temperature=0.9)), greedy)


# --------------------------------------------------------------------------- datasets


@pytest.mark.parametrize(
    "rows, words",
    [
        ([], ["train_dataset has no rows"]),
        ([{"question": "1+1="}], ["no 'prompt' column", "question"]),
        ([{"prompt": "1+1="}, {"prompt": "  "}], ["row 1", "empty prompt"]),
        ([{"prompt": "1+1="}, {"prompt": "2+<|mdm_mask|>="}], ["row 1", "mask token", "<|mdm_mask|>"]),
        ([{"prompt": "x" * 600}], ["row 0", "max_position_embeddings=512"]),
    ],
)
def test_dataset_problems_fail_when_the_trainer_is_built(tmp_path, rows, words):
    dataset = Dataset.from_list(rows) if rows else Dataset.from_dict({"prompt": []})
    with pytest.raises(ValueError) as info:
        make_trainer(tmp_path, dataset=dataset)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


# --------------------------------------------------------------------------- reward outputs


@pytest.mark.parametrize(
    "output, words",
    [
        ("0.5", ["returned str", "list of"]),
        (0.5, ["returned float"]),
        ("nested", ["returned list", "completion 0"]),
    ],
)
def test_reward_function_returning_the_wrong_type_names_the_function(tmp_path, output, words):
    def bad_scorer(prompts, completions, **kw):
        return [[0.5]] * len(completions) if output == "nested" else output

    trainer = make_trainer(tmp_path, reward=bad_scorer, args=make_args(tmp_path, max_steps=1))
    with pytest.raises(RewardFunctionError) as info:
        trainer.train()
    for word in ["bad_scorer", *words]:
        assert word in str(info.value), (word, str(info.value))


# --------------------------------------------------------------------------- evaluation groups


def test_eval_groups_by_num_generations_eval(tmp_path):
    args = make_args(tmp_path, num_generations_eval=2, per_device_eval_batch_size=4, max_steps=1)
    trainer = make_trainer(tmp_path, args=args, eval_dataset=make_dataset(4))
    metrics = trainer.evaluate()
    # ESS of a group of 2 is at most 2 (it was computed over groups of 4: up to 4)
    assert 1.0 <= metrics["eval_stabledrl/ess"] <= 2.0 + 1e-6


def test_eval_layout_that_splits_groups_fails_when_the_trainer_is_built(tmp_path):
    args = make_args(tmp_path, num_generations_eval=4, per_device_eval_batch_size=6)
    with pytest.raises(ValueError, match="per_device_eval_batch_size=6 is not a multiple of the eval group size 4"):
        make_trainer(tmp_path, args=args, eval_dataset=make_dataset(4))


# --------------------------------------------------------------------------- output folder and resume


def fake_checkpoint(path, complete=True, optimizer=True, scheduler=True):
    """A checkpoint folder whose files are small but readable (resume checks headers and archives)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(path / "model.safetensors"))
    if optimizer:
        torch.save({}, path / "optimizer.pt")
    if scheduler:
        torch.save({}, path / "scheduler.pt")
    if complete:
        (path / "trainer_state.json").write_text("{}")


def test_fresh_run_in_a_folder_with_another_runs_checkpoints_is_refused(tmp_path):
    fake_checkpoint(tmp_path / "out" / "checkpoint-5")
    trainer = make_trainer(tmp_path)
    with pytest.raises(ValueError, match="already holds checkpoints of another run.*resume_from_checkpoint=True"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_overwrite_output_dir_deletes_the_old_checkpoints(tmp_path):
    fake_checkpoint(tmp_path / "out" / "checkpoint-5")
    trainer = make_trainer(tmp_path, args=make_args(tmp_path, overwrite_output_dir=True, max_steps=1))
    trainer.train()
    assert not (tmp_path / "out" / "checkpoint-5").exists()


def test_resume_picks_the_newest_complete_checkpoint(tmp_path, caplog):
    from stabledrl_trl.safety import resolve_resume

    out = tmp_path / "out"
    fake_checkpoint(out / "checkpoint-2")
    fake_checkpoint(out / "checkpoint-10")
    fake_checkpoint(out / "checkpoint-12", complete=False)  # killed while saving
    with caplog.at_level("WARNING"):
        assert resolve_resume(True, str(out)) == str(out / "checkpoint-10")
        assert resolve_resume("true", str(out)) == str(
            out / "checkpoint-10"
        )  # command line: --resume_from_checkpoint true
    assert "Skipping incomplete checkpoint" in caplog.text and "checkpoint-12" in caplog.text


@pytest.mark.parametrize("missing", ["optimizer", "scheduler"])
def test_resume_from_a_checkpoint_without_optimizer_or_scheduler_is_an_error(tmp_path, missing):
    from stabledrl_trl.safety import resolve_resume

    path = tmp_path / "checkpoint-3"
    fake_checkpoint(path, **{missing: False})
    with pytest.raises(ValueError, match=f"lacks {missing}.pt"):
        resolve_resume(str(path), str(tmp_path))


def test_disk_full_while_saving_says_so(tmp_path, monkeypatch):
    import errno

    args = make_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
    trainer = make_trainer(tmp_path, args=args)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", full)
    with pytest.raises(OSError, match="Disk full while saving checkpoint-1"):
        trainer.train()


# --------------------------------------------------------------------------- weights and paths


def test_pickle_only_model_folder_is_refused_unless_allowed(tmp_path):
    path = tmp_path / "pickled"
    model = make_llada()
    model.config.save_pretrained(path)
    torch.save(model.state_dict(), path / "pytorch_model.bin")  # an old-style pickle checkpoint
    with pytest.raises(ValueError, match="only pickle weights.*allow_pickle_checkpoints=True"):
        make_trainer(tmp_path, model=str(path))
    trainer = make_trainer(tmp_path, model=str(path), args=make_args(tmp_path, allow_pickle_checkpoints=True))
    assert trainer.is_diffusion


@pytest.mark.parametrize("name", ["./no/such/model", "{tmp}/missing-model", "{tmp}/sub/missing"])
def test_missing_local_model_path_fails_at_once(tmp_path, name):
    name = name.format(tmp=tmp_path)
    with pytest.raises(FileNotFoundError, match="looks like a local path but does not exist"):
        make_trainer(tmp_path, model=name)


def test_missing_path_under_an_existing_relative_folder_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="checkpoints/sft") as error:
        make_trainer(tmp_path, model="checkpoints/sft")
    # names the argument, the folder the relative path resolves to, and what to give instead
    message = str(error.value)
    assert message.startswith("model='checkpoints/sft' ")
    assert str(tmp_path / "checkpoints" / "sft") in message and "save_pretrained" in message


# --------------------------------------------------------------------------- DDP


def test_ddp_does_not_search_for_unused_parameters_of_a_diffusion_model(tmp_path):
    trainer = make_trainer(tmp_path)
    assert trainer.accelerator.ddp_handler.find_unused_parameters is False
    explicit = make_trainer(tmp_path, args=make_args(tmp_path, ddp_find_unused_parameters=True))
    assert explicit.accelerator.ddp_handler.find_unused_parameters is True
    # every parameter receives a gradient in a step (what makes find_unused_parameters=False safe)
    from transformers import TrainerCallback

    seen = {}

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kw):
            seen["missing"] = [n for n, p in trainer.model.named_parameters() if p.requires_grad and p.grad is None]

    trainer.add_callback(Grads())
    trainer.train()
    assert seen["missing"] == []


# --------------------------------------------------------------------------- model card


def make_dream():
    from stabledrl_trl.models.dream import DreamConfig, DreamModel

    config = DreamConfig(
        vocab_size=101, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, mask_token_id=1, eos_token_id=0, pad_token_id=0, bos_token_id=0, rope_theta=1e6,
    )  # fmt: skip
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return DreamModel(config)


def make_sdar():
    from stabledrl_trl.models.sdar import SDARConfig, SDARForCausalLM
    from stabledrl_trl.tiny import tiny_sdar_config_dict

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return SDARForCausalLM(SDARConfig(**tiny_sdar_config_dict()))


def make_llada2():
    from stabledrl_trl.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
    from stabledrl_trl.tiny import tiny_llada2_config_dict

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return LLaDA2MoeModelLM(LLaDA2MoeConfig(**tiny_llada2_config_dict()))


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_model_card_names_stabledrl_cites_the_paper_and_its_quick_start_runs(tmp_path, family):
    import re
    import subprocess
    import sys

    model = {"llada": make_llada, "dream": make_dream, "sdar": make_sdar, "llada2": make_llada2}[family]()
    layout = {} if family == "llada" else dict(block_length=None, diffusion_steps=None)  # LLaDA's layout: its own
    args = make_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1, **layout)
    trainer = make_trainer(tmp_path, model=model, args=args)
    assert trainer._family_name == family
    trainer.train()  # each checkpoint writes the model card, README.md, into output_dir (as TRL does)
    trainer.save_model(args.output_dir)
    build_tiny_tokenizer().save_pretrained(args.output_dir)
    card = (tmp_path / "out" / "README.md").read_text()
    assert "StableDRL" in card and "2603.06743" in card and "loss_type='stable_drl'" in card
    assert "DeepSeekMath" not in card and "trained with GRPO" not in card
    assert "import stabledrl_trl" in card
    # The quick start, as printed, runs in a fresh process and decodes with the package's sampler.
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(PYTHONPATH=root, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the card decodes with the family's own rules (LLaDA2: whole blocks, the mask token among the candidates)
    assert ("whole_blocks=True" in code and "mask_candidate=True" in code) == (family == "llada2")


def test_model_card_of_a_trl_baseline_says_so(tmp_path):
    from stabledrl_trl.model_card import describe_objective

    short, detail = describe_objective(make_args(tmp_path, loss_type="grpo", beta=0.04))
    assert "TRL's `grpo`" in short and "beta=0.04" in detail
    short, _ = describe_objective(make_args(tmp_path, loss_type="dgpo"))
    assert "DGPO" in short
    for samples, words in ((1, "(1 Monte-Carlo mask sample)"), (2, "(2 Monte-Carlo mask samples)")):
        assert words in describe_objective(make_args(tmp_path, mc_samples=samples))[1]


def test_mask_id_mismatch_between_model_and_tokenizer_names_the_config_field(tmp_path):
    with pytest.raises(ValueError, match="StableDRLConfig field mask_token_id"):
        make_trainer(tmp_path, model=make_llada(mask_token_id=5))  # tokenizer says 1


def test_reward_outputs_trl_accepts_are_accepted():
    import numpy as np

    from stabledrl_trl.stabledrl_trainer import _check_reward_output

    accepted = (
        [1.0, None, 2],
        (0.5, 0.5),
        np.array([1.0, 2.0], dtype=np.float32),
        [np.float32(1.0), 1],
        [True, False],
    )
    for output in accepted:
        assert _check_reward_output("f", output, 2) is output
    for output in (np.zeros((2, 1)), {"a": 1.0}, ["1.0", 2.0]):
        with pytest.raises(RewardFunctionError, match="'f'"):
            _check_reward_output("f", output, 2)


@pytest.mark.parametrize(
    "name, params",
    [
        ("_get_grad_norm", ["self", "model", "grad_norm"]),
        ("_build_accelerator_args", ["self"]),
        ("_save_checkpoint", ["self", "model", "trial"]),
        ("save_model", ["self", "output_dir", "_internal_call"]),
        ("create_model_card", ["self", "model_name", "dataset_name", "tags"]),
        ("train", ["self", "resume_from_checkpoint", "trial"]),
    ],
)
def test_transformers_and_trl_hooks_the_safety_checks_override_still_exist(name, params):
    import inspect

    from trl import GRPOTrainer

    assert hasattr(GRPOTrainer, name), name
    found = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
    assert found[: len(params)] == params, (name, found)


def test_diffusion_model_without_completion_length_is_refused(tmp_path, tiny_llama):
    with pytest.raises(ValueError, match="max_completion_length=None: a diffusion LM"):
        make_trainer(tmp_path, args=make_args(tmp_path, max_completion_length=None))
    trainer = make_trainer(tmp_path, model=tiny_llama, args=make_args(tmp_path, max_completion_length=None))
    assert not trainer.is_diffusion  # TRL's "no limit" for an autoregressive model


def test_reward_function_without_kwargs_is_told_to_take_them():
    """A reward function written def f(completions): TRL's keywords are the problem, not a sample."""
    from stabledrl_trl.stabledrl_trainer import _wrap_reward_func

    def reward_len(completions):
        return [float(len(c)) for c in completions]

    wrapped = _wrap_reward_func(reward_len)
    with pytest.raises(RewardFunctionError, match=r"'reward_len' raised TypeError: .*'prompts'") as error:
        wrapped(prompts=["p"], completions=["ab"], completion_ids=[[5, 6]], trainer_state=None, answer=["1"])
    message = str(error.value)
    assert "keywords prompts, completions, completion_ids, trainer_state, answer" in message
    assert "add **kwargs" in message and "on sample" not in message

    def calls_badly(completions, **kwargs):  # a TypeError inside the function keeps naming the sample
        return [float(len(c, key=1)) for c in completions]

    with pytest.raises(RewardFunctionError, match="on sample 0") as error:
        _wrap_reward_func(calls_badly)(prompts=["p"], completions=["ab"])
    assert "add **kwargs" not in str(error.value)


def test_async_reward_function_stays_async_and_its_errors_name_the_sample():
    import asyncio

    from trl.trainer.utils import is_async_callable

    from stabledrl_trl.stabledrl_trainer import _wrap_reward_func

    async def judge(prompts, completions, **kw):
        await asyncio.sleep(0)
        if any("bad" in c for c in completions):
            raise KeyError("no score")
        return [float(len(c)) for c in completions]

    async def says_text(prompts, completions, **kw):
        return "fine"

    wrapped = _wrap_reward_func(judge)
    assert is_async_callable(wrapped) and wrapped.__name__ == "judge"  # TRL awaits it and logs it under its name
    assert asyncio.run(wrapped(prompts=["p", "q"], completions=["ab", "c"])) == [2.0, 1.0]
    with pytest.raises(RewardFunctionError, match=r"'judge' raised KeyError.*on sample 1: prompt='q'"):
        asyncio.run(wrapped(prompts=["p", "q"], completions=["ok", "bad"]))
    with pytest.raises(RewardFunctionError, match="'says_text' returned str"):
        asyncio.run(_wrap_reward_func(says_text)(prompts=["p"], completions=["x"]))
