"""Likelihood estimators for masked diffusion LMs: log pi(completion | prompt), length-normalised.

A masked diffusion LM has no tractable sequence likelihood; GRPO-style ratios are built from estimates of it, and the
estimators' noise is what makes those ratios noisy. Every estimator here has the same shape:

1. draw K masks per row (`stabledrl_trl.diffusion.masking`: counter-based, so each row's masks depend only on the seed,
   its row index, the sample index and positions, never on padding width or other rows; `seed` is an int, a
   torch.Generator (one int drawn) or a (B,) integer tensor of per-row seeds, which makes a row's masks independent of
   its index too);
2. replace masked tokens by the mask token and run the model on the (B*K, P+C) rows [prompt, completion] with
   attention_mask = [prompt_mask, completion_mask], in chunks of `chunk_size` rows;
3. read log p(true token) and the entropy at every completion position of every sample, and combine them with
   per-(sample, position) weights w (B, K, C):  token_logps[b, j] = sum_k w[b, k, j] * log p_k(y_j).

The weights are chosen so that the masked mean of token_logps over the real completion tokens is the sequence
estimate (seq_logps):
- "mean_field" (d1 / diffu-GRPO): all completion tokens masked, one pass; w = 1 on real tokens.
- "mc_elbo" / "block_random" (per-token mean, as the official StableDRL code): per sample, the mean of log p over its
  masked real tokens; estimate = mean over samples. w = mask * n_real / (K * n_masked).
- "mc_elbo_inv_t" (LLaDA / MDLM, 1/t-weighted): per sample sum over masked of log p / (p * n_real), p the sample's
  masking probability; estimate = mean over samples. w = mask / (K * p) (0 for a sample whose draw masked nothing).
- "block_random_coupled": block_random's masks in complementary pairs inside the chosen block (each pass has
  block_random's distribution, so the expectation is block_random's); same per-token-mean weights.
- "coupled" (DiffuCoder / ESPO): complementary mask pairs, each real token scored once per pair; w = mask / (number
  of passes in which the token is masked).
- "sdmc" / "sdmc_coupled" (semi-deterministic Monte Carlo, GDPO): Gauss-Legendre times t_i with weights omega_i; at
  node i, round(t_i n_real) random positions masked (with "sdmc_coupled" also their complement in a second pass);
  estimate = sum_i omega_i * (mean of log p over the node's masked real tokens). w = mask * n_real * omega / n_masked.

Every estimate is the mean of U independent units (`sample_seq_logps`, (B, U)): one pass each for mean_field,
mc_elbo, mc_elbo_inv_t and block_random, one pair for coupled and block_random_coupled, one repeat of all nodes for
sdmc. Their spread gives the estimate's standard error without another forward pass (`estimator_standard_error`).

Padding (mask 0) is never masked, keeps its ids, is not attended to and has weight 0; completion tokens after the
first EOS carry mask 0 and are padding too. A row with no real completion token gets estimate 0.

Memory: when gradients are enabled and there is more than one chunk, each chunk's forward + gather runs under
`torch.utils.checkpoint` (non-reentrant): only the chunk's (rows, C) outputs are kept, and activations are recomputed
chunk by chunk in backward, so raising K raises time, not peak memory, beyond one chunk.

SPG's EUBO_beta (upper bound used for negative advantages) is returned when `eubo_beta` is given, for any estimator:
(1/beta) * mean over real tokens masked in at least one sample of log((1/K) sum_k p_k^beta 1[masked in k] / t_hat_k),
t_hat_k the realised mask ratio of the sample's real completion tokens; computed with logsumexp.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from stabledrl_trl.diffusion.masking import (
    Masks,
    Seed,
    block_random_coupled_masks,
    block_random_masks,
    check_num_samples,
    check_probability,
    coupled_masks,
    mean_field_masks,
    random_ratio_masks,
    resolve_seed,
    sdmc_masks,
)

LogitsFn = Callable[[Tensor, Tensor], Tensor]  # (input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V)
# A logits_fn with attribute `two_copy = True` (stabledrl_trl.diffusion.block_estimators.StaircaseLogits) is given
# (N, 2L) rows [masked copy || clean copy] and their (N, 2L) attention mask, and returns the masked copy's logits
# (N, L, V), which are scored.


@dataclass
class LikelihoodEstimate:
    """Output of every estimator.

    token_logps: (B, C) per-token contributions, 0 where completion_mask == 0, differentiable; their masked mean over
        completion_mask equals seq_logps.
    seq_logps: (B,) length-normalised sequence estimate (per-token mean scale), differentiable.
    token_entropy: (B, C) entropy of the predicted distributions, combined like token_logps (mc_elbo_inv_t uses the
        per-token-mean weights so the values stay on the entropy scale), detached, for logging.
    eubo: (B,) SPG's EUBO_beta when eubo_beta was given, else None; differentiable.
    sample_seq_logps: (B, U) the sequence estimates of the U independent units (passes, pairs or repeats) whose mean
        is seq_logps, detached.
    """

    token_logps: Tensor
    seq_logps: Tensor
    token_entropy: Tensor
    eubo: Tensor | None = None
    sample_seq_logps: Tensor | None = None


# ----------------------------------------------------------------------------------------------------------------------
# Shared machinery


def _check_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask, mask_token_id, chunk_size, eubo_beta):
    for name, t in (
        ("prompt_ids", prompt_ids),
        ("prompt_mask", prompt_mask),
        ("completion_ids", completion_ids),
        ("completion_mask", completion_mask),
    ):
        if not isinstance(t, Tensor) or t.dim() != 2:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 2-D tensor, got {shape}")
    if prompt_ids.shape != prompt_mask.shape:
        raise ValueError(
            f"prompt_ids {tuple(prompt_ids.shape)} and prompt_mask {tuple(prompt_mask.shape)} must have the same shape"
        )
    if completion_ids.shape != completion_mask.shape:
        raise ValueError(
            f"completion_ids {tuple(completion_ids.shape)} and completion_mask {tuple(completion_mask.shape)} must "
            f"have the same shape"
        )
    if prompt_ids.shape[0] != completion_ids.shape[0]:
        raise ValueError(
            f"prompt_ids has {prompt_ids.shape[0]} rows but completion_ids has {completion_ids.shape[0]}; pass one "
            f"prompt row per completion (repeat prompts for the completions of a group)"
        )
    if completion_ids.shape[1] == 0:
        raise ValueError("completion_ids has zero columns; pass at least one completion position")
    for name, m in (("prompt_mask", prompt_mask), ("completion_mask", completion_mask)):
        if m.numel() and not bool(((m == 0) | (m == 1)).all()):
            raise ValueError(f"{name} must hold only 0 and 1 (1 = real token), got values {m.unique().tolist()[:8]}")
    if isinstance(mask_token_id, bool) or not isinstance(mask_token_id, int) or mask_token_id < 0:
        raise ValueError(f"mask_token_id must be a non-negative int (the model's mask token), got {mask_token_id!r}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(
            f"chunk_size must be a positive int (rows per forward pass) or None (all), got {chunk_size!r}"
        )
    if eubo_beta is not None and (
        isinstance(eubo_beta, bool) or not isinstance(eubo_beta, (int, float)) or not eubo_beta > 0
    ):
        raise ValueError(f"eubo_beta must be a positive number (SPG uses 1.5) or None, got {eubo_beta!r}")


def _masked_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask, masks: Masks, mask_token_id: int):
    """(B*K, P+C) input ids with masked tokens replaced by the mask id, and the matching attention mask.

    completion_mask here is what the model attends in the completion: the scored tokens, or the wider context mask.
    """
    B, K, _ = masks.completion.shape
    prompt = prompt_ids[:, None, :].expand(B, K, -1)  # (B, K, P)
    completion = completion_ids[:, None, :].expand(B, K, -1)  # (B, K, C)
    prompt = torch.where(masks.prompt, torch.full_like(prompt, mask_token_id), prompt)
    completion = torch.where(masks.completion, torch.full_like(completion, mask_token_id), completion)
    input_ids = torch.cat([prompt, completion], dim=-1).reshape(B * K, -1)  # (B*K, P+C)
    attention = torch.cat([prompt_mask, completion_mask], dim=-1).to(prompt_ids.dtype)  # (B, P+C)
    attention = attention[:, None, :].expand(B, K, -1).reshape(B * K, -1)  # (B*K, P+C)
    return input_ids, attention


def _chunk_logps(logits_fn: LogitsFn, input_ids: Tensor, attention_mask: Tensor, targets: Tensor, prompt_len: int):
    """log p(target) and entropy at the completion positions of one chunk: (n, C) each (entropy detached)."""
    n, L = input_ids.shape
    C = targets.shape[1]
    if getattr(logits_fn, "accepts_logits_to_keep", False):
        # Only the completion positions go through the output head (a DiffusionAdapter).
        keep = torch.arange(prompt_len, prompt_len + C, device=input_ids.device)  # (C,)
        logits = logits_fn(input_ids, attention_mask, logits_to_keep=keep)  # (n, C, V)
        expected, offset = (n, C), 0
    else:
        logits = logits_fn(input_ids, attention_mask)  # (n, L, V)
        if getattr(logits_fn, "two_copy", False):
            L //= 2  # a two-copy logits_fn returns the logits of the masked copy only
        expected, offset = (n, L), prompt_len
    if logits.dim() != 3 or tuple(logits.shape[:2]) != expected:
        raise ValueError(
            f"logits_fn must return logits of shape (N, L, V) = ({n}, {L}, V) aligned with input positions, got "
            f"{tuple(logits.shape)}"
        )
    # (n, C, V) at the completion positions; float32 for a stable softmax whatever the model dtype
    logits = logits[:, offset : offset + C].float()
    log_z = torch.logsumexp(logits, dim=-1)  # (n, C)
    logp = logits.gather(-1, targets[..., None]).squeeze(-1) - log_z  # (n, C)
    with torch.no_grad():
        # entr(p) = -p log p, 0 at p = 0 (e.g. -inf logits); one (n, C, V) temporary besides the probabilities
        entropy = torch.special.entr(torch.softmax(logits, dim=-1)).sum(-1)  # (n, C)
    return logp, entropy


def _score(logits_fn, input_ids, attention_mask, targets, prompt_len: int, chunk_size: int | None):
    """Run the model over all rows in chunks; returns log p (N, C) and entropy (N, C)."""
    N = input_ids.shape[0]
    size = N if chunk_size is None else min(chunk_size, N)
    starts = range(0, N, size)
    use_checkpoint = torch.is_grad_enabled() and len(starts) > 1
    logps, entropies = [], []
    for s in starts:
        args = (input_ids[s : s + size], attention_mask[s : s + size], targets[s : s + size])
        if use_checkpoint:
            # Keep only this chunk's (rows, C) outputs; its activations are recomputed during backward.
            logp, ent = checkpoint(
                _chunk_logps, logits_fn, *args, prompt_len, use_reentrant=False, preserve_rng_state=True
            )
        else:
            logp, ent = _chunk_logps(logits_fn, *args, prompt_len)
        logps.append(logp)
        entropies.append(ent)
    return torch.cat(logps), torch.cat(entropies)


def _eubo(logp: Tensor, masked: Tensor, real: Tensor, beta: float) -> Tensor:
    """SPG's EUBO_beta per row (B,), from per-sample log p (B, K, C), masks (B, K, C) and real tokens (B, C)."""
    K = logp.shape[1]
    masked = masked & real[:, None, :]  # (B, K, C)
    n_masked = masked.sum(-1).clamp(min=1)  # (B, K)
    n_real = real.sum(-1).clamp(min=1)  # (B,)
    log_t_hat = n_masked.double().log() - n_real.double().log()[:, None]  # (B, K) realised mask ratio
    terms = beta * logp - log_t_hat[..., None].to(logp.dtype)  # (B, K, C): log(p^beta / t_hat)
    terms = torch.where(masked, terms, torch.full_like(terms, -math.inf))
    seen = masked.any(dim=1)  # (B, C) masked in at least one sample
    # never-masked columns would be logsumexp of all -inf (nan gradients): give them zeros, dropped below
    terms = torch.where(seen[:, None, :], terms, torch.zeros_like(terms))
    log_mean = torch.logsumexp(terms, dim=1) - math.log(K)  # (B, C)
    per_token = torch.where(seen, log_mean / beta, torch.zeros_like(log_mean))
    return per_token.sum(-1) / seen.sum(-1).clamp(min=1)


