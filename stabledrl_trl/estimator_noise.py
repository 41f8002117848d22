"""Pure estimator noise in the importance weights, measured with the trainer's own scoring.

At theta = theta_old the true sequence log-ratio log pi_theta(y) - log pi_old(y) is 0, so whatever a trainer computes
there is noise of the likelihood estimator alone. This module measures it by calling a built `StableDRLTrainer`'s
own scoring hook (`_get_per_token_logps_and_entropies`, i.e. `family.estimate` with the trainer's `args`) on the
mask streams the trainer itself uses:

- old policy: with `mask_seed_mode="fresh"` the stream scored right after generation (`(_STREAM_OLD, step)`); with
  `"shared"` the inner iteration's stream (`(_STREAM_ITER, step, j)`);
- current policy at inner step j: `(_STREAM_STEP, step, j)` (fresh) or `(_STREAM_ITER, step, j)` (shared).

A pair is one (old, current) estimate of one completion at theta = theta_old; pairs of different `step`s draw
independent masks. The sequence log-ratio is the objectives' `SEQUENCE_INPUT` (the masked mean over completion
tokens of the per-token log-ratio, `PolicyLossInputs.sequence_mean`), so its exponential is the weight that
`grpo_seq` and `stable_drl` consume before clipping. Shared masks give exactly 0 (the same masks for both). With
`test_log_ratio_noise_std` > 0 the test-only noise is added per row as the trainer adds it (`noise_dose`).

    summary = measure_trainer_noise(trainer, prompts, pairs=512, seed=0)
    summary["log_ratio_sd"], summary["weight_max"]
"""

from __future__ import annotations

import math

import torch

from .evaluation import left_pad, render_prompt
from .noise_dose import log_ratio_noise


def noise_streams(mask_seed_mode: str, step: int, inner_step: int = 0) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(old stream, current stream) of the trainer's mask seeds for one generation step and inner step."""
    from .rollout_rows import _STREAM_ITER, _STREAM_OLD, _STREAM_STEP

    if mask_seed_mode == "shared":
        return (_STREAM_ITER, step, inner_step), (_STREAM_ITER, step, inner_step)
    if mask_seed_mode == "fresh":
        return (_STREAM_OLD, step), (_STREAM_STEP, step, inner_step)
    raise ValueError(f"mask_seed_mode={mask_seed_mode!r}: expected 'fresh' or 'shared'.")


def trainer_rollouts(trainer, prompts: list, generator: torch.Generator):
    """(prompt_ids (B, P), prompt_mask (B, P), completion_ids (B, C), completion_mask (B, C)): one rollout per prompt
    with the trainer's own sampler and settings (`family.generate(adapter, ..., trainer.args)`), no gradient."""
    tokenizer = trainer.processing_class
    ids = [tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in prompts]
    prompt_ids, prompt_mask = left_pad(ids, tokenizer.pad_token_id)
    model = trainer.model
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = trainer._diffusion_family.generate(
                trainer._adapter(model), prompt_ids, prompt_mask, trainer.args,
                eos_token_ids=tuple(trainer.eos_token_ids), generator=generator,
            )  # fmt: skip
    finally:
        model.train(was_training)
    return prompt_ids, prompt_mask, out.completion_ids, out.completion_mask


