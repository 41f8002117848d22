"""Masked diffusion LMs as native transformers models (no `trust_remote_code`): LLaDA, Dream and SDAR / TraDo.

Importing this package registers them with transformers' Auto classes (model types "llada", "Dream", "sdar").
"""

from .dream import DreamBaseModel, DreamConfig, DreamModel, register_dream
from .llada import LLaDAConfig, LLaDAModel, LLaDAModelLM, register_llada
from .sdar import SDARConfig, SDARForCausalLM, SDARModel, register_sdar

register_llada()
register_dream()
register_sdar()

__all__ = [
    "DreamBaseModel",
    "DreamConfig",
    "DreamModel",
    "LLaDAConfig",
    "LLaDAModel",
    "LLaDAModelLM",
    "SDARConfig",
    "SDARForCausalLM",
    "SDARModel",
]