def _estimate(
    logits_fn,
    prompt_ids,
    prompt_mask,
    completion_ids,
    completion_mask,
    masks: Masks,
    weights: Tensor,
    *,
    mask_token_id: int,
    chunk_size: int | None,
    eubo_beta: float | None,
    entropy_weights: Tensor | None = None,
    context_mask: Tensor | None = None,
    mask_context: bool = False,
    unit_size: int = 1,
) -> LikelihoodEstimate:
    """Forward the masked rows, then combine per-sample log p with the (B, K, C) weights.

    unit_size: consecutive passes forming one independent unit of the estimate (1, or 2 for complementary pairs).

    context_mask (B, C), optional: completion positions the model attends beyond the scored ones (e.g. the EOS tail
    of a fixed-length diffusion canvas). Never scored; visible tokens, or, with mask_context, mask tokens in every
    sample (the official StableDRL code masks the whole tail after the first EOS).
    """
    B, K, C = masks.completion.shape
    P = prompt_ids.shape[1]
    real = completion_mask.bool()  # (B, C)
    attended = completion_mask if context_mask is None else (context_mask.bool() | real).to(completion_mask.dtype)
    if mask_context and context_mask is not None:
        tail = context_mask.bool() & ~real  # (B, C) attended, unscored positions
        masks.completion = masks.completion | tail[:, None, :]
    input_ids, attention = _masked_inputs(prompt_ids, prompt_mask, completion_ids, attended, masks, mask_token_id)
    if getattr(logits_fn, "two_copy", False):
        # [noisy || clean]: the clean copy of each row follows its masked copy (block-diffusion "staircase" layout)
        clean = torch.cat([prompt_ids, completion_ids], dim=-1)[:, None, :].expand(B, K, -1).reshape(B * K, -1)
        input_ids = torch.cat([input_ids, clean], dim=-1)  # (B*K, 2(P+C))
        attention = torch.cat([attention, attention], dim=-1)
    # padding may hold any id; gather a valid one there (its weight is 0)
    targets = torch.where(real, completion_ids, torch.zeros_like(completion_ids))  # (B, C)
    targets = targets[:, None, :].expand(B, K, C).reshape(B * K, C)
    logp, entropy = _score(logits_fn, input_ids, attention, targets, P, chunk_size)
    logp = logp.reshape(B, K, C)
    entropy = entropy.reshape(B, K, C)

    weights = weights.to(logp.dtype)
    used = weights != 0
    # where, not multiply: a model may return non-finite logits at unscored (e.g. padding) positions
    token_logps = torch.where(used, weights * logp, torch.zeros_like(logp)).sum(dim=1)  # (B, C)
    ew = weights if entropy_weights is None else entropy_weights.to(logp.dtype)
    token_entropy = torch.where(ew != 0, ew * entropy, torch.zeros_like(entropy)).sum(dim=1)  # (B, C)
    n_real = real.sum(-1).clamp(min=1).to(logp.dtype)  # (B,)
    seq_logps = (token_logps * real).sum(-1) / n_real
    eubo = None if eubo_beta is None else _eubo(logp, masks.completion, real, float(eubo_beta))
    with torch.no_grad():
        # each pass's share of seq_logps, summed within a unit and scaled by U: the units' mean is seq_logps
        share = torch.where(used & real[:, None, :], weights * logp, torch.zeros_like(logp)).sum(-1) / n_real[:, None]
        units = K // unit_size
        samples = share.reshape(B, units, unit_size).sum(-1) * units  # (B, U)
    return LikelihoodEstimate(token_logps, seq_logps, token_entropy.detach(), eubo, samples)


