"""The family interface (`DiffusionFamily`) and the registry, the ground floor of every family module.

This module imports only the layers below it (the adapter, the samplers, the estimators, `SamplerSettings`), never
`diffusion/family.py`, the `families` package, the config or validation, so a family module that starts with
`from stabledrl_trl.diffusion.family_base import DiffusionFamily, register_family` (or the same names from
`diffusion/family.py`, which re-exports them) imports cleanly in a fresh interpreter, whichever module is imported
first. It sits beside the `families` package, not in it, so that importing it never runs `families/__init__.py`
(which imports every built-in family). See `diffusion/family.py` for how the trainer uses a family.

Contents: the interface (`DiffusionFamily`), the rollout samplers several families share (`SAMPLERS`: LLaDA's,
Dream's), the model-card snippet helpers (`CardSnippet`, `card_call`), the sampler-setting checks a family runs
(`check_sampler_settings`, `explicit_layout`, `fast_rollout_settings`), the estimator's own options
(`estimator_options`) and the registry (`FAMILIES`, `register_family`, `get_family`, `detect_family`,
`detect_family_from_config`, `is_diffusion_model`, `family_labels`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
from torch import Tensor

from .adapter import DiffusionAdapter, realign_shifted_logits, unwrap_model
from .dream_sampler import generate as dream_generate
from .dream_sampler import validate_dream_sampler_args
from .estimators import LikelihoodEstimate, default_num_samples, estimator_cost, get_estimator_spec
from .llada_sampler import SamplerOutput, validate_sampler_args
from .llada_sampler import generate as llada_generate
from .sampler_settings import (  # noqa: F401  (the sampler-setting checks families run, importable from here)
    BLOCK_SAMPLER_DEFAULTS,
    DREAM_SAMPLER_DEFAULTS,
    FAST_ROLLOUT_DEFAULTS,
    SAMPLER_NAMES,
    check_sampler_settings,
    explicit_layout,
    fast_rollout_settings,
)


def _llada_rollouts(adapter, prompt_ids, prompt_mask, args, eos_token_ids, generator) -> SamplerOutput:
    """LLaDA's semi-autoregressive sampler (`diffusion/llada_sampler.py`) with the config's settings.

    Finished rows leave the batch (exact) unless the reward reads the whole canvas (`reward_text="canvas"`): the
    tokens after the first EOS are then graded and must be decoded. `rollout_cache`, `parallel_threshold` and
    `max_tokens_per_step` select the approximate modes (the caches need a LLaDA model: `DiffusionFamily.check`).
    `top_k` / `top_p` restrict the candidate draw; the confidence stays LLaDA's (the drawn token's probability).
    """
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
        early_stop=getattr(args, "reward_text", "completion") != "canvas",
        cache=getattr(args, "rollout_cache", "none"),
        threshold=getattr(args, "parallel_threshold", None),
        max_tokens_per_step=getattr(args, "max_tokens_per_step", None),
        top_k=args.top_k,
        top_p=args.top_p,
    )


def _dream_rollouts(adapter, prompt_ids, prompt_mask, args, eos_token_ids, generator) -> SamplerOutput:
    """Dream's sampler (`diffusion/dream_sampler.py`); top_p None or 1.0 and top_k None or 0 mean no filtering."""
    return dream_generate(
        adapter,
        prompt_ids,
        prompt_mask,
        mask_token_id=adapter.mask_token_id,
        gen_length=args.max_completion_length,
        steps=args.diffusion_steps,
        alg=args.dream_alg,
        alg_temp=args.dream_alg_temp,
        eps=args.dream_eps,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k or None,  # Dream's code reads None, not 0, as no top-k filter
        eos_token_ids=tuple(eos_token_ids),
        generator=generator,
    )


def _llada_check(settings, adapter) -> None:
    """LLaDA's sampler arguments under `settings` (the layout, remasking, guidance and the model's mask id)."""
    s = settings
    validate_sampler_args(
        s.max_completion_length, s.block_length, s.diffusion_steps, s.temperature, s.remasking, s.cfg_scale,
        adapter.mask_token_id,
    )  # fmt: skip


def _dream_check(settings, adapter) -> None:
    """Dream's sampler arguments under `settings`."""
    s = settings
    validate_dream_sampler_args(
        s.max_completion_length, s.diffusion_steps, s.dream_alg, s.dream_alg_temp, s.dream_eps, s.temperature,
        s.top_p, s.top_k if s.top_k else None,
    )  # fmt: skip


