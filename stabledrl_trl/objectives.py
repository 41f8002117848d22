"""Policy objectives for RL on diffusion (and autoregressive) language models.

Each objective is a small pure function of tensors: no config object, no trainer state. It returns the per-unit
loss (one value per group for the self-normalised objectives, one per token for DGPO) together with detached
statistics for logging; `aggregate_loss` alone turns per-unit losses into the scalar that is back-propagated.

The trainer dispatches by name, as verl's `get_policy_loss_fn`: `OBJECTIVES` maps each loss_type to an
`ObjectiveSpec`: a policy-loss entry point taking one `PolicyLossInputs` (per-token log-probs, old log-probs,
advantages, mask, group size, EUBO and a `settings` mapping of the config fields it declares) and returning an
`ObjectiveOutput`, with what it declares: its level (how it is aggregated and normalised), what its ratio is built
from, the optional statistics it returns, whole groups, sandwich support, a settings check and its model-card text.
The registry is the one list of the package's objectives: the config's accepted loss types, `trl_fields`'
refusals, validation, the trainer and the model card all read it, so a new objective is one function registered
with `@register_objective(...)` in any module imported before the config is built.

Non-finite inputs: a sample whose estimate, old estimate or advantage is NaN or infinite is dropped from its
group (weight 0, counted in `stats["skipped"]`), never propagated; a group with no finite sample contributes 0.

Papers:
- StableDRL, "Stabilizing Reinforcement Learning for Diffusion Language Models", arXiv 2603.06743.
- SPG, "Sandwiched Policy Gradient for Masked Diffusion Language Models", arXiv 2510.09541.
- DGPO, arXiv 2603.14389 (soft clipping through the probability gradient).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

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
    prompt. eubo (B,) or None: the estimator's upper bound, when it computes one (SPG's sandwich). settings: the
    config's values of the fields the objective declares (`register_objective(settings=...)`), as verl's policy
    losses receive their config: a new setting is a config field and one name in the declaration, no trainer edit.
    """

    per_token_logps: torch.Tensor
    old_per_token_logps: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    group_size: int
    eubo: torch.Tensor | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)

    def sequence_mean(self, x: torch.Tensor) -> torch.Tensor:
        """(B,) masked mean over each row's completion tokens of x (B, T): L(y) from per-token values."""
        return (x * self.mask).sum(-1) / self.mask.sum(-1).clamp(min=1)


# A policy-loss entry point: one micro-batch's inputs -> per-unit loss, level and statistics. `ObjectiveOutput.level`
# fixes the aggregation (`aggregate_loss`) and the trainer's normaliser: "group" -> mean over the groups of an
# optimiser step; "token" -> mean over the tokens of the accumulation window (as TRL's `dapo`).
PolicyLossFn = Callable[[PolicyLossInputs], ObjectiveOutput]

# What each objective consumes from the likelihood estimator (see `ratio_input`).
# SEQUENCE_INPUT: a sequence-level log-weight L_theta(y) - L_old(y), the masked mean of the per-token values;
# TOKEN_INPUT: per-token log-ratios log pi_theta(y_t) - log pi_old(y_t), one per token (or their sum).
SEQUENCE_INPUT = "sequence"
TOKEN_INPUT = "token"

LEVELS = ("group", "token")
# How the masks of the policies compared in a ratio are drawn (the config's `mask_seed_mode`; an objective's
# `auto_mask_seed_mode`): "fresh" (official StableDRL, each policy its own masks) or "shared" (d1, one seed per
# inner iteration).
MASK_SEED_MODES = ("fresh", "shared")
# StableDRL's ratio (`stable_drl_ratio_form`): the mean or the sum of the per-token log-ratios.
STABLE_DRL_RATIO_FORMS = ("mean", "sum")
# The optional statistics the trainer reads from `ObjectiveOutput.stats` when an objective declares them:
# "applied_weight": (B,) or (B, T) multiplier of A grad log pi per unit (logged as weight_mean_neg_adv / _pos_adv);
# "clip_frac": its clipped fractions ("clip_frac" or "<x>_clip_frac": the all-clipped streak and its warning).
OPTIONAL_STATISTICS = ("applied_weight", "clip_frac")

# TRL 1.16's own loss types (computed by TRL's `_compute_loss`); a registered objective may not take their names.
TRL_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")