def estimator_standard_error(samples: Tensor) -> Tensor:
    """(B,) standard error of each row's estimate from its (B, U) unit values: std over units / sqrt(U).

    NaN for U < 2 (the spread of one unit is unknown). The units are independent draws, except that block_random's
    passes (and block_random_coupled's pairs) take different blocks of one permutation: negatively correlated, which
    makes this an overestimate there.
    """
    U = samples.shape[-1]
    if U < 2:
        return torch.full(samples.shape[:-1], math.nan, dtype=samples.dtype, device=samples.device)
    return samples.std(dim=-1) / math.sqrt(U)


# (per-row seeds (B,) or an int, prompt_mask (B, P), completion_mask (B, C)) -> Masks
MaskDraw = Callable[[Tensor | int, Tensor, Tensor], Masks]
Weigh = Callable[[Masks, Tensor], Tensor]  # (masks, real completion tokens (B, C) bool) -> weights (B, K, C)


def _mean_field_weights(masks: Masks, real: Tensor) -> Tensor:
    """(B, K, C): 1/K on every masked token (mean_field masks exactly the real completion tokens)."""
    return masks.completion / masks.completion.shape[1]


def _per_token_mean_weights(masks: Masks, real: Tensor) -> Tensor:
    """(B, K, C) weights of the per-token-mean form: mean over samples of the mean over masked real tokens, or, where
    the masks carry a quadrature weight (B, K) (sdmc), the weighted sum over samples of those means."""
    K = masks.completion.shape[1]
    masked = masks.completion & real[:, None, :]
    n_masked = masked.sum(-1, keepdim=True).clamp(min=1)  # (B, K, 1)
    n_real = real.sum(-1)[:, None, None]  # (B, 1, 1)
    if masks.weight is None:
        return masked * n_real / (K * n_masked)
    return masked * n_real * masks.weight[..., None] / n_masked


