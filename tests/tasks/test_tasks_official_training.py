"""The official task style inside a real StableDRLTrainer step: official prompts reach the model, the official
grading and the anti-short-boxed term are both called on every completion, and TRL adds them (weights 1)."""

import json

import pytest
import torch

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.tasks import get_task, load_task_dataset
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict


def _recording(func, log):
    def wrapped(prompts, completions, **kwargs):
        rewards = func(prompts, completions, **kwargs)
        log.append((prompts, completions, rewards))
        return rewards

    wrapped.__name__ = func.__name__  # TRL logs each reward under its function's name
    return wrapped


def test_official_countdown_rewards_are_added_in_a_training_step(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    rows = tmp_path / "countdown.jsonl"
    rows.write_text(
        "".join(json.dumps({"input": f"{i},{i + 1},{i + 2}", "output": str(3 * i + 3)}) + "\n" for i in range(4))
    )
    dataset = load_task_dataset("countdown", "train", data_files=str(rows), prompt_style="official")
    base, anti = get_task("countdown").reward_funcs_for("official")
    base_log, anti_log = [], []
    config = AutoConfig.for_model(**tiny_llada_config_dict())
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
    args = StableDRLConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, block_length=4, diffusion_steps=4, max_steps=1, logging_steps=1,
        save_strategy="no", seed=7,
    )  # fmt: skip
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=[_recording(base, base_log), _recording(anti, anti_log)],
        args=args,
        train_dataset=dataset,
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train()
    (prompts, completions, base_rewards), (_, anti_completions, anti_rewards) = base_log[0], anti_log[0]
    assert anti_completions == completions and len(completions) == 4
    assert (
        prompts[0][0]["content"].startswith("Given numbers [")
        and "e.g. <answer> 1 + 1 </answer>." in prompts[0][0]["content"]
    )
    # A random tiny model writes no <answer> tags and no box: official score 0, anti-short-boxed 1 unless empty.
    assert base_rewards == [0.0] * 4
    assert anti_rewards == [0.0 if not c[0]["content"].strip() else 1.0 for c in completions]
    logged = trainer.state.log_history[0]
    assert logged["rewards/countdown_official_reward/mean"] == pytest.approx(0.0)
    assert logged["rewards/anti_short_boxed_reward/mean"] == pytest.approx(sum(anti_rewards) / 4)
    assert logged["reward"] == pytest.approx(sum(b + a for b, a in zip(base_rewards, anti_rewards)) / 4)
