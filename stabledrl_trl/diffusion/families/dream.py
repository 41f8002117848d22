"""Dream / DiffuCoder: full attention with logits shifted by one, Dream's own sampler by default."""

from __future__ import annotations

from ..family_base import register_family
from .full_attention import MaskedDiffusionFamily


class DreamFamily(MaskedDiffusionFamily):
    """Dream / DiffuCoder: full attention, logits shifted by one (the adapter realigns them); rollouts use Dream's
    own sampler by default (`diffusion_sampler="llada"` selects LLaDA's), likelihoods the full-attention estimators."""

    name = "dream"
    label = "Dream / DiffuCoder"
    model_types = ("dream",)
    default_sampler = "dream"
    shifted_logits = True
    supports_canvas_cache = False


register_family(DreamFamily())
