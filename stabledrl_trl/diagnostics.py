"""Per-step diagnostics of `StableDRLTrainer` (the mechanism and noise metrics under `stabledrl/`), kept apart from
the trainer's TRL hooks; `TrainerDiagnostics` is a mixin of the trainer and overrides nothing of TRL's."""

from __future__ import annotations

import logging
import math

import torch
from accelerate.utils import gather

from .diffusion.estimators import estimator_standard_error
from .objectives import (
    PPO_CLIP_LOSS_TYPES,
    SEQUENCE_INPUT,
    config_ratio_input,
    trl_applied_weights,
    weight_by_advantage_sign,
)

logger = logging.getLogger("stabledrl_trl.stabledrl_trainer")  # the trainer's logger: its warnings keep their source

# TRL's losses: the per-micro-batch metric(s) TRL logs whose sum is the fraction of samples (tokens) whose ratio is
# clipped (TRL computes it inside its loss and returns nothing else). The package's objectives report theirs in
# their statistics (keys ending in "clip_frac").
_TRL_CLIP_METRICS = {
    "cispo": ("cispo_clip_ratio",),
    **{t: ("clip_ratio/region_mean",) for t in PPO_CLIP_LOSS_TYPES},
}


class TrainerDiagnostics:
    """Diagnostics `StableDRLTrainer` logs every step, as a mixin of the trainer (it reads the trainer's `args`,
    `loss_type`, `_metrics`, `_scoring`, `accelerator`): the applied weights by advantage sign, TRL's losses'
    weights, the estimator's noise, the largest ratio, the clipped fraction and the all-clipped streak, and the
    objective's own statistics."""

    def _log_applied_weights(self, mode, weights, advantages, mask=None):
        """`stabledrl/weight_mean_neg_adv` / `weight_mean_pos_adv`: mean multiplier the objective puts on the
        gradient term of negative- / positive-advantage samples (tokens, for token-level losses), over processes."""
        sums = gather(weight_by_advantage_sign(weights, advantages, mask).reshape(1, 4)).sum(0)  # (4,)
        for key, total, count in (("neg", sums[0], sums[1]), ("pos", sums[2], sums[3])):
            if count > 0:
                self._metrics[mode][f"stabledrl/weight_mean_{key}_adv"].append(float(total / count))

    def _log_trl_weights(self, inputs):
        """The applied weights of TRL's losses (`objectives.trl_applied_weights`), from the estimate just computed."""
        if self._scoring.last_estimate is None:
            return
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"].bool()  # (B, C)
        current = self._scoring.last_estimate.token_logps.detach()
        old = inputs.get("old_per_token_logps")
        log_r = current - (current if old is None else old)  # (B, C); exactly 0 on-policy
        advantages = inputs["advantages"]
        if self.loss_type == "vespo":
            adv = advantages[:, None] if advantages.dim() == 1 else advantages
            weights = self.get_gamma_weights(
                advantages=adv,
                log_ratio_per_token=log_r,
                mask=mask,
                importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
                k_pos=self.args.vespo_k_pos,
                lambda_pos=self.args.vespo_lambda_pos,
                k_neg=self.args.vespo_k_neg,
                lambda_neg=self.args.vespo_lambda_neg,
            )  # (B, 1)
            unit_mask = mask.any(-1, keepdim=True)
        else:
            if self.args.importance_sampling_level == "sequence":
                log_r = ((log_r * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None]  # (B, 1)
                unit_mask = mask.any(-1, keepdim=True)
            else:
                unit_mask = mask
            weights = trl_applied_weights(
                self.loss_type,
                log_r,
                advantages,
                epsilon_low=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                delta=self.args.delta,
                sapo_temperature_pos=getattr(self.args, "sapo_temperature_pos", 1.0),
                sapo_temperature_neg=getattr(self.args, "sapo_temperature_neg", 1.05),
            )
        if weights is not None:
            self._log_applied_weights(mode, weights, advantages.reshape(advantages.shape[0], -1)[:, 0], unit_mask)

    def _log_estimator_noise(self, inputs):
        """`stabledrl/estimator_noise_std`: with fresh masks, the noise that the likelihood estimator alone puts in
        L_theta - L_old, sqrt(2) x the standard error of the current estimate (std over its independent units /
        sqrt(U)), averaged over completions; the old estimate is independent with the same variance. No extra
        forward pass; not logged with fewer than two units per estimate, nor for shared masks or on-policy steps."""
        est = self._scoring.last_estimate
        if (
            est is None
            or est.sample_seq_logps is None
            or self.args.mask_seed_mode != "fresh"
            or inputs.get("old_per_token_logps") is None
        ):
            return
        se = estimator_standard_error(est.sample_seq_logps.float())  # (B,)
        rows = inputs["completion_mask"].bool().any(-1) & torch.isfinite(se)
        local = torch.stack([torch.where(rows, se, 0.0).sum() * math.sqrt(2.0), rows.sum().float()])
        total = gather(local.reshape(1, 2)).sum(0)
        if total[1] > 0:
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["stabledrl/estimator_noise_std"].append(float(total[0] / total[1]))

    def _log_ratio_max(self, inputs):
        """`stabledrl/weight_max` for objectives that do not log it: the largest unclipped ratio they consume,
        per token or per sequence (`objectives.ratio_input`), from the estimate just computed."""
        old = inputs.get("old_per_token_logps")
        if old is None or self._scoring.last_estimate is None:
            return  # on-policy: every ratio is exactly 1
        mask = inputs["completion_mask"].bool()  # (B, C)
        log_r = self._scoring.last_estimate.token_logps.detach() - old  # (B, C)
        level = config_ratio_input(self.args)
        if level == SEQUENCE_INPUT:
            log_r = ((log_r * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None]  # (B, 1)
            mask = mask.any(-1, keepdim=True)
        local = torch.where(mask & torch.isfinite(log_r), log_r, -torch.inf).max().reshape(1)
        value = gather(local.float()).max()
        self._metrics["train" if self.model.training else "eval"]["stabledrl/weight_max"].append(
            float(torch.exp(value.clamp(max=80.0)))
        )

    def _note_trl_clipping(self):
        """TRL's losses: record whether every sample (token) of this micro-batch, over all processes, had its ratio
        clipped, from the clip fraction TRL logged for it (`_TRL_CLIP_METRICS`)."""
        keys = _TRL_CLIP_METRICS.get(self.loss_type)
        metrics = self._metrics["train"]
        if keys is None or not all(metrics.get(k) for k in keys):
            return
        self._scoring.note_clipping(sum(float(metrics[k][-1]) for k in keys))  # the values logged for this micro-batch

    def _end_clipping_step(self):
        full = self._scoring.end_clipping_step()
        if full is None:
            return
        self._all_clipped_streak = self._all_clipped_streak + 1 if full else 0
        self._metrics["train"]["stabledrl/all_clipped"].append(float(full))
        self._metrics["train"]["stabledrl/all_clipped_streak"].append(float(self._all_clipped_streak))
        patience = self.args.all_clipped_patience
        if patience and self._all_clipped_streak == patience:
            if self.loss_type == "stable_drl":
                effect = (
                    f"every importance weight exceeded clip_c={self.args.clip_c}, so the group weights are uniform "
                    "and the update ignores the ratios"
                )
            else:
                effect = "the clipped objective gets no gradient from the ratios: the policy is not learning"
            logger.warning(
                f"Every sample was clipped for {patience} consecutive optimiser steps (up to step "
                f"{self.state.global_step + 1}, loss_type={self.loss_type!r}): {effect}. The ratios are likely "
                f"dominated by likelihood-estimator noise (likelihood_estimator={self.args.likelihood_estimator!r}, "
                f"mask_seed_mode={self.args.mask_seed_mode!r}). Fix: use mask_seed_mode='shared', more mc_samples "
                "or a lower learning rate; loss_type='stable_drl' keeps learning under such noise."
            )

    def _log_objective_stats(self, mode, stats, entropies, mask) -> dict[str, float]:
        """Log the objective's scalar statistics as `stabledrl/<key>` (reduced over processes); returns them."""
        m = self._metrics[mode]
        logged = {}
        for key, value in stats.items():
            if key in ("weights", "applied_weight") or not isinstance(value, torch.Tensor) or value.ndim != 0:
                continue
            reduce = "max" if key.endswith("max") else ("sum" if key == "skipped" else "mean")
            v = gather(value.detach().float().reshape(1))
            logged[key] = float(v.max() if reduce == "max" else v.sum() if reduce == "sum" else v.mean())
            m[f"stabledrl/{key}"].append(logged[key])
        if entropies is not None:
            ent = gather(((entropies * mask).sum() / mask.sum().clamp(min=1)).detach().reshape(1))
            m["entropy"].append(float(ent.mean()))
        return logged