@dataclass(frozen=True)
class ObjectiveSpec:
    """A registered objective and what the rest of the package derives from it (the config, `trl_fields`,
    validation, the trainer and the model card read these; none keeps its own list of objectives).

    fn: the `PolicyLossFn`. level: "group" (one unit per group of G completions, mean over the step's groups) or
    "token" (TRL `dapo`'s token mean); the trainer checks the output's level against it. ratio_input: what its
    importance ratio is built from, `SEQUENCE_INPUT` or `TOKEN_INPUT`, or a function of its settings mapping that
    returns one. settings: the config fields it reads (they reach it as `PolicyLossInputs.settings`; a GRPOConfig
    field it does not list, such as epsilon, is refused for it by `trl_fields`). statistics: which of
    `OPTIONAL_STATISTICS` it returns. whole_groups: it normalises over each prompt's completions, so micro-batches
    must hold whole groups and num_generations >= 2. supports_sandwich: it reads the EUBO (`sandwich=True`).
    auto_mask_seed_mode: `mask_seed_mode` when unset and beta = 0. sequence_fix: the setting that makes it consume
    the sequence log-weight (offered when per-token ratios meet fresh masks). check(config): raises for settings it
    cannot run with, at config construction. describe(config) -> (short name, paragraph) for the model card.
    """

    name: str
    fn: PolicyLossFn
    level: str
    ratio_input: str | Callable[[Mapping[str, Any]], str]
    settings: tuple[str, ...] = ()
    statistics: tuple[str, ...] = ()
    whole_groups: bool = False
    supports_sandwich: bool = False
    auto_mask_seed_mode: str = "shared"
    sequence_fix: str = ""
    check: Callable[[Any], None] | None = None
    describe: Callable[[Any], tuple[str, str]] | None = None

    def settings_of(self, config) -> dict[str, Any]:
        """{field: config value} of the settings this objective declares."""
        return {name: getattr(config, name) for name in self.settings}

    def consumes(self, settings: Mapping[str, Any]) -> str:
        """`SEQUENCE_INPUT` or `TOKEN_INPUT` under `settings`."""
        return self.ratio_input(settings) if callable(self.ratio_input) else self.ratio_input


# Every objective the package computes, by loss_type; `register_objective` adds one.
OBJECTIVES: dict[str, ObjectiveSpec] = {}


def register_objective(
    name: str,
    *,
    level: str,
    ratio_input: str | Callable[[Mapping[str, Any]], str] | None = None,
    settings: tuple[str, ...] = (),
    statistics: tuple[str, ...] = (),
    whole_groups: bool | None = None,
    supports_sandwich: bool = False,
    auto_mask_seed_mode: str = "shared",
    sequence_fix: str = "",
    check: Callable[[Any], None] | None = None,
    describe: Callable[[Any], tuple[str, str]] | None = None,
    replace: bool = False,
):
    """Decorator: register a `PolicyLossFn` as loss_type `name`, with what it declares (see `ObjectiveSpec`).

    ratio_input defaults to `SEQUENCE_INPUT` for level "group" and `TOKEN_INPUT` for level "token"; whole_groups
    to level == "group". `StableDRLConfig(loss_type=name)` is then accepted and the trainer dispatches to it; nothing
    else names it. `replace=True` swaps an objective registered under the same name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_objective needs a non-empty loss_type name, got {name!r}.")
    if name in TRL_LOSS_TYPES:
        raise ValueError(
            f"{name!r} is one of TRL's loss types {list(TRL_LOSS_TYPES)} (computed by TRL); choose another name."
        )
    if name in OBJECTIVES and not replace:
        raise ValueError(
            f"an objective named {name!r} is already registered; choose another name or pass replace=True."
        )
    if level not in LEVELS:
        raise ValueError(f"level={level!r} for objective {name!r}; choose one of {list(LEVELS)}.")
    if ratio_input is None:
        ratio_input = SEQUENCE_INPUT if level == "group" else TOKEN_INPUT
    if not callable(ratio_input) and ratio_input not in (SEQUENCE_INPUT, TOKEN_INPUT):
        raise ValueError(
            f"ratio_input={ratio_input!r} for objective {name!r}; choose {SEQUENCE_INPUT!r}, {TOKEN_INPUT!r} or a "
            "function of the settings returning one."
        )
    unknown = sorted(set(statistics) - set(OPTIONAL_STATISTICS))
    if unknown:
        raise ValueError(
            f"statistics {unknown} of objective {name!r} are not read by the trainer; the optional statistics are "
            f"{list(OPTIONAL_STATISTICS)} (any other scalar in stats is logged as stabledrl/<key> anyway)."
        )
    if auto_mask_seed_mode not in MASK_SEED_MODES:
        raise ValueError(
            f"auto_mask_seed_mode={auto_mask_seed_mode!r} for objective {name!r}; choose 'fresh' or 'shared'."
        )

    def wrap(fn: PolicyLossFn) -> PolicyLossFn:
        OBJECTIVES[name] = ObjectiveSpec(
            name=name,
            fn=fn,
            level=level,
            ratio_input=ratio_input,
            settings=tuple(settings),
            statistics=tuple(statistics),
            whole_groups=level == "group" if whole_groups is None else whole_groups,
            supports_sandwich=supports_sandwich,
            auto_mask_seed_mode=auto_mask_seed_mode,
            sequence_fix=sequence_fix,
            check=check,
            describe=describe,
        )
        return fn

    return wrap


def get_objective_spec(name: str) -> ObjectiveSpec:
    """The registered objective `name` with its declarations."""
    if name not in OBJECTIVES:
        raise ValueError(f"Unknown objective {name!r}; known objectives: {sorted(OBJECTIVES)}.")
    return OBJECTIVES[name]


def get_objective(name: str) -> PolicyLossFn:
    """The policy-loss entry point registered for loss_type `name`."""
    return get_objective_spec(name).fn


def own_loss_types() -> tuple[str, ...]:
    """The loss types this package computes: every registered objective, in registration order."""
    return tuple(OBJECTIVES)


def known_loss_types() -> tuple[str, ...]:
    """Every loss_type the config accepts: the registered objectives, then TRL's."""
    return own_loss_types() + TRL_LOSS_TYPES


