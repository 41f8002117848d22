"""The per-step state that `StableDRLTrainer`'s overrides of TRL's hooks hand to each other.

TRL's `GRPOTrainer` calls its hooks with fixed signatures (`_get_per_token_logps_and_entropies(model, input_ids,
...)`, `_calculate_rewards(inputs, prompts, ...)`), so what a diffusion LM needs besides (which masks to draw, the
estimate just computed, the decoded canvases) cannot travel as arguments. It lives here instead: one
`ScoringContext` per trainer, created in `StableDRLTrainer.__init__`, each field written by one hook and read by
another within the same generation or optimiser step. Run-long counters (the all-clipped and non-finite streaks)
are trainer state, not fields here.

Flow of one generation batch and its optimiser steps:

    _generate_and_score_completions   writes mask_stream (old policy), mask_rows (rollout row keys)
      -> _generate_single_turn         writes canvas_ids            (reward_text="canvas")
      -> _calculate_rewards            reads  canvas_ids (clears it); writes nonfinite_reward_rows
      -> _get_per_token_logps_...      reads  mask_stream, mask_rows; writes last_estimate
      <- back in _generate_and_score   reads  nonfinite_reward_rows (clears it)
    _compute_loss (per micro-batch)    writes mask_stream (inner iteration), mask_rows (the batch's keys)
      -> _get_per_token_logps_...      reads  mask_stream, mask_rows; writes last_estimate
      -> the objective / diagnostics   read   last_estimate (EUBO, per-unit estimates)
      -> note_clipping                 writes step_all_clipped
    training_step (end of an optimiser step)  reads step_all_clipped and resets it (`end_clipping_step`)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class ScoringContext:
    """What the trainer's hooks pass to each other within one step (see the module docstring for the flow).

    mask_stream: the stream ids mixed with each row's key and the config seed into its mask seed (e.g. (1, step) for
        the old policy under fresh masks, (2, gen_step, j) for inner iteration j under shared masks). Written before
        every scoring call, including before `super()._generate_and_score_completions`, because TRL's own code
        scores the old and reference policies through the overridden estimator hook. Read by
        `_get_per_token_logps_and_entropies`.
    mask_rows: (B,) keys of the rows being scored, their positions in the run's stream of rollouts (carried with
        each row as `mask_row_key`); None keys rows by their index in the call. Written by
        `_generate_and_score_completions` and `_compute_loss`; read by `_row_keys`.
    last_estimate: the likelihood estimate (`diffusion.estimators` output) of the last scoring call. Written by
        `_get_per_token_logps_and_entropies`; read by the objective (the EUBO of SPG's sandwich) and the
        diagnostics (`_log_trl_weights`, `_log_ratio_max`, `_log_estimator_noise`).
    canvas_ids: with reward_text="canvas", this process's last rollout canvases (B, C) as lists, after the EOS too.
        Written by `_generate_single_turn`; read and cleared by `_calculate_rewards`.
    nonfinite_reward_rows: (N_global,) bool, samples whose reward is inf, overflows or is NaN from every function.
        Written by `_calculate_rewards`; read and cleared by `_generate_and_score_completions`.
    step_all_clipped: whether every micro-batch of the current optimiser step so far had every sample (token) clipped;
        None before the first. Written by `note_clipping` (from `_compute_loss`); read and reset by
        `end_clipping_step` (from `training_step`).
    """

    mask_stream: tuple[int, ...] = (1, 0)
    mask_rows: torch.Tensor | None = None
    last_estimate: Any = None
    canvas_ids: list[list[int]] | None = None
    nonfinite_reward_rows: torch.Tensor | None = None
    step_all_clipped: bool | None = None

    def note_clipping(self, clipped_fraction: float) -> None:
        """Record one micro-batch's fraction of clipped samples (tokens), over all processes."""
        full = clipped_fraction >= 1.0 - 1e-6
        self.step_all_clipped = full if self.step_all_clipped is None else (self.step_all_clipped and full)

    def end_clipping_step(self) -> bool | None:
        """Whether the optimiser step just ended was fully clipped (None: nothing recorded); resets the flag."""
        full, self.step_all_clipped = self.step_all_clipped, None
        return full
