"""The shared top-k / top-p filter: against transformers' logits warpers, by hand at the top-p boundary, off values,
edge values of top_k, and bad arguments."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from stabledrl_trl.diffusion.filtering import filter_logits


def _reference(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """transformers' TopKLogitsWarper then TopPLogitsWarper (they take (N, V) scores). (..., V) -> (..., V)."""
    scores = logits.reshape(-1, logits.shape[-1])  # (N, V)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None and top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.reshape(logits.shape)


def _prefix_mass_gap(logits: torch.Tensor, top_k, top_p: float) -> float:
    """Smallest |probability of a sorted prefix - top_p| over all rows and prefixes, on the top-k-filtered logits.

    The two top-p rules differ only where a prefix's probability equals top_p; a gap far above the rounding error
    of the cumulative sums makes the comparison with TopPLogitsWarper exact.
    """
    kept = TopKLogitsWarper(top_k)(None, logits.reshape(-1, logits.shape[-1])) if top_k else logits
    probs = torch.softmax(kept.double(), dim=-1).sort(dim=-1, descending=True).values  # (..., V)
    return float((probs.cumsum(-1) - top_p).abs().min())


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "shape, dtype, scale",
    [((64, 500), torch.float64, 3.0), ((3, 5, 40), torch.float32, 2.0), ((30,), torch.float32, 1.0)],
)
@pytest.mark.parametrize("top_k", [None, 1, 4, 29, 1000])
@pytest.mark.parametrize("top_p", [None, 0.3, 0.9, 0.97])
def test_matches_transformers_top_k_then_top_p(seed, shape, dtype, scale, top_k, top_p):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(shape, generator=g, dtype=dtype)  # (..., V)
    if top_p is not None:
        gap = _prefix_mass_gap(logits, top_k, top_p)
        assert gap > (1e-10 if dtype == torch.float64 else 1e-5), gap  # continuous logits: no tie within rounding
    expected = _reference(logits, top_k, top_p)
    got = filter_logits(logits, top_k, top_p)
    assert got.shape == logits.shape and got.dtype == logits.dtype
    assert torch.equal(got, expected)
    if top_k == 1 or top_p == 0.3:
        assert torch.isinf(got).any()  # the comparison does exercise the filters


@pytest.mark.parametrize(
    "probs, top_p, dtype",
    [([0.5, 0.25, 0.25], 0.75, torch.float64), ([0.5, 0.25, 0.25], 0.75, torch.float32),
     ([0.5, 0.3, 0.2], 0.8, torch.float32)],
)  # fmt: skip
def test_exact_tie_keeps_the_token_after_the_prefix(probs, top_p, dtype):
    logits = torch.tensor(probs, dtype=dtype).log()[None]  # (1, 3)
    cumulative = torch.softmax(logits, -1).cumsum(-1)  # (1, 3)
    assert cumulative[0, 1] == top_p  # the first two tokens hold exactly top_p (compared in `dtype`)
    # SDAR's rule: the third token's predecessors hold top_p, not more, so it stays
    assert torch.equal(filter_logits(logits, top_p=top_p), logits)
    # transformers' TopPLogitsWarper drops it: the two rules differ here only (which of two equal logits goes is
    # the sort's choice, so count)
    dropped = torch.isinf(_reference(logits, None, top_p))  # (1, 3)
    assert dropped.sum() == 1 and not dropped[0, 0]
    # just below the tie a token is dropped as well, just above it none is
    below = filter_logits(logits, top_p=top_p - 1e-3)
    assert torch.isinf(below).sum() == 1 and torch.equal(below[:, 0], logits[:, 0])
    assert torch.equal(filter_logits(logits, top_p=top_p + 1e-3), logits)


