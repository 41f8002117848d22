"""The built-in model families, one module each; importing this package registers them, in detection order.

A family module defines a `DiffusionFamily` subclass (`diffusion/family_base.py`, which imports nothing above it) and
registers one instance with `register_family`; a new family is one more module like these (llada2.py is the shortest
complete example). The shared bases are named for their attention: `full_attention.py` (`MaskedDiffusionFamily`:
LLaDA, Dream, masked LMs) and `block_causal.py` (`BlockDiffusionFamily`: SDAR, TraDo, LLaDA2).
"""

# isort: off
# Registration order is detection order (the masked-LM fallback is tried last whatever its place).
from . import llada  # noqa: F401  (LLaDA)
from . import dream  # noqa: F401  (Dream / DiffuCoder)
from . import sdar  # noqa: F401  (SDAR / TraDo)
from . import llada2  # noqa: F401  (LLaDA2)
from . import masked_lm  # noqa: F401  (any transformers masked LM, tried last)
from . import diffusion_gemma  # noqa: F401  (DiffusionGemma: uniform-noise block diffusion)
# isort: on
