"""DiffusionGemma: the tiny config, detection, the per-row-seeded sampler against `model.generate`, and the
uniform-noise estimator against TRL's SFT loss, enumeration and padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stabledrl_trl.diffusion.gemma_sampler import gemma_generate, gemma_sampler_settings
from stabledrl_trl.diffusion.uniform_estimators import uniform_noise_estimate
from stabledrl_trl.tiny import tiny_diffusion_gemma_config


@pytest.fixture(scope="module")
def model():
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    return DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config()).eval()


def test_tiny_config_is_small_and_text_only(model):
    n = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for name, p in model.named_parameters() if "vision" in name)
    assert n < 100_000 and vision < 5_000
    cfg = model.config
    assert cfg.model_type == "diffusion_gemma" and cfg.canvas_length == 8
    assert cfg.text_config.layer_types[-1] == "full_attention"


# ------------------------------------------------------------------------------------------------ the sampler


def _reference(model, row, seed, eos, **kw):
    """`model.generate` on the row alone after torch.manual_seed(seed): the completion's tokens."""
    torch.manual_seed(seed)
    out = model.generate(row[None], eos_token_id=list(eos), pad_token_id=0, **kw).sequences[0, len(row) :]
    return out


def _ours(model, ids, mask, seeds, eos, max_new_tokens, steps, temperature=1.0):
    st = gemma_sampler_settings(model, max_new_tokens=max_new_tokens, max_denoising_steps=steps,
                                temperature=temperature)  # fmt: skip
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    return gemma_generate(model, ids, mask, st, eos_token_ids=tuple(eos), pad_token_id=0, generators=gens)


def _left_pad(rows):
    P = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), P, dtype=torch.long)
    mask = torch.zeros(len(rows), P, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, P - len(r) :] = r
        mask[i, P - len(r) :] = 1
    return ids, mask


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_seeded_rows_equal_model_generate_alone_and_padded(model, temperature):
    rows = [torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([11, 12, 13]), torch.tensor([20, 21, 22, 23])]
    seeds = [3, 4, 5]
    kw = {"max_new_tokens": 16, "max_denoising_steps": 3, "t_min": 0.4 * temperature, "t_max": 0.8 * temperature}
    refs = [_reference(model, r, s, (0,), **kw) for r, s in zip(rows, seeds)]
    for r, s, ref in zip(rows, seeds, refs):
        alone = _ours(model, r[None], torch.ones(1, len(r), dtype=torch.long), [s], (0,), 16, 3, temperature)
        assert alone.completion_ids[0].tolist() == ref.tolist()
    ids, mask = _left_pad(rows)
    batch = _ours(model, ids, mask, seeds, (0,), 16, 3, temperature)
    for i, ref in enumerate(refs):
        assert batch.completion_ids[i].tolist() == ref.tolist()
    # the rows differ (the test compares something)
    assert len({tuple(r.tolist()) for r in refs}) == 3


def test_eos_stops_rows_as_generate_does(model):
    """A row whose first canvas holds the EOS stops there (pad after it), the others go on; both equal generate."""
    rows = [torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([11, 12, 13])]
    kw = {"max_new_tokens": 16, "max_denoising_steps": 3}
    free = _reference(model, rows[0], 3, (0,), **kw)
    eos = (int(free[2]),)  # a token row 0 commits in its first canvas, used as the EOS id
    refs = [_reference(model, r, s, eos, **kw) for r, s in zip(rows, [3, 4])]
    assert refs[0][3:8].eq(0).all() or refs[0].shape[0] == 8  # padded after the EOS
    ids, mask = _left_pad(rows)
    out = _ours(model, ids, mask, [3, 4], eos, 16, 3)
    for i, ref in enumerate(refs):
        got = out.completion_ids[i]
        assert got[: len(ref)].tolist() == ref.tolist()
        assert got[len(ref) :].eq(0).all()
    first_eos = [int((out.completion_ids[i] == eos[0]).nonzero()[0]) if (out.completion_ids[i] == eos[0]).any()
                 else None for i in range(2)]  # fmt: skip
    assert first_eos[0] == 2 and out.completion_mask[0].tolist()[:4] == [1, 1, 1, 0]


