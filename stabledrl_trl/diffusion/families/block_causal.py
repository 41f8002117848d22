"""The block-causal base family (`BlockDiffusionFamily`: SDAR, TraDo, LLaDA2): SDAR's cached block sampler and one-pass
staircase likelihood estimates. `sdar.py` and `llada2.py` register families built on it."""

from __future__ import annotations

import torch
from torch import Tensor

from ..adapter import DiffusionAdapter, unwrap_model
from ..block_estimators import StaircaseLogits, staircase_estimate
from ..block_sampler import block_generate
from ..family_base import CardSnippet, DiffusionFamily, card_call, estimator_options
from ..llada_sampler import SamplerOutput


class BlockDiffusionFamily(DiffusionFamily):
    """Block diffusion (SDAR, TraDo): SDAR's cached block sampler and staircase likelihood estimates.

    The block size is the model's `config.block_size`. Rollouts: `max_completion_length` new tokens,
    `block_denoising_steps` steps per block (None = block size), `block_remasking`, `block_confidence_threshold`,
    `temperature`, `top_k`, `top_p`. A completion ends at its first EOS; nothing after it is part of the estimate
    (block-causal attention: later blocks never influence earlier ones, and the rest of the EOS block is not kept by
    TRL).
    """

    block_causal = True

    @staticmethod
    def block_size(adapter_or_model) -> int:
        model = adapter_or_model.model if isinstance(adapter_or_model, DiffusionAdapter) else adapter_or_model
        return int(unwrap_model(model).config.block_size)

    def check(self, args, model) -> None:
        super().check(args, model)
        if getattr(args, "eos_tail", "visible") == "masked":  # evaluation passes sampler settings only
            raise ValueError(
                "eos_tail='masked' shows a full-attention canvas's tail after the first EOS as mask tokens; a "
                "block-diffusion estimate has no such tail (block-causal attention: nothing after the EOS reaches the "
                "scored tokens). Leave eos_tail='visible' for SDAR, TraDo and LLaDA2."
            )
        block = self.block_size(model)
        steps = args.block_denoising_steps
        if steps is not None and steps > block:
            raise ValueError(
                f"block_denoising_steps={steps} exceeds the model's block size {block}: every step reveals at least "
                f"one token; use block_denoising_steps <= {block} or None (= {block})."
            )

    def training_logits(self, model, noisy_ids, clean_ids, attention_mask):
        # every block denoised given the clean blocks before it: [noisy || clean] in one pass (SDAR's training loss)
        return StaircaseLogits(model, self.block_size(model))(
            torch.cat([noisy_ids, clean_ids], 1), torch.cat([attention_mask, attention_mask], 1)
        )  # (B, L, V): the noisy copy's predictions

    def generate(self, adapter, prompt_ids, prompt_mask, args, *, eos_token_ids, generator):
        out = block_generate(
            adapter.model,
            prompt_ids,
            prompt_mask,
            mask_token_id=adapter.mask_token_id,
            eos_token_ids=tuple(eos_token_ids),
            pad_token_id=adapter.pad_token_id,
            block_size=self.block_size(adapter),
            gen_length=args.max_completion_length,
            denoising_steps=args.block_denoising_steps,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            remasking=args.block_remasking,
            confidence_threshold=args.block_confidence_threshold,
            **self.sampler_rules(prompt_ids, generator),
        )
        return SamplerOutput(out.completion_ids, out.completion_mask)

    def sampler_rules(self, prompt_ids: Tensor, generator: torch.Generator) -> dict:
        """The block sampler's family-specific options: SDAR's sampler draws from one generator for the batch."""
        return {"generator": generator}

    # The `sampler_rules` a model card's greedy call states (the generator is the card's own).
    card_rules: str = ""

    def card_snippet(self, settings) -> CardSnippet:
        s = settings
        body = (
            "    pad_token_id=lm.pad_token_id,\n    block_size=model.config.block_size,\n"
            f"    gen_length={s.max_completion_length},\n    denoising_steps={s.block_denoising_steps!r},\n"
            f"    temperature={s.temperature!r},\n    remasking={s.block_remasking!r},\n"
            "    generator=torch.Generator().manual_seed(0),\n" + self.card_rules
        )
        return CardSnippet(
            "import torch\n\nfrom stabledrl_trl.diffusion.block_sampler import block_generate",
            card_call("block_generate", "model", body),
            f"{self.label} block-diffusion sampler, up to {s.max_completion_length} tokens, block_remasking "
            f"'{s.block_remasking}', temperature {s.temperature:g}.",
        )

    def estimate(
        self, adapter, prompt_ids, prompt_mask, completion_ids, completion_mask, args, *, seeds, fill_token_id
    ):
        name = args.likelihood_estimator
        return staircase_estimate(
            name,
            adapter.model,
            prompt_ids,
            prompt_mask,
            completion_ids,
            completion_mask,
            block_size=self.block_size(adapter),
            mask_token_id=adapter.mask_token_id,
            seed=seeds,
            num_samples=self.num_mc_samples(args),
            p_mask_prompt=args.p_mask_prompt,
            chunk_size=args.estimator_chunk_size,
            eubo_beta=args.sandwich_beta if (args.sandwich and torch.is_grad_enabled()) else None,
            **{("estimator_block_size" if k == "block_size" else k): v for k, v in estimator_options(args).items()},
        )
