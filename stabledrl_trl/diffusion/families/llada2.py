"""LLaDA2 (MoE block diffusion): LLaDA2's generate rules on the cached block sampler, staircase estimates."""

from __future__ import annotations

import torch

from ..family_base import register_family
from .block_causal import BlockDiffusionFamily


class LLaDA2Family(BlockDiffusionFamily):
    """LLaDA2 (MoE block diffusion): LLaDA2's `generate` algorithm on the cached block sampler, staircase estimates.

    What differs from SDAR's sampler (`block_generate` options): the canvas is rounded up to whole blocks and the
    completion cut at `max_completion_length` (`whole_blocks`), the mask token stays a candidate of the full softmax
    (`mask_candidate`), and sampled candidates are drawn with `torch.multinomial` from one torch.Generator per row,
    seeded from the trainer's generator (LLaDA2's draw). The threshold rule (`block_remasking`
    "low_confidence_dynamic": strict >, every passing position committed, else the schedule's count) and the schedule
    are SDAR's, which are LLaDA2's. Temperature 0 is greedy (the LLaDA2.1 rule; LLaDA2.0's hub code samples there).
    Routed experts that no token chose get no gradient: DDP must search for unused parameters.
    """

    name = "llada2"
    label = "LLaDA2"
    model_types = ("llada2_moe",)
    uses_every_parameter = False
    card_rules = "    whole_blocks=True,\n    mask_candidate=True,\n"

    def sampler_rules(self, prompt_ids, generator):
        # LLaDA2's generate: whole-block canvas, the mask token among the candidates, one generator per row
        seeds = torch.randint(0, 2**62, (prompt_ids.shape[0],), generator=generator, device=generator.device)
        generators = [torch.Generator(device=prompt_ids.device).manual_seed(int(s)) for s in seeds.tolist()]
        return {"generator": generators, "whole_blocks": True, "mask_candidate": True}


register_family(LLaDA2Family())
