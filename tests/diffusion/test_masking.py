"""Tests for the counter-based uniforms and the mask samplers of stabledrl_trl.diffusion.masking."""

import math

import pytest
import torch

from stabledrl_trl.diffusion.masking import (
    _mul32,
    block_random_coupled_masks,
    block_random_masks,
    counter_uniform,
    coupled_masks,
    mean_field_masks,
    mix32,
    prompt_masks,
    random_ratio_masks,
    resolve_seed,
    sdmc_counts,
    sdmc_masks,
)


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Small tensors: intra-op threads only add overhead (large on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------------------------------
# Counter-based uniforms


def test_mul32_matches_python_integers():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 2**32, (1000,), generator=g, dtype=torch.int64)
    x[:3] = torch.tensor([0, 1, 2**32 - 1])
    for c in (0x85EBCA6B, 0xC2B2AE35, 0xFFFFFFFF, 1):
        expected = torch.tensor([(int(v) * c) % 2**32 for v in x])
        assert torch.equal(_mul32(x, c), expected)


def test_mix32_is_injective_on_a_range():
    x = torch.arange(2**16, dtype=torch.int64) * 65537  # spread values, still below 2^32
    h = mix32(x)
    assert h.unique().numel() == x.numel()
    assert bool(((h >= 0) & (h < 2**32)).all())


def test_counter_uniform_deterministic_and_in_range():
    pos = torch.arange(5000)
    u1 = counter_uniform(7, 2, 3, pos)
    u2 = counter_uniform(7, 2, 3, pos)
    assert u1.dtype == torch.float64
    assert torch.equal(u1, u2)
    assert bool(((u1 >= 0) & (u1 < 1)).all())


def test_counter_uniform_is_uniform():
    # Chi-square over 50 bins with 200k draws: the statistic has mean 49 and sd ~ 9.9; 49 + 6 sd ~ 109 is a bound a
    # correct uniform exceeds with negligible probability, while a visibly non-uniform hash lands far above it.
    n, bins = 200_000, 50
    u = counter_uniform(123, 1, torch.arange(n))
    counts = torch.bincount((u * bins).long(), minlength=bins).double()
    chi2 = (((counts - n / bins) ** 2) / (n / bins)).sum().item()
    assert chi2 < 109, chi2
    # moments: mean 1/2 (sd of the mean 0.29/sqrt(n) ~ 6.5e-4), variance 1/12
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 0.002


def _corr(a, b):
    a, b = a - a.mean(), b - b.mean()
    return ((a * b).mean() / (a.std() * b.std())).item()


def test_counter_uniform_independent_across_seeds_streams_and_indices():
    # Sample correlation of independent uniforms has sd 1/sqrt(n); 5/sqrt(n) bounds it with negligible failure odds.
    n = 50_000
    idx = torch.arange(n)
    tol = 5 / math.sqrt(n)
    base = counter_uniform(0, 1, 0, 0, idx)
    others = {
        "seed+1": counter_uniform(1, 1, 0, 0, idx),
        "stream": counter_uniform(0, 2, 0, 0, idx),
        "row": counter_uniform(0, 1, 1, 0, idx),
        "sample": counter_uniform(0, 1, 0, 1, idx),
        "position+1": counter_uniform(0, 1, 0, 0, idx + 1),
        "large seed": counter_uniform(2**40, 1, 0, 0, idx),
    }
    for name, other in others.items():
        assert abs(_corr(base, other)) < tol, name
        assert (base == other).float().mean().item() < 1e-3, name
    # swapping two counters changes the draw (slots are salted)
    a = counter_uniform(0, 1, idx, 5)
    b = counter_uniform(0, 1, 5, idx)
    assert abs(_corr(a, b)) < tol
    # same uniform for seeds that agree modulo 2^64 (documented reduction)
    assert torch.equal(counter_uniform(-1, 1, idx), counter_uniform(2**64 - 1, 1, idx))


