"""Tests for the masked-diffusion likelihood estimators (stabledrl_trl.diffusion.estimators).

The model is a tiny bidirectional attention LM built here from a seeded generator: it reads mask tokens, hides padded
keys and numbers positions by real tokens only, so a padded row gives the same logits as the row alone. Expectations
are checked against exact values obtained by enumerating every mask; everything else against literal loops over the
masks the estimator actually fed to the model (recorded from the model calls).
"""

import math
from itertools import combinations, product

import numpy as np
import pytest
import torch
from torch import nn

from stabledrl_trl.diffusion.estimators import (
    ESTIMATORS,
    LikelihoodEstimate,
    default_num_samples,
    estimate_likelihood,
    estimator_cost,
    estimator_standard_error,
)
from stabledrl_trl.diffusion.masking import random_ratio_masks

PAD, MASK = 0, 1
NAMES = list(ESTIMATORS)


class TinyBidirectionalLM(nn.Module):
    """One bidirectional attention layer + MLP; positions count real tokens; padded keys are hidden."""

    def __init__(self, vocab=7, dim=16, max_len=64, seed=0, scale=1.5):
        super().__init__()
        g = torch.Generator().manual_seed(seed)

        def w(*shape, s=1.0):
            return nn.Parameter(torch.randn(*shape, generator=g) * s)

        self.emb, self.pos = w(vocab, dim), w(max_len, dim, s=0.5)
        self.wq, self.wk, self.wv, self.wo = (w(dim, dim, s=dim**-0.5) for _ in range(4))
        self.w1, self.w2 = w(dim, 2 * dim, s=dim**-0.5), w(2 * dim, dim, s=(2 * dim) ** -0.5)
        self.head = w(dim, vocab, s=scale * dim**-0.5)

    def forward(self, input_ids, attention_mask):
        keep = attention_mask.bool()
        pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (N, L)
        x = self.emb[input_ids] + self.pos[pos]  # (N, L, D)
        scores = (x @ self.wq) @ (x @ self.wk).transpose(1, 2) / math.sqrt(x.shape[-1])  # (N, L, L)
        scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        x = x + torch.softmax(scores, -1) @ (x @ self.wv) @ self.wo
        x = x + torch.tanh(x @ self.w1) @ self.w2
        return x @ self.head  # (N, L, V)


class Recorder:
    """Wraps a logits_fn and keeps every call's inputs and outputs (detached)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, input_ids, attention_mask):
        out = self.fn(input_ids, attention_mask)
        self.calls.append((input_ids.clone(), attention_mask.clone(), out.detach().clone()))
        return out

    def inputs(self):
        return torch.cat([c[0] for c in self.calls]), torch.cat([c[1] for c in self.calls])

    def logits(self):
        return torch.cat([c[2] for c in self.calls])


def make_batch(prompts, completions, P=None, C=None, eos=None):
    """Left-pad prompts to width P and right-pad completions to width C with PAD; masks 1 on real tokens."""
    P = P or max(len(p) for p in prompts)
    C = C or max(len(c) for c in completions)
    B = len(prompts)
    pid, pm = torch.full((B, P), PAD), torch.zeros(B, P, dtype=torch.long)
    cid, cm = torch.full((B, C), PAD), torch.zeros(B, C, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if p:
            pid[i, P - len(p) :], pm[i, P - len(p) :] = torch.tensor(p), 1
        cid[i, : len(c)], cm[i, : len(c)] = torch.tensor(c), 1
    return pid, pm, cid, cm


ROWS = (
    [[3, 4, 5], [6], [2, 2, 3, 4], [5, 6]],
    [[2, 5, 3, 4, 6, 0], [4, 4], [6, 5, 4, 3, 2, 3, 4, 5, 0], [3]],
)
OPTIONS = {  # small blocks so block_random has several blocks; K passes per estimator
    "mean_field": dict(num_samples=2, p_mask_prompt=0.5),
    "mc_elbo": dict(num_samples=3, p_mask_prompt=0.3),
    "mc_elbo_inv_t": dict(num_samples=3, t_sampling="stratified"),
    "block_random": dict(num_samples=3, block_size=2),
    "block_random_coupled": dict(num_samples=4, block_size=2),
    "coupled": dict(num_samples=4, p_mask_prompt=0.3),
    "sdmc": dict(num_samples=6, nodes=3, p_mask_prompt=0.3),
    "sdmc_coupled": dict(num_samples=4, nodes=2),
}


def gauss_weights(name, nodes, K):
    """Each pass's weight in the sdmc estimate, from numpy's Gauss-Legendre rule: w_i / 2 per node, / repeats."""
    w = np.polynomial.legendre.leggauss(nodes)[1] / 2
    if name == "sdmc_coupled":
        w = np.repeat(w, 2) / 2
    return np.tile(w, K // len(w)) / (K // len(w))


def run(name, fn, batch, seed=0, **kw):
    opts = {**OPTIONS[name], **kw}
    return estimate_likelihood(name, fn, *batch, mask_token_id=MASK, seed=seed, eubo_beta=1.5, **opts)


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """The models here are tiny: intra-op threads only add overhead (large on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model():
    return TinyBidirectionalLM().eval()


# ----------------------------------------------------------------------------------------------------------------------
# Exactness against enumeration


def _exact_table(model, prompt, completion):
    """lp[(R, S)] = log p(true completion tokens) for prompt mask R and completion mask S (tuples of bools)."""
    table = {}
    with torch.no_grad():
        for R in product([False, True], repeat=len(prompt)):
            for S in product([False, True], repeat=len(completion)):
                ids = [MASK if r else t for r, t in zip(R, prompt)] + [MASK if s else t for s, t in zip(S, completion)]
                ids = torch.tensor([ids])
                logp = torch.log_softmax(model(ids, torch.ones_like(ids)), -1)[0, len(prompt) :]
                table[R, S] = logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1).double().numpy()
    return table


def _prompt_expectation(table, n_prompt, q):
    """elp[S] = E over prompt masks (each token w.p. q) of lp[(R, S)]: values are linear in lp, so this factorises."""
    out = {}
    for (R, S), v in table.items():
        prob = math.prod(q if r else 1 - q for r in R)
        out[S] = out.get(S, 0.0) + prob * v
    return out


