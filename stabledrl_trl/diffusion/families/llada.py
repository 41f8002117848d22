"""LLaDA: the full-attention family with LLaDA's sampler and its canvas cache (Fast-dLLM-style prefix / dual)."""

from __future__ import annotations

from ..family_base import register_family
from .full_attention import MaskedDiffusionFamily


class LLaDAFamily(MaskedDiffusionFamily):
    """LLaDA: full attention, LLaDA's sampler, the canvas cache of the native model."""

    name = "llada"
    label = "LLaDA"
    model_types = ("llada",)
    supports_canvas_cache = True


register_family(LLaDAFamily())
