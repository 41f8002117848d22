"""The settings a diffusion rollout sampler reads, as one typed, validated object.

Training rollouts read these settings from the `StableDRLConfig`; evaluation (`evaluation.evaluate_model`,
scripts/train.py's held-out accuracy, scripts/evaluate.py) reads them from a `SamplerSettings`. The field names are
the config's, so a family's `generate` (`diffusion/family.py`) accepts either object, and evaluation built with
`SamplerSettings.from_config(config)` decodes exactly as the trainer's rollouts for the same generator.

Both constructors validate through the config's own checks, never a copy of them:
- `SamplerSettings.from_config(config, **overrides)`: the config's settings (already validated by its
  `__post_init__`); overrides (e.g. an evaluation temperature) are checked by building a `StableDRLConfig` from the
  merged settings, so a bad value fails with training's message.
- `SamplerSettings.from_fields(**fields)`: the given fields over `StableDRLConfig`'s defaults, checked the same way
  (unset `block_length` / `diffusion_steps` get the config's length-derived defaults).
Which sampler reads which field, and the model-dependent checks, stay with the family (`DiffusionFamily.check`).

This module owns the sampler defaults (`SamplerSettings`' field defaults, read by `sampler_default`; the config
declares its sampler fields with them) and LLaDA's layout rule (`resolve_diffusion_layout`, `check_diffusion_layout`:
unset `block_length` / `diffusion_steps` derived from `max_completion_length`). It imports nothing from the package at
module level, so the config, the families and validation all build on it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplerSettings:
    """Rollout sampler settings; every field is the `StableDRLConfig` field of the same name and meaning."""

    max_completion_length: int  # canvas positions (LLaDA, Dream) or new tokens (block diffusion)
    block_length: int  # LLaDA's semi-autoregressive block
    diffusion_steps: int  # LLaDA's / Dream's denoising steps over the whole canvas
    temperature: float  # 0 = greedy
    top_k: int | None  # 0 / None = no filtering
    top_p: float | None  # 1.0 / None = no filtering
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
        """Settings from `fields` (StableDRLConfig field names) over the config's defaults, validated by building a
        `StableDRLConfig` from them: its error (naming the field, the value and the fix) is raised unchanged."""
        import tempfile
        import warnings

        from ..stabledrl_config import StableDRLConfig

        names = cls.field_names()
        unknown = sorted(set(fields) - set(names))
        if unknown:
            raise TypeError(f"{unknown} are not sampler settings; the fields are {list(names)}.")
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. temperature 0 with several generations: fine for an evaluation
            config = StableDRLConfig(
                output_dir=folder, report_to="none", use_cpu=True, bf16=False, mask_seed_mode="fresh", **fields
            )
        return cls.from_config(config)

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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
