"""The per-step diagnostics of the stability mechanism and of estimator noise, against hand computation.

`stabledrl/weight_mean_neg_adv` / `weight_mean_pos_adv`: the mean multiplier each objective puts on the gradient term
A_i grad log pi_i of negative- / positive-advantage samples (1 for every sample on-policy);
`stabledrl/equal_reward_group_frac`: the share of groups whose rewards are all equal;
`stabledrl/estimator_noise_std`: sqrt(2) x the standard error of the current estimate (fresh masks).
"""

import math

import pytest
import torch
from datasets import Dataset
from tiny_run import make_llada, tiny_args

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.diffusion.estimators import estimator_standard_error
from stabledrl_trl.objectives import (
    dgpo_loss,
    equal_reward_groups,
    stable_drl_loss,
    stable_drl_ratio_loss,
    trl_applied_weights,
    weight_by_advantage_sign,
)
from stabledrl_trl.tiny import build_tiny_tokenizer

# Planted sequence ratios r = [1.5, 3, 0.9, 0.5] for advantages [1, -1, 0.5, -0.5] (one group of 4).
RATIOS = torch.tensor([1.5, 3.0, 0.9, 0.5])
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])


# ----------------------------------------------------------------------------------------------------------------------
# Pure functions


def test_ppo_clip_weight_is_the_ratio_where_the_unclipped_term_is_taken_else_zero():
    w = trl_applied_weights("grpo", RATIOS.log()[:, None], ADV, epsilon_low=0.2, epsilon_high=0.2)
    # A > 0, r = 1.5 > 1.2: min(1.5 A, 1.2 A) takes the clipped constant -> 0
    # A < 0, r = 3: min(-3, -1.2) = -3, the unclipped term -> 3 (GRPO's unbounded negative-advantage weight)
    # A > 0, r = 0.9 inside [0.8, 1.2] -> 0.9;  A < 0, r = 0.5: min(-0.25, -0.4) takes the clipped one -> 0
    assert torch.allclose(w[:, 0], torch.tensor([0.0, 3.0, 0.9, 0.0]))
    # TRL's two-sided clip delta = 2: the ratio 3 is clamped to the constant 2 -> 0
    w = trl_applied_weights("dapo", RATIOS.log()[:, None], ADV, epsilon_low=0.2, epsilon_high=0.2, delta=2.0)
    assert torch.allclose(w[:, 0], torch.tensor([0.0, 0.0, 0.9, 0.0]))
    # token level: one weight per token, advantages broadcast over the row
    w = trl_applied_weights("bnpo", torch.log(torch.tensor([[1.5, 1.0], [3.0, 0.7]])), torch.tensor([1.0, -1.0]))
    assert torch.allclose(w, torch.tensor([[0.0, 1.0], [3.0, 0.0]]))
    # cispo: min(r, eps_high) whatever the sign; sapo: 4 s (1 - s) r with s = sigmoid(tau (r - 1))
    w = trl_applied_weights("cispo", RATIOS.log()[:, None], ADV, epsilon_high=2.0)
    assert torch.allclose(w[:, 0], torch.tensor([1.5, 2.0, 0.9, 0.5]))
    w = trl_applied_weights("sapo", RATIOS.log()[:, None], ADV, sapo_temperature_pos=1.0, sapo_temperature_neg=2.0)
    tau = torch.tensor([1.0, 2.0, 1.0, 2.0])
    s = torch.sigmoid(tau * (RATIOS - 1))
    assert torch.allclose(w[:, 0], 4 * s * (1 - s) * RATIOS)
    # on-policy every multiplier is 1
    for loss_type in ("grpo", "dr_grpo", "luspo", "sapo"):
        assert torch.allclose(trl_applied_weights(loss_type, torch.zeros(4, 1), ADV), torch.ones(4, 1))
    assert trl_applied_weights("vespo", torch.zeros(4, 1), ADV) is None


