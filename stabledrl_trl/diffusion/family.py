"""Model families behind one interface: how a kind of diffusion LM decodes rollouts and scores completions.

The trainer never branches on the model type. It asks `get_family(name)` for a `DiffusionFamily` once, then calls
- `family.generate(adapter, prompt_ids, prompt_mask, args, eos_token_ids=..., generator=...)` for rollouts, and
- `family.estimate(adapter, prompt_ids, prompt_mask, completion_ids, completion_mask, args, seeds=..., ...)` for
  per-token likelihood contributions (their masked mean is the sequence estimate),
where `args` is the `StableDRLConfig` (each family reads the fields it uses; `generate` and `check` read only the
sampler fields, so evaluation passes a `diffusion.sampler_settings.SamplerSettings` of the same names) and `adapter`
the model wrapped by `diffusion.adapter.as_diffusion_lm` (aligned float32 logits, special ids).

A batch flows: prompts (left-padded) -> `generate` -> completion ids (B, C) with the completion mask up to the
first EOS -> rewards and group advantages (TRL) -> `estimate` for the old policy (no gradient) and the current
policy (with gradient) -> the objective in `objectives.py` -> `aggregate_loss`.

The built-in families, one module each in `diffusion/families/` (registered in this order; detection tries them in
it, the masked-LM fallback last):
- `families/llada.py`, "llada": full bidirectional attention. LLaDA's semi-autoregressive sampler
  (`diffusion/llada_sampler.py`) and the estimators of `diffusion/estimators.py` on the rollout's fixed canvas.
- `families/dream.py`, "dream": Dream's own sampler (`diffusion/dream_sampler.py`: global schedule, entropy /
  maskgit_plus / topk_margin / origin ranking) and the full-attention estimators; the adapter realigns its logits.
- `families/sdar.py`, "sdar": block diffusion (SDAR, TraDo), block-causal attention. SDAR's block sampler with an
  exact KV cache (`diffusion/block_sampler.py`) and one-pass staircase estimates (`diffusion/block_estimators.py`)
  with the same masks and estimator forms as the full-attention family.
- `families/llada2.py`, "llada2": LLaDA2 (MoE block diffusion): the same machinery with LLaDA2's generate rules.
- `families/masked_lm.py`, "masked_lm": any transformers masked LM, as LLaDA.
The first three full-attention families build on `families/full_attention.py` (`MaskedDiffusionFamily`), the
block-diffusion ones on `families/block_causal.py` (`BlockDiffusionFamily`).
What they share (the `DiffusionFamily` interface, the samplers several families can use (`SAMPLERS`), the registry:
`register_family`, `get_family`, `detect_family`, `detect_family_from_config`) is defined in `family_base.py`,
which imports nothing above it; this module re-exports it, imports the built-in families (so they are registered)
and builds adapters (`as_diffusion_lm`: the model's family detected, its special ids resolved).
Autoregressive models have no family: the trainer keeps TRL's generation and exact log-probabilities.
`StableDRLConfig.diffusion_sampler` ("auto" = the family's `default_sampler`, "llada", "dream") picks the rollout
sampler of `SAMPLERS`; `check` rejects settings that sampler would ignore.

A family owns every fact the package needs about its models: which configs it decodes (`model_types`, `matches`;
`detect_family` asks every registered family), how its logits align (`shifted_logits`), what SFT trains on
(`training_logits`), whether LLaDA's canvas cache applies (`supports_canvas_cache`), its rollout sampler and the
settings that sampler reads (`default_sampler`, `check`, `check_rollout_settings`), its likelihood estimator
(`estimate`), the decoding snippet of the model card (`card_snippet`) and what DDP needs (`uses_every_parameter`).

Adding a family is one module and one registration, as each built-in one is: subclass `DiffusionFamily` (or a
family above), set `name`, `model_types` and the facts that differ, implement `generate` / `estimate` if the
inherited ones do not fit, and call `register_family(MyFamily())` when the module is imported. Nothing else in the
package names a family.
"""

from __future__ import annotations

# The interface and the registry first: a family module imported below (or by families/__init__.py) may import
# these names from this module while it is still being initialised.
from .family_base import (  # noqa: F401  (the interface and the registry, importable from here)
    BLOCK_SAMPLER_DEFAULTS,
    DREAM_SAMPLER_DEFAULTS,
    FAMILIES,
    FAST_ROLLOUT_DEFAULTS,
    SAMPLERS,
    CardSnippet,
    DiffusionFamily,
    RolloutSampler,
    card_call,
    check_sampler_settings,
    detect_family,
    detect_family_from_config,
    estimator_options,
    explicit_layout,
    family_labels,
    fast_rollout_settings,
    get_family,
    is_diffusion_model,
    register_family,
)

