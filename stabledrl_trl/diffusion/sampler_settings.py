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
    remasking: str  # LLaDA's sampler
    cfg_scale: float  # LLaDA's sampler
    diffusion_sampler: str  # "auto" (the family's own), "llada" or "dream"
    dream_alg: str  # Dream's sampler
    dream_alg_temp: float
    dream_eps: float
    block_denoising_steps: int | None  # block diffusion (SDAR, TraDo, LLaDA2)
    block_remasking: str
    block_confidence_threshold: float
    rollout_cache: str  # LLaDA's approximate modes ("none", None, None = exact decoding)
    parallel_threshold: float | None
    max_tokens_per_step: int | None
    reward_text: str  # "canvas" keeps finished rows decoding (the reward reads the whole canvas)

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