def _ratio_expectation(elp, n, eps, inv_t):
    """E over t ~ U(0, 1] and the masks of the random-ratio estimator.

    Per-token-mean form: a draw with no masked token has one uniformly chosen token masked instead (at-least-one
    rule). 1/t form: such a draw is worth 0, as in the ELBO.

    Integrated in s = log p (p = eps + (1 - eps) t, dt = p ds / (1 - eps)) with 200-point Gauss-Legendre: the
    integrand is then smooth (analytic) in s, including the 1/p of the 1/t form, so the rule is exact to ~1e-12.
    """
    nodes, weights = np.polynomial.legendre.leggauss(200)
    lo, hi = math.log(eps), 0.0
    total = 0.0
    for x, wq in zip(nodes, weights):
        s = (hi - lo) / 2 * x + (hi + lo) / 2
        p = math.exp(s)
        value = 0.0
        for S in product([False, True], repeat=n):
            k = sum(S)
            if k == 0:
                continue
            prob = p**k * (1 - p) ** (n - k)
            lp = sum(elp[S][i] for i in range(n) if S[i])
            value += prob * (lp / (p * n) if inv_t else lp / k)
        if not inv_t:  # nothing masked (prob (1-p)^n) -> one uniformly chosen token masked
            single = [tuple(j == i for j in range(n)) for i in range(n)]
            value += (1 - p) ** n * sum(elp[S][i] for i, S in enumerate(single)) / n
        total += wq * (hi - lo) / 2 * value * p / (1 - eps)
    return total


def _block_random_expectation(elp, n, block_size, q, canvas_blocks):
    """Sum over completion masks S of P(S) * per-token mean, P(S) literally from the block-random description.

    Block choice as the official code: entry k of a random permutation of the canvas_blocks canvas blocks, modulo
    the number c of blocks holding real tokens, so block b has probability |{e < canvas_blocks: e % c == b}| / NB.
    """
    blocks = [list(range(b, min(b + block_size, n))) for b in range(0, n, block_size)]
    c = len(blocks)
    p_block = [sum(e % c == b for e in range(canvas_blocks)) / canvas_blocks for b in range(c)]
    total = 0.0
    for S in product([False, True], repeat=n):
        prob = 0.0
        for bi, blk in enumerate(blocks):
            later = [i for b in blocks[bi + 1 :] for i in b]
            earlier = [i for b in blocks[:bi] for i in b]
            if not all(S[i] for i in later):
                continue
            k = sum(S[i] for i in blk)
            if k == 0:
                continue
            p_in = (1 / len(blk)) / math.comb(len(blk), k)  # count uniform in [1, n_b], subset uniform
            p_early = math.prod(q if S[i] else 1 - q for i in earlier)
            prob += p_in * p_early * p_block[bi]
        if prob:
            total += prob * sum(elp[S][i] for i in range(n) if S[i]) / sum(S)
    return total


def _coupled_expectation(elp, n):
    total = 0.0
    for size in range(1, n):
        for subset in combinations(range(n), size):
            S = tuple(i in subset for i in range(n))
            Sc = tuple(not s for s in S)
            value = sum(elp[S][i] if S[i] else elp[Sc][i] for i in range(n)) / n
            total += value / (n - 1) / math.comb(n, size)
    return total


def _count_means(elp, n):
    """h[m] = mean over the uniformly random m-subsets S of the mean of elp[S] over S, m = 1..n (h[0] unused)."""
    h = [math.nan]
    for m in range(1, n + 1):
        values = []
        for subset in combinations(range(n), m):
            S = tuple(i in subset for i in range(n))
            values.append(sum(elp[S][i] for i in subset) / m)
        h.append(sum(values) / len(values))
    return h


def _gauss(nodes):
    x, w = np.polynomial.legendre.leggauss(nodes)
    return (x + 1) / 2, w / 2


def _sdmc_expectation(elp, n, nodes, coupled=False, inv_t=False):
    """Exact expectation of the sdmc estimate: sum_i w_i h[m_i], m_i = max(1, floor(t_i n + 1/2)) (coupled: at most
    n - 1, and the complement's h[n - m_i] averaged in); inv_t weighs node i by m_i / (t_i n) (the 1/t form)."""
    h = _count_means(elp, n)
    total = 0.0
    for t, w in zip(*_gauss(nodes)):
        m = max(1, math.floor(t * n + 0.5))
        if coupled:
            m = min(m, max(n - 1, 1))
            total += w * (h[m] + h[n - m if n > 1 else 1]) / 2
        else:
            total += w * h[m] * (m / (t * n) if inv_t else 1.0)
    return total


def _block_random_coupled_expectation(elp, n, block_size, q, canvas_blocks):
    """Expectation of the block_random_coupled estimate from its own description, by enumerating every pair: block b
    (the official choice), count l uniform in [1, n_b], subset A of the block; pass 1 masks A, pass 2 the block's
    other tokens (the whole block again when l = n_b); both mask every later block and draw the earlier blocks'
    masks independently with probability q; the pair's value is the mean of the two passes' per-token means."""
    blocks = [list(range(b, min(b + block_size, n))) for b in range(0, n, block_size)]
    c = len(blocks)
    p_block = [sum(e % c == b for e in range(canvas_blocks)) / canvas_blocks for b in range(c)]

    def mean_over_earlier(masked_now, earlier):
        total = 0.0
        for E in product([False, True], repeat=len(earlier)):
            S = list(masked_now)
            for i, e in zip(earlier, E):
                S[i] = e
            S = tuple(S)
            prob = math.prod(q if e else 1 - q for e in E)
            total += prob * sum(elp[S][i] for i in range(n) if S[i]) / sum(S)
        return total

    total = 0.0
    for bi, blk in enumerate(blocks):
        later = [i for b in blocks[bi + 1 :] for i in b]
        earlier = [i for b in blocks[:bi] for i in b]
        for size in range(1, len(blk) + 1):
            for A in combinations(blk, size):
                second = A if size == len(blk) else tuple(i for i in blk if i not in A)
                prob = p_block[bi] / len(blk) / math.comb(len(blk), size)
                for masked in (A, second):
                    now = [i in masked or i in later for i in range(n)]
                    total += prob * mean_over_earlier(now, earlier) / 2
    return total


