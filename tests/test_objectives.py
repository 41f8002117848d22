"""Tests for the policy objectives in stabledrl_trl/objectives.py.

Values are checked against hand computations (numbers written out) or against literal reference formulas written
here; the stability claims (unconditional clipping, self-normalisation, DGPO's bounded weights) are checked on
planted outliers with explicit per-sample gradients of a small linear model.
"""

import math
import statistics

import pytest
import torch

from stabledrl_trl.objectives import (
    OBJECTIVES,
    ObjectiveOutput,
    PolicyLossInputs,
    aggregate_loss,
    dgpo_loss,
    get_objective,
    group_mean_advantages,
    spg_sandwich,
    stable_drl_loss,
    stable_drl_ratio_loss,
)

F64 = torch.float64
NAN, INF = float("nan"), float("inf")


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=True)


# ----------------------------------------------------------------------------------------------------------------
# A small model producing one sequence objective J_i per sample, for gradient-norm checks


def linear_j_model(seed: int, num_samples: int, dim: int = 5):
    """J_i = <x_i, w> + b with fixed features x_i; parameters (w, b). Explicit generator, no global RNG."""
    gen = torch.Generator().manual_seed(seed)
    feats = torch.randn(num_samples, dim, generator=gen, dtype=F64)  # (G, D)
    w = (0.3 * torch.randn(dim, generator=gen, dtype=F64)).requires_grad_()  # (D,)
    b = torch.tensor(-2.0, dtype=F64, requires_grad=True)
    params = (w, b)

    def forward() -> torch.Tensor:
        return feats @ w + b  # (G,)

    return forward, params


def flat_grad(loss: torch.Tensor, params, retain_graph: bool = False) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=retain_graph)])


def max_per_sample_grad_norm(forward, params) -> float:
    """max_i ||grad_params J_i||, each per-sample gradient computed on its own."""
    j = forward()
    return max(flat_grad(j[i], params, retain_graph=True).norm().item() for i in range(j.numel()))


# Six samples of one group; sample 1 has a NEGATIVE advantage and receives the planted importance ratio.
PLANT_ADV = [0.5, -1.5, 1.0, -0.3, 0.8, -0.5]
PLANT_LOG_RATIO = [0.1, 0.0, -0.2, 0.3, -0.1, 0.05]
PLANTED = 1


def planted_log_ratio(ratio: float) -> torch.Tensor:
    lr = t64(PLANT_LOG_RATIO)
    lr[PLANTED] = math.log(ratio)
    return lr  # (G,)


def grpo_conditional_loss(log_ratio: torch.Tensor, adv: torch.Tensor, eps: float = 0.2) -> torch.Tensor:
    """GRPO/PPO conditional clipping, one group, fixed 1/G normalisation: -sum_i min(rho A, clip(rho) A) / G."""
    rho = torch.exp(log_ratio)  # differentiable
    return -torch.minimum(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv).sum() / adv.numel()


def stable_drl_param_grad(ratio: float, clip_c: float = 5.0) -> torch.Tensor:
    forward, params = linear_j_model(0, len(PLANT_ADV))
    j = forward()  # (G,) sequence log-likelihood estimates under theta
    old = j.detach() - planted_log_ratio(ratio)  # so that log w = J - old is the planted log ratio
    out = stable_drl_loss(j, old, t64(PLANT_ADV), len(PLANT_ADV), clip_c=clip_c)
    return flat_grad(aggregate_loss(out), params)


def stable_drl_ratio_param_grad(ratio: float, eps: float = 0.2) -> torch.Tensor:
    forward, params = linear_j_model(0, len(PLANT_ADV))
    j = forward()
    # value exactly the planted log ratio (j - sg(j) is exactly 0), gradient grad J: a ratio can sit exactly on a bound
    log_ratio = (j - j.detach()) + planted_log_ratio(ratio)  # (G,)
    out = stable_drl_ratio_loss(log_ratio, t64(PLANT_ADV), len(PLANT_ADV), epsilon=eps)
    return flat_grad(aggregate_loss(out), params)


def grpo_param_grad(ratio: float) -> torch.Tensor:
    forward, params = linear_j_model(0, len(PLANT_ADV))
    j = forward()
    log_ratio = (j - j.detach()) + planted_log_ratio(ratio)
    return flat_grad(grpo_conditional_loss(log_ratio, t64(PLANT_ADV)), params)


# ----------------------------------------------------------------------------------------------------------------
# stable_drl


def test_stable_drl_weights_are_a_distribution_per_group():
    gen = torch.Generator().manual_seed(1)
    num_groups, group_size, clip_c = 5, 8, 5.0
    log_ratio = 2.0 * torch.randn(num_groups * group_size, generator=gen, dtype=F64)  # many above log 5
    old = torch.randn(num_groups * group_size, generator=gen, dtype=F64) - 20.0
    adv = torch.randn(num_groups * group_size, generator=gen, dtype=F64)
    out = stable_drl_loss(old + log_ratio, old, adv, group_size, clip_c=clip_c)

    w = out.stats["weights"]  # (G_n, G)
    assert w.shape == (num_groups, group_size)
    assert (log_ratio > math.log(clip_c)).sum() >= 5  # the clip is really exercised
    assert out.stats["clip_frac"].item() > 0
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(num_groups, dtype=F64))
    # literal reference: w_i = min(rho_i, C) / sum_j min(rho_j, C)
    capped = torch.exp(log_ratio).clamp(max=clip_c).view(num_groups, group_size)
    torch.testing.assert_close(w, capped / capped.sum(-1, keepdim=True))


