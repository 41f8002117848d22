"""Test-only noise of known size in the importance weights, for noise-dose studies (`scripts/bench_noise_dose.py`).

`StableDRLConfig.test_log_ratio_noise_std = s > 0` adds eps_i ~ N(0, s^2) to every completion's log-ratio:

    log w_i = (L_theta(y_i) - L_old(y_i)) + eps_i,

one draw per completion and inner step, seeded from (`seed`, the row's key, the generation step, the inner step), so
a row's draw does not depend on the batch layout and replays on resume. It is applied by subtracting eps_i from
every per-token old log-probability of the row: the sequence log-ratio (the masked token mean) moves by exactly
+eps_i, and so does each per-token log-ratio of per-token objectives. The old log-probabilities carry no gradient,
so the objective's gradient terms are unchanged; only the weights see the noise. This exists to vary the weight
noise at known levels on top of the estimator's own; never train a model you keep with it.
"""

from __future__ import annotations

import math

import torch

from .diffusion.seeding import mix_seed

NOISE_STREAM = 6  # a stream id of its own (the trainer's mask streams are 1-5)


def log_ratio_noise(row_keys: torch.Tensor, seed: int, step: int, inner_step: int, std: float) -> torch.Tensor:
    """eps (B,) float64 ~ N(0, std^2): one standard normal per row from a generator seeded with the row's seed."""
    if not math.isfinite(std) or std < 0:
        raise ValueError(f"test_log_ratio_noise_std={std!r} must be a finite number >= 0.")
    seeds = mix_seed(row_keys.long().cpu(), seed, NOISE_STREAM, step, inner_step)  # (B,) int64 in [0, 2^31)
    out = torch.empty(seeds.shape[0], dtype=torch.float64)
    for i, s in enumerate(seeds.tolist()):
        out[i] = torch.randn((), generator=torch.Generator().manual_seed(int(s)), dtype=torch.float64)
    return (out * std).to(row_keys.device)


def add_log_ratio_noise(inputs: dict, noise: torch.Tensor) -> dict:
    """A copy of `inputs` whose `old_per_token_logps` (B, C) are lowered by noise (B,): every log-ratio of row i
    (sequence and per token) rises by noise[i]. Raises when the batch has no old log-probabilities (on-policy
    steps compute the ratio as exactly 1: there is nothing to add the noise to)."""
    old = inputs.get("old_per_token_logps")
    if old is None:
        raise RuntimeError(
            "test_log_ratio_noise_std > 0 needs old log-probabilities, but this step is on-policy (the ratio is "
            "exactly 1): use num_iterations >= 2 or gradient_accumulation_steps not a multiple of "
            "steps_per_generation x num_iterations, or set test_log_ratio_noise_std=0."
        )
    out = dict(inputs)
    out["old_per_token_logps"] = old - noise.to(old.dtype)[:, None]  # (B, C)
    return out
