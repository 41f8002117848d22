"""Policy objectives for RL on diffusion (and autoregressive) language models.

Each objective is a small pure function of tensors: no config object, no trainer state. It returns the per-unit
loss (one value per group for the self-normalised objectives, one per token for DGPO) together with detached
statistics for logging; `aggregate_loss` alone turns per-unit losses into the scalar that is back-propagated.

The trainer dispatches by name, as verl's `get_policy_loss_fn`: `OBJECTIVES` maps each loss_type to a policy-loss
entry point taking one `PolicyLossInputs` (per-token log-probs, old log-probs, advantages, mask, group size, EUBO
and the hyper-parameters as plain values) and returning an `ObjectiveOutput`, whose `level` says how it is
aggregated and normalised. Registering a new entry with `register_objective` is all the trainer needs.

Non-finite inputs: a sample whose estimate, old estimate or advantage is NaN or infinite is dropped from its
group (weight 0, counted in `stats["skipped"]`), never propagated; a group with no finite sample contributes 0.

Papers:
- StableDRL, "Stabilizing Reinforcement Learning for Diffusion Language Models", arXiv 2603.06743.
- SPG, "Sandwiched Policy Gradient for Masked Diffusion Language Models", arXiv 2510.09541.
- DGPO, arXiv 2603.14389 (soft clipping through the probability gradient).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


@dataclass
class ObjectiveOutput:
    """What every objective returns.

    `unit_loss` is differentiable: (num_groups,) for group objectives, (B, T) for token objectives. `level` tells
    `aggregate_loss` how to reduce it. `stats` holds detached scalars or per-sample tensors for logging.
    """

    unit_loss: torch.Tensor
    level: str  # "group" | "token"
    stats: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyLossInputs:
    """Everything a registered objective may read for one micro-batch; the trainer builds it, the entry reads it.

    per_token_logps (B, T): the current policy's per-token log-probs (a likelihood estimator's per-token values for a
    diffusion LM; their masked mean is the sequence estimate), differentiable. old_per_token_logps (B, T): the old
    policy's, detached (equal to the current values, detached, on-policy). advantages (B,): NaN for a dropped sample.
    mask (B, T): the completion tokens scored (1) and padding / tool output (0). group_size: G consecutive rows per
    prompt. eubo (B,) or None: the estimator's upper bound, when it computes one (SPG's sandwich). The rest are the
    objectives' hyper-parameters, copied from the config as plain values.
    """

    per_token_logps: torch.Tensor
    old_per_token_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    group_size: int
    eubo: torch.Tensor | None = None
    clip_c: float = 5.0
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    stable_drl_ratio_form: str = "mean"
    sandwich: bool = False
    sandwich_omega: float = 0.5
    dgpo_n: float = 1.0
    dgpo_m: float = 2.0

    def sequence_mean(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) masked mean over each row's completion tokens of x (B, T): L(y) from per-token values."""
        return (x * self.mask).sum(-1) / self.mask.sum(-1).clamp(min=1)


# A policy-loss entry point: one micro-batch's inputs -> per-unit loss, level and statistics. `ObjectiveOutput.level`
# fixes the aggregation (`aggregate_loss`) and the trainer's normaliser: "group" -> mean over the groups of an
# optimiser step; "token" -> mean over the tokens of the accumulation window (as TRL's `dapo`).
PolicyLossFn = Callable[[PolicyLossInputs], ObjectiveOutput]

OBJECTIVES: dict[str, PolicyLossFn] = {}


def register_objective(name: str):
    """Decorator: register a `PolicyLossFn` under `name` (a loss_type); the trainer then dispatches to it."""

    def wrap(fn: PolicyLossFn) -> PolicyLossFn:
        OBJECTIVES[name] = fn
        return fn

    return wrap


def get_objective(name: str) -> PolicyLossFn:
    """The policy-loss entry point registered for loss_type `name`."""
    if name not in OBJECTIVES:
        raise ValueError(f"Unknown objective {name!r}; known objectives: {sorted(OBJECTIVES)}.")
    return OBJECTIVES[name]


# What each objective consumes from the likelihood estimator (see `ratio_input`).
# SEQUENCE_INPUT: a sequence-level log-weight L_theta(y) - L_old(y), the masked mean of the per-token values;
# TOKEN_INPUT: per-token log-ratios log pi_theta(y_t) - log pi_old(y_t), one per token (or their sum).
SEQUENCE_INPUT = "sequence"
TOKEN_INPUT = "token"