def test_stable_drl_hand_case_value_and_gradient():
    # G = 3, log ratios 0.1, 2.0 (above log 5 = 1.609: clipped to log 5), -0.5
    # unnormalised weights e^0.1 = 1.105171, 5, e^-0.5 = 0.606531; sum 6.711702
    # w = 0.164663, 0.744968, 0.090369
    # loss = -(w0 * 1 * -3.0 + w1 * -2 * -1.0 + w2 * 1 * -2.5) = -0.770022
    seq = leaf([-3.0, -1.0, -2.5])
    old = leaf([-3.1, -3.0, -2.0])  # requires grad only to show that no gradient reaches it
    adv = t64([1.0, -2.0, 1.0])
    out = stable_drl_loss(seq, old, adv, 3, clip_c=5.0)

    z = math.exp(0.1) + 5.0 + math.exp(-0.5)
    w_hand = t64([math.exp(0.1) / z, 5.0 / z, math.exp(-0.5) / z])
    torch.testing.assert_close(w_hand, t64([0.16466330, 0.74496757, 0.09036913]), rtol=0, atol=1e-8)
    assert out.level == "group"
    assert out.unit_loss.shape == (1,)
    torch.testing.assert_close(out.stats["weights"][0], w_hand)
    torch.testing.assert_close(out.unit_loss, t64([-0.7700224058821379]))

    g_seq, g_old = torch.autograd.grad(aggregate_loss(out), (seq, old), allow_unused=True)
    # weights are detached: the gradient is exactly -w_i A_i, nothing flows through log w or into old
    assert g_old is None or torch.equal(g_old, torch.zeros_like(g_old))
    assert torch.equal(g_seq, -(out.stats["weights"][0] * adv))
    torch.testing.assert_close(g_seq, -w_hand * adv)


def test_stable_drl_objective_logps_spg_sandwich_hand_case():
    # log ratios 0.2, -0.1, 1.9 (clipped to log 5); weights e^0.2, e^-0.1, 5 over 7.126238
    # omega = 0.3: J = [elbo_0 (A > 0), 0.3 * -1.2 + 0.7 * -2.0 = -1.76, 0.3 * -2.0 + 0.7 * -3.0 = -2.7 (A = 0)]
    # loss = -(w0 * 1 * -1.0 + w1 * -0.5 * -1.76 + w2 * 0 * -2.7) = 0.0596592
    elbo = leaf([-1.0, -2.0, -3.0])
    eubo = leaf([-0.5, -1.2, -2.0])
    adv = t64([1.0, -0.5, 0.0])
    j = spg_sandwich(elbo, eubo, adv, omega=0.3)
    torch.testing.assert_close(j, t64([-1.0, -1.76, -2.7]))
    torch.testing.assert_close(spg_sandwich(elbo, eubo, adv), t64([-1.0, -1.6, -2.5]))  # default omega 0.5

    seq = leaf([-10.0, -20.0, -30.0])
    old = t64([-10.2, -19.9, -31.9])
    out = stable_drl_loss(seq, old, adv, 3, clip_c=5.0, objective_logps=j)
    z = math.exp(0.2) + math.exp(-0.1) + 5.0
    w = [math.exp(0.2) / z, math.exp(-0.1) / z, 5.0 / z]
    torch.testing.assert_close(out.stats["weights"][0], t64(w))
    torch.testing.assert_close(out.unit_loss, t64([0.059659205945464144]))

    g_elbo, g_eubo, g_seq = torch.autograd.grad(out.unit_loss.sum(), (elbo, eubo, seq), allow_unused=True)
    torch.testing.assert_close(g_elbo, t64([-w[0] * 1.0, -w[1] * -0.5 * 0.7, 0.0]))
    torch.testing.assert_close(g_eubo, t64([0.0, -w[1] * -0.5 * 0.3, 0.0]))
    assert g_seq is None  # with an explicit objective, seq_logps only feeds the detached weights


def test_stable_drl_unconditional_clipping_planted_outlier():
    clip_c = 5.0
    g_planted = stable_drl_param_grad(1e5, clip_c)
    g_at_bound = stable_drl_param_grad(clip_c, clip_c)
    torch.testing.assert_close(g_planted, g_at_bound)

    forward, params = linear_j_model(0, len(PLANT_ADV))
    bound = max(abs(a) for a in PLANT_ADV) * max_per_sample_grad_norm(forward, params)
    assert g_planted.norm().item() <= bound


def test_stable_drl_ratio_unconditional_clipping_planted_outlier():
    eps = 0.2
    g_planted = stable_drl_ratio_param_grad(1e5, eps)
    g_at_bound = stable_drl_ratio_param_grad(1.0 + eps, eps)
    assert torch.equal(g_planted, g_at_bound)

    forward, params = linear_j_model(0, len(PLANT_ADV))
    bound = max(abs(a) for a in PLANT_ADV) * max_per_sample_grad_norm(forward, params)
    assert g_planted.norm().item() <= bound

    # the weights on grad log pi_i, read from the gradient w.r.t. the log ratios: >= 0, summing to at most 1
    log_ratio = planted_log_ratio(1e5).requires_grad_()
    adv = t64(PLANT_ADV)
    (g,) = torch.autograd.grad(
        stable_drl_ratio_loss(log_ratio, adv, len(PLANT_ADV), epsilon=eps).unit_loss.sum(), log_ratio
    )
    coef = -g / adv  # (G,)
    assert coef[PLANTED].item() == 0.0
    assert (coef >= 0).all()
    assert coef.sum().item() <= 1.0 + 1e-12


