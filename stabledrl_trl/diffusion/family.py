"""Model families behind one interface: how a kind of diffusion LM decodes rollouts and scores completions.

The trainer never branches on the model type. It asks `get_family(name)` for a `DiffusionFamily` once, then calls
- `family.generate(adapter, prompt_ids, prompt_mask, args, eos_token_ids=..., generator=...)` for rollouts, and
- `family.estimate(adapter, prompt_ids, prompt_mask, completion_ids, completion_mask, args, seeds=..., ...)` for
  per-token likelihood contributions (their masked mean is the sequence estimate),
where `args` is the `StableDRLConfig` (each family reads the fields it uses) and `adapter` the model wrapped by
`diffusion.adapter.as_diffusion_lm` (aligned float32 logits, special ids).

A batch flows: prompts (left-padded) -> `generate` -> completion ids (B, C) with the completion mask up to the
first EOS -> rewards and group advantages (TRL) -> `estimate` for the old policy (no gradient) and the current
policy (with gradient) -> the objective in `objectives.py` -> `aggregate_loss`.

Families registered here:
- "llada", "masked_lm": full bidirectional attention. LLaDA's semi-autoregressive sampler
  (`diffusion/sampler.py`) and the estimators of `diffusion/estimators.py` on the rollout's fixed canvas.
- "dream": the same interface; Dream's logits are realigned by the adapter.
Autoregressive models have no family: the trainer keeps TRL's generation and exact log-probabilities.

Adding a family: subclass `DiffusionFamily`, implement `generate` and `estimate` (and `estimator_passes` if its
cost differs), register an instance in `FAMILIES` under the name `diffusion.adapter.detect_family` returns.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .adapter import DiffusionAdapter
from .estimators import LikelihoodEstimate, estimate_likelihood, estimator_cost
from .sampler import SamplerOutput
from .sampler import generate as llada_generate


class DiffusionFamily:
    """Interface of a model family; see the module docstring."""

    name: str = "base"

    def generate(
        self,
        adapter: DiffusionAdapter,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        args,
        *,
        eos_token_ids: tuple[int, ...],
        generator: torch.Generator,
    ) -> SamplerOutput:
        """prompt_ids, prompt_mask (B, P) left-padded -> SamplerOutput with completion_ids / completion_mask (B, C)."""
        raise NotImplementedError

    def estimate(
        self,
        adapter: DiffusionAdapter,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        completion_ids: Tensor,
        completion_mask: Tensor,
        args,
        *,
        seeds: Tensor,
        fill_token_id: int,
    ) -> LikelihoodEstimate:
        """Per-token likelihood contributions on completion tokens, (B, C), from masks seeded per row by `seeds`.

        completion_ids / completion_mask (B, C) are right-padded (1 up to and including the first EOS);
        fill_token_id is what the rollout's canvas holds after the first EOS (the tokenizer's EOS).
        With gradients enabled the estimate is differentiable (the current policy); otherwise it is not.
        """
        raise NotImplementedError

    def num_mc_samples(self, args) -> int:
        """Monte-Carlo mask samples per estimate under `args`."""
        return 1 if args.likelihood_estimator == "mean_field" else args.mc_samples

    def estimator_passes(self, args) -> int:
        """Forward passes per completion for one estimate under `args` (logged as stabledrl/estimator_passes)."""
        return estimator_cost(args.likelihood_estimator, self.num_mc_samples(args))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class MaskedDiffusionFamily(DiffusionFamily):
    """Full-attention masked diffusion LMs (LLaDA, masked LMs): LLaDA's sampler, canvas-based estimators."""

    name = "llada"

    def generate(self, adapter, prompt_ids, prompt_mask, args, *, eos_token_ids, generator):
        return llada_generate(
            adapter,
            prompt_ids,
            prompt_mask,
            mask_token_id=adapter.mask_token_id,
            gen_length=args.max_completion_length,
            block_length=args.block_length,
            steps=args.diffusion_steps,
            temperature=args.temperature,
            remasking=args.remasking,
            cfg_scale=args.cfg_scale,
            eos_token_ids=tuple(eos_token_ids),
            generator=generator,
        )

    def estimate(
        self, adapter, prompt_ids, prompt_mask, completion_ids, completion_mask, args, *, seeds, fill_token_id
    ):
        # The sampler decodes a fixed canvas of max_completion_length positions, and the model sees the tail after
        # the first EOS while it generates. Rebuild that canvas: the tail is unscored context, visible EOS tokens
        # (eos_tail "visible") or mask tokens (eos_tail "masked", the official StableDRL code, which also attends to
        # the prompt's left padding and masks it like prompt tokens).
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
            torch.ones_like(prompt_mask) if masked_tail else prompt_mask,
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
            **({"block_size": args.estimator_block_size} if name == "block_random" else {}),
        )
        est.token_logps, est.token_entropy = est.token_logps[:, :c], est.token_entropy[:, :c]  # (B, C)
        return est


class DreamFamily(MaskedDiffusionFamily):
    """Dream / DiffuCoder: full attention, logits shifted by one (the adapter realigns them)."""

    name = "dream"


class MaskedLMFamily(MaskedDiffusionFamily):
    """Any transformers masked LM with a mask token (BERT, RoBERTa, ModernBERT)."""

    name = "masked_lm"


FAMILIES: dict[str, DiffusionFamily] = {
    "llada": MaskedDiffusionFamily(),
    "dream": DreamFamily(),
    "masked_lm": MaskedLMFamily(),
}


def get_family(name: str) -> DiffusionFamily:
    """The registered family `name` (as returned by `diffusion.adapter.detect_family`)."""
    if name not in FAMILIES:
        raise ValueError(f"no diffusion family {name!r}; registered: {sorted(FAMILIES)}.")
    return FAMILIES[name]
