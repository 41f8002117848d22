"""SDAR / TraDo: the block-causal family with SDAR's sampler rules."""

from __future__ import annotations

from ..family_base import register_family
from .block_causal import BlockDiffusionFamily


class SDARFamily(BlockDiffusionFamily):
    """SDAR / TraDo: block diffusion with SDAR's sampler (one generator for the batch)."""

    name = "sdar"
    label = "SDAR / TraDo"
    model_types = ("sdar",)


register_family(SDARFamily())