def test_conditional_clipping_grows_with_outlier_stable_drl_does_not():
    ratios = [1e1, 1e3, 1e5]
    grpo_norms = [grpo_param_grad(r).norm().item() for r in ratios]
    stable_norms = [stable_drl_param_grad(r).norm().item() for r in ratios]
    ratio_norms = [stable_drl_ratio_param_grad(r).norm().item() for r in ratios]

    # GRPO keeps rho * A when A < 0 and rho > 1 + eps: the gradient grows like the planted ratio
    assert grpo_norms[1] > 30 * grpo_norms[0]
    assert grpo_norms[2] > 90 * grpo_norms[1]
    forward, params = linear_j_model(0, len(PLANT_ADV))
    bound = max(abs(a) for a in PLANT_ADV) * max_per_sample_grad_norm(forward, params)
    assert grpo_norms[2] > 1e3 * bound
    # both StableDRL forms: constant (every planted ratio is beyond the clip) and bounded
    assert stable_norms[0] == pytest.approx(stable_norms[1], rel=1e-12)
    assert stable_norms[0] == pytest.approx(stable_norms[2], rel=1e-12)
    assert ratio_norms[0] == ratio_norms[1] == ratio_norms[2]
    assert max(stable_norms + ratio_norms) <= bound


# ----------------------------------------------------------------------------------------------------------------
# stable_drl_ratio


def test_stable_drl_ratio_hand_case():
    # ratios 1.1 (inside), 0.5 (below: 0.8), 3.0 (above: 1.2), 0.95 (inside); eps = 0.2
    # rho_bar = 1.1, 0.8, 1.2, 0.95, S = 4.05; loss = -(1.1 * 1 + 0.8 * -1 + 1.2 * -0.5 + 0.95 * 0.5) / 4.05
    #         = -0.175 / 4.05 = -0.0432099
    log_ratio = leaf([math.log(1.1), math.log(0.5), math.log(3.0), math.log(0.95)])
    adv = t64([1.0, -1.0, -0.5, 0.5])
    out = stable_drl_ratio_loss(log_ratio, adv, 4, epsilon=0.2)
    torch.testing.assert_close(out.unit_loss, t64([-0.175 / 4.05]))
    torch.testing.assert_close(out.stats["weights"][0], t64([1.1, 0.8, 1.2, 0.95]) / 4.05)
    assert out.stats["clip_frac"].item() == pytest.approx(0.5)
    (g,) = torch.autograd.grad(out.unit_loss.sum(), log_ratio)
    # d loss / d log rho_i = -rho_i A_i / S inside the bounds (detached normaliser), 0 outside
    torch.testing.assert_close(g, t64([-1.1 * 1.0 / 4.05, 0.0, 0.0, -0.95 * 0.5 / 4.05]))


def test_stable_drl_ratio_two_groups_weights_are_rho_bar_over_sum():
    gen = torch.Generator().manual_seed(2)
    log_ratio = 0.4 * torch.randn(3 * 5, generator=gen, dtype=F64)
    adv = torch.randn(3 * 5, generator=gen, dtype=F64)
    out = stable_drl_ratio_loss(log_ratio, adv, 5, epsilon=0.2)
    rho_bar = torch.exp(log_ratio).clamp(0.8, 1.2).view(3, 5)
    w = rho_bar / rho_bar.sum(-1, keepdim=True)
    torch.testing.assert_close(out.stats["weights"], w)
    torch.testing.assert_close(out.unit_loss, -(w * adv.view(3, 5)).sum(-1))


# ----------------------------------------------------------------------------------------------------------------
# zero advantages


def test_zero_advantages_give_zero_loss_and_gradient():
    gen = torch.Generator().manual_seed(3)
    seq = (torch.randn(8, generator=gen, dtype=F64) - 5.0).requires_grad_()
    old = seq.detach() + 3.0 * torch.randn(8, generator=gen, dtype=F64)
    old[2] = seq[2].detach() - math.log(1e5)  # a planted outlier changes nothing
    zeros = torch.zeros(8, dtype=F64)

    out = stable_drl_loss(seq, old, zeros, 4)
    (g,) = torch.autograd.grad(aggregate_loss(out), seq)
    assert torch.equal(out.unit_loss.abs(), torch.zeros(2, dtype=F64)) and torch.equal(g.abs(), zeros)

    log_ratio = (seq - old).detach().requires_grad_()
    out = stable_drl_ratio_loss(log_ratio, zeros, 4)
    (g,) = torch.autograd.grad(aggregate_loss(out), log_ratio)
    assert torch.equal(out.unit_loss.abs(), torch.zeros(2, dtype=F64)) and torch.equal(g.abs(), zeros)

    tok = (torch.randn(2, 6, generator=gen, dtype=F64) - 2.0).requires_grad_()
    old_tok = tok.detach() + 0.5 * torch.randn(2, 6, generator=gen, dtype=F64)
    mask = torch.ones(2, 6, dtype=F64)
    for adv in (torch.zeros(2, dtype=F64), torch.zeros(2, 6, dtype=F64)):
        out = dgpo_loss(tok, old_tok, adv, mask)
        (g,) = torch.autograd.grad(aggregate_loss(out, mask, mask.sum()), tok)
        assert torch.equal(out.unit_loss.abs(), torch.zeros(2, 6, dtype=F64))
        assert torch.equal(g.abs(), torch.zeros(2, 6, dtype=F64))


