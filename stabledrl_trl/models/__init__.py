"""Masked diffusion LMs as native transformers models (no `trust_remote_code`): LLaDA, Dream, SDAR / TraDo, LLaDA2.

Importing this package registers them with transformers' Auto classes (model types "llada", "Dream", "sdar",
"llada2_moe").
"""

from .dream import DreamBaseModel, DreamConfig, DreamModel, register_dream
from .llada import LLaDAConfig, LLaDAModel, LLaDAModelLM, register_llada
from .llada2 import LLaDA2MoeConfig, LLaDA2MoeModel, LLaDA2MoeModelLM, register_llada2
from .sdar import SDARConfig, SDARForCausalLM, SDARModel, register_sdar

register_llada()
register_dream()
register_sdar()
register_llada2()

__all__ = [
    "DreamBaseModel",
    "DreamConfig",
    "DreamModel",
    "LLaDA2MoeConfig",
    "LLaDA2MoeModel",
    "LLaDA2MoeModelLM",
    "LLaDAConfig",
    "LLaDAModel",
    "LLaDAModelLM",
    "SDARConfig",
    "SDARForCausalLM",
    "SDARModel",
]
