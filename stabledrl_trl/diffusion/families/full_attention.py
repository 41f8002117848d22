"""The full-attention base family (`MaskedDiffusionFamily`: LLaDA, Dream, masked LMs): LLaDA's sampler by default,
canvas-based estimators. `llada.py`, `dream.py` and `masked_lm.py` register families built on it."""

from __future__ import annotations

import torch

from ..estimators import estimate_likelihood
from ..family_base import DiffusionFamily, estimator_options


class MaskedDiffusionFamily(DiffusionFamily):
    """Full-attention masked diffusion LMs (LLaDA, Dream, masked LMs): LLaDA's sampler by default, canvas-based
    estimators. A subclass sets `name`, `model_types` and the facts that differ."""

    uses_every_parameter = True
    default_sampler = "llada"

    def estimate(
        self, adapter, prompt_ids, prompt_mask, completion_ids, completion_mask, args, *, seeds, fill_token_id
    ):
        # The sampler decodes a fixed canvas of max_completion_length positions, and the model sees the tail after
        # the first EOS while it generates. Rebuild that canvas: the tail is unscored context, visible EOS tokens
        # (eos_tail "visible") or mask tokens (eos_tail "masked", the official StableDRL code). In both modes the
        # prompt's left padding is neither attended nor masked: the official code never pads (one prompt per
        # rollout batch), so a padded row is scored exactly as the row alone.
        c = completion_ids.size(1)
        canvas = max(c, args.max_completion_length)
        canvas_ids = completion_ids.new_full((completion_ids.size(0), canvas), fill_token_id)  # (B, G)
        canvas_ids[:, :c] = torch.where(completion_mask.bool(), completion_ids, fill_token_id)
        scored = completion_mask.new_zeros(canvas_ids.shape)  # (B, G)
        scored[:, :c] = completion_mask
        name = args.likelihood_estimator
        masked_tail = args.eos_tail == "masked"
        est = estimate_likelihood(
            name,
            adapter,
            prompt_ids,
            prompt_mask,
            canvas_ids,
            scored,
            mask_token_id=adapter.mask_token_id,
            seed=seeds,
            context_mask=torch.ones_like(scored),
            mask_context=masked_tail,
            num_samples=self.num_mc_samples(args),
            p_mask_prompt=args.p_mask_prompt,
            chunk_size=args.estimator_chunk_size,
            eubo_beta=args.sandwich_beta if (args.sandwich and torch.is_grad_enabled()) else None,
            **estimator_options(args),
        )
        est.token_logps, est.token_entropy = est.token_logps[:, :c], est.token_entropy[:, :c]  # (B, C)
        return est