def test_dgpo_zero_advantage_with_huge_ratio_is_zero_not_nan():
    # A = 0 (e.g. a group whose completions all got the same reward) on a token whose log ratio is 100: the loss
    # term is -0 * r * d = 0 and so is its gradient; exp(100) overflows float32, which must not turn it into NaN.
    tok = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old_tok = torch.tensor([[-100.0, -0.1]])
    mask = torch.ones(1, 2)
    out = dgpo_loss(tok, old_tok, torch.zeros(1), mask)
    (g,) = torch.autograd.grad(aggregate_loss(out, mask, 2.0), tok)
    assert torch.isfinite(out.unit_loss).all(), f"zero-advantage token gave loss {out.unit_loss.tolist()}"
    assert torch.isfinite(g).all(), f"zero-advantage token gave gradient {g.tolist()}"
    assert torch.equal(out.unit_loss.abs(), torch.zeros(1, 2)) and torch.equal(g.abs(), torch.zeros(1, 2))


# ----------------------------------------------------------------------------------------------------------------
# group_mean_advantages


def test_group_mean_advantages_hand_values():
    rewards = t64([1.0, 2.0, 3.0, 0.0, 0.0, 4.0])
    adv = group_mean_advantages(rewards, 3)
    torch.testing.assert_close(adv, t64([-1.0, 0.0, 1.0, -4 / 3, -4 / 3, 8 / 3]))

    # std scaling: group 0 std (n - 1) = 1; group 1 std = sqrt((16/9 + 16/9 + 64/9) / 2) = sqrt(48/9)
    scaled = group_mean_advantages(rewards, 3, scale=True)
    s1 = math.sqrt(48 / 9)
    expected = t64([-1.0, 0.0, 1.0]) / (1.0 + 1e-4)
    expected = torch.cat([expected, t64([-4 / 3, -4 / 3, 8 / 3]) / (s1 + 1e-4)])
    torch.testing.assert_close(scaled, expected)
    assert s1 == pytest.approx(statistics.stdev([0.0, 0.0, 4.0]))

    # a constant group has zero advantages, scaled or not
    flat = group_mean_advantages(t64([2.0, 2.0, 2.0]), 3, scale=True)
    assert torch.equal(flat.abs(), torch.zeros(3, dtype=F64))


def test_group_mean_advantages_non_finite_rewards():
    rewards = t64([1.0, NAN, 3.0, INF, 5.0, 5.0, 5.0, 9.0])
    adv = group_mean_advantages(rewards, 4)
    # group 0: mean of {1, 3} = 2; group 1: all finite, mean 6
    assert torch.isnan(adv[1]) and torch.isnan(adv[3])
    torch.testing.assert_close(adv[[0, 2]], t64([-1.0, 1.0]))
    torch.testing.assert_close(adv[4:], t64([-1.0, -1.0, -1.0, 3.0]))

    scaled = group_mean_advantages(rewards, 4, scale=True)
    assert torch.isnan(scaled[1]) and torch.isnan(scaled[3])
    torch.testing.assert_close(scaled[[0, 2]], t64([-1.0, 1.0]) / (math.sqrt(2.0) + 1e-4))
    torch.testing.assert_close(scaled[4:], t64([-1.0, -1.0, -1.0, 3.0]) / (2.0 + 1e-4))

    # a NaN advantage makes stable_drl drop the sample
    out = stable_drl_loss(torch.zeros(8, dtype=F64), torch.zeros(8, dtype=F64), adv, 4)
    assert out.stats["skipped"].item() == 2
    torch.testing.assert_close(out.stats["weights"][0], t64([0.5, 0.0, 0.5, 0.0]))


# ----------------------------------------------------------------------------------------------------------------
# dgpo


def dgpo_weight(r: float, a: float, eps_low: float, eps_high: float, n: float, m: float) -> float:
    """Literal DGPO weight on grad log pi (= r * d), per region."""
    if a < 0 and r < 1 - eps_low:
        return r ** (n + 1) / (1 - eps_low) ** n
    if a > 0 and r > 1 + eps_high:
        return r * ((1 + eps_high) / r) ** (1 / m)
    return r


@pytest.mark.parametrize(
    "eps_low, eps_high, n, m",
    [(0.2, 0.2, 1.0, 2.0), (0.1, 0.28, 2.0, 3.0)],
)
def test_dgpo_hand_loss_and_gradient_every_region(eps_low, eps_high, n, m):
    # (ratio, advantage) per token: low region, high region, reverse low (A > 0, r small), reverse high
    # (A < 0, r large), inside with both signs
    cases = [(0.5, -2.0), (2.0, 1.5), (0.5, 1.0), (2.0, -1.0), (1.05, 0.7), (0.95, -0.3)]
    ratio = t64([r for r, _ in cases])
    tok = leaf([-1.0, -2.0, -0.5, -3.0, -1.5, -0.7])
    old = (tok.detach() - torch.log(ratio)).view(1, -1)  # (1, 6)
    adv = t64([a for _, a in cases]).view(1, -1)  # (1, 6) per-token advantages
    mask = torch.ones(1, len(cases), dtype=F64)
    out = dgpo_loss(tok.view(1, -1), old, adv, mask, epsilon_low=eps_low, epsilon_high=eps_high, n=n, m=m)
    assert out.level == "token"

    weights = [dgpo_weight(r, a, eps_low, eps_high, n, m) for r, a in cases]
    if (eps_low, n) == (0.2, 1.0):
        assert weights[0] == pytest.approx(0.5**2 / 0.8)  # r^(n+1) / (1 - eps)^n
        assert weights[1] == pytest.approx(2.0 * math.sqrt(1.2 / 2.0))  # r ((1 + eps) / r)^(1/m)
    else:
        assert weights[0] == pytest.approx(0.5**3 / 0.9**2)
        assert weights[1] == pytest.approx(2.0 * (1.28 / 2.0) ** (1 / 3))
    assert weights[2:] == [0.5, 2.0, 1.05, 0.95]  # d = 1 outside the two decay regions

    expected = t64([-a * w for (_, a), w in zip(cases, weights)]).view(1, -1)
    torch.testing.assert_close(out.unit_loss, expected)
    # d is detached: the gradient w.r.t. log pi is -A * r * d (the loss' own value), not -A * d(r d)/d log pi
    (g,) = torch.autograd.grad(aggregate_loss(out, mask), tok)
    torch.testing.assert_close(g.view(1, -1), expected)
    assert out.stats["low_clip_frac"].item() == pytest.approx(1 / 6)
    assert out.stats["high_clip_frac"].item() == pytest.approx(1 / 6)