# TRL 1.16 loss types and what they consume at importance_sampling_level="token". "vespo" builds its sequence weight
# from the *sum* of per-token log-ratios whatever the level; every other TRL loss at level "sequence" takes the masked
# mean of the per-token log-ratios, which is L_theta - L_old for the estimators here.
_TRL_ALWAYS_TOKEN = ("vespo",)


def ratio_input(loss_type: str, importance_sampling_level: str = "token", stable_drl_ratio_form: str = "mean") -> str:
    """What an objective's importance ratio is built from: `SEQUENCE_INPUT` or `TOKEN_INPUT`.

    - "stable_drl": log w = L_theta - L_old, sequence level (the official StableDRL weight).
    - "stable_drl_ratio": form "mean" uses exp(L_theta - L_old), the length-normalised sequence ratio (sequence
      level); form "sum" uses exp(sum_t of per-token log-ratios) (token level).
    - "dgpo": per-token ratios.
    - TRL's losses: per-token ratios at importance_sampling_level "token", the sequence log-weight at "sequence"
      (TRL averages the per-token log-ratios over the completion mask, i.e. L_theta - L_old); "vespo" always sums
      per-token log-ratios.

    A Monte-Carlo likelihood estimator's per-token values are not per-token log-probs: only their masked mean is an
    estimate (of the sequence log-likelihood per token). Per-token log-ratios are therefore meaningful only when the
    old and the current policy are scored on the same masks; the sequence log-weight is meaningful with any masks.
    """
    if loss_type == "stable_drl":
        return SEQUENCE_INPUT
    if loss_type == "stable_drl_ratio":
        if stable_drl_ratio_form not in ("mean", "sum"):
            raise ValueError(f"stable_drl_ratio_form={stable_drl_ratio_form!r}; choose 'mean' or 'sum'.")
        return SEQUENCE_INPUT if stable_drl_ratio_form == "mean" else TOKEN_INPUT
    if loss_type == "dgpo" or loss_type in _TRL_ALWAYS_TOKEN:
        return TOKEN_INPUT
    return SEQUENCE_INPUT if importance_sampling_level == "sequence" else TOKEN_INPUT


def group_mean_advantages(rewards: torch.Tensor, group_size: int, scale: bool = False) -> torch.Tensor:
    """A_i = r_i - mean_j r_j within each group of `group_size` consecutive rows (optionally / std).

    rewards: (B,), B a multiple of group_size. Non-finite rewards are left out of the group mean and get A = NaN,
    so the objectives drop them.
    """
    _check_groups(rewards.shape[0], group_size)
    grouped = rewards.view(-1, group_size)  # (G_n, G)
    finite = torch.isfinite(grouped)
    count = finite.sum(-1, keepdim=True).clamp(min=1)  # (G_n, 1)
    mean = torch.where(finite, grouped, 0.0).sum(-1, keepdim=True) / count  # (G_n, 1)
    adv = grouped - mean  # (G_n, G)
    if scale:
        var = (torch.where(finite, adv, 0.0) ** 2).sum(-1, keepdim=True) / (count - 1).clamp(min=1)
        adv = adv / (var.sqrt() + 1e-4)
    return torch.where(finite, adv, float("nan")).view(-1)  # (B,)


def _check_groups(n: int, group_size: int) -> None:
    if group_size < 1 or n % group_size != 0:
        raise ValueError(
            f"group_size={group_size} does not divide the batch of {n} rows: each group of group_size consecutive rows "
            "holds the completions of one prompt, so pass whole groups (batch size a multiple of group_size)."
        )


def _finite(*tensors: torch.Tensor) -> torch.Tensor:
    ok = torch.ones_like(tensors[0], dtype=torch.bool)
    for t in tensors:
        ok = ok & torch.isfinite(t.detach())
    return ok


def _group_stats(log_w: torch.Tensor, weights: torch.Tensor, valid: torch.Tensor, clipped: torch.Tensor) -> dict:
    """Diagnostics shared by the self-normalised objectives; all (G_n, G) inputs, detached."""
    raw_w = torch.exp(log_w.clamp(max=80.0))  # unclipped importance weights; clamp only guards the exp
    n_valid = valid.sum().clamp(min=1)
    ess = 1.0 / (weights**2).sum(-1).clamp(min=1e-12)  # (G_n,) effective sample size per group
    ess = torch.where(valid.any(-1), ess, torch.zeros_like(ess))
    lw = torch.where(valid, log_w, 0.0)
    lw_mean = lw.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
    lw_var = torch.where(valid, (log_w - lw_mean) ** 2, 0.0).sum(-1) / (valid.sum(-1) - 1).clamp(min=1)
    return {
        "weight_mean": torch.where(valid, raw_w, 0.0).sum() / n_valid,
        "weight_max": torch.where(valid, raw_w, torch.zeros_like(raw_w)).max(),
        "clip_frac": (clipped & valid).sum() / n_valid,
        "ess": ess.mean(),
        "log_ratio_std": lw_var.sqrt().mean(),
        "skipped": (~valid).sum().float(),
        "weights": weights.detach(),
    }