def _inv_t_weights(masks: Masks, real: Tensor) -> Tensor:
    """(B, K, C) weights of the 1/t ELBO: mask / (K p), p the sample's masking probability.

    A sample whose draw masked nothing contributes 0 to the 1/t ELBO; the token the at-least-one rule masked in it
    must not be scored with weight 1/p (that would add a term growing like log(1/eps)), so such samples get weight 0.
    """
    masked = masks.completion & real[:, None, :] & ~masks.fallback[..., None]
    return masked / (masks.completion.shape[1] * masks.mask_prob[..., None])


def _coupled_weights(masks: Masks, real: Tensor) -> Tensor:
    """(B, K, C): each real token's log p averaged over the passes that mask it."""
    masked = masks.completion & real[:, None, :]
    return masked / masked.sum(dim=1, keepdim=True).clamp(min=1)


@dataclass(frozen=True, eq=False)
class EstimatorInputs:
    """The inputs every likelihood estimator shares, handed to it as one value (`shared_keywords` builds it from the
    estimators' common keyword signature), so an estimator declares only its own options.

    logits_fn: the model, (input_ids (N, L), attention_mask (N, L)) -> logits (N, L, V) (see `LogitsFn`).
    prompt_ids, prompt_mask: (B, P), left-padded. completion_ids, completion_mask: (B, C), right-padded; the mask is 1
        on the scored tokens (up to and including the first EOS).
    mask_token_id: the model's mask token. seed: an int, a torch.Generator or (B,) per-row seeds (`masking.Seed`).
    num_samples: forward passes per completion (None: the estimator derives it from its options, as sdmc).
    p_mask_prompt: probability of masking each prompt token. chunk_size: rows per forward pass (None: all).
    eubo_beta: SPG's EUBO_beta is returned when given. context_mask (B, C): attended, never scored completion
        positions (the rollout's EOS tail); mask_context: show them as mask tokens (the official StableDRL code).
    """

    logits_fn: LogitsFn
    prompt_ids: Tensor  # (B, P)
    prompt_mask: Tensor  # (B, P)
    completion_ids: Tensor  # (B, C)
    completion_mask: Tensor  # (B, C)
    mask_token_id: int
    seed: Seed
    num_samples: int | None
    p_mask_prompt: float
    chunk_size: int | None = None
    eubo_beta: float | None = None
    context_mask: Tensor | None = None  # (B, C)
    mask_context: bool = False


# The keywords every estimator takes besides its own options (the fields of `EstimatorInputs` after the tensors).
SHARED_KEYWORDS = tuple(f.name for f in fields(EstimatorInputs))[5:]


