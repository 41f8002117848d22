"""stabledrl_trl: stable reinforcement learning (StableDRL, DGPO) for masked diffusion language models, on TRL."""

from . import models  # registers LLaDA, Dream and SDAR with transformers' Auto classes
from .version import __version__

__all__ = ["StableDRLConfig", "StableDRLTrainer", "__version__", "models"]


def __getattr__(name):
    # TRL is imported lazily: `import stabledrl_trl` (which registers the models) stays fast.
    if name == "StableDRLConfig":
        from .stabledrl_config import StableDRLConfig

        return StableDRLConfig
    if name == "StableDRLTrainer":
        from .stabledrl_trainer import StableDRLTrainer

        return StableDRLTrainer
    raise AttributeError(f"module 'stabledrl_trl' has no attribute {name!r}")
