"""Default LoRA target modules for the models this package loads natively, as PEFT has them for known architectures.

PEFT fills `LoraConfig.target_modules` from its own table (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`,
by `config.model_type`) when it is left unset, and raises a bare "Please specify `target_modules`" otherwise.
LLaDA, Dream, SDAR / TraDo and LLaDA2 are not in that table, so `--use_peft true` without `lora_target_modules`
ended in PEFT's traceback. `with_default_lora_targets` gives them PEFT's choice for the nearest architecture it
knows: the attention query and value projections (`q_proj`, `v_proj`, PEFT's default for Llama and Qwen2, whose
layer names LLaDA, Dream and SDAR share), and for LLaDA2's fused attention input `query_key_value` (PEFT's default
for the fused-QKV models Falcon, BLOOM and GPT-NeoX). A model PEFT knows keeps PEFT's default; any other model is
refused before loading, naming the field and, for a model object, its linear layers. The default taken is logged.
"""

from __future__ import annotations

import copy
import json
import logging
import os

logger = logging.getLogger(__name__)

LORA_DEFAULT_TARGETS: dict[str, list[str]] = {
    "llada": ["q_proj", "v_proj"],
    "Dream": ["q_proj", "v_proj"],
    "sdar": ["q_proj", "v_proj"],
    "llada2_moe": ["query_key_value"],
}


def model_type_of(model) -> str | None:
    """`config.model_type` of a model object, or of a model path (its config.json; a hub id through AutoConfig);
    None when it cannot be read (the loading error then comes from where the model loads)."""
    if not isinstance(model, str):
        return getattr(getattr(model, "config", None), "model_type", None)
    config = os.path.join(model, "config.json")
    if os.path.isfile(config):
        try:
            with open(config) as f:
                return json.load(f).get("model_type")
        except (OSError, ValueError):
            return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model).model_type
    except Exception:  # noqa: BLE001  (unreadable here: transformers reports it when the model loads)
        return None


def _linear_layer_names(model) -> list[str]:
    import torch

    if isinstance(model, str) or not isinstance(model, torch.nn.Module):
        return []
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def with_default_lora_targets(peft_config, model):
    """`peft_config` with `target_modules` filled for a native model when a LoRA config leaves both
    `target_modules` and `target_parameters` unset (a copy; the caller's config is not changed), else `peft_config`
    itself. Raises ValueError naming `lora_target_modules` / `peft_config.target_modules` for a model neither this
    package nor PEFT has a default for."""
    from peft import LoraConfig
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULTS

    if not isinstance(peft_config, LoraConfig):
        return peft_config
    if peft_config.target_modules is not None or getattr(peft_config, "target_parameters", None):
        return peft_config
    model_type = model_type_of(model)
    if model_type in LORA_DEFAULT_TARGETS:
        targets = LORA_DEFAULT_TARGETS[model_type]
        filled = copy.copy(peft_config)
        filled.target_modules = set(targets)
        logger.warning(
            f"LoRA: lora_target_modules (peft_config.target_modules) is not set; using the default for model_type "
            f"{model_type!r}: {targets} (PEFT's choice for the same attention layout). Set lora_target_modules to "
            "adapt other layers, e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]."
        )
        return filled
    if model_type is None or model_type in PEFT_DEFAULTS:
        return peft_config  # PEFT's own default (or the model's loading error) applies
    layers = _linear_layer_names(model)
    raise ValueError(
        f"LoRA: lora_target_modules (peft_config.target_modules) is not set and neither PEFT nor stabledrl_trl has a "
        f"default for model_type {model_type!r}. Set it to the names of the linear layers to adapt"
        + (f" (this model's linear layers: {layers})" if layers else "")
        + ", e.g. `lora_target_modules: [q_proj, v_proj]` in the YAML or `LoraConfig(target_modules=[...])`."
    )
