"""The built-in model families, one module each; importing this package registers them, in detection order.

A family module defines a `DiffusionFamily` subclass (`diffusion/family_base.py`, which imports nothing above it) and
registers one instance with `register_family`; a new family is one more module like these (llada2.py is the shortest
complete example).
"""

from . import (
    dream,  # noqa: F401  (Dream / DiffuCoder)
    llada,  # noqa: F401  (LLaDA)
    llada2,  # noqa: F401  (LLaDA2)
    masked_lm,  # noqa: F401  (any transformers masked LM, tried last)
    sdar,  # noqa: F401  (SDAR / TraDo)
)