def test_weights_by_advantage_sign_sum_and_count_and_skip_zero_and_masked_units():
    stats = weight_by_advantage_sign(
        torch.tensor([2.0, 3.0, 0.5, 7.0, 1.0]), torch.tensor([-1.0, -2.0, 1.0, 0.0, 3.0])
    )
    assert stats.tolist() == [5.0, 2.0, 1.5, 2.0]  # neg: 2 + 3; pos: 0.5 + 1; A = 0 left out
    tokens = torch.tensor([[1.0, 4.0, 9.0], [2.0, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert weight_by_advantage_sign(tokens, torch.tensor([-1.0, 1.0]), mask).tolist() == [5.0, 2.0, 2.0, 1.0]
    assert weight_by_advantage_sign(torch.tensor([1.0, math.nan]), torch.tensor([1.0, 1.0])).tolist() == [0, 0, 1, 1]


def test_equal_reward_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.1, 0.1, math.nan, 0.1])
    assert equal_reward_groups(rewards, 4).tolist() == [2.0, 3.0]  # groups 2 (all 0.5) and 3 (NaN ignored)
    with pytest.raises(ValueError, match="group_size"):
        equal_reward_groups(rewards, 5)


def test_own_objectives_applied_weights():
    log_w = RATIOS.log()
    # stable_drl: G x softmax of the clipped log-weights (C = 5 clips nothing here) = 4 r / sum r
    out = stable_drl_loss(log_w, torch.zeros(4), ADV, 4, clip_c=5.0)
    assert torch.allclose(out.stats["applied_weight"], 4 * RATIOS / RATIOS.sum())
    # with C = 2 the ratio 3 is clipped to 2 (its weight bounded, not zeroed)
    out = stable_drl_loss(log_w, torch.zeros(4), ADV, 4, clip_c=2.0)
    clipped = torch.tensor([1.5, 2.0, 0.9, 0.5])
    assert torch.allclose(out.stats["applied_weight"], 4 * clipped / clipped.sum())
    # stable_drl_ratio: G rho / sum(clip(rho)) inside [0.8, 1.2], 0 where the ratio is clipped (a constant)
    out = stable_drl_ratio_loss(log_w, ADV, 4, epsilon=0.2)
    bar = torch.tensor([1.2, 1.2, 0.9, 0.8])
    assert torch.allclose(out.stats["applied_weight"], torch.tensor([0.0, 0.0, 4 * 0.9 / bar.sum(), 0.0]))
    # dgpo, token level: r * d, d = (r / 0.8)^n below 0.8 for A < 0, ((1.2) / r)^(1/m) above 1.2 for A > 0
    out = dgpo_loss(log_w[:, None], torch.zeros(4, 1), ADV, torch.ones(4, 1), n=1.0, m=2.0)
    expected = torch.tensor([1.5 * (1.2 / 1.5) ** 0.5, 3.0, 0.9, 0.5 * (0.5 / 0.8)])
    assert torch.allclose(out.stats["applied_weight"][:, 0], expected)


# ----------------------------------------------------------------------------------------------------------------------
# Through the trainer's loss and reward code


def make_trainer(tmp_path, reward_func=None, **kw):
    model = make_llada()
    base = dict(
        max_completion_length=4,
        max_steps=1,
        save_strategy="no",
        seed=7,
        likelihood_estimator="mean_field",
        p_mask_prompt=0.0,
        mask_seed_mode="shared",
    )

    def default_reward(prompts, completions, **_):
        return [0.0] * len(completions)

    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=reward_func or default_reward,
        args=tiny_args(tmp_path, **{**base, **kw}),
        train_dataset=Dataset.from_list([{"prompt": f"{i}+1="} for i in range(4)]),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop; the tests call the loss directly
    trainer.model.train()
    return trainer


def planted_inputs(trainer):
    """One group with old log-probs planted so that every row's sequence log-ratio is log RATIOS[i]."""
    prompt_ids = torch.tensor([[3, 20, 21, 2, 4]] * 4)
    completion_ids = torch.tensor([[10, 11, 12, 0]] * 4)
    mask = torch.ones_like(completion_ids)
    ids, am = torch.cat([prompt_ids, completion_ids], 1), torch.cat([torch.ones_like(prompt_ids), mask], 1)
    trainer._scoring.mask_stream = (2, 0, 0)  # the shared stream _compute_loss uses at step 0, iteration 0
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 4)
    old = logps - RATIOS.log()[:, None]  # every token's log-ratio is log r, so is the token mean
    return dict(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=mask,
        advantages=ADV,
        old_per_token_logps=old,
        num_items_in_batch=mask.sum(),
        mask_gen_step=torch.zeros(4, dtype=torch.long),
    )