def needs_whole_groups(loss_type: str) -> bool:
    """Whether `loss_type` normalises over each prompt's completions (micro-batches of whole groups)."""
    return loss_type in OBJECTIVES and OBJECTIVES[loss_type].whole_groups


# TRL 1.16 loss types and what they consume at importance_sampling_level="token". "vespo" builds its sequence weight
# from the *sum* of per-token log-ratios whatever the level; every other TRL loss at level "sequence" takes the masked
# mean of the per-token log-ratios, which is L_theta - L_old for the estimators here.
TRL_ALWAYS_TOKEN = ("vespo",)


def ratio_input(loss_type: str, importance_sampling_level: str = "token", stable_drl_ratio_form: str = "mean") -> str:
    """What an objective's importance ratio is built from: `SEQUENCE_INPUT` or `TOKEN_INPUT`.

    - a registered objective: what it declares (`ObjectiveSpec.ratio_input`), e.g. "stable_drl": the sequence
      log-weight L_theta - L_old; "stable_drl_ratio": form "mean" exp(L_theta - L_old) (sequence), form "sum"
      exp(sum_t of per-token log-ratios) (token); "dgpo": per-token ratios.
    - TRL's losses: per-token ratios at importance_sampling_level "token", the sequence log-weight at "sequence"
      (TRL averages the per-token log-ratios over the completion mask, i.e. L_theta - L_old); "vespo" always sums
      per-token log-ratios.

    A Monte-Carlo likelihood estimator's per-token values are not per-token log-probs: only their masked mean is an
    estimate (of the sequence log-likelihood per token). Per-token log-ratios are therefore meaningful only when the
    old and the current policy are scored on the same masks; the sequence log-weight is meaningful with any masks.
    """
    if loss_type in OBJECTIVES:
        settings = {
            "importance_sampling_level": importance_sampling_level,
            "stable_drl_ratio_form": stable_drl_ratio_form,
        }
        return OBJECTIVES[loss_type].consumes(settings)
    if loss_type in TRL_ALWAYS_TOKEN:
        return TOKEN_INPUT
    return SEQUENCE_INPUT if importance_sampling_level == "sequence" else TOKEN_INPUT


def config_ratio_input(config) -> str:
    """`ratio_input` under a config: its loss_type with the settings that objective declares."""
    spec = OBJECTIVES.get(config.loss_type)
    if spec is not None:
        return spec.consumes(spec.settings_of(config))
    return ratio_input(config.loss_type, config.importance_sampling_level)


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


def _check_epsilons_in_unit_interval(config) -> None:
    """The ratio-clipping objectives need 0 < epsilon, epsilon_high < 1 (a bound at or below 0 would clip every
    ratio to a non-positive value)."""
    eps_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    for name, value in (("epsilon", config.epsilon), ("epsilon_high", eps_high)):
        if not 0.0 < value < 1.0:
            raise ValueError(f"{name}={value} must be in (0, 1) for loss_type={config.loss_type!r}; use 0.2.")


def _describe_stable_drl(config) -> tuple[str, str]:
    detail = (
        f"Objective: StableDRL (`loss_type='stable_drl'`): unconditional clipping of the sequence importance "
        f"weight (log w <- min(log w, log {config.clip_c:g})) and self-normalisation over the "
        f"{config.num_generations} completions of each prompt (group softmax of the clipped log-weights)"
    )
    if config.sandwich:
        detail += (
            f", with SPG's sandwich objective for negative advantages (beta={config.sandwich_beta:g}, "
            f"omega={config.sandwich_omega:g})"
        )
    return "StableDRL (arXiv 2603.06743)", detail