def test_counter_uniform_broadcasts():
    rows = torch.arange(3)[:, None]
    pos = torch.arange(4)[None, :]
    grid = counter_uniform(5, 1, rows, pos)
    assert grid.shape == (3, 4)
    assert grid[2, 3] == counter_uniform(5, 1, 2, 3)


def test_resolve_seed():
    assert resolve_seed(17) == 17
    g1 = torch.Generator().manual_seed(3)
    g2 = torch.Generator().manual_seed(3)
    a, b = resolve_seed(g1), resolve_seed(g2)
    assert a == b
    assert resolve_seed(g1) != a  # the generator advanced
    for bad in (1.5, "0", None, True):
        with pytest.raises(ValueError, match="seed"):
            resolve_seed(bad)


# ----------------------------------------------------------------------------------------------------------------------
# Samplers


def _batch(B=6, P=5, C=9, seed=0):
    """Left-padded prompt masks and right-padded completion masks of varied lengths (>= 1 real token each)."""
    g = torch.Generator().manual_seed(seed)
    p_len = torch.randint(1, P + 1, (B,), generator=g)
    c_len = torch.randint(1, C + 1, (B,), generator=g)
    prompt_mask = (torch.arange(P)[None, :] >= (P - p_len)[:, None]).long()  # (B, P)
    completion_mask = (torch.arange(C)[None, :] < c_len[:, None]).long()  # (B, C)
    return prompt_mask, completion_mask


def _all_samplers(K=4):
    return {
        "mean_field": lambda s, pm, cm: mean_field_masks(s, pm, cm, num_samples=K, p_mask_prompt=0.5),
        "random_ratio": lambda s, pm, cm: random_ratio_masks(s, pm, cm, num_samples=K, p_mask_prompt=0.5),
        "stratified": lambda s, pm, cm: random_ratio_masks(
            s, pm, cm, num_samples=K, t_sampling="stratified", p_mask_prompt=0.5
        ),
        "block_random": lambda s, pm, cm: block_random_masks(
            s, pm, cm, num_samples=K, block_size=3, p_mask_prompt=0.5
        ),
        "coupled": lambda s, pm, cm: coupled_masks(s, pm, cm, num_samples=K, p_mask_prompt=0.5),
        "block_random_coupled": lambda s, pm, cm: block_random_coupled_masks(
            s, pm, cm, num_samples=K, block_size=3, p_mask_prompt=0.5
        ),
        "sdmc": lambda s, pm, cm: sdmc_masks(s, pm, cm, num_samples=K, nodes=2, p_mask_prompt=0.5),
        "sdmc_coupled": lambda s, pm, cm: sdmc_masks(
            s, pm, cm, num_samples=K, nodes=1, coupled=True, p_mask_prompt=0.5
        ),
    }


@pytest.mark.parametrize("name", list(_all_samplers()))
def test_masks_never_touch_padding_and_mask_at_least_one(name):
    prompt_mask, completion_mask = _batch(B=40)
    masks = _all_samplers()[name](0, prompt_mask, completion_mask)
    assert masks.prompt.dtype == torch.bool and masks.completion.dtype == torch.bool
    assert masks.prompt.shape == (40, 4, 5) and masks.completion.shape == (40, 4, 9)
    assert not bool((masks.prompt & ~prompt_mask.bool()[:, None]).any())
    assert not bool((masks.completion & ~completion_mask.bool()[:, None]).any())
    assert bool(masks.completion.any(-1).all())  # every sample masks at least one real completion token