def shared_keywords(*, num_samples: int | None, p_mask_prompt: float):
    """Decorator: an estimator written as `fn(x: EstimatorInputs, *, own options) -> LikelihoodEstimate` becomes the
    public estimator `fn(logits_fn, prompt_ids, prompt_mask, completion_ids, completion_mask, *, mask_token_id, seed,
    num_samples=num_samples, p_mask_prompt=p_mask_prompt, chunk_size=None, eubo_beta=None, context_mask=None,
    mask_context=False, **own options)`, with that signature (the registry reads its defaults). `num_samples` and
    `p_mask_prompt` are the estimator's defaults; the function written on the inputs stays reachable as
    `.on_inputs` (to build an estimator on another one)."""

    def wrap(on_inputs: Callable[..., LikelihoodEstimate]) -> Callable[..., LikelihoodEstimate]:
        own = list(inspect.signature(on_inputs).parameters.values())[1:]
        wrong = [p.name for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY or p.name in SHARED_KEYWORDS]
        if wrong:
            raise TypeError(
                f"estimator {on_inputs.__name__}: its own options {wrong} must be keyword-only (after `*`) and not "
                f"one of the shared keywords {list(SHARED_KEYWORDS)}, which reach it as fields of its EstimatorInputs."
            )

        def estimator(
            logits_fn, prompt_ids, prompt_mask, completion_ids, completion_mask, *, mask_token_id, seed,
            num_samples=num_samples, p_mask_prompt=p_mask_prompt, chunk_size=None, eubo_beta=None, context_mask=None,
            mask_context=False, **options,
        ) -> LikelihoodEstimate:  # fmt: skip
            x = EstimatorInputs(
                logits_fn, prompt_ids, prompt_mask, completion_ids, completion_mask, mask_token_id, seed, num_samples,
                p_mask_prompt, chunk_size, eubo_beta, context_mask, mask_context,
            )  # fmt: skip
            return on_inputs(x, **options)

        shared = list(inspect.signature(estimator).parameters.values())[:-1]  # without **options
        functools.update_wrapper(estimator, on_inputs)
        estimator.__signature__ = inspect.Signature([*shared, *own], return_annotation=LikelihoodEstimate)
        estimator.on_inputs = on_inputs
        return estimator

    return wrap


