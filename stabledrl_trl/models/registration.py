"""Registration of the package's native model classes with transformers' Auto classes.

Once a model type is registered, `AutoConfig` reads its checkpoints with the package's config class and `AutoModel` /
`AutoModelForCausalLM` (and, where asked, `AutoModelForMaskedLM`) build the package's model class, so loading needs
no `trust_remote_code`. `exist_ok=True`: registering again (a re-import) replaces nothing and raises nothing.
"""

from __future__ import annotations


def register_auto_classes(model_type: str, config_class: type, model_class: type, *, masked_lm: bool = False) -> None:
    """Register `config_class` under `model_type` with AutoConfig and `model_class` for it with AutoModel and
    AutoModelForCausalLM, and with AutoModelForMaskedLM when `masked_lm`."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    AutoConfig.register(model_type, config_class, exist_ok=True)
    auto_classes = (AutoModel, AutoModelForCausalLM) + ((AutoModelForMaskedLM,) if masked_lm else ())
    for auto_class in auto_classes:
        auto_class.register(config_class, model_class, exist_ok=True)