def test_dgpo_sequence_advantages_broadcast_and_mask():
    gen = torch.Generator().manual_seed(4)
    tok = (torch.randn(3, 5, generator=gen, dtype=F64) - 2.0).requires_grad_()
    old = tok.detach() + 0.6 * torch.randn(3, 5, generator=gen, dtype=F64)
    adv = t64([1.0, -0.5, 2.0])
    mask = torch.ones(3, 5, dtype=F64)
    mask[1, 3:] = 0
    out_seq = dgpo_loss(tok, old, adv, mask, n=2.0)
    out_tok = dgpo_loss(tok, old, adv[:, None].expand(3, 5), mask, n=2.0)
    torch.testing.assert_close(out_seq.unit_loss, out_tok.unit_loss)
    ratio = torch.exp(tok.detach() - old)
    w = [[dgpo_weight(ratio[b, t].item(), adv[b].item(), 0.2, 0.2, 2.0, 2.0) for t in range(5)] for b in range(3)]
    expected = -adv[:, None] * t64(w) * mask
    torch.testing.assert_close(out_seq.unit_loss, expected)
    # token-level aggregation: masked sum over the normaliser
    loss = aggregate_loss(out_seq, mask, mask.sum())
    torch.testing.assert_close(loss, expected.sum() / 13)
    (g,) = torch.autograd.grad(loss, tok)
    torch.testing.assert_close(g, expected / 13)


@pytest.mark.parametrize("n, m", [(1.0, 2.0), (2.0, 3.0)])
def test_dgpo_gradient_weight_continuous_at_both_boundaries(n, m):
    eps_low, eps_high, delta = 0.2, 0.28, 1e-9
    # low boundary (A < 0): just outside (r slightly below 1 - eps) vs just inside
    # high boundary (A > 0): just outside (r slightly above 1 + eps) vs just inside
    ratios = [(1 - eps_low) * (1 - delta), (1 - eps_low) * (1 + delta), (1 + eps_high) * (1 + delta)]
    ratios += [(1 + eps_high) * (1 - delta)]
    advs = [-1.0, -1.0, 1.0, 1.0]
    tok = leaf([-1.0] * 4)
    old = (tok.detach() - torch.log(t64(ratios))).view(1, 4)
    mask = torch.ones(1, 4, dtype=F64)
    out = dgpo_loss(
        tok.view(1, 4), old, t64(advs).view(1, 4), mask, epsilon_low=eps_low, epsilon_high=eps_high, n=n, m=m
    )
    (g,) = torch.autograd.grad(out.unit_loss.sum(), tok)
    weight = -g / t64(advs)  # weight on grad log pi
    # the boundary is really crossed: one token in each decay region
    assert out.stats["low_clip_frac"].item() == pytest.approx(0.25)
    assert out.stats["high_clip_frac"].item() == pytest.approx(0.25)
    torch.testing.assert_close(weight[0], weight[1], rtol=1e-7, atol=0)
    torch.testing.assert_close(weight[2], weight[3], rtol=1e-7, atol=0)
    assert weight[1].item() == pytest.approx(1 - eps_low, rel=1e-7)
    assert weight[3].item() == pytest.approx(1 + eps_high, rel=1e-7)