def pure_noise_log_ratios(
    trainer, prompt_ids, prompt_mask, completion_ids, completion_mask, *, draws: int = 1, inner_step: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence log-ratios (draws * B,), largest per-token log-ratio of each pair (draws * B,)) at theta = theta_old.

    Draw d scores every completion twice with the trainer's hook, on the old and the current mask streams of
    generation step d (`noise_streams`). The sequence log-ratio of a pair is
        log w = sum_t m_t (l_t^cur - l_t^old) / sum_t m_t,
    l_t the per-token values of the estimate (B, C), m the completion mask.
    """
    scoring = trainer._scoring
    saved = (scoring.mask_stream, scoring.mask_rows)
    ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + C)
    attn = torch.cat([prompt_mask, completion_mask], dim=1)  # (B, P + C)
    c = completion_ids.shape[1]
    mask = completion_mask.bool()  # (B, C)
    sequence, token_max = [], []
    model = trainer.model
    was_training = model.training
    model.eval()  # dropout off: theta is exactly theta_old for both estimates
    try:
        with torch.no_grad():
            for d in range(draws):
                old_stream, cur_stream = noise_streams(trainer.args.mask_seed_mode, d, inner_step)
                values = []
                for stream in (old_stream, cur_stream):
                    scoring.mask_stream, scoring.mask_rows = stream, None  # rows keyed by their index
                    logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, attn, c)
                    values.append(logps.double())  # (B, C)
                log_r = torch.where(mask, values[1] - values[0], 0.0)  # (B, C)
                if trainer.args.test_log_ratio_noise_std > 0:  # the test-only noise, as the trainer adds it
                    eps = log_ratio_noise(torch.arange(ids.shape[0]), trainer.args.seed, d, inner_step,
                                          trainer.args.test_log_ratio_noise_std)  # fmt: skip
                    log_r = torch.where(mask, log_r + eps[:, None], 0.0)
                sequence.append(log_r.sum(-1) / mask.sum(-1).clamp(min=1))  # (B,)
                token_max.append(torch.where(mask, log_r, -math.inf).max(-1).values)  # (B,)
    finally:
        scoring.mask_stream, scoring.mask_rows = saved
        model.train(was_training)
    rows = mask.any(-1).repeat(draws)  # (draws * B,): completions with no scored token have no ratio
    return torch.cat(sequence)[rows], torch.cat(token_max)[rows]


def noise_summary(log_ratios: torch.Tensor, token_max: torch.Tensor | None = None, clip_c: float = 5.0) -> dict:
    """Statistics of pure-noise sequence log-ratios (N,): sd, mean (with its standard error), the largest |log w|,
    the largest weight exp(max log w), the fraction of weights above clip_c (clipped by StableDRL's upper bound)
    and below 1 / clip_c, and (with token_max) the largest per-token weight."""
    x = log_ratios.double()
    n = x.numel()
    if n < 2:
        raise ValueError(f"noise_summary needs at least 2 log-ratios, got {n}.")
    sd = x.std().item()
    out = {
        "pairs": n,
        "log_ratio_sd": sd,
        "log_ratio_mean": x.mean().item(),
        "log_ratio_mean_se": sd / math.sqrt(n),
        "log_ratio_abs_max": x.abs().max().item(),
        "weight_max": math.exp(min(x.max().item(), 700.0)),
        "weight_min": math.exp(max(x.min().item(), -700.0)),
        "frac_above_clip_c": (x > math.log(clip_c)).double().mean().item(),
        "frac_below_inv_clip_c": (x < -math.log(clip_c)).double().mean().item(),
        "clip_c": clip_c,
    }
    if token_max is not None:
        out["token_weight_max"] = math.exp(min(token_max.double().max().item(), 700.0))
    return out


def measure_trainer_noise(trainer, prompts: list, *, pairs: int = 512, seed: int = 0, clip_c: float = 5.0) -> dict:
    """`noise_summary` of `pairs` pure-noise pairs: one rollout per prompt (the trainer's sampler, generator seeded
    with `seed`), prompts cycled as the trainer's groups are (each prompt `num_generations` times in a row), scored
    once per pair (`pure_noise_log_ratios`, one draw). Adds the number of scored tokens per completion (mean, min,
    max) and the scoring setting (estimator, mc_samples, estimator_block_size, mask_seed_mode)."""
    g = trainer.args.num_generations
    rows = [prompts[(i // g) % len(prompts)] for i in range(pairs)]
    generator = torch.Generator().manual_seed(seed)
    pid, pm, cid, cm = trainer_rollouts(trainer, rows, generator)
    log_r, token_max = pure_noise_log_ratios(trainer, pid, pm, cid, cm, draws=1)
    lengths = cm.sum(-1).double()
    args = trainer.args
    return {
        **noise_summary(log_r, token_max, clip_c),
        "scored_tokens_mean": lengths.mean().item(),
        "scored_tokens_min": int(lengths.min().item()),
        "scored_tokens_max": int(lengths.max().item()),
        "likelihood_estimator": args.likelihood_estimator,
        "mc_samples": args.mc_samples,
        "estimator_block_size": args.estimator_block_size,
        "mask_seed_mode": args.mask_seed_mode,
        "rollout_seed": seed,
    }
