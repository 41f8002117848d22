"""Masked diffusion LMs as native transformers models (no `trust_remote_code`): LLaDA and Dream.

Importing this package registers them with transformers' Auto classes (model types "llada" and "Dream").
"""

from .dream import DreamBaseModel, DreamConfig, DreamModel, register_dream
from .llada import LLaDAConfig, LLaDAModel, LLaDAModelLM, register_llada

register_llada()
register_dream()

__all__ = [
    "DreamBaseModel",
    "DreamConfig",
    "DreamModel",
    "LLaDAConfig",
    "LLaDAModel",
    "LLaDAModelLM",
]