def test_dgpo_extreme_log_ratios_stay_finite_float32():
    # log r = -1e4 (A > 0 reverse region, A < 0 low region), log r = +150 with A > 0 and m = 2: the untaken
    # branch (e.g. (r / (1 - eps))^n or exp(150)) would overflow in float32
    tok = torch.tensor([[-1e4, -1e4, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, -150.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    out = dgpo_loss(tok, old, adv, mask, m=2.0)
    (g,) = torch.autograd.grad(aggregate_loss(out, mask, 3.0), tok)
    assert torch.isfinite(out.unit_loss).all() and torch.isfinite(g).all()
    assert out.unit_loss[0, 0].item() == 0.0 and out.unit_loss[0, 1].item() == 0.0
    # high region: r d = r sqrt(1.2 / r) = sqrt(1.2) exp(75)
    expected = -math.sqrt(1.2) * math.exp(75.0)
    assert out.unit_loss[0, 2].item() == pytest.approx(expected, rel=1e-5)
    assert g[0, 2].item() == pytest.approx(expected / 3.0, rel=1e-5)
    assert g[0, 0].item() == 0.0 and g[0, 1].item() == 0.0


# ----------------------------------------------------------------------------------------------------------------
# non-finite inputs


def test_stable_drl_non_finite_samples_are_dropped():
    gen = torch.Generator().manual_seed(5)
    group_size = 4
    seq = torch.randn(16, generator=gen, dtype=F64) - 4.0
    old = seq + 1.5 * torch.randn(16, generator=gen, dtype=F64)
    adv = torch.randn(16, generator=gen, dtype=F64)
    dropped = {0: 1, 1: 0, 2: 2}  # group -> dropped sample
    seq[0 * 4 + 1] = NAN
    old[1 * 4 + 0] = INF
    adv[2 * 4 + 2] = -INF
    seq[12], old[13], adv[14], seq[15] = NAN, -INF, NAN, -INF  # group 3: nothing finite
    seq = seq.requires_grad_()
    out = stable_drl_loss(seq, old, adv, group_size)
    w = out.stats["weights"]
    assert out.stats["skipped"].item() == 3 + 4
    assert 0.0 < out.stats["ess"].item() <= group_size  # the empty group must not blow up the ESS
    (g,) = torch.autograd.grad(aggregate_loss(out), seq)
    assert torch.isfinite(out.unit_loss).all() and torch.isfinite(g).all()

    for grp, bad in dropped.items():
        keep = [i for i in range(group_size) if i != bad]
        idx = [grp * group_size + i for i in keep]
        ref = stable_drl_loss(seq.detach()[idx], old[idx], adv[idx], group_size - 1)  # the group without it
        assert w[grp, bad].item() == 0.0 and g[grp * group_size + bad].item() == 0.0
        torch.testing.assert_close(w[grp, keep], ref.stats["weights"][0])
        torch.testing.assert_close(w[grp].sum(), torch.tensor(1.0, dtype=F64))
        torch.testing.assert_close(out.unit_loss[grp], ref.unit_loss[0])
        torch.testing.assert_close(g[idx], -ref.stats["weights"][0] * adv[idx])
    assert out.unit_loss[3].item() == 0.0
    assert torch.equal(w[3], torch.zeros(4, dtype=F64))
    assert torch.equal(g[12:].abs(), torch.zeros(4, dtype=F64))


def test_stable_drl_non_finite_objective_logps_is_dropped():
    seq, old = t64([-1.0, -2.0, -3.0]), t64([-1.0, -2.5, -3.0])
    adv = t64([1.0, -1.0, 0.5])
    j = leaf([-1.0, NAN, -2.0])
    out = stable_drl_loss(seq, old, adv, 3, objective_logps=j)
    (g,) = torch.autograd.grad(out.unit_loss.sum(), j)
    torch.testing.assert_close(out.stats["weights"][0], t64([0.5, 0.0, 0.5]))
    torch.testing.assert_close(out.unit_loss, t64([-(0.5 * 1.0 * -1.0 + 0.5 * 0.5 * -2.0)]))
    torch.testing.assert_close(g, t64([-0.5, 0.0, -0.25]))
    assert out.stats["skipped"].item() == 1


def test_stable_drl_ratio_non_finite_samples_are_dropped():
    gen = torch.Generator().manual_seed(6)
    log_ratio = 0.3 * torch.randn(12, generator=gen, dtype=F64)
    adv = torch.randn(12, generator=gen, dtype=F64)
    log_ratio[1] = NAN
    adv[6] = INF
    log_ratio[8], log_ratio[9], adv[10], log_ratio[11] = INF, -INF, NAN, NAN  # group 2: nothing finite
    log_ratio = log_ratio.requires_grad_()
    out = stable_drl_ratio_loss(log_ratio, adv, 4)
    (g,) = torch.autograd.grad(aggregate_loss(out), log_ratio)
    w = out.stats["weights"]
    assert out.stats["skipped"].item() == 2 + 4
    assert torch.isfinite(out.unit_loss).all() and torch.isfinite(g).all()
    for grp, bad in {0: 1, 1: 2}.items():
        keep = [i for i in range(4) if i != bad]
        idx = [grp * 4 + i for i in keep]
        ref = stable_drl_ratio_loss(log_ratio.detach()[idx], adv[idx], 3)
        assert w[grp, bad].item() == 0.0 and g[grp * 4 + bad].item() == 0.0
        torch.testing.assert_close(w[grp, keep], ref.stats["weights"][0])
        torch.testing.assert_close(w[grp].sum(), torch.tensor(1.0, dtype=F64))
        torch.testing.assert_close(out.unit_loss[grp], ref.unit_loss[0])
    assert out.unit_loss[2].item() == 0.0
    assert torch.equal(w[2], torch.zeros(4, dtype=F64))
    assert torch.equal(g[8:].abs(), torch.zeros(4, dtype=F64))


def test_dgpo_non_finite_tokens_are_dropped():
    gen = torch.Generator().manual_seed(7)
    tok = torch.randn(4, 5, generator=gen, dtype=F64) - 2.0
    old = tok + 0.5 * torch.randn(4, 5, generator=gen, dtype=F64)
    adv = t64([1.0, -1.0, NAN, 0.5])
    mask = torch.ones(4, 5, dtype=F64)
    mask[3, 4] = 0
    tok[0, 1] = NAN
    old[1, 2] = INF
    tok[3, 4] = NAN  # masked out anyway: not counted as skipped
    tok = tok.requires_grad_()
    out = dgpo_loss(tok, old, adv, mask)
    loss = aggregate_loss(out, mask, mask.sum())
    (g,) = torch.autograd.grad(loss, tok)
    assert out.stats["skipped"].item() == 1 + 1 + 5
    assert torch.isfinite(out.unit_loss).all() and torch.isfinite(g).all()

    # same as the clean batch with the dropped tokens masked out
    bad = ~torch.isfinite(tok.detach() - old) | torch.isnan(adv)[:, None]
    clean_mask = mask * (~bad)
    clean_tok = torch.where(bad, -1.0, tok.detach()).requires_grad_()
    clean_old = torch.where(bad, -1.0, old)
    clean = dgpo_loss(clean_tok, clean_old, torch.nan_to_num(adv), clean_mask)
    torch.testing.assert_close(out.unit_loss * mask, clean.unit_loss * clean_mask)
    (g_clean,) = torch.autograd.grad(aggregate_loss(clean, clean_mask, mask.sum()), clean_tok)
    torch.testing.assert_close(g, g_clean)
    assert torch.equal(g[bad].abs(), torch.zeros(int(bad.sum()), dtype=F64))


# ----------------------------------------------------------------------------------------------------------------
# aggregate_loss, stats, registry


def test_aggregate_loss_group_and_token_levels():
    group = ObjectiveOutput(t64([1.0, -2.0, 4.5]), "group")
    assert aggregate_loss(group, normalizer=4.0).item() == pytest.approx(3.5 / 4.0)
    assert aggregate_loss(group).item() == pytest.approx(3.5)

    unit = t64([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = t64([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])
    token = ObjectiveOutput(unit, "token")
    assert aggregate_loss(token, mask, 4.0).item() == pytest.approx((1 + 2 + 5 + 6) / 4.0)
    assert aggregate_loss(token, mask, torch.tensor(7.0)).item() == pytest.approx(14 / 7.0)

    with pytest.raises(ValueError, match="sequence"):
        aggregate_loss(ObjectiveOutput(unit, "sequence"), mask)


def test_stable_drl_stats_hand_case():
    # group 0: log ratios 0.1, 2.0, -0.5 (2.0 clipped); group 1: 0.3, 0.3, 0.3 (uniform weights)
    log_ratio = t64([0.1, 2.0, -0.5, 0.3, 0.3, 0.3])
    old = t64([-1.0, -2.0, -3.0, -4.0, -5.0, -6.0])
    out = stable_drl_loss(old + log_ratio, old, t64([1.0, -1.0, 0.0, 0.5, 0.5, -1.0]), 3, clip_c=5.0)
    s = out.stats
    raw = [math.exp(x) for x in [0.1, 2.0, -0.5, 0.3, 0.3, 0.3]]  # unclipped exp(log w)
    assert s["weight_mean"].item() == pytest.approx(sum(raw) / 6)
    assert s["weight_max"].item() == pytest.approx(math.exp(2.0))
    assert s["clip_frac"].item() == pytest.approx(1 / 6)
    z = math.exp(0.1) + 5.0 + math.exp(-0.5)
    ess0 = 1.0 / ((math.exp(0.1) / z) ** 2 + (5.0 / z) ** 2 + (math.exp(-0.5) / z) ** 2)
    assert s["ess"].item() == pytest.approx((ess0 + 3.0) / 2)
    std0 = statistics.stdev([0.1, 2.0, -0.5])  # 1.305118
    assert std0 == pytest.approx(1.3051181, abs=1e-6)
    assert s["log_ratio_std"].item() == pytest.approx((std0 + 0.0) / 2)
    assert s["skipped"].item() == 0
    for key, value in s.items():
        assert not value.requires_grad, key


@pytest.mark.parametrize("group_size", [2, 4, 16])
def test_uniform_weights_have_ess_equal_to_group_size(group_size):
    log_ratio = torch.full((2 * group_size,), 0.7, dtype=F64)
    adv = torch.linspace(-1, 1, 2 * group_size, dtype=F64)
    out = stable_drl_loss(log_ratio - 3.0, torch.full_like(log_ratio, -3.0), adv, group_size)
    assert out.stats["ess"].item() == pytest.approx(group_size)
    out = stable_drl_ratio_loss(torch.zeros(2 * group_size, dtype=F64), adv, group_size)
    assert out.stats["ess"].item() == pytest.approx(group_size)
    assert out.stats["log_ratio_std"].item() == 0.0


def test_stable_drl_ratio_stats_use_unclipped_ratios():
    log_ratio = t64([math.log(3.0), math.log(0.5), 0.0, math.log(1.1)])
    out = stable_drl_ratio_loss(log_ratio, t64([1.0, -1.0, 0.5, -0.5]), 4)
    assert out.stats["weight_mean"].item() == pytest.approx((3.0 + 0.5 + 1.0 + 1.1) / 4)
    assert out.stats["weight_max"].item() == pytest.approx(3.0)
    assert out.stats["clip_frac"].item() == pytest.approx(0.5)
    assert out.stats["log_ratio_std"].item() == pytest.approx(statistics.stdev(log_ratio.tolist()))


def test_registry_lists_the_package_loss_types_and_refuses_unknown_names():
    from stabledrl_trl.objectives import TRL_LOSS_TYPES, known_loss_types, register_objective

    assert list(OBJECTIVES)[:3] == ["stable_drl", "stable_drl_ratio", "dgpo"]
    assert known_loss_types() == (*OBJECTIVES, *TRL_LOSS_TYPES)
    assert [OBJECTIVES[n].level for n in ("stable_drl", "stable_drl_ratio", "dgpo")] == ["group", "group", "token"]
    with pytest.raises(ValueError, match=r"'grpo_typo'.*stable_drl"):
        get_objective("grpo_typo")
    # a registration that could not work is refused when it is made, naming what to change
    with pytest.raises(ValueError, match="one of TRL's loss types"):
        register_objective("dapo", level="token")
    with pytest.raises(ValueError, match="already registered"):
        register_objective("stable_drl", level="group")
    with pytest.raises(ValueError, match="level='sequence'.*'group', 'token'"):
        register_objective("new_objective", level="sequence")
    with pytest.raises(ValueError, match=r"statistics \['weights'\]"):
        register_objective("new_objective", level="group", statistics=("weights",))
    assert "new_objective" not in OBJECTIVES and "dapo" not in OBJECTIVES


def test_each_objective_declares_what_its_ratio_is_built_from():
    from stabledrl_trl.objectives import SEQUENCE_INPUT, TOKEN_INPUT, ratio_input

    assert ratio_input("stable_drl") == SEQUENCE_INPUT and ratio_input("dgpo") == TOKEN_INPUT
    assert ratio_input("stable_drl_ratio", stable_drl_ratio_form="mean") == SEQUENCE_INPUT
    assert ratio_input("stable_drl_ratio", stable_drl_ratio_form="sum") == TOKEN_INPUT
    assert ratio_input("grpo", "sequence") == SEQUENCE_INPUT and ratio_input("grpo", "token") == TOKEN_INPUT
    assert ratio_input("vespo", "sequence") == TOKEN_INPUT
    with pytest.raises(ValueError, match="stable_drl_ratio_form='max'"):
        ratio_input("stable_drl_ratio", stable_drl_ratio_form="max")


def _policy_inputs(**settings) -> PolicyLossInputs:
    """Two groups of three rows, four token slots, ragged masks; per-token values as log-probs."""
    gen = torch.Generator().manual_seed(3)
    logps = (-torch.rand(6, 4, generator=gen, dtype=F64) * 2).requires_grad_(True)  # (B, T)
    old = logps.detach() + 0.3 * torch.randn(6, 4, generator=gen, dtype=F64)  # (B, T)
    mask = t64([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    adv = t64([1.0, -0.5, -0.5, 0.7, -0.2, -0.5])
    eubo = -torch.rand(6, generator=gen, dtype=F64)
    return PolicyLossInputs(logps, old, adv, mask, 3, eubo=eubo, settings=settings)


def _same(a: ObjectiveOutput, b: ObjectiveOutput):
    assert a.level == b.level
    torch.testing.assert_close(a.unit_loss, b.unit_loss, rtol=0, atol=0)
    assert sorted(a.stats) == sorted(b.stats)
    for k in a.stats:
        torch.testing.assert_close(a.stats[k], b.stats[k], rtol=0, atol=0)


def test_stable_drl_entry_is_the_pure_function_on_masked_sequence_means():
    x = _policy_inputs(clip_c=1.5)
    n = x.mask.sum(-1)
    seq, old_seq = (x.per_token_logps * x.mask).sum(-1) / n, (x.old_per_token_logps * x.mask).sum(-1) / n
    _same(get_objective("stable_drl")(x), stable_drl_loss(seq, old_seq, x.advantages, 3, clip_c=1.5))
    # the sandwich reads the EUBO only when asked to
    x = _policy_inputs(clip_c=1.5, sandwich=True, sandwich_omega=0.25)
    j = spg_sandwich(seq, x.eubo, x.advantages, 0.25)
    _same(
        get_objective("stable_drl")(x), stable_drl_loss(seq, old_seq, x.advantages, 3, clip_c=1.5, objective_logps=j)
    )


@pytest.mark.parametrize("form", ["mean", "sum"])
def test_stable_drl_ratio_entry_builds_the_sequence_log_ratio_of_its_form(form):
    x = _policy_inputs(epsilon=0.1, stable_drl_ratio_form=form)
    total = ((x.per_token_logps - x.old_per_token_logps) * x.mask).sum(-1)
    log_ratio = total / x.mask.sum(-1) if form == "mean" else total
    _same(get_objective("stable_drl_ratio")(x), stable_drl_ratio_loss(log_ratio, x.advantages, 3, epsilon=0.1))


def test_dgpo_entry_passes_its_hyperparameters():
    x = _policy_inputs(epsilon=0.1, epsilon_high=0.3, dgpo_n=2.0, dgpo_m=3.0)
    expected = dgpo_loss(
        x.per_token_logps, x.old_per_token_logps, x.advantages, x.mask, epsilon_low=0.1, epsilon_high=0.3, n=2.0, m=3.0
    )
    _same(get_objective("dgpo")(x), expected)
    # epsilon_high None reads epsilon on both sides, as TRL resolves it
    x = _policy_inputs(epsilon=0.1, epsilon_high=None, dgpo_n=2.0, dgpo_m=3.0)
    expected = dgpo_loss(
        x.per_token_logps, x.old_per_token_logps, x.advantages, x.mask, epsilon_low=0.1, epsilon_high=0.1, n=2.0, m=3.0
    )
    _same(get_objective("dgpo")(x), expected)


def test_bad_hyperparameters_raise_value_error():
    x = torch.zeros(4, dtype=F64)
    for clip_c in (1.0, 0.5):
        with pytest.raises(ValueError, match="clip_c"):
            stable_drl_loss(x, x, x, 2, clip_c=clip_c)
    for eps in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="epsilon"):
            stable_drl_ratio_loss(x, x, 2, epsilon=eps)


@pytest.mark.parametrize(
    "call",
    [
        lambda x: stable_drl_loss(x, x, x, 3),
        lambda x: stable_drl_ratio_loss(x, x, 3),
        lambda x: group_mean_advantages(x, 3),
    ],
    ids=["stable_drl", "stable_drl_ratio", "group_mean_advantages"],
)
def test_batch_not_a_multiple_of_group_size_raises_value_error(call):
    # 5 rows cannot form groups of 3: a clear ValueError naming group_size, not a reshape error
    try:
        call(torch.zeros(5, dtype=F64))
    except Exception as err:  # noqa: BLE001 - the point is which exception comes out
        assert isinstance(err, ValueError) and "group_size" in str(err), (
            f"B = 5, group_size = 3: expected a ValueError naming group_size, got {type(err).__name__}: {err}"
        )
    else:
        raise AssertionError("B = 5, group_size = 3 was accepted silently")