@pytest.mark.parametrize(
    "loss_type, extra, neg, pos",
    [
        # sequence-level GRPO: weights [0, 3, 0.9, 0] (see above) -> negatives (3 + 0) / 2, positives (0 + 0.9) / 2
        ("grpo", dict(importance_sampling_level="sequence"), 1.5, 0.45),
        # token-level GRPO: every token carries the row's ratio, so the token means are the same
        ("grpo", dict(), 1.5, 0.45),
        # StableDRL: 4 r / sum r = [1.017, 2.034, 0.610, 0.339] -> (2.034 + 0.339) / 2, (1.017 + 0.610) / 2
        ("stable_drl", dict(), 4 * 3.5 / 5.9 / 2, 4 * 2.4 / 5.9 / 2),
    ],
)
def test_trainer_logs_the_applied_weights_of_planted_ratios(tmp_path, loss_type, extra, neg, pos):
    trainer = make_trainer(tmp_path, loss_type=loss_type, **extra)
    trainer._compute_loss(trainer.model, planted_inputs(trainer))
    metrics = trainer._metrics["train"]
    assert metrics["stabledrl/weight_mean_neg_adv"][-1] == pytest.approx(neg, rel=1e-4)
    assert metrics["stabledrl/weight_mean_pos_adv"][-1] == pytest.approx(pos, rel=1e-4)
    assert "stabledrl/estimator_noise_std" not in metrics  # shared masks: not logged


def test_trainer_logs_estimator_noise_with_fresh_masks(tmp_path):
    trainer = make_trainer(
        tmp_path, loss_type="stable_drl", likelihood_estimator="mc_elbo", mc_samples=4, mask_seed_mode="fresh"
    )
    inputs = planted_inputs(trainer)
    trainer._compute_loss(trainer.model, inputs)
    logged = trainer._metrics["train"]["stabledrl/estimator_noise_std"][-1]
    # the estimate _compute_loss made (stream (3, step 0, iteration 0)), recomputed: same per-row masks
    trainer._scoring.mask_stream = (3, 0, 0)
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 4)
    units = trainer._scoring.last_estimate.sample_seq_logps.double()  # (4, 4): four passes, one unit each
    by_hand = math.sqrt(2) * sum(units[b].std().item() / 2 for b in range(4)) / 4
    assert logged == pytest.approx(by_hand, rel=1e-4) and logged > 0
    assert torch.allclose(estimator_standard_error(units), units.std(-1) / 2)


def test_trainer_logs_the_share_of_groups_with_equal_rewards(tmp_path):
    def planted(prompts, completions, value, **_):
        return list(value)

    trainer = make_trainer(tmp_path, reward_func=planted)
    values = [1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5]  # 3 groups of 4: equal, mixed, equal
    inputs = [{"prompt": "1+1=", "value": v} for v in values]
    trainer._calculate_rewards(inputs, ["1+1="] * 12, ["2"] * 12, [[5]] * 12)
    assert trainer._metrics["train"]["stabledrl/equal_reward_group_frac"][-1] == pytest.approx(2 / 3)