EXACT_CASES = {
    "mean_field": dict(num_samples=1, p_mask_prompt=0.3),
    "mc_elbo": dict(num_samples=2, p_mask_prompt=0.0),
    "mc_elbo_stratified": dict(num_samples=3, p_mask_prompt=0.2, t_sampling="stratified", eps=0.05),
    "mc_elbo_inv_t": dict(num_samples=2, p_mask_prompt=0.0),
    "mc_elbo_inv_t_stratified": dict(num_samples=2, p_mask_prompt=0.0, t_sampling="stratified", eps=0.05),
    "block_random": dict(num_samples=2, p_mask_prompt=0.3, block_size=2),
    "block_random_coupled": dict(num_samples=2, p_mask_prompt=0.3, block_size=2),
    "coupled": dict(num_samples=2, p_mask_prompt=0.25),
    "sdmc": dict(num_samples=3, p_mask_prompt=0.2, nodes=3),
    "sdmc_coupled": dict(num_samples=4, p_mask_prompt=0.0, nodes=2),
}


@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_monte_carlo_mean_matches_exact_expectation(model, case):
    name = case.replace("_stratified", "")
    opts = EXACT_CASES[case]
    prompt, completion = [3, 4], [2, 5, 3]
    n = len(completion)
    table = _exact_table(model, prompt, completion)
    elp = _prompt_expectation(table, len(prompt), opts["p_mask_prompt"])
    if name == "mean_field":
        exact = float(np.mean(elp[(True,) * n]))
    elif name in ("mc_elbo", "mc_elbo_inv_t"):
        exact = _ratio_expectation(elp, n, opts.get("eps", 1e-3), inv_t=name == "mc_elbo_inv_t")
    elif name in ("block_random", "block_random_coupled"):
        # a 3-block canvas holding 2 real blocks: blocks chosen with probabilities 2/3, 1/3; the coupled form has
        # block_random's expectation (its own enumeration: test_block_random_coupled_pairs_enumerate_to_block_random)
        exact = _block_random_expectation(elp, n, opts["block_size"], opts["p_mask_prompt"], canvas_blocks=3)
    elif name in ("sdmc", "sdmc_coupled"):
        exact = _sdmc_expectation(elp, n, opts["nodes"], coupled=name == "sdmc_coupled")
    else:
        exact = _coupled_expectation(elp, n)

    # Rows of one batch are independent replicates (their masks hash the row index); two seeds, 3000 rows each,
    # with one padding column on each side so the layout is not the trivial one.
    N = 3000
    batch = make_batch([prompt] * N, [completion] * N, P=3, C=6 if name.startswith("block_random") else 4)
    with torch.no_grad():
        est = torch.cat(
            [
                estimate_likelihood(name, model, *batch, mask_token_id=MASK, seed=seed, **opts).seq_logps
                for seed in (0, 1)
            ]
        ).double()
    # The mean of 2N i.i.d. estimates has sd std/sqrt(2N); |mean - exact| <= 5 sd fails for a correct estimator with
    # probability < 1e-6 (CLT), while a wrong mask distribution or weighting moves the mean by far more here.
    se = est.std().item() / math.sqrt(est.numel())
    assert est.std().item() > 0 or name == "mean_field"
    assert abs(est.mean().item() - exact) <= 5 * se + 1e-6, (case, est.mean().item(), exact, se)


@pytest.mark.parametrize("completion, block_size, canvas_blocks", [([2, 5, 3], 2, 3), ([2, 5, 3, 6], 3, 4), ([4, 6], 2, 1)])
def test_block_random_coupled_pairs_enumerate_to_block_random(model, completion, block_size, canvas_blocks):
    # Every pair enumerated: the coupled form estimates exactly block_random's quantity (the official SPG bound).
    n = len(completion)
    elp = _prompt_expectation(_exact_table(model, [3, 4], completion), 2, 0.3)
    coupled = _block_random_coupled_expectation(elp, n, block_size, 0.3, canvas_blocks)
    independent = _block_random_expectation(elp, n, block_size, 0.3, canvas_blocks)
    assert abs(coupled - independent) < 1e-12, (coupled, independent)


def test_block_random_coupled_mean_equals_block_randoms_mean(model):
    # Unbiased against block_random's Monte-Carlo mean: 3 real blocks of 4 on a 4-block canvas, prompt masking on.
    g = torch.Generator().manual_seed(5)
    completion = torch.randint(2, 7, (11,), generator=g).tolist()
    N = 4000
    batch = make_batch([[3, 4, 5]] * N, [completion] * N, C=16)
    with torch.no_grad():
        a, b = (
            estimate_likelihood(name, model, *batch, mask_token_id=MASK, seed=7, num_samples=4, block_size=4)
            for name in ("block_random", "block_random_coupled")
        )
    se = math.sqrt(a.seq_logps.var().item() / N + b.seq_logps.var().item() / N)
    assert abs(a.seq_logps.mean().item() - b.seq_logps.mean().item()) <= 5 * se, (a.seq_logps.mean(), b.seq_logps.mean())


def test_sdmc_count_weighting_matches_the_elbo_where_the_inv_t_weight_does_not(model):
    # A 5-token completion: the count masked at node t is round(5 t), far from 5 t at small t (t = 0.047 -> 1 token).
    completion = [2, 5, 3, 6, 4]
    n = len(completion)
    elp = _prompt_expectation(_exact_table(model, [3], completion), 1, 0.0)
    elbo = _ratio_expectation(elp, n, 1e-9, inv_t=True)  # the 1/t-weighted ELBO / n, integrated over t
    assert abs(elbo - sum(_count_means(elp, n)[1:]) / n) < 1e-6  # = the mean over counts of the per-token means
    for nodes in range(1, 6):
        count_bias = _sdmc_expectation(elp, n, nodes) - elbo
        inv_t_bias = _sdmc_expectation(elp, n, nodes, inv_t=True) - elbo
        print(f"nodes {nodes}: bias of the count-weighted form {count_bias:+.4f}, of the 1/t form {inv_t_bias:+.4f}")
        assert abs(count_bias) < 0.06
        if nodes != 2:  # two nodes happen to mask 1 and 4 tokens at t = 0.21, 0.79: m / (t n) ~ 0.95, 1.01
            assert abs(inv_t_bias) > 0.4 and abs(inv_t_bias) > 10 * abs(count_bias)
    # the implementation's mean is the count-weighted expectation (3 nodes; 3000 rows x 2 seeds)
    N = 3000
    batch = make_batch([[3]] * N, [completion] * N)
    with torch.no_grad():
        est = torch.cat([
            estimate_likelihood("sdmc", model, *batch, mask_token_id=MASK, seed=s, nodes=3).seq_logps for s in (0, 1)
        ]).double()  # fmt: skip
    se = est.std().item() / math.sqrt(est.numel())
    assert abs(est.mean().item() - _sdmc_expectation(elp, n, 3)) <= 5 * se + 1e-6