def stable_drl_loss(
    seq_logps: torch.Tensor,
    old_seq_logps: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
    *,
    clip_c: float = 5.0,
    objective_logps: torch.Tensor | None = None,
) -> ObjectiveOutput:
    """StableDRL, official form (arXiv 2603.06743): unconditional clipping + group self-normalisation.

        log w_i   = sg(L_theta(y_i) - L_old(y_i))                 sequence level, detached
        log w_i  <- min(log w_i, log C)                           for every sample, whatever the sign of A_i
        w_hat     = softmax_i(log w)   within each group of G completions of one prompt
        loss_g    = - sum_i w_hat_i * A_i * J_i

    J_i is `objective_logps` if given (e.g. SPG's sandwich, `spg_sandwich`), else `seq_logps`. Because w_hat >= 0
    and sums to 1, grad loss_g = -sum_i w_hat_i A_i grad J_i is a convex combination of per-sample terms, so
    ||grad loss_g|| <= max_i |A_i| * max_i ||grad J_i|| whatever the ratios.

    Shapes: seq_logps, old_seq_logps, advantages, objective_logps (B,), B = num_groups * group_size, rows of a
    group consecutive. Returns unit_loss (num_groups,).
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_c must be > 1 (got {clip_c}); the official value is 5.0.")
    _check_groups(seq_logps.shape[0], group_size)
    target = seq_logps if objective_logps is None else objective_logps
    valid = _finite(seq_logps, old_seq_logps, advantages, target).view(-1, group_size)  # (G_n, G)
    log_w = (seq_logps.detach() - old_seq_logps.detach()).view(-1, group_size)  # (G_n, G)
    log_c = math.log(clip_c)
    clipped = log_w > log_c
    clipped_log_w = torch.where(valid, log_w.clamp(max=log_c), float("-inf"))  # dropped samples get weight 0
    weights = torch.softmax(clipped_log_w, dim=-1)  # (G_n, G)
    weights = torch.nan_to_num(weights, nan=0.0)  # an all-dropped group: softmax of all -inf is NaN -> 0
    adv = torch.where(valid, advantages.view(-1, group_size), 0.0)  # (G_n, G)
    j = torch.where(valid, target.view(-1, group_size), 0.0)  # (G_n, G), where() keeps NaN out of the graph
    unit_loss = -(weights * adv * j).sum(-1)  # (G_n,)
    stats = _group_stats(log_w, weights, valid, clipped)
    stats["applied_weight"] = (weights * group_size).detach().view(-1)  # (B,) multiplier of A_i grad J_i; uniform = 1
    return ObjectiveOutput(unit_loss, "group", stats)


def stable_drl_ratio_loss(
    seq_log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    group_size: int,
    *,
    epsilon: float = 0.2,
) -> ObjectiveOutput:
    """StableDRL, ratio-level form: unconditionally clipped, self-normalised importance ratios.

        rho_i     = exp(log pi_theta(y_i) - log pi_old(y_i))        (seq_log_ratio, differentiable)
        rho_bar_i = clip(rho_i, 1 - eps, 1 + eps)                  for every sample, whatever the sign of A_i
        loss_g    = - sum_i rho_bar_i * A_i / sg(sum_j rho_bar_j)

    Clipping is strict: a ratio at or beyond a bound is a constant (no gradient), so a planted outlier gives
    exactly the gradient of a ratio sitting on the bound. The normaliser is detached, so the gradient
    -sum_i (rho_bar_i / S) A_i grad log pi_i has non-negative weights summing to at most 1.

    Shapes: seq_log_ratio, advantages (B,). Returns unit_loss (num_groups,).
    """
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"epsilon must be in (0, 1) (got {epsilon}); the usual value is 0.2.")
    _check_groups(seq_log_ratio.shape[0], group_size)
    lo, hi = 1.0 - epsilon, 1.0 + epsilon
    valid = _finite(seq_log_ratio, advantages).view(-1, group_size)  # (G_n, G)
    log_r = torch.where(valid, seq_log_ratio.view(-1, group_size), 0.0)  # (G_n, G)
    inside = (log_r > math.log(lo)) & (log_r < math.log(hi))
    # exp only where inside the bounds, so an outlier never overflows in the graph
    rho = torch.exp(torch.where(inside, log_r, 0.0))
    rho_bar = torch.where(inside, rho, log_r.detach().clamp(math.log(lo), math.log(hi)).exp())
    rho_bar = torch.where(valid, rho_bar, 0.0)  # (G_n, G)
    norm = rho_bar.detach().sum(-1, keepdim=True)  # (G_n, 1)
    weights = torch.where(norm > 0, rho_bar / norm.clamp(min=1e-12), 0.0)  # (G_n, G)
    adv = torch.where(valid, advantages.view(-1, group_size), 0.0)
    unit_loss = -(weights * adv).sum(-1)  # (G_n,)
    stats = _group_stats(seq_log_ratio.detach().view(-1, group_size), weights, valid, ~inside)
    # multiplier of A_i grad log rho_i: G rho_i / S inside the bounds, 0 where the ratio is clipped (a constant)
    stats["applied_weight"] = torch.where(inside, weights * group_size, 0.0).detach().view(-1)  # (B,)
    return ObjectiveOutput(unit_loss, "group", stats)


def dgpo_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    n: float = 1.0,
    m: float = 2.0,
) -> ObjectiveOutput:
    """DGPO (arXiv 2603.14389): soft clipping through the probability gradient, token level.

        r     = pi_theta / pi_old                       per token
        d     = (r / (1 - eps_low))^n                   where r < 1 - eps_low and A < 0
              = ((1 + eps_high) / r)^(1/m)              where r > 1 + eps_high and A > 0
              = 1                                       elsewhere (including PPO's reverse regions)
        loss  = - A * r * sg(d)

    d is computed in log space, one branch at a time (log d <= 0 in its region), so an untaken branch that would
    overflow never enters the graph; r * sg(d) = exp(log r + sg(log d)) has gradient r * d * grad log pi.
    Tokens with A = 0 stay out of the graph (0 * inf would be NaN), and the weight r * d is capped at e^80: a token
    beyond the cap (only possible in PPO's unclipped reverse region, A < 0 and r > e^80) contributes no gradient,
    so float32 never overflows.

    Shapes: per_token_logps, old_per_token_logps, mask (B, T); advantages (B,) or (B, T). Returns (B, T).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)  # (B, 1)
    log_r = per_token_logps - old_per_token_logps.detach()  # (B, T)
    valid = _finite(log_r, advantages.expand_as(log_r)) & mask.bool()
    active = valid & (advantages.expand_as(log_r) != 0)
    log_r = torch.where(active, log_r, 0.0)
    adv = torch.where(valid, advantages.expand_as(log_r), 0.0)  # (B, T)
    lr = log_r.detach()
    low = (lr < math.log(1 - epsilon_low)) & (adv < 0)
    high = (lr > math.log(1 + epsilon_high)) & (adv > 0)
    log_d = torch.zeros_like(lr)
    log_d = torch.where(low, n * (lr - math.log(1 - epsilon_low)).clamp(max=0.0), log_d)
    log_d = torch.where(high, (math.log(1 + epsilon_high) - lr).clamp(max=0.0) / m, log_d)
    unit_loss = -adv * torch.exp((log_r + log_d).clamp(max=80.0))  # (B, T)
    unit_loss = torch.where(active, unit_loss, 0.0)
    n_tok = mask.bool().sum().clamp(min=1)
    stats = {
        "low_clip_frac": (low & valid).sum() / n_tok,
        "high_clip_frac": (high & valid).sum() / n_tok,
        "skipped": (mask.bool() & ~valid).sum().float(),
        # (B, T) multiplier r * d of A grad log pi per token (0 where dropped)
        "applied_weight": torch.where(valid, torch.exp((log_r + log_d).detach().clamp(max=80.0)), 0.0),
    }
    return ObjectiveOutput(unit_loss, "token", stats)


# ------------------------------------------------------------------ registered entry points (one per loss_type)


@register_objective("stable_drl")
def stable_drl_policy_loss(x: PolicyLossInputs) -> ObjectiveOutput:
    """`stable_drl_loss` on the sequence estimates L = masked mean of the per-token values; with `sandwich` and an
    EUBO, J_i is SPG's sandwich (`spg_sandwich`)."""
    seq = x.sequence_mean(x.per_token_logps)  # (B,)
    objective = None
    if x.sandwich and x.eubo is not None:
        objective = spg_sandwich(seq, x.eubo, x.advantages, x.sandwich_omega)
    return stable_drl_loss(
        seq,
        x.sequence_mean(x.old_per_token_logps),
        x.advantages,
        x.group_size,
        clip_c=x.clip_c,
        objective_logps=objective,
    )


@register_objective("stable_drl_ratio")
def stable_drl_ratio_policy_loss(x: PolicyLossInputs) -> ObjectiveOutput:
    """`stable_drl_ratio_loss` on log rho = L_theta - L_old (form "mean") or the sum of per-token log-ratios ("sum");
    epsilon is `epsilon_low`."""
    seq_log_ratio = ((x.per_token_logps - x.old_per_token_logps) * x.mask).sum(-1)  # (B,)
    if x.stable_drl_ratio_form == "mean":
        seq_log_ratio = seq_log_ratio / x.mask.sum(-1).clamp(min=1)
    return stable_drl_ratio_loss(seq_log_ratio, x.advantages, x.group_size, epsilon=x.epsilon_low)


@register_objective("dgpo")
def dgpo_policy_loss(x: PolicyLossInputs) -> ObjectiveOutput:
    """`dgpo_loss` on the per-token values, token level."""
    return dgpo_loss(
        x.per_token_logps,
        x.old_per_token_logps,
        x.advantages,
        x.mask,
        epsilon_low=x.epsilon_low,
        epsilon_high=x.epsilon_high,
        n=x.dgpo_n,
        m=x.dgpo_m,
    )


PPO_CLIP_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def trl_applied_weights(
    loss_type: str,
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    delta: float | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
) -> torch.Tensor | None:
    """The multiplier TRL 1.16's policy loss puts on each unit's A * grad log pi (1 for every unit on-policy).

        PPO clip (grpo, bnpo, dr_grpo, dapo, luspo): loss = -min(r' A, clip(r, 1 - eps_low, 1 + eps_high) A), r' = r
            (or min(r, delta) with TRL's two-sided `delta`); multiplier r where the unclipped term is the minimum or r is
            inside the bounds (and r < delta), 0 where the clipped constant is taken;
        cispo: min(r, eps_high) (detached);
        sapo: 4 s (1 - s) r, s = sigmoid(tau (r - 1)), tau by the sign of A.

    Shapes: log_ratio (B, T) per token or (B, 1) per sequence, advantages broadcastable to it. Returns the multiplier
    (same shape, detached), or None for a loss type not covered here (vespo's weight is TRL's `get_gamma_weights`).
    """
    log_ratio = log_ratio.detach()
    adv = advantages.detach()
    adv = (adv[:, None] if adv.dim() == 1 else adv).expand_as(log_ratio)
    r = torch.exp(log_ratio.clamp(max=80.0))
    if loss_type in PPO_CLIP_LOSS_TYPES:
        lo, hi = 1.0 - epsilon_low, 1.0 + epsilon_high
        r1 = r if delta is None else r.clamp(max=delta)
        clipped = r.clamp(lo, hi)
        unclipped_taken = (r1 * adv < clipped * adv) | ((r > lo) & (r < hi))
        carries = unclipped_taken if delta is None else unclipped_taken & (r < delta)
        return torch.where(carries, r, torch.zeros_like(r))
    if loss_type == "cispo":
        return r.clamp(max=epsilon_high)
    if loss_type == "sapo":
        tau = torch.where(adv > 0, sapo_temperature_pos, sapo_temperature_neg)
        s = torch.sigmoid(tau * (r - 1.0))
        return 4.0 * s * (1.0 - s) * r
    return None


def weight_by_advantage_sign(
    weights: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """(4,) [sum, count] of the applied weights of negative-advantage units, then of positive-advantage units.

    weights: (B,) per sample or (B, T) per token (then `mask` (B, T) selects the units); advantages (B,). Units with
    A = 0 or a non-finite weight or advantage are left out. Sums and counts gather exactly across micro-batches and
    processes; the means are sum / count.
    """
    weights = weights.detach()
    adv = advantages.detach().reshape(advantages.shape[0], *([1] * (weights.dim() - 1))).expand_as(weights)
    keep = torch.isfinite(weights) & torch.isfinite(adv)
    if mask is not None:
        keep = keep & mask.bool().expand_as(weights)
    neg, pos = keep & (adv < 0), keep & (adv > 0)
    zero = torch.zeros_like(weights)
    return torch.stack(
        [torch.where(neg, weights, zero).sum(), neg.sum(), torch.where(pos, weights, zero).sum(), pos.sum()]
    ).float()


def equal_reward_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(2,) [groups whose rewards are all equal, groups]: such a group has zero advantages and trains nothing.

    rewards: (B,) total rewards, consecutive rows of a group; NaN rewards are ignored (a group of NaN is equal).
    """
    _check_groups(rewards.shape[0], group_size)
    grouped = rewards.detach().view(-1, group_size)  # (G_n, G)
    finite = ~torch.isnan(grouped)
    hi = torch.where(finite, grouped, -torch.inf).max(-1).values
    lo = torch.where(finite, grouped, torch.inf).min(-1).values
    equal = (hi == lo) | (finite.sum(-1) <= 1)
    return torch.stack([equal.sum(), torch.tensor(grouped.shape[0], device=rewards.device)]).float()


def spg_sandwich(elbo: torch.Tensor, eubo: torch.Tensor, advantages: torch.Tensor, omega: float = 0.5) -> torch.Tensor:
    """SPG's sandwiched sequence objective (arXiv 2510.09541): a lower bound where it is pushed up, a mix with the
    upper bound where it is pushed down.

        J_i = ELBO_i                                   if A_i > 0
            = omega * EUBO_i + (1 - omega) * ELBO_i    otherwise

    Shapes: all (B,). Returns (B,).
    """
    return torch.where(advantages > 0, elbo, omega * eubo + (1.0 - omega) * elbo)


def add_kl_penalty(
    out: ObjectiveOutput,
    per_token_logps: torch.Tensor,
    ref_per_token_logps: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    group_size: int,
    old_per_token_logps: torch.Tensor | None = None,
) -> tuple[ObjectiveOutput, torch.Tensor]:
    """`out` plus TRL's KL penalty to a reference policy, on the objective's own units.

        kl_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1        (k3 estimator, >= 0; TRL's GRPO KL)
        kl_t <- kl_t * exp(logp_t - old_t)                         if old_per_token_logps is given (TRL's
                                                                   use_bias_correction_kl)
        token objectives: unit_t += beta * kl_t
        group objectives: unit_g += beta * mean_{i in g} (sum_t kl_it m_it / sum_t m_it)

    so with `aggregate_loss` the penalty is beta x the mean KL per token (dgpo, as TRL's `dapo`) or per sequence
    averaged over groups (stable_drl, stable_drl_ratio). A non-finite kl_t counts as 0.
    Shapes: per_token_logps, ref_per_token_logps, old_per_token_logps, mask (B, T). Returns the new output and the
    per-token KL (B, T), detached, for logging. KL regularisation: arXiv 2402.03300 (GRPO), eq. 4.
    """
    log_ratio = ref_per_token_logps - per_token_logps  # (B, T)
    kl = torch.exp(log_ratio) - log_ratio - 1.0  # (B, T)
    if old_per_token_logps is not None:
        kl = kl * torch.exp(per_token_logps - old_per_token_logps)
    kl = torch.where(torch.isfinite(kl), kl, torch.zeros_like(kl))
    if out.level == "token":
        unit = out.unit_loss + beta * kl
    elif out.level == "group":
        _check_groups(kl.shape[0], group_size)
        m = mask.to(kl.dtype)
        seq_kl = (kl * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (B,)
        unit = out.unit_loss + beta * seq_kl.view(-1, group_size).mean(-1)  # (G_n,)
    else:
        raise ValueError(f"Unknown loss level {out.level!r}.")
    return ObjectiveOutput(unit, out.level, out.stats), kl.detach()


def aggregate_loss(out: ObjectiveOutput, mask: torch.Tensor | None = None, normalizer: float | torch.Tensor = 1.0):
    """The one place that reduces per-unit losses to the scalar that is back-propagated.

    group level: sum over the micro-batch's groups / normalizer (normalizer = groups per micro-batch x gradient
    accumulation steps gives the mean over all groups of an optimiser step; DDP's gradient mean covers processes).
    token level: sum over unmasked tokens / normalizer (normalizer = tokens per accumulation window and process,
    as TRL's `dapo`).
    """
    if out.level == "group":
        return out.unit_loss.sum() / normalizer
    if out.level == "token":
        return (out.unit_loss * mask).sum() / normalizer
    raise ValueError(f"Unknown loss level {out.level!r}.")
