"""Evaluation during training writes a protocol card per evaluation (stabledrl_trl/eval_cards.py): a 2-step run with
eval_steps=1 on the tiny model writes cards at steps 1 and 2 whose score equals the logged eval_reward, with the
run's sampler settings; the score and its interval by hand for each kind of reward."""

from __future__ import annotations

import json
import math

import pytest
import torch
from datasets import Dataset

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.eval_cards import CARDS_FOLDER, score_records
from stabledrl_trl.protocol_card import ratio_interval, read_cards, score_block, wilson_interval
from stabledrl_trl.results import mean_interval
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict


def _text(completion):
    return completion if isinstance(completion, str) else completion[-1]["content"]


def has_digit(prompts, completions, **kwargs):
    """1 / 0: the completion holds a digit."""
    return [float(any(ch.isdigit() for ch in _text(c))) for c in completions]


def digit_share(prompts, completions, **kwargs):
    t = [_text(c) for c in completions]
    return [sum(ch.isdigit() for ch in x) / max(len(x), 1) for x in t]


def _llada():
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))


def _dataset(n):
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i + 1}="}]} for i in range(n)])


def _run(tmp_path, reward, **kw):
    torch.set_num_threads(1)
    args = StableDRLConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, block_length=4, diffusion_steps=4, max_steps=2,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=7, temperature=1.0, eval_strategy="steps",
        eval_steps=1, per_device_eval_batch_size=4, **kw,
    )  # fmt: skip
    trainer = StableDRLTrainer(model=_llada(), reward_funcs=reward, args=args, train_dataset=_dataset(8),
                               eval_dataset=_dataset(4), processing_class=build_tiny_tokenizer())  # fmt: skip
    trainer.train()
    logged = {e["step"]: e for e in trainer.state.log_history if "eval_reward" in e}
    return trainer, logged, tmp_path / "out" / CARDS_FOLDER


def test_two_steps_with_eval_steps_1_write_a_card_per_evaluation(tmp_path):
    trainer, logged, folder = _run(tmp_path, has_digit, num_generations_eval=2)
    assert sorted(logged) == [1, 2]
    paths = sorted(folder.glob("*.json"))
    assert [p.name for p in paths] == ["eval-step0000001.json", "eval-step0000002.json"]
    cards = read_cards([str(p) for p in paths])
    for card in cards:
        score = card["score"]
        assert card["protocol_name"] == "training_eval" and card["step"] in (1, 2)
        # 4 prompts x 2 completions, two eval batches of 4: the accuracy is the logged mean reward
        assert card["completions"] == 8 and score["n"] == 8 and score["problems"] == 4
        assert score["metric"] == "accuracy_by_prompt"
        assert score["value"] == pytest.approx(logged[card["step"]]["eval_reward"], abs=1e-6)
        assert card["logged_metrics"]["eval_reward"] == logged[card["step"]]["eval_reward"]
        assert score["k"] == round(score["value"] * 8)
        sampler = card["protocol"]["sampler"]
        assert (sampler["max_completion_length"], sampler["diffusion_steps"], sampler["block_length"]) == (8, 4, 4)
        assert sampler["temperature"] == 1.0 and card["protocol"]["seeds"] == [7]
        assert card["runtime"]["num_processes"] == 1 and card["deviations"] == []
        assert card["reward_functions"] == {"has_digit": 1.0} and card["unscored"] == 0
    assert (tmp_path / "out" / "eval_cards").is_dir() and not list((tmp_path / "out" / "eval_cards").glob("*.json"))


def test_a_reward_that_is_not_1_or_0_gives_the_mean_reward(tmp_path):
    trainer, logged, folder = _run(tmp_path, digit_share, num_generations_eval=1)
    card = json.loads((folder / "eval-step0000002.json").read_text())
    score = card["score"]
    assert score["metric"] == "mean_reward" and score["n"] == 4 and card["completions"] == 4
    assert score["value"] == pytest.approx(logged[2]["eval_reward"], abs=1e-6)
    assert score["interval"][0] <= score["value"] <= score["interval"][1]


def test_scores_and_intervals_by_hand():
    nan = float("nan")
    # one completion per prompt, 1 / 0: accuracy with Wilson's interval; NaN (no function scored it) left out
    metric, records, unscored = score_records(torch.tensor([1.0, 0.0, 1.0, nan, 1.0]), 1)
    assert (metric, unscored, [r["correct"] for r in records]) == ("accuracy", 1, [True, False, True, True])
    assert score_block(metric, {0: records})["interval"] == pytest.approx(list(wilson_interval(3, 4)))
    # groups of 2: the prompt is the unit (right 2, 1, 1, 0 of 2; the ratio estimator's interval)
    metric, records, _ = score_records(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]), 2)
    assert metric == "accuracy_by_prompt" and [r["right"] for r in records] == [2, 1, 1, 0]
    assert all(r["samples"] == 2 for r in records)
    block = score_block(metric, {0: records})
    assert block["value"] == 0.5 and block["interval"] == pytest.approx(list(ratio_interval([2, 1, 1, 0], [2] * 4)))
    # R = 0.5, residuals a - R b = (1, 0, 0, -1): se = sqrt(2 / (4 * 3)) / 2
    z = 1.959963984540054
    assert block["interval"] == pytest.approx([0.5 - z * math.sqrt(1 / 6) / 2, 0.5 + z * math.sqrt(1 / 6) / 2])
    # any other reward: the mean of the prompts' means, Student t over prompts
    metric, records, _ = score_records(torch.tensor([0.5, 1.0, -1.0, 0.0]), 2)
    assert metric == "mean_reward" and records == [{"reward": 0.75}, {"reward": -0.5}]
    block = score_block(metric, {0: records})
    assert block["value"] == pytest.approx(0.125) and block["interval"] == pytest.approx(
        list(mean_interval([0.75, -0.5]))
    )