def _run(
    draw_masks: MaskDraw, weigh: Weigh, x: EstimatorInputs, *, unit_size: int = 1, weigh_entropy: Weigh | None = None
) -> LikelihoodEstimate:
    """What every estimator does: check the inputs, draw the masks from per-row seeds, weigh them, score.

    draw_masks: the estimator's mask sampler with its own options bound; weigh: its weight rule; weigh_entropy: the
    rule for the entropy (None: the same weights).
    """
    _check_inputs(
        x.prompt_ids, x.prompt_mask, x.completion_ids, x.completion_mask, x.mask_token_id, x.chunk_size, x.eubo_beta
    )
    masks = draw_masks(resolve_seed(x.seed, x.completion_ids.shape[0]), x.prompt_mask, x.completion_mask)
    real = x.completion_mask.bool()  # (B, C)
    # both rules read the masks as drawn, before _estimate masks the context tail
    weights = weigh(masks, real)  # (B, K, C)
    entropy_weights = None if weigh_entropy is None else weigh_entropy(masks, real)  # (B, K, C)
    return _estimate(
        x.logits_fn, x.prompt_ids, x.prompt_mask, x.completion_ids, x.completion_mask, masks, weights,
        mask_token_id=x.mask_token_id, chunk_size=x.chunk_size, eubo_beta=x.eubo_beta, entropy_weights=entropy_weights,
        context_mask=x.context_mask, mask_context=x.mask_context, unit_size=unit_size,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------------
# Estimators


@shared_keywords(num_samples=1, p_mask_prompt=0.15)
def mean_field(x: EstimatorInputs) -> LikelihoodEstimate:
    """d1's one-step mean-field proxy: every completion token masked, prompt tokens w.p. p_mask_prompt.

    token_logps = log p(y_j) at each completion position; with num_samples > 1 (different prompt masks) averaged.
    """
    draw = partial(mean_field_masks, num_samples=x.num_samples, p_mask_prompt=x.p_mask_prompt)
    return _run(draw, _mean_field_weights, x)


@shared_keywords(num_samples=2, p_mask_prompt=0.0)
def mc_elbo(x: EstimatorInputs, *, t_sampling: str = "uniform", eps: float = 1e-3) -> LikelihoodEstimate:
    """Monte-Carlo ELBO, per-token-mean form (the official StableDRL code): no 1/t weight.

    Per sample: t uniform in (0, 1] (or stratified), each real completion token masked w.p. eps + (1 - eps) t, at least
    one masked (see `random_ratio_masks`); sample value = mean of log p over its masked real tokens. Estimate = mean
    over samples.
    """
    draw = partial(
        random_ratio_masks, num_samples=x.num_samples, t_sampling=t_sampling, eps=eps, p_mask_prompt=x.p_mask_prompt
    )
    return _run(draw, _per_token_mean_weights, x)


@shared_keywords(num_samples=2, p_mask_prompt=0.0)
def mc_elbo_inv_t(x: EstimatorInputs, *, t_sampling: str = "uniform", eps: float = 1e-3) -> LikelihoodEstimate:
    """Monte-Carlo ELBO with LLaDA / MDLM's 1/t weight, divided by the completion length.

    Same masks as `mc_elbo`; sample value = (sum of log p over masked real tokens) / (p * n_real), p = eps + (1-eps) t
    the sample's masking probability. Estimate = mean over samples (the length-normalised ELBO). A sample whose draw
    masked no token is worth 0 here, as in the ELBO itself: the token the at-least-one rule masks in it is run through
    the model but gets weight 0, which keeps the estimate unbiased for the ELBO (weighting it by 1/p would add a bias
    of order log(1/eps) / n_real^2 per token).
    """
    draw = partial(
        random_ratio_masks, num_samples=x.num_samples, t_sampling=t_sampling, eps=eps, p_mask_prompt=x.p_mask_prompt
    )
    return _run(draw, _inv_t_weights, x, weigh_entropy=_per_token_mean_weights)


@shared_keywords(num_samples=2, p_mask_prompt=0.15)
def block_random(x: EstimatorInputs, *, block_size: int = 32) -> LikelihoodEstimate:
    """SPG's block-random ELBO (the official StableDRL code): masks from `block_random_masks`, per-token-mean form."""
    draw = partial(block_random_masks, num_samples=x.num_samples, block_size=block_size, p_mask_prompt=x.p_mask_prompt)
    return _run(draw, _per_token_mean_weights, x)


@shared_keywords(num_samples=2, p_mask_prompt=0.15)
def block_random_coupled(x: EstimatorInputs, *, block_size: int = 32) -> LikelihoodEstimate:
    """The official block-random estimate with complementary masks inside the chosen block (lower variance).

    Masks from `block_random_coupled_masks`: passes 2q, 2q+1 share a block (pairs take different blocks as the
    official permutation gives them) and split its real tokens into a random subset and its complement. Every pass has
    block_random's mask distribution, and the value is the same per-token mean averaged over passes, so the
    expectation equals block_random's (the SPG bound of the official code), and the EUBO_beta of the sandwich is the
    same formula on these masks. num_samples counts passes (even).
    """
    draw = partial(
        block_random_coupled_masks, num_samples=x.num_samples, block_size=block_size, p_mask_prompt=x.p_mask_prompt
    )
    return _run(draw, _per_token_mean_weights, x, unit_size=2)


@shared_keywords(num_samples=None, p_mask_prompt=0.0)
def sdmc(x: EstimatorInputs, *, nodes: int = 3) -> LikelihoodEstimate:
    """Semi-deterministic Monte-Carlo ELBO (GDPO; Block-R1, NeMo-RL): Gauss-Legendre quadrature over t.

        ELBO / n = int_0^1 (1/(t n)) E[sum of log p over tokens masked w.p. t] dt
                ~= sum_i omega_i * (1/m_i) sum_{j in S_i} log p(y_j | y with S_i masked)

    t_i, omega_i: the `nodes`-point Gauss-Legendre rule on (0, 1) (`masking.gauss_legendre_times`); S_i a uniformly
    random set of m_i = round(t_i n) real tokens (at least 1; `masking.sdmc_counts`), n = real completion tokens.
    A node's sum is divided by the count m_i actually masked, not by t_i n: with the rounded count the 1/t weight
    m_i / (t_i n) is far from 1 on short completions (t = 0.047, n = 5: 4.3x), which biases the estimate. Cost: one
    pass per node; num_samples (passes, a multiple of nodes; None = nodes) averages repeats.
    """
    draw = partial(sdmc_masks, num_samples=x.num_samples, nodes=nodes, coupled=False, p_mask_prompt=x.p_mask_prompt)
    return _run(draw, _per_token_mean_weights, x, unit_size=nodes)


@shared_keywords(num_samples=None, p_mask_prompt=0.0)
def sdmc_coupled(x: EstimatorInputs, *, nodes: int = 3) -> LikelihoodEstimate:
    """`sdmc` with complementary masks at each node: the node's second pass masks the other real tokens.

    Node i's two passes (m_i and n - m_i masked, m_i clamped to [1, n - 1]) each get weight omega_i / 2, so the
    estimate is sum_i omega_i (mean over S_i + mean over the complement) / 2. Cost: two passes per node; num_samples
    (a multiple of 2 * nodes; None = 2 * nodes) averages repeats.
    """
    draw = partial(sdmc_masks, num_samples=x.num_samples, nodes=nodes, coupled=True, p_mask_prompt=x.p_mask_prompt)
    return _run(draw, _per_token_mean_weights, x, unit_size=2 * nodes)


@shared_keywords(num_samples=2, p_mask_prompt=0.0)
def coupled(x: EstimatorInputs) -> LikelihoodEstimate:
    """Coupled (complementary) masks, DiffuCoder / ESPO: each pair scores every real token exactly once.

    num_samples counts forward passes (even). Pair value = mean over real tokens of log p from the pass where the
    token was masked; estimate = mean over pairs. With one real token both passes mask it and it is averaged over them.
    """
    draw = partial(coupled_masks, num_samples=x.num_samples, p_mask_prompt=x.p_mask_prompt)
    return _run(draw, _coupled_weights, x, unit_size=2)


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered likelihood estimator and what the rest of the package derives from it (the config's accepted
    names and sample checks, `DiffusionFamily.estimator_options` / `num_mc_samples` / `estimator_passes`, the
    memory planner; none keeps its own list of estimators).

    fn: the estimator, called as `fn(logits_fn, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
    mask_token_id, seed, num_samples, p_mask_prompt, chunk_size, eubo_beta, context_mask, mask_context, **options)`
    (the shared keywords are `SHARED_KEYWORDS`), returning a `LikelihoodEstimate`. unit_passes: forward passes in one
    independent unit, an int or a function of the options (sdmc: its nodes). default_samples: the default number of
    passes, an int, a function of the options, or None for the `num_samples` default of fn's signature. options: {fn
    keyword: config field} of the estimator's own options (a field left None takes fn's default). even_samples:
    num_samples must be even (complementary pairs). max_samples: more passes than this would be ignored (with the
    reason, `max_samples_reason`). sandwich: SPG's EUBO is defined on its masks (`sandwich=True` accepts it).
    """

    name: str
    fn: Callable[..., LikelihoodEstimate]
    unit_passes: int | Callable[[Mapping[str, Any]], int] = 1
    default_samples: int | Callable[[Mapping[str, Any]], int] | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    even_samples: bool = False
    max_samples: int | None = None
    max_samples_reason: str = ""
    sandwich: bool = False

    def option_values(self, config) -> dict[str, Any]:
        """{fn keyword: value} of the estimator's own options under `config` (a field left None: fn's default)."""
        params = inspect.signature(self.fn).parameters
        values = {}
        for keyword, config_field in self.options.items():
            value = getattr(config, config_field, None)
            values[keyword] = params[keyword].default if value is None else value
        return values

    def passes_per_unit(self, options: Mapping[str, Any]) -> int:
        return self.unit_passes(self._with_defaults(options)) if callable(self.unit_passes) else self.unit_passes

    def default_num_samples(self, options: Mapping[str, Any]) -> int:
        if self.default_samples is None:
            return inspect.signature(self.fn).parameters["num_samples"].default
        if callable(self.default_samples):
            return self.default_samples(self._with_defaults(options))
        return self.default_samples

    def _with_defaults(self, options: Mapping[str, Any]) -> dict[str, Any]:
        params = inspect.signature(self.fn).parameters
        return {k: options.get(k, params[k].default) for k in self.options} | dict(options)


# Every likelihood estimator, by the name `likelihood_estimator` selects; `register_estimator` adds one.
ESTIMATOR_SPECS: dict[str, EstimatorSpec] = {}


class _EstimatorFunctions(Mapping):
    """`ESTIMATORS`: the registered estimators' functions by name, a live view of `ESTIMATOR_SPECS`."""

    def __getitem__(self, name: str) -> Callable[..., LikelihoodEstimate]:
        return ESTIMATOR_SPECS[name].fn

    def __iter__(self):
        return iter(ESTIMATOR_SPECS)

    def __len__(self) -> int:
        return len(ESTIMATOR_SPECS)