@pytest.mark.parametrize("name", list(_all_samplers()))
def test_masks_invariant_to_padding_width_and_other_rows(name):
    sampler = _all_samplers()[name]
    prompt_mask, completion_mask = _batch(B=8)
    masks = sampler(11, prompt_mask, completion_mask)
    # 3 extra left-padding columns on prompts, 4 extra right-padding columns on completions. block_random permutes
    # the canvas blocks (as the official code), so its canvas width is part of the input: only the prompt is
    # widened for it (the trainer always passes the fixed max_completion_length canvas).
    extra = 0 if name.startswith("block_random") else 4
    wide = sampler(
        11,
        torch.cat([torch.zeros(8, 3, dtype=torch.long), prompt_mask], 1),
        torch.cat([completion_mask, torch.zeros(8, extra, dtype=torch.long)], 1),
    )
    assert torch.equal(wide.prompt[..., 3:], masks.prompt)
    assert not bool(wide.prompt[..., :3].any())
    assert torch.equal(wide.completion[..., :9], masks.completion)
    assert not bool(wide.completion[..., 9:].any())
    # other rows changed: row 3's masks unchanged
    pm2, cm2 = _batch(B=8, seed=99)
    pm2[3], cm2[3] = prompt_mask[3], completion_mask[3]
    other = sampler(11, pm2, cm2)
    assert torch.equal(other.prompt[3], masks.prompt[3])
    assert torch.equal(other.completion[3], masks.completion[3])
    # same seed, same masks; another seed, other masks
    again = sampler(11, prompt_mask, completion_mask)
    assert torch.equal(again.completion, masks.completion) and torch.equal(again.prompt, masks.prompt)
    moved = sampler(12, prompt_mask, completion_mask)
    assert not (torch.equal(moved.completion, masks.completion) and torch.equal(moved.prompt, masks.prompt))


def test_prompt_masks_rate():
    # 4000 rows x 2 samples x 10 real tokens at rate 0.15: sd of the rate ~ 0.0028, tolerance 5 sd.
    prompt_mask = torch.ones(4000, 10, dtype=torch.long)
    prompt_mask[:, :3] = 0
    m = prompt_masks(0, prompt_mask, 2, 0.15)
    real = prompt_mask.bool()[:, None].expand_as(m)
    rate = m[real].float().mean().item()
    assert abs(rate - 0.15) < 5 * math.sqrt(0.15 * 0.85 / real.sum().item())
    assert not bool(prompt_masks(0, prompt_mask, 2, 0.0).any())
    assert bool(prompt_masks(0, prompt_mask, 2, 1.0)[real].all())


def test_mean_field_masks_all_completion():
    prompt_mask, completion_mask = _batch(B=10)
    m = mean_field_masks(0, prompt_mask, completion_mask, p_mask_prompt=0.0)
    assert torch.equal(m.completion[:, 0], completion_mask.bool())
    assert not bool(m.prompt.any())


def test_random_ratio_masks_rate_follows_t():
    B, K, C = 3000, 3, 12
    completion_mask = torch.ones(B, C, dtype=torch.long)
    prompt_mask = torch.ones(B, 2, dtype=torch.long)
    for t_sampling in ("uniform", "stratified"):
        m = random_ratio_masks(1, prompt_mask, completion_mask, num_samples=K, t_sampling=t_sampling, eps=0.1)
        p = m.mask_prob  # (B, K)
        assert bool(((p >= 0.1) & (p <= 1.0)).all())
        if t_sampling == "stratified":
            t = (p - 0.1) / 0.9
            k = torch.arange(K, dtype=torch.float64)[None]
            assert bool(((t > k / K - 1e-12) & (t <= (k + 1) / K + 1e-12)).all())
        # E[masked count - p C | p] = 0 except for the fallback, which adds P(empty) = (1-p)^C tokens; the residual
        # has sd <= sqrt(C/4) per sample, so its mean over B*K samples is within 5 sd of 0.
        resid = m.completion.sum(-1).double() - p * C - (1 - p) ** C
        assert abs(resid.mean().item()) < 5 * math.sqrt(C / 4 / (B * K)), t_sampling
        # t is uniform: mean p = 0.1 + 0.9/2 (sd of t's mean 0.29/sqrt(BK))
        assert abs(p.mean().item() - 0.55) < 5 * 0.9 * math.sqrt(1 / 12 / (B * K))