class CardSnippet(NamedTuple):
    """How a model card tells its reader to decode: the import line(s), the call on `lm` (the model wrapped by
    `as_diffusion_lm`) or `model`, with `inputs` the tokenised prompt, and one sentence on the rollouts."""

    imports: str
    call: str
    rollouts: str


_COMMON_CARD_ARGS = "    mask_token_id=lm.mask_token_id,\n    eos_token_ids=lm.eos_token_ids,\n"


def card_call(function: str, model: str, body: str) -> str:
    """The call of a model card's decoding snippet: `function(model, inputs..., mask / EOS ids, body)`."""
    return (
        f'out = {function}(\n    {model},\n    inputs["input_ids"],\n    inputs["attention_mask"],\n'
        + _COMMON_CARD_ARGS
        + body
        + ")"
    )


def _llada_card(settings) -> CardSnippet:
    s = settings
    body = (
        f"    gen_length={s.max_completion_length},\n    block_length={s.block_length},\n"
        f"    steps={s.diffusion_steps},\n    temperature=0.0,\n    remasking={s.remasking!r},\n"
    )
    return CardSnippet(
        "from stabledrl_trl.diffusion.llada_sampler import generate",
        card_call("generate", "lm", body),
        f"LLaDA's masked-diffusion sampler, {s.max_completion_length} positions in blocks of {s.block_length}, "
        f"{s.diffusion_steps} steps, temperature {s.temperature:g}, remasking '{s.remasking}'.",
    )


def _dream_card(settings) -> CardSnippet:
    s = settings
    body = (
        f"    gen_length={s.max_completion_length},\n    steps={s.diffusion_steps},\n"
        f"    alg={s.dream_alg!r},\n    alg_temp={s.dream_alg_temp!r},\n    eps={s.dream_eps!r},\n"
        "    temperature=0.0,\n"
    )
    return CardSnippet(
        "from stabledrl_trl.diffusion.dream_sampler import generate",
        card_call("generate", "lm", body),
        f"Dream's sampler, {s.max_completion_length} positions, {s.diffusion_steps} steps, alg '{s.dream_alg}', "
        f"temperature {s.temperature:g}.",
    )


class RolloutSampler(NamedTuple):
    """A rollout sampler several families can use: `run(adapter, prompt_ids, prompt_mask, settings, eos_token_ids,
    generator)` decodes, `check(settings, adapter)` validates its arguments, `card(settings)` is its model-card
    snippet. `settings` is a `StableDRLConfig` or a `SamplerSettings` (same field names)."""

    run: Callable[..., SamplerOutput]
    check: Callable[..., None]
    card: Callable[..., CardSnippet]


# Rollout samplers by the name `StableDRLConfig.diffusion_sampler` selects ("auto" = the family's own).
SAMPLERS: dict[str, RolloutSampler] = dict(
    zip(
        SAMPLER_NAMES,  # ("llada", "dream"), the names the config accepts
        (
            RolloutSampler(_llada_rollouts, _llada_check, _llada_card),
            RolloutSampler(_dream_rollouts, _dream_check, _dream_card),
        ),
        strict=True,
    )
)


def estimator_options(args) -> dict:
    """The estimator's own keyword arguments under `args`, as it declares them (`register_estimator(options=...)`):
    block_size for the block-random estimators, nodes for sdmc (a config field left None: the estimator's default)."""
    return get_estimator_spec(args.likelihood_estimator).option_values(args)