# isort: split
from . import families  # noqa: F401  (the built-in families register themselves when imported)
from .adapter import END_OF_TURN_TOKENS, NO_MASK_TOKEN, DiffusionAdapter, as_id_list, unwrap_model
from .families.block_causal import BlockDiffusionFamily  # noqa: F401
from .families.dream import DreamFamily  # noqa: F401
from .families.full_attention import MaskedDiffusionFamily  # noqa: F401
from .families.llada import LLaDAFamily  # noqa: F401
from .families.llada2 import LLaDA2Family  # noqa: F401
from .families.masked_lm import MaskedLMFamily  # noqa: F401
from .families.sdar import SDARFamily  # noqa: F401


def as_diffusion_lm(
    model,
    tokenizer=None,
    family: str | None = None,
    mask_token_id: int | None = None,
    eos_token_ids=None,
    pad_token_id: int | None = None,
) -> DiffusionAdapter:
    """Wrap `model` (LLaDA, Dream, a masked LM; possibly inside DDP / FSDP / PEFT) in a `DiffusionAdapter`.

    family: a registered family's name; detected from the model when None (`family.detect_family`).
    mask_token_id: the argument, else the model config's `mask_token_id`, else the tokenizer's mask token.
    eos_token_ids: the argument, else the config's (and generation config's) eos ids plus the tokenizer's EOS and
        end-of-turn tokens ("<|eot_id|>", "<|im_end|>", DiffuCoder's "<|dlm_pad|>") when it has them.
    pad_token_id: the argument, else the tokenizer's pad id (it is what pads the batches), else the config's.
    """
    if isinstance(model, DiffusionAdapter):
        model = model.model
    inner = unwrap_model(model)
    config = getattr(inner, "config", None)
    if family is None:
        family = detect_family(model)
        if family is None:
            model_type = getattr(config, "model_type", None)
            raise ValueError(
                f"{type(inner).__name__} (model_type={model_type!r}) is not a masked diffusion LM ({family_labels()})."
                f" Load a diffusion model, or pass family= one of {sorted(FAMILIES)} if it is one."
            )
    family_object = get_family(family)  # raises for an unknown name

    explicit_mask = mask_token_id is not None
    if getattr(family_object, "mask_free", False):  # uniform-noise corruption (DiffusionGemma): no mask token
        if explicit_mask and mask_token_id != NO_MASK_TOKEN:
            raise ValueError(f"mask_token_id={mask_token_id}: {family} models have no mask token; remove it.")
        mask_token_id = NO_MASK_TOKEN
    if mask_token_id is None:
        config_mask = getattr(config, "mask_token_id", None)
        tokenizer_mask = getattr(tokenizer, "mask_token_id", None) if tokenizer is not None else None
        if config_mask is not None and tokenizer_mask is not None and config_mask != tokenizer_mask:
            raise ValueError(
                f"The model config's mask_token_id={config_mask} differs from the tokenizer's mask token id "
                f"{tokenizer_mask}; give the right one explicitly: the StableDRLConfig field mask_token_id (YAML "
                "`mask_token_id: N`), or as_diffusion_lm(..., mask_token_id=N)."
            )
        mask_token_id = config_mask if config_mask is not None else tokenizer_mask
    if mask_token_id is None:
        raise ValueError(
            f"No mask token id for {type(inner).__name__}: neither its config nor the tokenizer defines one. Set "
            "the StableDRLConfig field mask_token_id (YAML `mask_token_id: N`), as_diffusion_lm(..., mask_token_id=N), "
            "model.config.mask_token_id or tokenizer.mask_token."
        )

    if eos_token_ids is None:
        eos_token_ids = as_id_list(getattr(config, "eos_token_id", None))
        generation_config = getattr(inner, "generation_config", None)
        eos_token_ids += as_id_list(getattr(generation_config, "eos_token_id", None))
        if tokenizer is not None:
            eos_token_ids += as_id_list(tokenizer.eos_token_id)
            vocab = tokenizer.get_vocab()
            eos_token_ids += [vocab[token] for token in END_OF_TURN_TOKENS if token in vocab]
    else:
        eos_token_ids = as_id_list(eos_token_ids)

    if pad_token_id is None:
        pad_token_id = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad_token_id is None:
            pad_token_id = getattr(config, "pad_token_id", None)
    if pad_token_id is None:
        raise ValueError(
            "No pad token id: set tokenizer.pad_token (e.g. `tokenizer.pad_token = tokenizer.eos_token`), "
            "model.config.pad_token_id, or pass pad_token_id=..."
        )
    if explicit_mask and int(mask_token_id) == int(pad_token_id):
        raise ValueError(
            f"mask_token_id={mask_token_id} is the pad token id: padding would read as masked positions. Give the "
            "model's mask token id (its config's mask_token_id or the tokenizer's mask token), or leave mask_token_id "
            "unset to read it from there."
        )
    return DiffusionAdapter(model, family_object, int(mask_token_id), eos_token_ids, int(pad_token_id))