def test_random_ratio_fallback_masks_one_uniform_token():
    # With eps = 0 and a single real token most samples would mask nothing at small t: the fallback masks it.
    completion_mask = torch.zeros(500, 6, dtype=torch.long)
    completion_mask[:, 0] = 1
    m = random_ratio_masks(0, torch.ones(500, 1, dtype=torch.long), completion_mask, num_samples=2, eps=0.0)
    assert bool(m.completion[..., 0].all()) and not bool(m.completion[..., 1:].any())
    # the draw masked the token w.p. p; otherwise the fallback did: fallback rate = E[1 - p] = 1/2 (t uniform, eps 0)
    assert abs(m.fallback.double().mean().item() - 0.5) < 5 * math.sqrt(0.25 / 1000)
    # Three real tokens: when the fallback fires exactly one token is masked and it is uniform over the three.
    B = 6000
    cm = torch.ones(B, 3, dtype=torch.long)
    m = random_ratio_masks(5, torch.ones(B, 1, dtype=torch.long), cm, num_samples=1, eps=0.0)
    fired = m.fallback[:, 0].nonzero().squeeze(-1)
    assert bool((m.completion[fired, 0].sum(-1) == 1).all())
    # P(fallback) = E[(1 - t)^3] = 1/4 with t uniform
    assert abs(fired.numel() / B - 0.25) < 5 * math.sqrt(0.25 * 0.75 / B)
    assert not bool(m.fallback[m.completion[:, 0].sum(-1) > 1].any())
    share = m.completion[fired, 0].float().mean(0)  # (3,)
    assert bool(((share - 1 / 3).abs() < 5 * math.sqrt(2 / 9 / fired.numel())).all()), share


def test_block_random_structure():
    B, K, C, bs, p = 3000, 2, 11, 4, 0.3
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    completion_mask = (torch.arange(C)[None] < lengths[:, None]).long()
    prompt_mask = torch.ones(B, 7, dtype=torch.long)
    m = block_random_masks(3, prompt_mask, completion_mask, num_samples=K, block_size=bs, p_mask_prompt=p)
    real = completion_mask.bool()
    block_of = torch.arange(C) // bs
    n_blocks_real = (lengths + bs - 1) // bs  # real tokens form a prefix
    chosen = m.block  # (B, K)
    assert bool((chosen < n_blocks_real[:, None]).all())  # the chosen block holds real tokens
    later = block_of[None, None] > chosen[..., None]
    inside = block_of[None, None] == chosen[..., None]
    earlier = block_of[None, None] < chosen[..., None]
    real3 = real[:, None].expand(B, K, C)
    # later blocks: every real token masked
    assert bool(m.completion[later & real3].all())
    # chosen block: count in [1, real tokens in the block], uniform over that range
    n_in = (inside & real3).sum(-1)
    count = (m.completion & inside).sum(-1)
    assert bool(((count >= 1) & (count <= n_in)).all())
    full = n_in == bs  # blocks with bs real tokens: count uniform on 1..bs, mean (bs+1)/2, var (bs^2-1)/12
    c = count[full].double()
    assert abs(c.mean().item() - (bs + 1) / 2) < 5 * math.sqrt((bs * bs - 1) / 12 / c.numel())
    # chosen block uniform among real blocks: mean of chosen / (n_blocks - 1) for rows with 3 real blocks
    three = n_blocks_real[:, None].expand(B, K) == 3
    share = torch.bincount(chosen[three], minlength=3).double() / three.sum()
    assert bool(((share - 1 / 3).abs() < 5 * math.sqrt(2 / 9 / three.sum().item())).all()), share
    # earlier blocks and prompt at rate p
    e = m.completion[earlier & real3].double()
    assert abs(e.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / e.numel())
    pr = m.prompt.double()
    assert abs(pr.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / pr.numel())