def test_sdmc_equals_hand_computation_on_a_toy_model():
    # The true token's log-probability depends only on how many completion tokens are masked: f(m) = log softmax of
    # logit 0.5 * (n - m) on token 3 among 7 tokens. Then sdmc = sum_i w_i f(m_i), known by hand.
    n = 5

    def fn(ids, attn):
        visible = (ids[:, 2:] != MASK).sum(-1).float()  # (N,) unmasked completion tokens (prompt: 2 columns)
        logits = torch.zeros(ids.shape[0], ids.shape[1], 7)
        logits[..., 3] = 0.5 * visible[:, None]
        return logits

    def f(m):
        return 0.5 * (n - m) - math.log(math.exp(0.5 * (n - m)) + 6)

    batch = make_batch([[4, 5]] * 2, [[3] * n] * 2)
    expected = {
        # t = (1 -+ 1/sqrt 3) / 2 = 0.211, 0.789: round(1.06) = 1, round(3.94) = 4 tokens, weights 1/2
        ("sdmc", 2): (f(1) + f(4)) / 2,
        # t = 0.113, 1/2, 0.887: 1, 3 (2.5 rounds up), 4 tokens; weights 5/18, 8/18, 5/18
        ("sdmc", 3): (5 * f(1) + 8 * f(3) + 5 * f(4)) / 18,
        # one node at t = 1/2: 3 tokens and their complement of 2, weight 1/2 each
        ("sdmc_coupled", 1): (f(3) + f(2)) / 2,
        # nodes 1 and 4 tokens, complements 4 and 1
        ("sdmc_coupled", 2): (f(1) + f(4) + f(4) + f(1)) / 4,
    }
    for (name, nodes), value in expected.items():
        est = estimate_likelihood(name, fn, *batch, mask_token_id=MASK, seed=0, nodes=nodes)
        assert torch.allclose(est.seq_logps, torch.full((2,), value), atol=1e-6), (name, nodes, est.seq_logps, value)
        # repeats average: two repeats give the same value here (positions do not matter to this model)
        twice = estimate_likelihood(name, fn, *batch, mask_token_id=MASK, seed=0, nodes=nodes,
                                    num_samples=2 * default_num_samples(name, nodes))  # fmt: skip
        assert torch.allclose(twice.seq_logps, est.seq_logps, atol=1e-6)
        assert twice.sample_seq_logps.shape == (2, 2) and est.sample_seq_logps.shape == (2, 1)


@pytest.mark.parametrize("length, block_size, K", [(12, 12, 2), (12, 4, 4)])
def test_block_random_coupled_lowers_variance_at_equal_forward_passes(model, length, block_size, K):
    # Same rows, seeds and forward passes: one block of 12 (K = 2: one pair) and 3 blocks of 4 (K = 4: two pairs on
    # different blocks). The per-token mean of a pass weighs a token by 1 / (tokens masked), so a pair whose split is
    # uneven (l, n - l) keeps most of the smaller side's position noise: the gain is ~0.5-0.7x here, not the ~0.05x
    # of `coupled` (which estimates a different quantity, each token weighted equally). Fixed seeds: deterministic.
    g = torch.Generator().manual_seed(3)
    completion = torch.randint(2, 7, (length,), generator=g).tolist()
    N = 3000
    batch = make_batch([[3, 4, 5, 6]] * N, [completion] * N)
    with torch.no_grad():
        var = {
            name: estimate_likelihood(
                name, model, *batch, mask_token_id=MASK, seed=0, num_samples=K, block_size=block_size,
                p_mask_prompt=0.0,
            ).seq_logps.var().item()
            for name in ("block_random", "block_random_coupled")
        }  # fmt: skip
    ratio = var["block_random_coupled"] / var["block_random"]
    print(f"variance ratio block_random_coupled / block_random at {K} passes: {ratio:.3f}")
    assert ratio < 0.8, ratio


@pytest.mark.parametrize("name, K", [("mc_elbo", 4), ("block_random", 4), ("coupled", 6), ("sdmc", 6)])
def test_unit_spread_predicts_the_estimates_variance(model, name, K):
    # sample_seq_logps holds the U independent units; their mean is the estimate, and std / sqrt(U) its standard error:
    # over 3000 replicate rows the mean squared standard error matches the estimate's variance across rows.
    g = torch.Generator().manual_seed(1)
    completion = torch.randint(2, 7, (9,), generator=g).tolist()
    N = 3000
    batch = make_batch([[3, 4]] * N, [completion] * N)
    kw = {"nodes": 3} if name == "sdmc" else {"block_size": 9} if name == "block_random" else {}
    with torch.no_grad():
        est = estimate_likelihood(name, model, *batch, mask_token_id=MASK, seed=2, num_samples=K, **kw)
    U = K // {"coupled": 2, "sdmc": 3}.get(name, 1)
    assert est.sample_seq_logps.shape == (N, U) and not est.sample_seq_logps.requires_grad
    assert torch.allclose(est.sample_seq_logps.mean(-1), est.seq_logps, atol=1e-5)
    se = estimator_standard_error(est.sample_seq_logps)
    assert torch.allclose(se, est.sample_seq_logps.std(-1) / math.sqrt(U))
    predicted, actual = (se.double() ** 2).mean().item(), est.seq_logps.double().var().item()
    print(f"{name}: mean squared standard error {predicted:.5f}, variance across rows {actual:.5f}")
    # block_random's passes take different blocks of one permutation; with one block they are independent, as here
    assert abs(predicted / actual - 1) < 0.15, (predicted, actual)
    assert torch.isnan(estimator_standard_error(est.sample_seq_logps[:, :1])).all()  # one unit: unknown spread


