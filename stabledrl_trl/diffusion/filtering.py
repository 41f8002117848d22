"""Top-k / top-p (nucleus) filtering of candidate logits, shared by LLaDA's sampler and the block-diffusion sampler.

The rule is the one of SDAR's and LLaDA2's `sample_with_temperature_topk_topp` (`top_k_logits`, then
`top_p_logits`), which the SDAR and LLaDA2 fixtures reproduce:

1. top-k: keep every token whose logit is >= the k-th largest logit of its row. Tokens tied with the k-th largest
   are all kept (so more than k tokens survive on exact logit ties), as in transformers' `TopKLogitsWarper`.
2. top-p, on the distribution left by top-k (softmax of the top-k-filtered logits): sort the tokens by decreasing
   logit and keep a token when the probability of the tokens ranked before it is <= top_p. The kept set is the
   sorted prefix up to and including the token whose cumulative probability crosses top_p, and always holds the most
   likely token. Exact tie: when a prefix holds exactly top_p, the token after it is kept too (the prefix has not
   exceeded top_p): with probabilities [0.5, 0.25, 0.25] and top_p = 0.75 all three tokens stay. transformers'
   `TopPLogitsWarper` drops that token; the two rules agree everywhere else. Tokens with equal logits are ordered
   by `torch.sort`.

Off: top_k None or 0 and top_p None or 1.0 each mean "no filter" in `filter_logits`, LLaDA's `generate` and
`block_generate`. `StableDRLConfig` (typed like TRL's GRPOConfig) takes the numbers: top_k 0 and top_p 1.0, its
defaults, are off. Dream's sampler keeps Dream's own filter (`dream_sampler.filter_logits`: top-p before top-k).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def validate_filter_args(top_k, top_p) -> None:
    """Raise a ValueError naming the argument, its value and the fix for a bad top_k / top_p."""
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be None or an integer >= 0 (None or 0 = no top-k filter), got {top_k!r}.")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1] (None or 1 = no nucleus filter), got {top_p!r}.")


def filter_logits(logits: Tensor, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """Top-k, then top-p on the top-k-filtered distribution (the module docstring's rule). (..., V) -> (..., V).

    Logits outside the kept set become -inf; the others are returned unchanged. `logits` is not modified; with both
    filters off it is returned as is. top_k None / 0 and top_p None / 1.0 mean off; top_k >= V keeps every token.
    """
    validate_filter_args(top_k, top_p)
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]  # (..., 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (..., V)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)  # (..., V)
        # drop a token when the tokens before it already exceed top_p: the token that crosses top_p stays
        drop_sorted = F.pad(cumulative[..., :-1] > top_p, (1, 0), value=False)  # (..., V)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # (..., V) in vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
