"""The routing-health metric of mixture-of-experts models (LLaDA2), logged by the trainer every optimiser step."""

from __future__ import annotations

import math

import torch

from .diffusion.adapter import unwrap_model


def expert_load_entropy(model, reduce=None) -> dict[str, float]:
    """Routing health of a mixture-of-experts model, then a reset of the counts it read.

    Every router module exposing `expert_load` (E,) (tokens routed to each expert since its last reset, e.g.
    LLaDA2's `mlp.gate`) gives the normalised entropy H(p) / log E of p = load / sum(load): 1 = a uniform load,
    0 = every token on one expert (a routing collapse). Returns {"moe/expert_load_entropy": mean over routers,
    "moe/expert_load_entropy_min": the lowest router}, or {} for a model without routers.
    reduce: sums a tensor over processes (the trainer passes accelerate's `reduce(..., "sum")` under data
    parallelism), so the entropy is that of the step's whole load, not of one process's share; called once, on the
    concatenated counts of every router, by every process.
    """
    loads = []
    for module in unwrap_model(model).modules():
        load = getattr(module, "expert_load", None)
        if isinstance(load, torch.Tensor) and load.dim() == 1 and load.numel() >= 2:
            loads.append(load)
    if not loads:
        return {}
    counts = torch.cat([load.detach().double() for load in loads])  # (sum of E,) every router's counts
    if reduce is not None:
        counts = reduce(counts)
    values = []
    for part in counts.split([load.numel() for load in loads]):  # (E,) per router
        total = float(part.sum())
        if total > 0:
            p = part / total  # (E,)
            values.append(float(-(p * p.clamp_min(1e-300).log()).sum()) / math.log(part.numel()))
    for load in loads:
        load.zero_()
    if not values:
        return {}
    return {"moe/expert_load_entropy": sum(values) / len(values), "moe/expert_load_entropy_min": min(values)}