def test_exact_expectation_distinguishes_estimators(model):
    # The exact values above are not all equal: a test of one estimator against another's expectation would fail.
    prompt, completion = [3, 4], [2, 5, 3]
    elp = _prompt_expectation(_exact_table(model, prompt, completion), 2, 0.0)
    values = [
        float(np.mean(elp[(True,) * 3])),
        _ratio_expectation(elp, 3, 1e-3, inv_t=False),
        _ratio_expectation(elp, 3, 1e-3, inv_t=True),
        _block_random_expectation(elp, 3, 2, 0.0, canvas_blocks=3),
        _coupled_expectation(elp, 3),
        _block_random_expectation(elp, 3, 2, 0.0, canvas_blocks=2),  # = a uniform choice among the real blocks
    ]
    gaps = [abs(a - b) for a, b in combinations(values, 2)]
    assert min(gaps) > 0.01, values


def test_coupled_has_lower_variance_than_independent_masks(model):
    # Same model, same inputs, same number of forward passes (2): coupled masks score every token once per pair.
    g = torch.Generator().manual_seed(3)
    completion = torch.randint(2, 7, (12,), generator=g).tolist()
    N = 3000
    batch = make_batch([[3, 4, 5, 6]] * N, [completion] * N)
    with torch.no_grad():
        coupled = estimate_likelihood("coupled", model, *batch, mask_token_id=MASK, seed=0, num_samples=2)
        independent = estimate_likelihood("mc_elbo", model, *batch, mask_token_id=MASK, seed=0, num_samples=2)
    ratio = (coupled.seq_logps.var() / independent.seq_logps.var()).item()
    print(f"variance ratio coupled / mc_elbo at 2 forward passes: {ratio:.3f}")
    # With 3000 rows a variance estimate is within ~5% of the truth; the measured ratio is far below 0.7.
    assert ratio < 0.7, ratio


# ----------------------------------------------------------------------------------------------------------------------
# Literal checks on the masks the estimator used


def _literal(name, batch, rec, opts, seed, beta=1.5):
    """Per-row (token_logps, seq, eubo) from the recorded masked inputs, by plain Python loops."""
    pid, pm, cid, cm = batch
    ids, attn = rec.inputs()
    logp_all = torch.log_softmax(rec.logits().double(), -1)
    B, P = pid.shape
    C = cid.shape[1]
    K = ids.shape[0] // B
    if name == "mc_elbo_inv_t":
        draw = random_ratio_masks(seed, pm, cm, num_samples=K, t_sampling=opts.get("t_sampling", "uniform"))
        p, fallback = draw.mask_prob, draw.fallback
    out = []
    for b in range(B):
        real = [j for j in range(C) if cm[b, j]]
        n = len(real)
        tok = [0.0] * C
        seq = 0.0
        lps, masked_sets = [], []
        for k in range(K):
            row = b * K + k
            # padding untouched, attention = [prompt_mask, completion_mask]
            assert torch.equal(attn[row], torch.cat([pm[b], cm[b]]))
            for j in range(P):  # padding keeps its id; a real prompt token is itself or the mask token
                assert ids[row, j] == pid[b, j] or (pm[b, j] and ids[row, j] == MASK)
            for j in range(C):
                if not cm[b, j]:
                    assert ids[row, P + j] == cid[b, j]
            masked = [j for j in real if ids[row, P + j] == MASK]
            assert masked, "every sample masks at least one real token"
            lp = {j: logp_all[row, P + j, cid[b, j]].item() for j in range(C)}
            lps.append(lp)
            masked_sets.append(masked)
            if name in ("mc_elbo", "block_random", "block_random_coupled"):
                seq += sum(lp[j] for j in masked) / len(masked) / K
                for j in masked:
                    tok[j] += n * lp[j] / (K * len(masked))
            elif name in ("sdmc", "sdmc_coupled"):
                omega = gauss_weights(name, opts["nodes"], K)[k]
                seq += omega * sum(lp[j] for j in masked) / len(masked)
                for j in masked:
                    tok[j] += omega * n * lp[j] / len(masked)
            elif name == "mc_elbo_inv_t" and not fallback[b, k]:  # a draw that masked nothing is worth 0
                seq += sum(lp[j] for j in masked) / (p[b, k].item() * n) / K
                for j in masked:
                    tok[j] += lp[j] / (K * p[b, k].item())
            elif name == "mean_field":
                assert masked == real
        if name == "mean_field":
            for j in real:
                tok[j] = sum(lp[j] for lp in lps) / K
            seq = sum(tok) / n
        if name == "coupled":
            for j in real:
                hits = [lps[k][j] for k in range(K) if j in masked_sets[k]]
                tok[j] = sum(hits) / len(hits)
            seq = sum(tok) / n
        # EUBO_beta literally: (1/beta) mean over tokens masked somewhere of log((1/K) sum_k p^beta 1[masked]/t_hat)
        seen = [j for j in real if any(j in m for m in masked_sets)]
        terms = []
        for j in seen:
            logs = [beta * lps[k][j] - math.log(len(masked_sets[k]) / n) for k in range(K) if j in masked_sets[k]]
            top = max(logs)  # shift by the max so that p^beta underflowing to 0 stays finite in log space
            terms.append((top + math.log(math.fsum(math.exp(v - top) for v in logs) / K)) / beta)
        out.append((tok, seq, sum(terms) / len(seen)))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_estimate_equals_literal_loop_over_recorded_masks(model, name):
    batch = make_batch(*ROWS)
    rec = Recorder(model)
    with torch.no_grad():
        est = run(name, rec, batch, seed=5)
    assert isinstance(est, LikelihoodEstimate)
    assert est.token_logps.shape == batch[2].shape and est.seq_logps.shape == (4,) and est.eubo.shape == (4,)
    assert len(rec.calls) == 1 and rec.calls[0][0].shape[0] == 4 * OPTIONS[name]["num_samples"]
    for b, (tok, seq, eubo) in enumerate(_literal(name, batch, rec, OPTIONS[name], seed=5)):
        assert torch.allclose(est.token_logps[b].double(), torch.tensor(tok, dtype=torch.float64), atol=1e-5)
        assert abs(est.seq_logps[b].item() - seq) < 1e-5
        assert abs(est.eubo[b].item() - eubo) < 1e-5
    # convention: masked mean of token_logps == seq_logps; zero at padding
    cm = batch[3].bool()
    assert torch.allclose((est.token_logps * cm).sum(-1) / cm.sum(-1), est.seq_logps, atol=1e-6)
    assert not bool(est.token_logps[~cm].any()) and not bool(est.token_entropy[~cm].any())
    # entropy is combined like the log-probs: positive exactly where the token was scored
    scored = est.token_logps != 0
    assert bool((est.token_entropy[scored] > 0).all()) and bool((est.token_entropy >= 0).all())
    if name in ("mean_field", "coupled"):
        assert bool(scored[cm].all())