def test_greedy_equals_generate_with_argmax_proposals(model, monkeypatch):
    """temperature 0: the denoiser's proposal is the argmax (no multinomial draw); generate with torch.multinomial
    replaced by the argmax is the reference."""
    row = torch.tensor([5, 6, 7, 8])
    ours = _ours(model, row[None], torch.ones(1, 4, dtype=torch.long), [7], (0,), 16, 5, temperature=0.0)
    monkeypatch.setattr(torch, "multinomial", lambda probs, num_samples, **_: probs.argmax(-1, keepdim=True))
    ref = _reference(model, row, 7, (0,), max_new_tokens=16, max_denoising_steps=5)
    assert ours.completion_ids[0].tolist() == ref.tolist()


# ------------------------------------------------------------------------------------------------ the estimator


def _sft_reference_loss(model, input_ids, labels, block_idx, t, u, random_tokens, sc_mask, eos):
    """TRL's examples/scripts/sft_diffusion_gemma.py diffusion loss (PR #6003), its random draws given."""
    C = model.config.canvas_length
    B, S = input_ids.shape
    supervised = labels != -100
    prefix_len = supervised.int().argmax(dim=1)
    response_len = supervised.sum(dim=1)
    encoder_len = prefix_len + block_idx * C
    offsets = torch.arange(C)
    abs_idx = (encoder_len[:, None] + offsets).clamp(max=S - 1)
    in_response = offsets < (response_len - block_idx * C)[:, None]
    target = torch.where(in_response, input_ids.gather(1, abs_idx), eos)
    corrupt = u < t[:, None]
    canvas_ids = torch.where(corrupt, random_tokens, target)
    cache_mask = (torch.arange(S) < encoder_len[:, None]).long()
    kw = {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "decoder_input_ids": canvas_ids,
        "decoder_attention_mask": torch.cat([cache_mask, torch.ones(B, C, dtype=torch.long)], 1),
        "decoder_position_ids": encoder_len[:, None] + offsets,
    }
    with torch.no_grad():
        kw["self_conditioning_logits"] = model(**kw).logits
    kw["self_conditioning_mask"] = sc_mask
    logits = model(**kw).logits
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


@pytest.mark.parametrize("block,sc", [(0, False), (1, True), (2, True)])
def test_estimate_equals_trl_sft_loss(model, block, sc):
    C, eos = 8, 0
    prompt = torch.tensor([[5, 6, 7, 8, 9]])
    response = torch.tensor([30 + i for i in range(19)] + [eos])  # 20 tokens: 3 blocks, the last EOS-filled
    completion = torch.zeros(1, 24, dtype=torch.long)
    completion[0, :20] = response
    cmask = torch.zeros(1, 24, dtype=torch.long)
    cmask[0, :20] = 1
    g = torch.Generator().manual_seed(block)
    t = torch.tensor([0.3 + 0.2 * block])
    u = torch.rand(1, C, generator=g)
    tok = torch.randint(0, 104, (1, C), generator=g)
    scm = torch.tensor([sc])
    draws = {"block": torch.tensor([[block]]), "t": t[None], "u": u[None], "tokens": tok[None], "sc": scm[None]}
    est = uniform_noise_estimate(model, prompt, torch.ones_like(prompt), completion, cmask, seeds=torch.tensor([0]),
                                 fill_token_id=eos, draws=draws)  # fmt: skip
    n_blocks, n_tokens = 3, 20
    ours = -est.sample_seq_logps[0, 0] * n_tokens / (n_blocks * C)  # mean cross-entropy over the canvas
    input_ids = torch.cat([prompt[0], response])[None]
    labels = torch.cat([torch.full((5,), -100), response])[None]
    ref = _sft_reference_loss(model, input_ids, labels, torch.tensor([block]), t, u, tok, scm, eos)
    assert abs(float(ours.detach()) - float(ref.detach())) < 1e-5
    assert float(ref.detach()) > 1.0  # a real loss, not a degenerate one


