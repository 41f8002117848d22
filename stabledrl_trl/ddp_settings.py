"""DDP's unused-parameter search, one rule for the RL trainer and the SFT warm-up.

transformers turns `find_unused_parameters` on for any model trained without activation checkpointing: one extra
graph traversal per step. A diffusion family whose model uses every parameter in every forward pass
(`DiffusionFamily.uses_every_parameter`: LLaDA, Dream) needs no search, so it is off for them unless
`ddp_find_unused_parameters` is set explicitly; the block-diffusion and MoE families keep transformers' choice.
`StableDRLTrainer` and `MaskedDiffusionSFTTrainer` both apply it in transformers' `_build_accelerator_args` hook, so
the warm-up under two processes runs DDP as the RL step does.
"""

from __future__ import annotations


def without_needless_unused_parameter_search(
    accelerator_args: dict, model, ddp_find_unused_parameters, diffusion=None
) -> dict:
    """`accelerator_args` (transformers' `_build_accelerator_args` result) with the DDP handler's
    `find_unused_parameters` turned off when `ddp_find_unused_parameters` is None and `model`'s family uses every
    parameter in every forward pass. `diffusion` False (an autoregressive run) leaves it as transformers set it."""
    from accelerate.utils import DistributedDataParallelKwargs

    from .diffusion.family import detect_family, get_family

    family = detect_family(model) if diffusion is not False else None
    if ddp_find_unused_parameters is None and family is not None and get_family(family).uses_every_parameter:
        for handler in accelerator_args.get("kwargs_handlers", []):
            if isinstance(handler, DistributedDataParallelKwargs):
                handler.find_unused_parameters = False
    return accelerator_args