def test_mean_field_is_log_softmax_at_masked_positions():
    # Hand-built input: logits depend on the (masked) input ids and the column, nothing else.
    g = torch.Generator().manual_seed(0)
    table, col = torch.randn(7, 7, generator=g), torch.randn(8, 7, generator=g)

    def fn(ids, attn):
        return table[ids] + col[: ids.shape[1]] + attn[..., None]

    rec = Recorder(fn)
    pid, pm = torch.tensor([[0, 3, 4]]), torch.tensor([[0, 1, 1]])
    cid, cm = torch.tensor([[2, 5, 0, 6]]), torch.tensor([[1, 1, 1, 0]])  # EOS (0) is the last real token
    est = estimate_likelihood("mean_field", rec, pid, pm, cid, cm, mask_token_id=MASK, seed=0, p_mask_prompt=0.0)
    ids, attn = rec.inputs()
    assert ids.tolist() == [[0, 3, 4, 1, 1, 1, 6]]
    assert attn.tolist() == [[0, 1, 1, 1, 1, 1, 0]]
    logits = fn(ids, attn)[0, 3:]  # (C, V)
    logp = torch.log_softmax(logits, -1)
    expected = torch.stack([logp[0, 2], logp[1, 5], logp[2, 0], torch.tensor(0.0)])
    assert torch.allclose(est.token_logps[0], expected, atol=1e-6)
    assert torch.allclose(est.seq_logps[0], expected[:3].mean(), atol=1e-6)
    entropy = -(logp.exp() * logp).sum(-1)
    assert torch.allclose(est.token_entropy[0, :3], entropy[:3], atol=1e-6) and est.token_entropy[0, 3] == 0
    assert est.eubo is None


# ----------------------------------------------------------------------------------------------------------------------
# Seeds, padding, rows, EOS


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_estimate_other_seed_other_masks(model, name):
    batch = make_batch(*ROWS)
    with torch.no_grad():
        a, b = run(name, model, batch, seed=3), run(name, model, batch, seed=3)
        assert torch.equal(a.seq_logps, b.seq_logps) and torch.equal(a.token_logps, b.token_logps)
        r1, r2 = Recorder(model), Recorder(model)
        run(name, r1, batch, seed=3), run(name, r2, batch, seed=4)
        assert not torch.equal(r1.inputs()[0], r2.inputs()[0])
        # a torch.Generator in the same state gives the same masks; it advances, so the next call differs
        g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
        first = run(name, model, batch, seed=g1)
        assert torch.equal(first.seq_logps, run(name, model, batch, seed=g2).seq_logps)
        r3, r4 = Recorder(model), Recorder(model)
        run(name, r3, batch, seed=g1), run(name, r4, batch, seed=torch.Generator().manual_seed(9))
        assert not torch.equal(r3.inputs()[0], r4.inputs()[0])


def _pad(batch, left, right):
    pid, pm, cid, cm = batch
    B = pid.shape[0]
    return (
        torch.cat([torch.full((B, left), PAD), pid], 1),
        torch.cat([torch.zeros(B, left, dtype=torch.long), pm], 1),
        torch.cat([cid, torch.full((B, right), PAD)], 1),
        torch.cat([cm, torch.zeros(B, right, dtype=torch.long)], 1),
    )