@register_objective(
    "stable_drl",
    level="group",
    ratio_input=SEQUENCE_INPUT,
    settings=("clip_c", "sandwich", "sandwich_omega"),
    statistics=("applied_weight", "clip_frac"),
    supports_sandwich=True,
    auto_mask_seed_mode="fresh",  # the official StableDRL setting: the old policy scored once on its own masks
    describe=_describe_stable_drl,
)
def stable_drl_policy_loss(x: PolicyLossInputs) -> ObjectiveOutput:
    """`stable_drl_loss` on the sequence estimates L = masked mean of the per-token values; with `sandwich` and an
    EUBO, J_i is SPG's sandwich (`spg_sandwich`). Settings: clip_c, sandwich, sandwich_omega."""
    s = x.settings
    seq = x.sequence_mean(x.per_token_logps)  # (B,)
    objective = None
    if s.get("sandwich", False) and x.eubo is not None:
        objective = spg_sandwich(seq, x.eubo, x.advantages, s.get("sandwich_omega", 0.5))
    return stable_drl_loss(
        seq,
        x.sequence_mean(x.old_per_token_logps),
        x.advantages,
        x.group_size,
        clip_c=s.get("clip_c", 5.0),
        objective_logps=objective,
    )


def _stable_drl_ratio_input(settings: Mapping[str, Any]) -> str:
    form = settings.get("stable_drl_ratio_form", "mean")
    if form not in STABLE_DRL_RATIO_FORMS:
        raise ValueError(f"stable_drl_ratio_form={form!r}; choose 'mean' or 'sum'.")
    return SEQUENCE_INPUT if form == "mean" else TOKEN_INPUT


def _describe_stable_drl_ratio(config) -> tuple[str, str]:
    high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    return "StableDRL, ratio-level form (arXiv 2603.06743)", (
        f"Objective: StableDRL at ratio level (`loss_type='stable_drl_ratio'`): every sequence ratio clipped to "
        f"[1 - {config.epsilon:g}, 1 + {high:g}] "
        f"whatever the advantage's sign, normalised by the sum of the group's clipped ratios"
    )


@register_objective(
    "stable_drl_ratio",
    level="group",
    ratio_input=_stable_drl_ratio_input,
    settings=("epsilon", "stable_drl_ratio_form"),
    statistics=("applied_weight", "clip_frac"),
    sequence_fix="stable_drl_ratio_form='mean' (exp(L_theta - L_old))",
    check=_check_epsilons_in_unit_interval,
    describe=_describe_stable_drl_ratio,
)
def stable_drl_ratio_policy_loss(x: PolicyLossInputs) -> ObjectiveOutput:
    """`stable_drl_ratio_loss` on log rho = L_theta - L_old (form "mean") or the sum of per-token log-ratios ("sum");
    epsilon is the config's `epsilon`. Settings: epsilon, stable_drl_ratio_form."""
    s = x.settings
    seq_log_ratio = ((x.per_token_logps - x.old_per_token_logps) * x.mask).sum(-1)  # (B,)
    if s.get("stable_drl_ratio_form", "mean") == "mean":
        seq_log_ratio = seq_log_ratio / x.mask.sum(-1).clamp(min=1)
    return stable_drl_ratio_loss(seq_log_ratio, x.advantages, x.group_size, epsilon=s.get("epsilon", 0.2))


def _describe_dgpo(config) -> tuple[str, str]:
    return (
        "DGPO soft clipping (arXiv 2603.14389), with StableDRLTrainer",
        f"Objective: DGPO (`loss_type='dgpo'`, n={config.dgpo_n:g}, m={config.dgpo_m:g})",
    )


@register_objective(
    "dgpo",
    level="token",
    ratio_input=TOKEN_INPUT,
    settings=("epsilon", "epsilon_high", "dgpo_n", "dgpo_m"),
    statistics=("applied_weight", "clip_frac"),
    check=_check_epsilons_in_unit_interval,
    describe=_describe_dgpo,
)
def dgpo_policy_loss(x: PolicyLossInputs) -> ObjectiveOutput:
    """`dgpo_loss` on the per-token values, token level. Settings: epsilon, epsilon_high (None: epsilon, as TRL),
    dgpo_n, dgpo_m."""
    s = x.settings
    epsilon_low = s.get("epsilon", 0.2)
    epsilon_high = s.get("epsilon_high")
    return dgpo_loss(
        x.per_token_logps,
        x.old_per_token_logps,
        x.advantages,
        x.mask,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_low if epsilon_high is None else epsilon_high,
        n=s.get("dgpo_n", 1.0),
        m=s.get("dgpo_m", 2.0),
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