def test_padded_row_equals_row_alone(model):
    rows = [torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([11, 12])]
    comps = torch.tensor([[40, 41, 42, 43, 44, 45, 46, 47, 48, 0, 0, 0, 0, 0, 0, 0],
                          [50, 51, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]])  # fmt: skip
    cmask = torch.tensor([[1] * 10 + [0] * 6, [1] * 3 + [0] * 13])
    ids, mask = _left_pad(rows)
    seeds = torch.tensor([11, 12])
    for form in ("block_random", "block_random_coupled"):
        batch = uniform_noise_estimate(model, ids, mask, comps, cmask, seeds=seeds, fill_token_id=0, num_samples=2,
                                       estimator=form, self_conditioning="training")  # fmt: skip
        for i, r in enumerate(rows):
            alone = uniform_noise_estimate(model, r[None], torch.ones(1, len(r), dtype=torch.long), comps[i : i + 1],
                                           cmask[i : i + 1], seeds=seeds[i : i + 1], fill_token_id=0, num_samples=2,
                                           estimator=form, self_conditioning="training")  # fmt: skip
            torch.testing.assert_close(batch.token_logps[i], alone.token_logps[0], atol=1e-5, rtol=0)
            torch.testing.assert_close(batch.seq_logps[i], alone.seq_logps[0], atol=1e-5, rtol=0)
        # masked mean of the per-token contributions is the sequence estimate
        torch.testing.assert_close((batch.token_logps.sum(-1) / cmask.sum(-1)), batch.seq_logps)
        assert (batch.token_logps[cmask == 0] == 0).all()


def _exact_target(model, prompt, completion, cmask, eos, eps=1e-3):
    """sum_b E_t E_{x_t} sum_i log p(y_i | x_t) by enumerating every corruption of a 2-token canvas (each position
    kept, or replaced by any of the V tokens) and integrating the polynomial in t exactly (Gauss-Legendre)."""
    C = model.config.canvas_length
    V = model.config.text_config.vocab_size
    n_blocks = (int(cmask.sum()) - 1) // C + 1  # the blocks the completion occupies (the last EOS-filled)
    nodes, weights = np.polynomial.legendre.leggauss(8)
    ts = eps + (1 - eps) * (nodes + 1) / 2  # U(eps, 1): E f(t) = sum_j w_j/2 f(t_j)
    # states of a 2-position canvas: for each position, None (kept) or a token
    states = [(a, b) for a in [None, *range(V)] for b in [None, *range(V)]]
    total = 0.0
    targets = torch.where(cmask.bool(), completion, torch.full_like(completion, eos))
    for blk in range(n_blocks):
        clean = targets[0, blk * C : (blk + 1) * C]
        canv = torch.stack([torch.tensor([clean[0] if a is None else a, clean[1] if b is None else b])
                            for a, b in states])  # fmt: skip
        n = canv.shape[0]
        draws = {"block": torch.full((1, n), blk), "t": torch.full((1, n), 0.5), "u": torch.zeros(1, n, C),
                 "tokens": canv[None], "sc": None}  # fmt: skip
        est = uniform_noise_estimate(model, prompt.expand(n, -1), torch.ones(n, prompt.shape[1], dtype=torch.long),
                                     completion.expand(n, -1), cmask.expand(n, -1), seeds=torch.zeros(n),
                                     fill_token_id=eos, draws=draws)  # fmt: skip
        f = est.sample_seq_logps[:, 0].double() * cmask.sum() / n_blocks  # the block's canvas log-prob sum
        ncorrupt = torch.tensor([(a is not None) + (b is not None) for a, b in states], dtype=torch.float64)
        for t, w in zip(ts, weights):
            prob = (t / V) ** ncorrupt * (1 - t) ** (C - ncorrupt)  # each replaced position: t * 1/V
            total += w / 2 * float((prob * f).sum())
    return total


@pytest.mark.slow
def test_k_sample_mean_is_unbiased_by_enumeration():
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(1)
    m = DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config(vocab_size=10, canvas_length=2)).eval()
    prompt = torch.tensor([[3, 4, 5]])
    completion = torch.tensor([[6, 0, 0, 0]])  # 2 tokens (the second the EOS): one block scored
    cmask = torch.tensor([[1, 1, 0, 0]])
    completion2 = torch.tensor([[6, 2, 0, 0]])  # 3 tokens: two blocks, the second EOS-filled
    cmask2 = torch.tensor([[1, 1, 1, 0]])
    for comp, cm in ((completion, cmask), (completion2, cmask2)):
        exact = _exact_target(m, prompt, comp, cm, eos=0)
        n = 2000
        for form in ("block_random", "block_random_coupled"):
            with torch.no_grad():
                est = uniform_noise_estimate(m, prompt.expand(n, -1), torch.ones(n, 3, dtype=torch.long),
                                             comp.expand(n, -1), cm.expand(n, -1), seeds=torch.arange(n),
                                             fill_token_id=0, num_samples=2, estimator=form)  # fmt: skip
            values = est.seq_logps.double() * cm.sum()  # the estimate of the block sum
            mean, se = float(values.mean()), float(values.std() / n**0.5)
            assert abs(mean - exact) < 4 * se + 1e-6, (form, mean, exact, se)