def _assert_same(a, b, rows=slice(None), C=None):
    C = C or a.token_logps.shape[1]
    assert torch.allclose(a.seq_logps[rows], b.seq_logps[rows], atol=1e-5)
    assert torch.allclose(a.token_logps[rows], b.token_logps[rows, :C], atol=1e-5)
    assert torch.allclose(a.eubo[rows], b.eubo[rows], atol=1e-5)
    assert torch.allclose(a.token_entropy[rows], b.token_entropy[rows, :C], atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_padding_other_rows_and_tokens_after_eos_change_nothing(model, name):
    batch = make_batch(*ROWS)
    C = batch[2].shape[1]
    with torch.no_grad():
        base = run(name, model, batch, seed=1)
        # extra left padding of prompts and extra right padding of completions
        # (block_random permutes the canvas blocks, so its canvas keeps its block count: C 9 -> 10, blocks of 2)
        _assert_same(base, run(name, model, _pad(batch, 3, 1 if name.startswith("block_random") else 5), seed=1), C=C)
        # other rows replaced: row 1 keeps its estimate (its masks hash its row index, not its neighbours)
        other = make_batch(
            [[6, 6, 6, 6, 6], ROWS[0][1], [2], [3, 3]], [[5], ROWS[1][1], [2, 3, 4, 5, 6, 2, 3], [4, 4]], C=C
        )
        _assert_same(base, run(name, model, other, seed=1), rows=slice(1, 2), C=C)
        # tokens after the end of the completion mask (after EOS) are free
        pid, pm, cid, cm = batch
        cid2 = torch.where(cm.bool(), cid, torch.full_like(cid, 6))
        _assert_same(base, run(name, model, (pid, pm, cid2, cm), seed=1))
        # left padding ids: free as well
        pid2 = torch.where(pm.bool(), pid, torch.full_like(pid, 5))
        _assert_same(base, run(name, model, (pid2, pm, cid, cm), seed=1))


@pytest.mark.parametrize("name", NAMES)
def test_per_row_seed_tensor_makes_rows_layout_independent(model, name):
    batch = make_batch(*ROWS)
    seeds = torch.tensor([11, 12, 13, 14])
    perm = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        base = run(name, model, batch, seed=seeds)
        shuffled = run(name, model, tuple(t[perm] for t in batch), seed=seeds[perm])
        assert torch.allclose(base.seq_logps[perm], shuffled.seq_logps, atol=1e-5)
        assert torch.allclose(base.eubo[perm], shuffled.eubo, atol=1e-5)
        right = 1 if name.startswith("block_random") else 3  # same canvas block count for block_random
        _assert_same(base, run(name, model, _pad(batch, 2, right), seed=seeds), C=batch[2].shape[1])
    with pytest.raises(ValueError, match="one seed per row"):
        run(name, model, batch, seed=seeds[:3])


# ----------------------------------------------------------------------------------------------------------------------
# Chunking, gradients, EUBO


class CountingModel(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, input_ids, attention_mask):
        self.calls += 1
        return self.inner(input_ids, attention_mask)


@pytest.mark.parametrize("name", ["mc_elbo", "block_random", "block_random_coupled", "coupled", "sdmc_coupled"])
def test_chunking_gives_equal_estimates_and_gradients(name):
    batch = make_batch(*ROWS)
    K = OPTIONS[name]["num_samples"]
    results = {}
    for chunk in (None, 1, 5):
        m = CountingModel(TinyBidirectionalLM(seed=1))
        est = run(name, m, batch, seed=2, chunk_size=chunk)
        forward_calls = m.calls
        (est.seq_logps.sum() + est.eubo.sum()).backward()
        grads = [p.grad.clone() for p in m.parameters()]
        results[chunk] = (est, grads, forward_calls, m.calls)
    ref, ref_grads, calls, _ = results[None]
    assert calls == 1
    for chunk in (1, 5):
        est, grads, forward_calls, total_calls = results[chunk]
        n_chunks = math.ceil(4 * K / chunk)
        assert forward_calls == n_chunks
        assert total_calls == 2 * n_chunks  # checkpointed: every chunk's forward is recomputed once in backward
        for field in ("seq_logps", "token_logps", "eubo", "token_entropy"):
            assert torch.allclose(getattr(est, field), getattr(ref, field), atol=1e-6), field
        for g, rg in zip(grads, ref_grads):
            assert torch.allclose(g, rg, atol=1e-6)
    assert not ref.token_entropy.requires_grad and ref.seq_logps.requires_grad


def test_no_checkpoint_without_gradients():
    m = CountingModel(TinyBidirectionalLM())
    with torch.no_grad():
        run("coupled", m, make_batch(*ROWS), chunk_size=3)
    assert m.calls == math.ceil(16 / 3)


def test_eubo_finite_for_extreme_log_probs():
    # Logits scaled so that log p of the true tokens reaches -1e4: p^beta underflows to 0 in linear space.
    inner = TinyBidirectionalLM(seed=2)

    def fn(ids, attn):
        return 1e3 * inner(ids, attn)

    batch = make_batch(*ROWS)
    rec = Recorder(fn)
    est = run("block_random", rec, batch, seed=0)
    assert est.seq_logps.detach().min().item() < -500
    assert bool(torch.isfinite(est.eubo).all()) and bool(torch.isfinite(est.seq_logps).all())
    est.eubo.sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in inner.parameters())
    for b, (_, _, eubo) in enumerate(_literal("block_random", batch, rec, OPTIONS["block_random"], seed=0)):
        assert abs(est.eubo[b].item() - eubo) <= 1e-5 * abs(eubo)


def test_eubo_upper_bounds_elbo_terms_on_one_sample():
    # With one sample, EUBO = mean over masked of log p - log(t_hat)/beta >= the per-token-mean ELBO (t_hat <= 1).
    batch = make_batch(*ROWS)
    with torch.no_grad():
        est = run("block_random", TinyBidirectionalLM(), batch, num_samples=1)
    assert bool((est.eubo >= est.seq_logps - 1e-6).all())


def test_works_with_tiny_llada(tiny_llada):
    # The package's LLaDA model (bidirectional, padding keys hidden): padding invariance end to end.
    def fn(ids, attn):
        return tiny_llada(input_ids=ids, attention_mask=attn).logits

    batch = make_batch([[10, 11, 12], [13]], [[20, 21, 22, 0], [23, 24]])
    with torch.no_grad():
        base = run("block_random", fn, batch, seed=0)
        # right padding within the canvas's last block (block_random permutes the canvas blocks)
        _assert_same(base, run("block_random", fn, _pad(batch, 2, 0), seed=0), C=4)
    assert bool(torch.isfinite(base.seq_logps).all()) and bool((base.seq_logps < 0).all())


# ----------------------------------------------------------------------------------------------------------------------
# Costs and argument checks


