"""Any transformers masked LM with a mask token (BERT, RoBERTa, ModernBERT): the fallback family."""

from __future__ import annotations

from ..family_base import register_family
from .full_attention import MaskedDiffusionFamily


class MaskedLMFamily(MaskedDiffusionFamily):
    """Any transformers masked LM with a mask token (BERT, RoBERTa, ModernBERT)."""

    name = "masked_lm"
    label = "a transformers masked LM"
    uses_every_parameter = False  # not established for every transformers masked-LM architecture
    supports_canvas_cache = False
    fallback = True

    def matches(self, model) -> bool:
        """Any model of transformers' masked-LM mapping (BertForMaskedLM, ...), but not an encoder-decoder (BART sits
        in the mapping but decodes causally)."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING

        config = getattr(model, "config", None)
        if config is None or getattr(config, "is_encoder_decoder", False):
            return False
        try:
            masked_lm_class = MODEL_FOR_MASKED_LM_MAPPING[type(config)]
        except (KeyError, ValueError):
            return False
        classes = masked_lm_class if isinstance(masked_lm_class, tuple) else (masked_lm_class,)
        return isinstance(model, classes)

    def matches_config(self, config) -> bool:
        """A config.json whose first architecture is a `...ForMaskedLM` and not an encoder-decoder."""
        architectures = getattr(config, "architectures", None) or []
        return bool(architectures) and str(architectures[0]).endswith("ForMaskedLM") and not getattr(
            config, "is_encoder_decoder", False
        )


register_family(MaskedLMFamily())