def test_stable_drl_step_raises_the_preferred_completion():
    """Gradients flow through the uniform-noise estimate the right way: one StableDRL step with advantage +1 for
    completion A and -1 for B raises F(A) - F(B) (scored on the same corruption draws before and after)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from stabledrl_trl.objectives import stable_drl_loss

    torch.manual_seed(3)
    m = DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config()).train()
    prompt = torch.tensor([[5, 6, 7], [5, 6, 7]])
    comp = torch.tensor([[20, 21, 22, 23, 24, 25, 26, 0], [40, 41, 42, 43, 44, 45, 46, 0]])
    cmask = torch.ones(2, 8, dtype=torch.long)
    seeds = torch.tensor([1, 2])

    def margin():
        with torch.no_grad():
            est = uniform_noise_estimate(m, prompt, torch.ones_like(prompt), comp, cmask, seeds=seeds,
                                         fill_token_id=0, num_samples=4)  # fmt: skip
        return float(est.seq_logps[0] - est.seq_logps[1])

    before = margin()
    est = uniform_noise_estimate(m, prompt, torch.ones_like(prompt), comp, cmask, seeds=seeds, fill_token_id=0,
                                 num_samples=4)  # fmt: skip
    out = stable_drl_loss(est.seq_logps, est.seq_logps.detach(), torch.tensor([1.0, -1.0]), group_size=2)
    out.unit_loss.sum().backward()
    with torch.no_grad():
        for p in m.parameters():
            if p.grad is not None:
                p -= 0.05 * p.grad
    after = margin()
    assert after > before + 0.01, (before, after)


def test_mean_loo_conversion_by_hand():
    """prediction='mean_loo' adds log(1 + V alpha / (1 - alpha)), alpha = 1 - t, to the observed token's logit
    (arXiv 2605.22765) before the log-softmax; 'denoiser' uses the logits as they are."""
    from stabledrl_trl.diffusion.uniform_estimators import target_logps

    logits = torch.tensor([[[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]]])  # (1, 2, V=4)
    targets = torch.tensor([[2, 1]])
    canvas = torch.tensor([[0, 1]])  # position 0 observed token 0 (corrupted), position 1 observed its target
    t = torch.tensor([0.25])
    bonus = float(np.log(1 + 4 * 0.75 / 0.25))  # log 13
    rows = [[0.5 + bonus, -1.0, 2.0, 0.0], [1.0, 1.0 + bonus, 1.0, 1.0]]
    expected = [float(np.log(np.exp(r[k]) / np.exp(r).sum())) for r, k in zip(np.array(rows), [2, 1])]
    got, _ = target_logps(logits, targets, canvas, t, "mean_loo")
    torch.testing.assert_close(got[0], torch.tensor(expected), atol=1e-6, rtol=0)
    plain, _ = target_logps(logits, targets, canvas, t, "denoiser")
    torch.testing.assert_close(plain, torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1))
    with pytest.raises(ValueError, match="prediction"):
        target_logps(logits, targets, canvas, t, "x0")


def test_sampler_settings_follow_the_model_generation_config(model):
    """The entropy bound, schedule and stopping thresholds are the model's (its generation config over transformers'
    defaults); the RL temperature scales the schedule; 0 is greedy."""
    s = gemma_sampler_settings(model, max_new_tokens=16)
    assert (s.max_denoising_steps, s.t_min, s.t_max, s.entropy_bound) == (48, 0.4, 0.8, 0.1)
    assert (s.stability_threshold, s.confidence_threshold, s.greedy) == (1, 0.005, False)
    model.generation_config.t_max = 0.6
    try:
        s = gemma_sampler_settings(model, max_new_tokens=16, max_denoising_steps=7, temperature=0.5)
        assert (s.max_denoising_steps, s.t_min, s.t_max) == (7, 0.2, 0.3)
    finally:
        model.generation_config.t_max = None
    assert gemma_sampler_settings(model, max_new_tokens=8, temperature=0.0).greedy
    with pytest.raises(ValueError, match="temperature"):
        gemma_sampler_settings(model, max_new_tokens=8, temperature=-1.0)