def test_estimator_cost():
    assert {n: default_num_samples(n) for n in NAMES} == {
        "mean_field": 1,
        "mc_elbo": 2,
        "mc_elbo_inv_t": 2,
        "block_random": 2,
        "block_random_coupled": 2,
        "coupled": 2,
        "sdmc": 3,
        "sdmc_coupled": 6,
    }
    assert default_num_samples("sdmc", nodes=5) == 5 and default_num_samples("sdmc_coupled", nodes=1) == 2
    assert estimator_cost("mean_field") == 1
    assert estimator_cost("mc_elbo", 8) == 8 and estimator_cost("coupled", 4) == 4
    assert estimator_cost("sdmc", None, nodes=4) == 4 and estimator_cost("sdmc_coupled", 8, nodes=2) == 8
    for name in ("coupled", "block_random_coupled"):
        with pytest.raises(ValueError, match="even"):
            estimator_cost(name, 3)
    with pytest.raises(ValueError, match="multiple of 3"):
        estimator_cost("sdmc", 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        estimator_cost("sdmc_coupled", 6, nodes=2)
    with pytest.raises(ValueError, match="unknown likelihood estimator"):
        estimator_cost("elbo", 2)


def test_defaults_are_used(model):
    batch = make_batch(*ROWS)
    rec = Recorder(model)
    with torch.no_grad():
        estimate_likelihood("block_random", rec, *batch, mask_token_id=MASK, seed=0)
        assert rec.calls[0][0].shape[0] == 4 * 2
        rec2 = Recorder(model)
        estimate_likelihood("mc_elbo", rec2, *batch, mask_token_id=MASK, seed=0)
    # mc_elbo: no prompt masking by default
    P = batch[0].shape[1]
    assert not bool((rec2.inputs()[0][:, :P] == MASK).any())


def test_bad_arguments_raise_value_error(model):
    pid, pm, cid, cm = make_batch(*ROWS)

    def call(name="mc_elbo", **kw):
        args = dict(prompt_ids=pid, prompt_mask=pm, completion_ids=cid, completion_mask=cm)
        args.update({k: kw.pop(k) for k in list(kw) if k in args})
        kw.setdefault("mask_token_id", MASK)
        kw.setdefault("seed", 0)
        return estimate_likelihood(name, model, *args.values(), **kw)

    cases = [
        (dict(name="elbo"), "unknown likelihood estimator"),
        (dict(name="coupled", num_samples=3), "even"),
        (dict(block_size=4), "does not take"),
        (dict(name="block_random", block_size=0), "block_size"),
        (dict(name="block_random_coupled", num_samples=3), "even"),
        (dict(name="sdmc", nodes=6), "nodes"),
        (dict(name="sdmc", nodes=0), "nodes"),
        (dict(name="sdmc", num_samples=4), "multiple of 3"),
        (dict(name="sdmc_coupled", num_samples=3, nodes=1), "multiple of 2"),
        (dict(name="sdmc", block_size=2), "does not take"),
        (dict(num_samples=0), "num_samples"),
        (dict(p_mask_prompt=2.0), "p_mask_prompt"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(eubo_beta=0.0), "eubo_beta"),
        (dict(mask_token_id=None), "mask_token_id"),
        (dict(seed=0.5), "seed"),
        (dict(t_sampling="halton"), "t_sampling"),
        (dict(completion_mask=cm[:, :-1]), "same shape"),
        (dict(prompt_ids=pid[:2], prompt_mask=pm[:2]), "rows"),
        (dict(completion_mask=cm * 2), "only 0 and 1"),
        (dict(completion_ids=cid[:, :0], completion_mask=cm[:, :0]), "zero columns"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            call(**kw)
    with pytest.raises(ValueError, match="logits of shape"):
        estimate_likelihood(
            "mean_field", lambda i, a: model(i, a)[:, 1:], pid, pm, cid, cm, mask_token_id=MASK, seed=0
        )


def test_context_mask_tokens_are_visible_but_never_masked_or_scored():
    """A diffusion rollout's EOS tail: attended as context, not masked, not scored."""
    seen = []

    def recording(ids, am):
        seen.append((ids.clone(), am.clone()))
        base = torch.randn(ids.shape[1], 11, generator=torch.Generator().manual_seed(0))  # (L, V)
        logits = base.expand(ids.shape[0], -1, -1).clone()  # (N, L, V)
        logits[..., 5] += am.sum(-1, keepdim=True).float()  # depends on how many positions are attended
        return logits

    prompt = torch.tensor([[3, 4]])
    pm = torch.ones_like(prompt)
    completion = torch.tensor([[5, 6, 0, 0]])
    scored = torch.tensor([[1, 1, 0, 0]])
    context = torch.ones_like(scored)
    for name in ("mean_field", "mc_elbo", "block_random", "coupled"):
        seen.clear()
        est = estimate_likelihood(
            name,
            recording,
            prompt,
            pm,
            completion,
            scored,
            mask_token_id=1,
            seed=3,
            context_mask=context,
            **({"block_size": 2} if name == "block_random" else {}),
        )
        for ids, am in seen:
            assert am[:, 2:].eq(1).all()  # the whole canvas is attended
            assert ids[:, 4:].eq(0).all()  # the tail is never masked
        assert est.token_logps[0, 2:].eq(0).all()  # nor scored
        # without the context mask the tail is not attended: the estimate changes (the model sees other inputs)
        plain = estimate_likelihood(
            name,
            recording,
            prompt,
            pm,
            completion,
            scored,
            mask_token_id=1,
            seed=3,
            **({"block_size": 2} if name == "block_random" else {}),
        )
        assert not torch.allclose(plain.seq_logps, est.seq_logps)


@pytest.mark.parametrize("name", NAMES)
def test_masked_context_is_masked_in_every_sample_attended_and_never_scored(model, name):
    """The official EOS tail: every position after the first EOS is a mask token in every sample, and attended."""
    batch = make_batch(*ROWS)
    pid, pm, cid, cm = batch
    context = torch.ones_like(cm)
    tail = context.bool() & ~cm.bool()  # (B, C)
    rec = Recorder(model)
    with torch.no_grad():
        est = run(name, rec, batch, seed=4, context_mask=context, mask_context=True)
        visible = run(name, model, batch, seed=4, context_mask=context)
        plain = run(name, Recorder(model), batch, seed=4)
    ids, attn = rec.inputs()
    K, P = ids.shape[0] // cid.shape[0], pid.shape[1]
    ids = ids.view(cid.shape[0], K, -1)[..., P:]  # (B, K, C)
    attn = attn.view(cid.shape[0], K, -1)[..., P:]
    assert bool(ids[tail[:, None].expand_as(ids)].eq(MASK).all())  # the tail: mask tokens in every sample
    assert bool(attn.eq(1).all())  # the whole canvas attended
    # the real tokens get the same masks as without a context (same seed): only the tail differs
    rec_plain = Recorder(model)
    with torch.no_grad():
        run(name, rec_plain, batch, seed=4)
    plain_ids = rec_plain.inputs()[0].view(cid.shape[0], K, -1)[..., P:]
    real = cm.bool()[:, None].expand_as(ids)
    assert torch.equal(ids[real] == MASK, plain_ids[real] == MASK)
    assert bool(est.token_logps[tail].eq(0).all())  # never scored
    # what the tail holds no longer matters: it is masked
    cid2 = torch.where(tail, torch.full_like(cid, 6), cid)
    with torch.no_grad():
        other = run(name, model, (pid, pm, cid2, cm), seed=4, context_mask=context, mask_context=True)
    assert torch.allclose(other.seq_logps, est.seq_logps, atol=1e-6)
    # and it is a different estimate from the visible tail's and from no tail at all
    rows = tail.any(-1)
    assert not torch.allclose(est.seq_logps[rows], visible.seq_logps[rows], atol=1e-4)
    assert not torch.allclose(est.seq_logps[rows], plain.seq_logps[rows], atol=1e-4)
