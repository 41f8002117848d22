"""The settings a diffusion rollout sampler reads, as one typed, validated object.

Training rollouts read these settings from the `StableDRLConfig`; evaluation (`evaluation.evaluate_model`,
scripts/train.py's held-out accuracy, scripts/evaluate.py) reads them from a `SamplerSettings`. The field names are
the config's, so a family's `generate` (`diffusion/family.py`) accepts either object, and evaluation built with
`SamplerSettings.from_config(config)` decodes exactly as the trainer's rollouts for the same generator.

Both constructors validate with the same functions as the config's `__post_init__`, never a copy of them, and
without building a config: `check_field_types` and `check_config_values` (types, float ranges; `checks.py`) and
`check_sampler_values` (this module: the sampler fields' values and combinations, LLaDA's layout, Dream's arguments,
settings the chosen sampler would ignore), so a bad value fails with training's message.
- `SamplerSettings.from_config(config, **overrides)`: the config's settings (already validated by its
  `__post_init__`); overrides (e.g. an evaluation temperature) are checked as `from_fields` checks them.
- `SamplerSettings.from_fields(**fields)`: the given fields over the defaults (unset `block_length` /
  `diffusion_steps` get the length-derived defaults).
Which model can run which sampler, and the model-dependent checks, stay with the family (`DiffusionFamily.check`).

This module owns the sampler defaults (`SamplerSettings`' field defaults, read by `sampler_default`; the config
declares its sampler fields with them; `top_k` / `top_p` are GRPOConfig's), the names of the shared rollout samplers
(`SAMPLER_NAMES`), the sampler-setting checks and LLaDA's layout rule (`resolve_diffusion_layout`,
`check_diffusion_layout`). It imports only the samplers and `checks.py`, so the config, the families and validation
all build on it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass

from trl import GRPOConfig

from ..checks import _is_int, check_config_values, check_field_types
from .block_sampler import REMASKING_STRATEGIES
from .dream_sampler import validate_dream_sampler_args
from .llada_sampler import CACHE_MODES, REMASKING_MODES

# The rollout samplers several families share, by the name `diffusion_sampler` selects ("auto": the family's own);
# `family_base.py` maps each to its run / check / card functions.
SAMPLER_NAMES = ("llada", "dream")
REWARD_TEXTS = ("completion", "canvas")
_GRPO_FIELDS = GRPOConfig.__dataclass_fields__


@dataclass(frozen=True)
class SamplerSettings:
    """Rollout sampler settings; every field is the `StableDRLConfig` field of the same name and meaning."""

    max_completion_length: int = 256  # canvas positions (LLaDA, Dream) or new tokens (block diffusion)
    block_length: int | None = None  # LLaDA's semi-autoregressive block (None: derived from the length)
    diffusion_steps: int | None = None  # LLaDA's / Dream's denoising steps over the whole canvas (None: derived)
    temperature: float = 0.9  # 0 = greedy
    top_k: int | None = _GRPO_FIELDS["top_k"].default  # 0 / None = no filtering
    top_p: float | None = _GRPO_FIELDS["top_p"].default  # 1.0 / None = no filtering
    remasking: str = "low_confidence"  # LLaDA's sampler
    cfg_scale: float = 0.0  # LLaDA's sampler
    diffusion_sampler: str = "auto"  # "auto" (the family's own), "llada" or "dream"
    dream_alg: str = "entropy"  # Dream's sampler
    dream_alg_temp: float = 0.0
    dream_eps: float = 1e-3
    block_denoising_steps: int | None = None  # block diffusion (SDAR, TraDo, LLaDA2)
    block_remasking: str = "low_confidence_dynamic"
    block_confidence_threshold: float = 0.9
    rollout_cache: str = "none"  # LLaDA's approximate modes ("none", None, None = exact decoding)
    parallel_threshold: float | None = None
    max_tokens_per_step: int | None = None
    reward_text: str = "completion"  # "canvas" keeps finished rows decoding (the reward reads the whole canvas)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_config(cls, config, **overrides) -> SamplerSettings:
        """The settings `config` (a `StableDRLConfig`) drives rollouts with, with `overrides` checked as training
        checks them (a `ValueError` with the config's message for a bad value)."""
        names = cls.field_names()
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise TypeError(f"{unknown} are not sampler settings; the fields are {list(names)}.")
        values = {name: getattr(config, name) for name in names}
        if overrides:
            return cls.from_fields(**{**values, **overrides})
        return cls(**{name: _plain(value) for name, value in values.items()})

    @classmethod
    def from_fields(cls, **fields) -> SamplerSettings:
        """Settings from `fields` (StableDRLConfig field names) over the defaults, validated by the config's own
        checks (`check_field_types`, `check_config_values`, `check_sampler_values`): a bad value fails with the
        error training gives (naming the field, the value and the fix)."""
        names = cls.field_names()
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise TypeError(f"{unknown} are not sampler settings; the fields are {list(names)}.")
        settings = cls(**fields)
        hints = _type_hints(cls)
        check_field_types(settings, hints)
        check_config_values(settings, hints)
        block_length, diffusion_steps = check_sampler_values(settings)
        values = {**dataclasses.asdict(settings), "block_length": block_length, "diffusion_steps": diffusion_steps}
        return cls(**{name: _plain(value) for name, value in values.items()})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _plain(value):
    """The config's "unset" defaults are int / float subclasses; store their plain values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    return value


def sampler_default(name: str):
    """The default of the sampler setting `name`: `StableDRLConfig` declares its sampler fields with these."""
    default = SamplerSettings.__dataclass_fields__[name].default
    if default is dataclasses.MISSING:
        raise KeyError(f"{name!r} has no sampler default (its default is the config's own).")
    return default


# ----------------------------------------------------------------------------------------------- the layout rule

OFFICIAL_BLOCK_LENGTH = 32
OFFICIAL_TOKENS_PER_STEP = 2  # 256 positions in 128 steps


def resolve_diffusion_layout(
    max_completion_length: int, block_length: int | None, diffusion_steps: int | None, check: bool = True
) -> tuple[int, int]:
    """Fill unset `block_length` / `diffusion_steps` from `max_completion_length` and check the layout.

    block_length None: 32 (official) when it divides L = max_completion_length, else the largest divisor of L <= 32.
    diffusion_steps None: L / 2 (the official 2 tokens per step), rounded down to a multiple of the number of blocks
    L / block_length, and at least one step per block; never more steps than positions.
    `check=False` fills the defaults but leaves a layout the user set explicitly unchecked (for a model that may be
    autoregressive); `check_diffusion_layout` checks it later. Messages use the config's field names.
    """
    length = max_completion_length
    if length is None:  # TRL's "no limit" for autoregressive models; the trainer refuses it for a dLLM
        return block_length, diffusion_steps
    if not _is_int(length) or length < 1:
        raise ValueError(f"max_completion_length must be a positive integer, got {length!r}.")
    if block_length is None:
        block_length = max(d for d in range(1, min(OFFICIAL_BLOCK_LENGTH, length) + 1) if length % d == 0)
    if diffusion_steps is None and _is_int(block_length) and block_length >= 1 and length % block_length == 0:
        num_blocks = length // block_length
        diffusion_steps = num_blocks * max(1, length // OFFICIAL_TOKENS_PER_STEP // num_blocks)
    if check:
        check_diffusion_layout(length, block_length, diffusion_steps)
    return block_length, diffusion_steps


def check_diffusion_layout(max_completion_length: int, block_length, diffusion_steps) -> None:
    """Raise a ValueError naming the config field, its value and the fix for a layout the sampler cannot run."""
    length = max_completion_length
    if length is None:
        raise ValueError(
            "max_completion_length=None: a diffusion LM decodes a fixed canvas of max_completion_length positions; "
            "set it (the official StableDRL recipe uses 256)."
        )
    if not _is_int(block_length) or block_length < 1:
        raise ValueError(f"block_length must be a positive integer (or None for the default), got {block_length!r}.")
    if length % block_length != 0:
        divisors = [d for d in range(1, length + 1) if length % d == 0 and d <= OFFICIAL_BLOCK_LENGTH]
        raise ValueError(
            f"block_length={block_length} must divide max_completion_length={length} (every block has the same "
            f"length). Set block_length to a divisor of {length} (e.g. {divisors[-1]}), leave it unset for that "
            f"default, or change max_completion_length to a multiple of {block_length}."
        )
    num_blocks = length // block_length
    if diffusion_steps is None:
        raise ValueError("diffusion_steps is None; leave both block_length and diffusion_steps unset, or set both.")
    if not _is_int(diffusion_steps) or diffusion_steps < 1:
        raise ValueError(
            f"diffusion_steps must be a positive integer (or None for the default), got {diffusion_steps!r}."
        )
    if diffusion_steps % num_blocks != 0:
        raise ValueError(
            f"diffusion_steps={diffusion_steps} must be a multiple of the number of blocks max_completion_length / "
            f"block_length = {length} / {block_length} = {num_blocks} (steps are split evenly across blocks); use "
            f"e.g. diffusion_steps={num_blocks * max(1, diffusion_steps // num_blocks)}, or leave it unset."
        )
    if diffusion_steps > length:
        raise ValueError(
            f"diffusion_steps={diffusion_steps} is more than max_completion_length={length}: a step reveals at "
            f"least one position, so at most {length} steps can do anything. Use diffusion_steps <= {length} "
            f"(the official ratio is {length // OFFICIAL_TOKENS_PER_STEP or 1}), or leave it unset."
        )



@functools.lru_cache(maxsize=None)
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


# ----------------------------------------------------------------------------------------------- the checks

# Defaults of the settings only Dream's sampler reads.
DREAM_SAMPLER_DEFAULTS = {name: sampler_default(name) for name in ("dream_alg", "dream_alg_temp", "dream_eps")}
# Settings only the block-diffusion sampler reads.
BLOCK_SAMPLER_DEFAULTS = {
    name: sampler_default(name) for name in ("block_denoising_steps", "block_remasking", "block_confidence_threshold")
}
# The approximate rollout modes, which only LLaDA's sampler has (the caches only on LLaDA models).
FAST_ROLLOUT_DEFAULTS = {
    name: sampler_default(name) for name in ("rollout_cache", "parallel_threshold", "max_tokens_per_step")
}


def fast_rollout_settings(args) -> dict:
    """The approximate rollout modes `args` turns on (fields of FAST_ROLLOUT_DEFAULTS not at their default)."""
    return {k: getattr(args, k) for k, v in FAST_ROLLOUT_DEFAULTS.items() if getattr(args, k, v) != v}


def explicit_layout(args, names=("block_length", "diffusion_steps")) -> dict:
    """LLaDA's layout fields of `names` that `args` sets away from the values `max_completion_length` derives (what a
    sampler without LLaDA's blocks would ignore); a value equal to the derived one cannot be told from unset."""
    length = getattr(args, "max_completion_length", None)
    if length is None:
        return {}
    derived = dict(zip(("block_length", "diffusion_steps"), resolve_diffusion_layout(length, None, None, check=False)))
    return {name: getattr(args, name) for name in names if getattr(args, name, None) not in (None, derived[name])}


def check_sampler_settings(args, sampler: str) -> None:
    """Raise if `args` sets something the rollout sampler `sampler` ('llada' or 'dream') does not read."""
    if sampler == "dream":
        layout = explicit_layout(args, names=("block_length",))
        if layout:
            raise ValueError(
                f"{layout}: Dream's sampler decodes the whole completion at once, without LLaDA's blocks, so "
                "block_length would be ignored; remove it (diffusion_steps sets Dream's steps)."
            )
        fast = fast_rollout_settings(args)
        if fast:
            raise ValueError(
                f"{fast} are approximate modes of LLaDA's sampler; Dream's sampler has none. Leave them at their "
                f"defaults {FAST_ROLLOUT_DEFAULTS} or set diffusion_sampler='llada'."
            )
        if args.remasking != "low_confidence":
            raise ValueError(
                f"remasking={args.remasking!r} is a setting of LLaDA's sampler; Dream's sampler ranks positions by "
                "dream_alg (dream_alg='origin' reveals them at random). Leave remasking='low_confidence'."
            )
        if args.cfg_scale != 0:
            raise ValueError(
                f"cfg_scale={args.cfg_scale}: Dream's sampler has no classifier-free guidance; set cfg_scale=0 or "
                "diffusion_sampler='llada'."
            )
    else:
        changed = {k: getattr(args, k) for k, v in DREAM_SAMPLER_DEFAULTS.items() if getattr(args, k) != v}
        if changed:
            raise ValueError(
                f"{changed} only apply to Dream's sampler, but rollouts use LLaDA's sampler; set "
                "diffusion_sampler='dream' (or 'auto' with a Dream model) or leave them at their defaults "
                f"{DREAM_SAMPLER_DEFAULTS}."
            )


class _WithLayout:
    """`settings` with the resolved `block_length` / `diffusion_steps` (what the checks after the layout read)."""

    def __init__(self, settings, block_length, diffusion_steps):
        self._settings, self.block_length, self.diffusion_steps = settings, block_length, diffusion_steps

    def __getattr__(self, name):
        return getattr(self._settings, name)


def check_sampler_values(settings, diffusion: bool | None = None) -> tuple[int | None, int | None]:
    """The sampler settings' values and combinations, as `StableDRLConfig.__post_init__` checks them (it calls this);
    returns the resolved (block_length, diffusion_steps). `settings`: a config or a `SamplerSettings` (types and
    float ranges already checked); `diffusion`: the config's `diffusion` (False: an autoregressive model, which reads
    none of the diffusion samplers' settings)."""
    s = settings
    if s.remasking not in REMASKING_MODES:
        raise ValueError(f"remasking={s.remasking!r}; choose 'low_confidence' or 'random'.")
    if s.rollout_cache not in CACHE_MODES:
        raise ValueError(f"rollout_cache={s.rollout_cache!r}; choose 'none' (exact), 'prefix' or 'dual' (approximate).")
    if s.max_tokens_per_step is not None:
        if s.max_tokens_per_step < 1:
            raise ValueError(f"max_tokens_per_step={s.max_tokens_per_step} must be >= 1 or None (no cap).")
        if s.parallel_threshold is None:
            raise ValueError(
                f"max_tokens_per_step={s.max_tokens_per_step} caps confidence-threshold decoding only; set "
                "parallel_threshold (e.g. 0.9) or leave max_tokens_per_step=None."
            )
    # Sampler layout: unset block_length / diffusion_steps get defaults that fit max_completion_length; a layout
    # set explicitly is checked where LLaDA's sampler may run (not for diffusion=False: an autoregressive model
    # never uses these fields; not for Dream's block-free sampler). The trainer checks again once it knows the
    # model's sampler.
    block_length, diffusion_steps = resolve_diffusion_layout(
        s.max_completion_length,
        s.block_length,
        s.diffusion_steps,
        check=diffusion is not False and s.diffusion_sampler != "dream",
    )
    # before the samplers' own checks, so the message is the field's and not one sampler's
    if s.top_k is not None and s.top_k < 0:
        raise ValueError(f"top_k={s.top_k} must be >= 0 (0 = off).")
    # `diffusion_sampler` and the settings that only one sampler reads: a setting the chosen sampler would ignore is
    # an error. With 'auto' the model decides, so the check against the family runs in the trainer.
    if s.diffusion_sampler != "auto" and s.diffusion_sampler not in SAMPLER_NAMES:
        raise ValueError(
            f"diffusion_sampler={s.diffusion_sampler!r}; choose 'auto' (the model family's own sampler) or one "
            f"of {' / '.join(repr(name) for name in SAMPLER_NAMES)}."
        )
    if not (diffusion is False or s.max_completion_length is None):  # an autoregressive model reads none of them
        validate_dream_sampler_args(
            gen_length=s.max_completion_length,
            steps=diffusion_steps,
            alg=s.dream_alg,
            alg_temp=s.dream_alg_temp,
            eps=s.dream_eps,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k else None,
        )
        if s.diffusion_sampler in SAMPLER_NAMES:
            check_sampler_settings(_WithLayout(s, block_length, diffusion_steps), s.diffusion_sampler)
    if s.reward_text not in REWARD_TEXTS:
        raise ValueError(
            f"reward_text={s.reward_text!r}; choose 'completion' (the text up to the first EOS) or 'canvas' "
            "(the whole decoded generation canvas, as the official StableDRL code grades it)."
        )
    # Block diffusion (SDAR, TraDo)
    if s.block_remasking not in REMASKING_STRATEGIES:
        raise ValueError(f"block_remasking={s.block_remasking!r}; choose one of {list(REMASKING_STRATEGIES)}.")
    if s.block_denoising_steps is not None and s.block_denoising_steps < 1:
        raise ValueError(
            f"block_denoising_steps={s.block_denoising_steps} must be >= 1, or None for the model's block size."
        )
    return block_length, diffusion_steps