ESTIMATORS: Mapping[str, Callable[..., LikelihoodEstimate]] = _EstimatorFunctions()


def register_estimator(
    name: str,
    *,
    unit_passes: int | Callable[[Mapping[str, Any]], int] = 1,
    default_samples: int | Callable[[Mapping[str, Any]], int] | None = None,
    options: Mapping[str, str] | None = None,
    even_samples: bool = False,
    max_samples: int | None = None,
    max_samples_reason: str = "",
    sandwich: bool = False,
    replace: bool = False,
):
    """Decorator: register a likelihood estimator under `name` (see `EstimatorSpec`); `likelihood_estimator=name`
    is then accepted by the config and used by every family that scores with `estimate_likelihood` or
    `block_estimators.staircase_estimate`. `replace=True` swaps an estimator registered under the same name."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_estimator needs a non-empty name, got {name!r}.")
    if name in ESTIMATOR_SPECS and not replace:
        raise ValueError(f"an estimator named {name!r} is already registered; choose another name or pass replace=True.")

    def wrap(fn: Callable[..., LikelihoodEstimate]) -> Callable[..., LikelihoodEstimate]:
        params = inspect.signature(fn).parameters
        missing = [k for k in (*SHARED_KEYWORDS, *(options or {})) if k not in params]
        if missing:
            raise TypeError(
                f"estimator {name!r} ({fn.__name__}) does not take {missing}; an estimator takes (logits_fn, "
                f"prompt_ids, prompt_mask, completion_ids, completion_mask, *, {', '.join(SHARED_KEYWORDS)}) and its "
                "own options (an estimator written on EstimatorInputs gets them from @shared_keywords)."
            )
        if default_samples is None and params["num_samples"].default is inspect.Parameter.empty:
            raise TypeError(f"estimator {name!r}: give num_samples a default or pass default_samples=.")
        ESTIMATOR_SPECS[name] = EstimatorSpec(
            name=name,
            fn=fn,
            unit_passes=unit_passes,
            default_samples=default_samples,
            options=dict(options or {}),
            even_samples=even_samples,
            max_samples=max_samples,
            max_samples_reason=max_samples_reason,
            sandwich=sandwich,
        )
        return fn

    return wrap


def get_estimator_spec(name: str) -> EstimatorSpec:
    """The registered estimator `name` with its declarations."""
    _check_name(name)
    return ESTIMATOR_SPECS[name]


def _sdmc_passes(coupled: bool):
    def passes(options: Mapping[str, Any]) -> int:
        return options["nodes"] * (2 if coupled else 1)

    return passes


def _register_builtin_estimators() -> None:
    """The package's estimators, in the order the config lists them."""
    single = (
        "the one-step estimator masks every completion token and takes exactly one forward pass, so further samples "
        "would be ignored"
    )
    register_estimator("mean_field", max_samples=1, max_samples_reason=single)(mean_field)
    register_estimator("mc_elbo")(mc_elbo)
    register_estimator("mc_elbo_inv_t")(mc_elbo_inv_t)
    register_estimator("block_random", options={"block_size": "estimator_block_size"}, sandwich=True)(block_random)
    register_estimator(
        "block_random_coupled",
        unit_passes=2,
        even_samples=True,
        options={"block_size": "estimator_block_size"},
        sandwich=True,
    )(block_random_coupled)
    register_estimator("coupled", unit_passes=2, even_samples=True)(coupled)
    nodes = {"nodes": "sdmc_nodes"}
    register_estimator("sdmc", unit_passes=_sdmc_passes(False), default_samples=_sdmc_passes(False), options=nodes)(
        sdmc
    )
    register_estimator(
        "sdmc_coupled", unit_passes=_sdmc_passes(True), default_samples=_sdmc_passes(True), options=nodes
    )(sdmc_coupled)