class DiffusionFamily:
    """Interface of a model family; see the module docstring."""

    name: str = "base"
    # How messages name the models of the family.
    label: str = "diffusion LM"
    # config.model_type values (compared lower-cased) of the models this family decodes; see `matches_config`.
    model_types: tuple[str, ...] = ()
    # Tried only when no other family matches (e.g. any transformers masked LM).
    fallback: bool = False
    # The family's own rollout sampler (a key of SAMPLERS), used when args.diffusion_sampler is "auto".
    default_sampler: str | None = None
    # Every parameter takes part in every forward pass (so DDP needs no unused-parameter search each step).
    uses_every_parameter: bool = False
    # Output i-1 holds the prediction for token i (Dream: trained from an autoregressive LM).
    shifted_logits: bool = False
    # The model's forward accepts LLaDA's approximate `CanvasCache` (Fast-dLLM-style prefix / dual cache).
    supports_canvas_cache: bool = False
    # Block-causal attention (block diffusion): the memory planner sizes its rollout KV cache.
    block_causal: bool = False

    def matches_config(self, config) -> bool:
        """Whether a model with this transformers config (or a loaded config.json) belongs to the family."""
        return str(getattr(config, "model_type", "") or "").lower() in self.model_types

    def matches(self, model) -> bool:
        """Whether the (unwrapped) model belongs to the family; by default its config decides."""
        config = getattr(model, "config", None)
        return config is not None and self.matches_config(config)

    def card_snippet(self, settings) -> CardSnippet:
        """The model card's decoding code and rollout sentence for the sampler `settings` select."""
        if self.default_sampler is None:
            raise NotImplementedError
        return SAMPLERS[self.sampler_name(settings)].card(settings)

    def check_rollout_settings(self, settings, adapter: DiffusionAdapter) -> None:
        """`check`, then the chosen sampler's own argument checks with the model's special ids (evaluation calls it
        with a `SamplerSettings`; training's config has passed the same checks at construction). A family with its
        own sampler (no `default_sampler`) has `check` alone: its sampler checks its arguments when called."""
        self.check(settings, adapter.model)
        if self.default_sampler is not None:
            SAMPLERS[self.sampler_name(settings)].check(settings, adapter)

    def sampler_name(self, args) -> str:
        """The rollout sampler under `args`: `args.diffusion_sampler`, or the family's own for "auto"."""
        choice = getattr(args, "diffusion_sampler", "auto")
        return self.default_sampler if choice == "auto" else choice

    def check(self, args, model) -> None:
        """Raise a ValueError naming the field and the fix when `args` cannot drive this family's `model`, or sets
        what its rollouts would ignore (e.g. dream_alg with LLaDA's sampler); the trainer calls it once, at construction."""
        if self.default_sampler is not None:
            check_sampler_settings(args, self.sampler_name(args))
            block = {k: getattr(args, k) for k, v in BLOCK_SAMPLER_DEFAULTS.items() if getattr(args, k, v) != v}
            if block:
                raise ValueError(
                    f"{block} are settings of the block-diffusion sampler (SDAR, TraDo, LLaDA2), which {self.name} "
                    f"models do not use; leave them at their defaults {BLOCK_SAMPLER_DEFAULTS}."
                )
            cache = getattr(args, "rollout_cache", "none")
            if cache != "none" and not self.supports_canvas_cache:
                raise ValueError(
                    f"rollout_cache={cache!r} needs LLaDA (the model with the canvas cache path); this model is "
                    f"family {self.name!r}. Set rollout_cache='none'."
                )
        elif getattr(args, "diffusion_sampler", "auto") != "auto":
            raise ValueError(
                f"diffusion_sampler={args.diffusion_sampler!r}: {self.name} models decode with their own sampler, not "
                "LLaDA's or Dream's; set diffusion_sampler='auto'."
            )
        else:
            unused = {k: getattr(args, k) for k, v in DREAM_SAMPLER_DEFAULTS.items() if getattr(args, k, v) != v}
            if getattr(args, "remasking", "low_confidence") != "low_confidence":
                unused["remasking"] = args.remasking
            if getattr(args, "cfg_scale", 0) != 0:
                unused["cfg_scale"] = args.cfg_scale
            unused.update(fast_rollout_settings(args))
            unused.update(
                explicit_layout(args)
            )  # LLaDA's blocks and steps (block_denoising_steps sets this sampler's)
            if unused:
                raise ValueError(
                    f"{unused} are settings of LLaDA's / Dream's samplers, which {self.name} models do not use (they "
                    "decode with their own sampler); leave them at their defaults."
                )

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
        """prompt_ids, prompt_mask (B, P) left-padded -> SamplerOutput with completion_ids / completion_mask (B, C).

        The default runs the sampler `sampler_name(args)` selects; families with their own decoding override it.
        """
        if self.default_sampler is None:
            raise NotImplementedError
        sampler = SAMPLERS[self.sampler_name(args)]
        return sampler.run(adapter, prompt_ids, prompt_mask, args, eos_token_ids, generator)

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

    def training_logits(self, model, noisy_ids: Tensor, clean_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """noisy_ids, clean_ids, attention_mask (B, L) -> logits (B, L, V): position i's prediction of clean token i.

        What masked-diffusion SFT trains on (`sft.MaskedDiffusionSFTTrainer`). Full attention: one forward of the
        noisy row, with shifted logits realigned (output i-1 -> position i, a row's first real token keeping its own).
        """
        out = model(input_ids=noisy_ids, attention_mask=attention_mask)
        logits = out.logits if hasattr(out, "logits") else out[0]  # (B, L, V)
        return realign_shifted_logits(logits, attention_mask) if self.shifted_logits else logits

    def num_mc_samples(self, args) -> int:
        """Monte-Carlo mask samples per estimate under `args`: mc_samples, or the estimator's default when unset."""
        if getattr(args, "mc_samples", None) is not None:
            return args.mc_samples
        return default_num_samples(args.likelihood_estimator, **estimator_options(args))

    def estimator_passes(self, args) -> int:
        """Forward passes per completion for one estimate under `args` (logged as stabledrl/estimator_passes)."""
        return estimator_cost(args.likelihood_estimator, self.num_mc_samples(args), **estimator_options(args))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


# ----------------------------------------------------------------------------------------------- the registry

# Every family the package knows, by name; `register_family` adds one.
FAMILIES: dict[str, DiffusionFamily] = {}


def register_family(family: DiffusionFamily, *, replace: bool = False) -> DiffusionFamily:
    """Make `family` known to detection, the trainer, evaluation, SFT and the model card; returns it.

    A family module calls this once when imported. `replace=True` swaps a family registered under the same name.
    """
    if not isinstance(family, DiffusionFamily):
        raise TypeError(f"register_family needs a DiffusionFamily instance, got {type(family).__name__}.")
    if not family.name or family.name == DiffusionFamily.name:
        raise ValueError(f"{type(family).__name__} needs a `name` of its own (got {family.name!r}).")
    if family.name in FAMILIES and not replace:
        raise ValueError(
            f"a family named {family.name!r} is already registered ({FAMILIES[family.name]!r}); choose another name "
            "or pass replace=True."
        )
    if not family.model_types and not family.fallback and type(family).matches is DiffusionFamily.matches:
        raise ValueError(
            f"{type(family).__name__} has no model_types and no `matches`: no model would ever be detected as "
            f"{family.name!r}. Set model_types = ('<config.model_type>',)."
        )
    cls = type(family)
    missing = []
    if cls.estimate is DiffusionFamily.estimate:
        missing.append("estimate (the likelihood estimator)")
    if family.default_sampler is None:
        if cls.generate is DiffusionFamily.generate:
            missing.append("generate (its rollout sampler), or default_sampler = 'llada' / 'dream'")
        if cls.card_snippet is DiffusionFamily.card_snippet:
            missing.append("card_snippet (the model card's decoding code)")
    if missing:
        raise TypeError(
            f"{cls.__name__} does not implement {'; '.join(missing)}. Subclass the nearest built-in family instead "
            "(MaskedDiffusionFamily for full attention with LLaDA's sampler, BlockDiffusionFamily for block "
            "diffusion) and override only what differs."
        )
    FAMILIES[family.name] = family
    return family


def get_family(name: str) -> DiffusionFamily:
    """The registered family `name` (as returned by `detect_family`)."""
    if name not in FAMILIES:
        raise ValueError(f"no diffusion family {name!r}; registered: {sorted(FAMILIES)}.")
    return FAMILIES[name]


def _in_detection_order() -> list[DiffusionFamily]:
    return [f for f in FAMILIES.values() if not f.fallback] + [f for f in FAMILIES.values() if f.fallback]


def detect_family(model) -> str | None:
    """The name of the registered family whose models `model` (possibly inside DDP / FSDP / PEFT) belongs to, or
    None: autoregressive LMs (LlamaForCausalLM, Qwen2ForCausalLM, ...) and models without an LM head."""
    inner = unwrap_model(model)
    if getattr(inner, "config", None) is None:
        return None
    for family in _in_detection_order():
        if family.matches(inner):
            return family.name
    return None


def detect_family_from_config(config) -> str | None:
    """`detect_family` before loading: the family of a model with this config (e.g. `AutoConfig.from_pretrained`)."""
    for family in _in_detection_order():
        if family.matches_config(config):
            return family.name
    return None


def is_diffusion_model(model) -> bool:
    """True for a model some registered family decodes (see `detect_family`)."""
    return detect_family(model) is not None


def family_labels() -> str:
    """The registered families as messages name them, e.g. "LLaDA, Dream / DiffuCoder, ... or a masked LM"."""
    labels = [f.label for f in _in_detection_order()]
    return ", ".join(labels[:-1]) + f" or {labels[-1]}" if len(labels) > 1 else "".join(labels)