def test_block_random_choice_follows_one_permutation_of_the_canvas_blocks():
    """Official block choice: sample k takes entry k of a random permutation of the NB canvas blocks, mod c."""
    B, NB, bs = 6000, 8, 2
    C = NB * bs
    lengths = torch.tensor([C] * (B // 2) + [5, 6] * (B // 4))  # 8 real blocks, or 3 (5 or 6 real tokens)
    completion_mask = (torch.arange(C)[None] < lengths[:, None]).long()
    prompt_mask = torch.ones(B, 3, dtype=torch.long)
    m = block_random_masks(11, prompt_mask, completion_mask, num_samples=2, block_size=bs, p_mask_prompt=0.0)
    eight, three = slice(0, B // 2), slice(B // 2, B)
    # c = 8: the two samples never share a block, and each block is equally likely (1/8)
    assert bool((m.block[eight, 0] != m.block[eight, 1]).all())
    n8 = B // 2
    share8 = torch.bincount(m.block[eight].reshape(-1), minlength=NB).double() / (2 * n8)
    assert bool(((share8 - 1 / 8).abs() < 5 * math.sqrt(1 / 8 * 7 / 8 / (2 * n8))).all()), share8
    # c = 3: entries {0,3,6} -> block 0, {1,4,7} -> 1, {2,5} -> 2: probabilities 3/8, 3/8, 2/8
    n3 = B // 2
    chosen3 = m.block[three]  # (n3, 2)
    assert bool((chosen3 < 3).all())
    for k in range(2):
        share = torch.bincount(chosen3[:, k], minlength=3).double() / n3
        expected = torch.tensor([3 / 8, 3 / 8, 2 / 8], dtype=torch.float64)
        assert bool(((share - expected).abs() < 5 * torch.sqrt(expected * (1 - expected) / n3)).all()), share
    # distinct entries of one permutation: P(both samples on block 2) = (2/8)(1/7), not (2/8)^2 as if independent
    both2 = ((chosen3[:, 0] == 2) & (chosen3[:, 1] == 2)).double().mean().item()
    assert abs(both2 - 1 / 28) < 5 * math.sqrt(1 / 28 * 27 / 28 / n3)
    # more samples than blocks: sample k + NB reuses sample k's permutation entry
    m10 = block_random_masks(11, prompt_mask[:50], completion_mask[:50], num_samples=NB + 2, block_size=bs)
    assert torch.equal(m10.block[:, NB:], m10.block[:, :2])
    assert torch.equal(m10.block[:, :2], m.block[:50])  # the first samples do not depend on K


def test_block_random_coupled_pairs_split_one_block_and_pass_alone_like_block_random():
    B, K, C, bs, p = 4000, 4, 11, 4, 0.3
    g = torch.Generator().manual_seed(2)
    lengths = torch.randint(1, C + 1, (B,), generator=g)
    completion_mask = (torch.arange(C)[None] < lengths[:, None]).long()
    prompt_mask = torch.ones(B, 7, dtype=torch.long)
    m = block_random_coupled_masks(3, prompt_mask, completion_mask, num_samples=K, block_size=bs, p_mask_prompt=p)
    plain = block_random_masks(3, prompt_mask, completion_mask, num_samples=K // 2, block_size=bs, p_mask_prompt=p)
    real = completion_mask.bool()
    block_of = torch.arange(C) // bs
    # pair q shares its block, which is block_random's sample q (the official permutation: pairs antithetic)
    assert torch.equal(m.block[:, 0::2], m.block[:, 1::2]) and torch.equal(m.block[:, 0::2], plain.block)
    inside = (block_of[None, None] == m.block[:, 0::2, None]) & real[:, None]  # (B, Q, C)
    later = (block_of[None, None] > m.block[:, 0::2, None]) & real[:, None]
    first, second = m.completion[:, 0::2], m.completion[:, 1::2]
    a, b = first & inside, second & inside
    n_in = inside.sum(-1)
    full = a.sum(-1) == n_in
    # inside the block: the two passes are complements, or both mask the whole block (count = n_b)
    assert torch.equal((a ^ b)[~full], inside[~full]) and not bool((a & b)[~full].any())
    assert torch.equal(b[full], inside[full])
    assert bool(first[later].all()) and bool(second[later].all())  # later blocks fully masked in both passes
    # each pass alone: count uniform on [1, n_b] (rows whose block holds 4 real tokens), as block_random's
    four = n_in == bs
    for half in (a, b):
        share = torch.bincount(half.sum(-1)[four], minlength=bs + 1)[1:].double() / four.sum()
        assert bool(((share - 1 / bs).abs() < 5 * math.sqrt(1 / bs * (1 - 1 / bs) / four.sum().item())).all()), share
    # earlier blocks: independent per pass at rate p
    earlier = (block_of[None, None] < m.block[..., None]) & real[:, None]
    e1, e2 = m.completion[:, 0::2][earlier[:, 0::2]].double(), m.completion[:, 1::2][earlier[:, 1::2]].double()
    both = (m.completion[:, 0::2] & m.completion[:, 1::2])[earlier[:, 0::2]].double()
    n = e1.numel()
    assert abs(e1.mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n) and abs(e2.mean().item() - p) < 5 * math.sqrt(
        p * (1 - p) / n
    )
    assert abs(both.mean().item() - p * p) < 5 * math.sqrt(p * p / n)


def test_sdmc_masks_fixed_counts_random_positions_and_weights():
    import numpy as np

    # counts: round(t n), half up, at least 1 (coupled: at most n - 1); n = 1..12 against a literal loop
    for nodes in range(1, 6):
        t, w = np.polynomial.legendre.leggauss(nodes)
        t = (t + 1) / 2
        for n in range(1, 13):
            plain = [max(1, int(math.floor(x * n + 0.5))) for x in t]
            coupled = [min(c, max(n - 1, 1)) for c in plain]
            assert sdmc_counts(torch.tensor([n]), nodes)[0].tolist() == plain
            assert sdmc_counts(torch.tensor([n]), nodes, coupled=True)[0].tolist() == coupled
    B, C = 4000, 7
    completion_mask = torch.ones(B, C, dtype=torch.long)
    completion_mask[:, 5:] = 0  # 5 real tokens, 2 padding
    prompt_mask = torch.ones(B, 2, dtype=torch.long)
    m = sdmc_masks(5, prompt_mask, completion_mask, num_samples=6, nodes=3)  # two repeats of 3 nodes
    assert m.completion.shape == (B, 6, C)
    assert m.completion.sum(-1)[0].tolist() == [1, 3, 4, 1, 3, 4]
    assert torch.allclose(m.weight[0], torch.tensor([5, 8, 5, 5, 8, 5], dtype=torch.float64) / 36)
    # positions uniform: each real position masked at node i with probability m_i / 5
    for k, count in enumerate([1, 3, 4]):
        rate = m.completion[:, k, :5].double().mean(0)
        q = count / 5
        assert bool(((rate - q).abs() < 5 * math.sqrt(q * (1 - q) / B)).all()), rate
    assert not torch.equal(m.completion[:, 0], m.completion[:, 3])  # repeats draw their own positions
    c = sdmc_masks(5, prompt_mask, completion_mask, nodes=2, coupled=True)  # one repeat: 4 passes
    assert torch.equal(c.completion[:, 0] ^ c.completion[:, 1], completion_mask.bool())
    assert torch.equal(c.completion[:, 2] ^ c.completion[:, 3], completion_mask.bool())
    assert c.completion.sum(-1)[0].tolist() == [1, 4, 4, 1]
    assert torch.allclose(c.weight[0], torch.full((4,), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="multiple of 6"):
        sdmc_masks(5, prompt_mask, completion_mask, num_samples=4, nodes=3, coupled=True)


def test_coupled_masks_are_complementary():
    prompt_mask, completion_mask = _batch(B=300, C=10)
    K = 6
    m = coupled_masks(4, prompt_mask, completion_mask, num_samples=K)
    real = completion_mask.bool()
    n_real = real.sum(-1)
    first, second = m.completion[:, 0::2], m.completion[:, 1::2]  # (B, K/2, C)
    multi = n_real >= 2
    assert not bool((first & second)[multi].any())
    assert torch.equal((first | second)[multi], real[multi][:, None].expand(-1, K // 2, -1))
    count = first.sum(-1)[multi]
    assert bool(((count >= 1) & (count <= (n_real[multi] - 1)[:, None])).all())
    single = n_real == 1
    assert bool(single.any())
    assert torch.equal(first[single], second[single]) and bool((first[single].sum(-1) == 1).all())
    assert not bool(m.prompt.any())  # default prompt masking 0


def test_coupled_count_is_uniform():
    # n_real = 5: l uniform on {1..4}; a uniformly random subset: each token in `first` w.p. E[l]/n = 2.5/5.
    B = 4000
    completion_mask = torch.ones(B, 5, dtype=torch.long)
    m = coupled_masks(9, torch.ones(B, 1, dtype=torch.long), completion_mask, num_samples=2)
    count = m.completion[:, 0].sum(-1)
    share = torch.bincount(count, minlength=5)[1:].double() / B
    assert bool(((share - 0.25).abs() < 5 * math.sqrt(0.25 * 0.75 / B)).all()), share
    per_pos = m.completion[:, 0].double().mean(0)
    assert bool(((per_pos - 0.5).abs() < 5 * math.sqrt(0.25 / B)).all()), per_pos


def test_bad_arguments_raise_value_error():
    pm, cm = _batch(B=2)
    with pytest.raises(ValueError, match="num_samples"):
        coupled_masks(0, pm, cm, num_samples=3)
    with pytest.raises(ValueError, match="num_samples"):
        random_ratio_masks(0, pm, cm, num_samples=0)
    with pytest.raises(ValueError, match="p_mask_prompt"):
        block_random_masks(0, pm, cm, num_samples=2, p_mask_prompt=1.5)
    with pytest.raises(ValueError, match="block_size"):
        block_random_masks(0, pm, cm, num_samples=2, block_size=0)
    with pytest.raises(ValueError, match="t_sampling"):
        random_ratio_masks(0, pm, cm, num_samples=2, t_sampling="sobol")
    with pytest.raises(ValueError, match="eps"):
        random_ratio_masks(0, pm, cm, num_samples=2, eps=1.0)
    with pytest.raises(ValueError, match="batch size"):
        mean_field_masks(0, pm[:1], cm)
    with pytest.raises(ValueError, match="zero columns"):
        mean_field_masks(0, pm, cm[:, :0])


def test_tensor_seed_matches_int_seed():
    idx = torch.arange(100)
    seeds = torch.tensor([5, -1, 2**40 + 3])
    grid = counter_uniform(seeds[:, None], 1, idx[None, :])  # (3, 100)
    for i, s in enumerate([5, -1, 2**40 + 3]):
        assert torch.equal(grid[i], counter_uniform(s, 1, idx))


@pytest.mark.parametrize("name", list(_all_samplers()))
def test_per_row_seeds_follow_the_row_not_its_index(name):
    sampler = _all_samplers()[name]
    prompt_mask, completion_mask = _batch(B=6)
    seeds = torch.tensor([101, 202, 303, 404, 505, 606])
    masks = sampler(seeds, prompt_mask, completion_mask)
    perm = torch.tensor([3, 5, 0, 1, 4, 2])
    moved = sampler(seeds[perm], prompt_mask[perm], completion_mask[perm])
    assert torch.equal(moved.prompt, masks.prompt[perm]) and torch.equal(moved.completion, masks.completion[perm])
    # two rows with the same content and the same seed get the same masks, wherever they sit
    pm, cm = prompt_mask[[0, 0, 0]], completion_mask[[0, 0, 0]]
    same = sampler(torch.tensor([7, 7, 8]), pm, cm)  # row 2: another seed
    assert torch.equal(same.completion[0], same.completion[1]) and torch.equal(same.prompt[0], same.prompt[1])
    with pytest.raises(ValueError, match="one seed per row"):
        sampler(seeds[:5], prompt_mask, completion_mask)
    with pytest.raises(ValueError, match="integers"):
        sampler(seeds.float(), prompt_mask, completion_mask)