def test_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))  # (1, 5), already sorted
    # 0.5 < 0.6: the second token is kept (it crosses 0.6); 0.5 + 0.2 > 0.6 drops the rest
    assert torch.isfinite(filter_logits(logits, None, 0.6)).tolist() == [[True, True, False, False, False]]
    assert torch.isfinite(filter_logits(logits, None, 0.45)).tolist() == [[True, False, False, False, False]]
    assert torch.isfinite(filter_logits(logits, None, 0.9)).sum() == 4  # 0.85 <= 0.9 < 0.95
    assert torch.isfinite(filter_logits(logits, None, 1e-6)).sum() == 1  # the most likely token always stays
    shuffled = logits[:, [3, 0, 4, 2, 1]]  # vocabulary order does not matter
    assert torch.isfinite(filter_logits(shuffled, None, 0.6)).tolist() == [[False, True, False, False, True]]
    kept = filter_logits(logits, None, 0.6)
    assert torch.equal(kept[:, :2], logits[:, :2])  # kept logits are unchanged


def test_top_p_reads_the_top_k_filtered_distribution():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64))  # (1, 4)
    # top-k 2 leaves [0.4, 0.3] -> renormalised [4/7, 3/7]; 4/7 > 0.5 drops the second token
    assert torch.isfinite(filter_logits(logits, 2, 0.5)).tolist() == [[True, False, False, False]]
    # top-p first would have kept two (0.4 <= 0.5): the order matters and is top-k first
    assert torch.isfinite(filter_logits(filter_logits(logits, None, 0.5), 2, None)).sum() == 2
    # top-3 leaves [0.4, 0.3, 0.2] / 0.9; the mass before the third token is 7/9 <= 0.95: all three stay
    assert torch.isfinite(filter_logits(logits, 3, 0.95)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filter_logits(logits, 3, 0.7)).tolist() == [[True, True, False, False]]  # 4/9 <= 0.7 < 7/9


def test_every_off_value_is_the_identity():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 6, 20, generator=g)  # (B, N, V)
    logits[..., 7] = float("-inf")  # a masked-out token (the mask token) stays -inf
    outs = [filter_logits(logits, k, p) for k in (None, 0) for p in (None, 1.0, 1)]
    assert all(out is logits for out in outs)  # not even a copy
    assert torch.equal(filter_logits(logits), logits)
    # off on one side leaves the other filter alone
    for k in (None, 0):
        assert torch.equal(filter_logits(logits, k, 0.8), filter_logits(logits, None, 0.8))
    for p in (None, 1.0):
        assert torch.equal(filter_logits(logits, 3, p), filter_logits(logits, 3, None))


def test_top_k_of_the_vocabulary_or_more_keeps_everything_and_top_k_one_the_argmax():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(5, 16, generator=g)  # (N, V)
    logits[:, 2] = float("-inf")
    for k in (16, 17, 1000):
        assert torch.equal(filter_logits(logits, k), logits)
    assert torch.equal(filter_logits(logits, 15), logits)  # 15 finite logits: the 15th is the smallest finite one
    one = filter_logits(logits, 1)
    assert torch.isfinite(one).sum(-1).tolist() == [1] * 5
    assert torch.equal(torch.isfinite(one).float().argmax(-1), logits.argmax(-1))
    assert torch.equal(one.max(-1).values, logits.max(-1).values)
    three = filter_logits(logits, 3)
    assert torch.isfinite(three).sum(-1).tolist() == [3] * 5
    assert torch.equal(three.topk(3).indices, logits.topk(3).indices)


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(filter_logits(logits, 2)).tolist() == [[True, True, True, False]]


def test_input_is_not_modified():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(5))
    before = logits.clone()
    filter_logits(logits, 2, 0.5)
    assert torch.equal(logits, before)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(top_k=-1), "top_k"),
        (dict(top_k=1.5), "top_k"),
        (dict(top_k=2.0), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_k="3"), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=-0.5), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(top_p=True), "top_p"),
        (dict(top_p="0.9"), "top_p"),
    ],
)
def test_bad_values_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        filter_logits(torch.zeros(1, 4), **kwargs)