_register_builtin_estimators()


def _check_name(name) -> None:
    if name not in ESTIMATOR_SPECS:
        raise ValueError(f"unknown likelihood estimator {name!r}; choose one of {sorted(ESTIMATOR_SPECS)}")


def passes_per_unit(name: str, nodes: int = 3, **options) -> int:
    """Forward passes in one independent unit of the estimator: 1, 2 for the paired forms, nodes (x 2) for sdmc."""
    return get_estimator_spec(name).passes_per_unit({"nodes": nodes, **options})


def default_num_samples(name: str, nodes: int = 3, **options) -> int:
    """The estimator's default number of forward passes per completion (1 for mean_field, one repeat of the nodes
    for sdmc, 2 otherwise)."""
    return get_estimator_spec(name).default_num_samples({"nodes": nodes, **options})


def estimator_cost(name: str, num_samples: int | None = None, nodes: int = 3, **options) -> int:
    """Forward passes per completion: num_samples for every estimator (mean_field: 1 by default; the paired forms: 2
    per pair; sdmc: one per node and repeat)."""
    spec = get_estimator_spec(name)
    k = default_num_samples(name, nodes, **options) if num_samples is None else num_samples
    check_num_samples(k, even=spec.even_samples)
    unit = passes_per_unit(name, nodes, **options)
    if k % unit:
        raise ValueError(f"num_samples={k} must be a multiple of {unit} for estimator {name!r} ({nodes} nodes)")
    return k


def estimate_likelihood(
    name: str,
    logits_fn: LogitsFn,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    mask_token_id: int,
    seed: Seed,
    num_samples: int | None = None,
    p_mask_prompt: float | None = None,
    chunk_size: int | None = None,
    eubo_beta: float | None = None,
    context_mask: Tensor | None = None,
    mask_context: bool = False,
    **estimator_kwargs,
) -> LikelihoodEstimate:
    """Estimate length-normalised log-likelihoods of completions with the estimator `name` (see ESTIMATORS).

    prompt_ids (B, P) left-padded with prompt_mask; completion_ids (B, C) right-padded with completion_mask (1 up to and
    including the first EOS), the tokens masked and scored. context_mask (B, C), optional, adds completion positions
    the model attends as visible, unmasked, unscored context (a diffusion rollout's EOS tail after the first EOS, which
    the model saw while generating); mask_context=True shows those positions as mask tokens instead (the official
    StableDRL code). num_samples / p_mask_prompt None take the estimator's defaults (mean_field: 1 / 0.15;
    mc_elbo, mc_elbo_inv_t: 2 / 0; block_random, block_random_coupled: 2 / 0.15; coupled: 2 / 0; sdmc: nodes / 0;
    sdmc_coupled: 2 nodes / 0). Extra keyword arguments go to the estimator (mc_elbo*: t_sampling, eps;
    block_random*: block_size; sdmc*: nodes).
    """
    _check_name(name)
    fn = ESTIMATORS[name]
    params = inspect.signature(fn).parameters
    allowed = [p for p in params if params[p].kind is inspect.Parameter.KEYWORD_ONLY]
    extra = sorted(set(estimator_kwargs) - set(allowed))
    if extra:
        own = sorted(set(allowed) - (set(SHARED_KEYWORDS) - {"context_mask"}))
        raise ValueError(f"estimator {name!r} does not take {extra}; its own options are {own}")
    kwargs = dict(estimator_kwargs)
    if num_samples is not None:
        kwargs["num_samples"] = num_samples
    if p_mask_prompt is not None:
        check_probability("p_mask_prompt", p_mask_prompt)
        kwargs["p_mask_prompt"] = p_mask_prompt
    return fn(
        logits_fn, prompt_ids, prompt_mask, completion_ids, completion_mask,
        mask_token_id=mask_token_id, seed=seed, chunk_size=chunk_size, eubo_beta=eubo_beta,
        context_mask=context_mask, mask_context=mask_context, **kwargs,
    )  # fmt: skip
