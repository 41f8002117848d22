"""Staircase (one-pass) block-diffusion likelihood estimates: the fixture's 2n logits and a forward-per-block reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import stabledrl_trl  # noqa: F401
from stabledrl_trl.diffusion.block_estimators import StaircaseLogits, staircase_estimate
from stabledrl_trl.diffusion.masking import (
    block_random_coupled_masks,
    mean_field_masks,
    random_ratio_masks,
    sdmc_masks,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sdar-tiny"
LLADA2_FIXTURE = Path(__file__).parent.parent / "fixtures" / "llada2-tiny"
MASK = 1


@pytest.fixture(params=["sdar", "llada2"])
def block_model(request):
    """A tiny block-diffusion model builder of each architecture: SDAR (dense) and LLaDA2 (MoE)."""
    return request.getfixturevalue(f"tiny_{request.param}")




def batch():
    """Two left-padded prompts (3 and 6 real tokens) and right-padded completions (9 and 5 real tokens)."""
    prompt = torch.tensor([[0, 0, 0, 5, 6, 7], [8, 9, 10, 11, 12, 13]])
    pmask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    comp = torch.tensor([[20, 21, 22, 23, 24, 25, 26, 27, 0], [30, 31, 32, 33, 0, 0, 0, 0, 0]])
    cmask = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0, 0]])
    return prompt, pmask, comp, cmask


def per_block_reference(model, prompt, pmask, comp, cmask, masks, block_size):
    """log p of every completion token, (B, K, C), with one plain block-causal forward per block and sample.

    For the block holding a token: the clean real tokens of all earlier blocks, then the block's noisy tokens.
    """
    B, K, C = masks.completion.shape
    out = torch.zeros(B, K, C, dtype=torch.float64)
    for b in range(B):
        p_real, c_real = pmask[b].bool(), cmask[b].bool()
        clean = torch.cat([prompt[b][p_real], comp[b][c_real]])  # (n,)
        cols = torch.arange(C)[c_real]  # completion columns of the real tokens
        n_prompt = int(p_real.sum())
        for k in range(K):
            noisy = torch.cat([
                torch.where(masks.prompt[b, k][p_real], MASK, prompt[b][p_real]),
                torch.where(masks.completion[b, k][c_real], MASK, comp[b][c_real]),
            ])  # fmt: skip
            for start in range(0, len(clean), block_size):
                end = min(start + block_size, len(clean))
                ids = torch.cat([clean[:start], noisy[start:end]])[None]
                with torch.no_grad():
                    logp = model(ids).logits[0, start:end].double().log_softmax(-1)  # (n_block, V)
                for pos in range(max(start, n_prompt), end):
                    out[b, k, cols[pos - n_prompt]] = logp[pos - start, clean[pos]]
    return out


def test_fixture_two_copy_logits():
    """StaircaseLogits reproduces the noisy-half logits SDAR's original model gives the fixture's [noisy || x] row."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE).eval()
    ref = load_file(FIXTURE / "reference.safetensors")
    rows = torch.cat([ref["noisy"], ref["x"]], dim=1)  # (1, 40)
    with torch.no_grad():
        logits = StaircaseLogits(model, 4)(rows, torch.ones_like(rows))
    assert logits.shape == (1, 20, 96)
    assert (logits - ref["logits2n"][:, :20]).abs().max() <= 1e-5


def test_fixture_estimate_uses_the_noisy_copy_logits():
    """A mean-field estimate scoring the fixture's masked positions (the others visible context) reads the noisy
    copy's predictions of SDAR's original forward."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE).eval()
    ref = load_file(FIXTURE / "reference.safetensors")
    x = ref["x"]
    prompt, comp = x[:, :8], x[:, 8:]  # the fixture's noisy row masks some positions from 8 on
    masked = ref["noisy"][:, 8:] == 95
    masks = mean_field_masks(0, torch.ones_like(prompt), masked.long(), num_samples=1, p_mask_prompt=0.0)
    assert torch.equal(masks.completion[:, 0], masked)
    with torch.no_grad():
        est = staircase_estimate("mean_field", model, prompt, torch.ones_like(prompt), comp, masked.long(),
                                 block_size=4, mask_token_id=95, seed=0, p_mask_prompt=0.0,
                                 context_mask=torch.ones_like(comp))  # unmasked positions: visible, unscored  # fmt: skip
    expected = ref["logits2n"][0, 8:20].log_softmax(-1).gather(-1, comp[0, :, None])[:, 0]  # (12,)
    assert torch.allclose(est.token_logps[0][masked[0]], expected[masked[0]], atol=1e-5)


def test_llada2_fixture_two_copy_logits():
    """StaircaseLogits on LLaDA2 reproduces the noisy half of dFactory's [noisy | clean] forward by LLaDA2's code."""
    model = transformers.AutoModelForCausalLM.from_pretrained(LLADA2_FIXTURE, block_size=4).eval()
    ref = load_file(LLADA2_FIXTURE / "reference.safetensors")
    rows = ref["bd2n_input_ids"]  # (1, 32)
    with torch.no_grad():
        logits = StaircaseLogits(model, 4)(rows, torch.ones_like(rows))
    assert logits.shape == (1, 16, 128)
    assert (logits - ref["bd2n_logits"][:, :16]).abs().max() <= 1e-4


@pytest.mark.parametrize(
    "name, K, extra",
    [
        ("mc_elbo", 3, {}),
        ("mc_elbo_inv_t", 3, {}),
        ("mean_field", 3, {}),
        ("sdmc", 3, {"nodes": 3}),
        ("sdmc_coupled", 4, {"nodes": 2}),
        ("block_random_coupled", 4, {"estimator_block_size": 2}),
    ],
)
def test_matches_one_forward_per_block(name, K, extra, block_model):
    model = block_model(seed=1, num_key_value_heads=2)
    prompt, pmask, comp, cmask = batch()
    seeds = torch.tensor([101, 202])
    p_prompt = 0.3
    with torch.no_grad():
        est = staircase_estimate(name, model, prompt, pmask, comp, cmask, block_size=4, mask_token_id=MASK,
                                 seed=seeds, num_samples=K, p_mask_prompt=p_prompt, **extra)  # fmt: skip
    real = cmask.bool()
    n_real = real.sum(-1)[:, None, None]
    if name in ("sdmc", "sdmc_coupled", "block_random_coupled"):
        if name == "block_random_coupled":
            masks = block_random_coupled_masks(seeds, pmask, cmask, num_samples=K, block_size=2, p_mask_prompt=p_prompt)
            omega = torch.full((2, K), 1.0 / K, dtype=torch.float64)
        else:
            masks = sdmc_masks(seeds, pmask, cmask, num_samples=K, nodes=extra["nodes"], p_mask_prompt=p_prompt,
                               coupled=name == "sdmc_coupled")  # fmt: skip
            omega = masks.weight
        masked = masks.completion & real[:, None]
        weights = masked * n_real * omega[..., None] / masked.sum(-1, keepdim=True)  # weighted mean over masked
    elif name == "mean_field":
        masks = mean_field_masks(seeds, pmask, cmask, num_samples=K, p_mask_prompt=p_prompt)
        weights = masks.completion.double() / K
    else:
        masks = random_ratio_masks(seeds, pmask, cmask, num_samples=K, p_mask_prompt=p_prompt)
        masked = masks.completion & real[:, None]
        if name == "mc_elbo":  # mean over samples of the mean over masked tokens, times n_real
            weights = masked * real.sum(-1)[:, None, None] / (K * masked.sum(-1, keepdim=True))
        else:  # 1/t: log p / p_k, mean over samples; a sample that masked nothing is worth 0
            weights = (masked & ~masks.fallback[..., None]) / (K * masks.mask_prob[..., None])
    logp = per_block_reference(model, prompt, pmask, comp, cmask, masks, block_size=4)
    expected = (weights.double() * logp).sum(1)  # (B, C)
    assert torch.allclose(est.token_logps.double(), expected, atol=2e-5), (est.token_logps, expected)
    assert torch.allclose(est.seq_logps.double(), (expected * real).sum(-1) / real.sum(-1), atol=2e-5)


def test_chunked_batched_and_differentiable(block_model):
    """Chunking and the batch layout do not change a row's estimate; gradients reach the weights."""
    model = block_model(seed=2)
    prompt, pmask, comp, cmask = batch()
    seeds = torch.tensor([7, 8])
    kwargs = dict(block_size=4, mask_token_id=MASK, num_samples=2, p_mask_prompt=0.15)
    whole = staircase_estimate("mc_elbo", model, prompt, pmask, comp, cmask, seed=seeds, **kwargs)
    chunked = staircase_estimate("mc_elbo", model, prompt, pmask, comp, cmask, seed=seeds, chunk_size=1, **kwargs)
    assert torch.allclose(whole.token_logps, chunked.token_logps, atol=1e-6)
    alone = staircase_estimate("mc_elbo", model, prompt[1:, :], pmask[1:], comp[1:, :5], cmask[1:, :5],
                               seed=seeds[1:], **kwargs)  # fmt: skip
    assert torch.allclose(alone.token_logps[0], whole.token_logps[1, :5], atol=1e-5)
    whole.seq_logps.sum().backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().max() > 0


def test_block_random_and_coupled_run_and_eubo(block_model):
    model = block_model(seed=3)
    prompt, pmask, comp, cmask = batch()
    for name, extra in (("block_random", {"estimator_block_size": 4}), ("coupled", {})):
        est = staircase_estimate(name, model, prompt, pmask, comp, cmask, block_size=4, mask_token_id=MASK,
                                 seed=torch.tensor([1, 2]), num_samples=2, eubo_beta=1.5, **extra)  # fmt: skip
        assert est.token_logps.shape == (2, 9) and torch.isfinite(est.seq_logps).all() and est.eubo is not None
        assert (est.token_logps[~cmask.bool()] == 0).all()


def test_bad_block_size_raises(tiny_sdar):
    with pytest.raises(ValueError, match="block_size"):
        StaircaseLogits(tiny_sdar(), 0)
