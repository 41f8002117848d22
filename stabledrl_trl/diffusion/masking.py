"""Mask samplers for masked-diffusion likelihood estimators: pure functions of padding masks and a seed.

Every random draw is a counter-based hash of (seed, stream, row, sample, position) turned into a uniform in [0, 1),
so a row's masks depend only on the seed, its row index, the Monte-Carlo sample index and each token's position, never
on the batch's padding width or on other rows. The seed is an int (shared by the batch; the row index tells rows
apart), a torch.Generator (one int is drawn from it), or a (B,) integer tensor of per-row seeds (then the row index is
not used: a row's masks follow its own seed wherever it sits in the batch). Positions are counted so that padding moves
no real token:

- completion column j (completions are RIGHT-padded) has position j, counted from the completion start;
- prompt column j of a width-P prompt (prompts are LEFT-padded) has position P - 1 - j, counted from the prompt end.

All samplers return a `Masks`: boolean tensors saying which tokens are replaced by the mask token in each of the K
samples. Padding (mask value 0) is never masked.

Samplers (see `stabledrl_trl.diffusion.estimators` for the estimates built on them):
- `mean_field_masks`: every real completion token masked (d1 / diffu-GRPO one-step proxy).
- `random_ratio_masks`: one ratio t per sample, each real completion token masked with p = eps + (1 - eps) t
  (LLaDA / MDLM); at least one masked token per sample.
- `block_random_masks`: SPG's block-random scheme used by the official StableDRL code.
- `block_random_coupled_masks`: block-random masks in complementary pairs inside the chosen block (same marginal).
- `coupled_masks`: pairs of complementary masks over the real completion tokens (DiffuCoder / ESPO).
- `sdmc_masks`: fixed Gauss-Legendre times t, round(t L) random positions per node, optionally in complementary pairs.
Each of them also masks real prompt tokens independently with probability `p_mask_prompt`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF
_GOLDEN32 = 0x9E3779B9  # 2^32 / golden ratio: spreads consecutive counters before mixing

# One stream per kind of draw, so that e.g. the ratio t and the token masks of a sample are independent.
STREAM_PROMPT = 1
STREAM_COMPLETION = 2
STREAM_TIME = 3
STREAM_FALLBACK = 4
STREAM_BLOCK = 5
STREAM_COUNT = 6
STREAM_SUBSET = 7

T_SAMPLINGS = ("uniform", "stratified")


# ----------------------------------------------------------------------------------------------------------------------
# Counter-based uniforms


Seed = int | Tensor | torch.Generator


def resolve_seed(seed: Seed, batch_size: int | None = None) -> int | Tensor:
    """Normalise a seed: an int as is; a `torch.Generator` gives one int drawn from it (advancing its state); a (B,)
    integer tensor of per-row seeds is returned as int64 (checked against batch_size when given); a 0-d integer tensor
    gives an int.
    """
    if isinstance(seed, torch.Generator):
        return int(torch.randint(0, 2**62, (1,), generator=seed, device=seed.device).item())
    if isinstance(seed, Tensor):
        if seed.dtype.is_floating_point or seed.dtype.is_complex or seed.dtype == torch.bool:
            raise ValueError(f"a seed tensor must hold integers, got dtype {seed.dtype}")
        if seed.dim() == 0:
            return int(seed.item())
        if seed.dim() != 1 or (batch_size is not None and seed.shape[0] != batch_size):
            raise ValueError(
                f"a seed tensor must have shape (B,) = ({batch_size},), one seed per row, got {tuple(seed.shape)}"
            )
        return seed.long()
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(
            f"seed must be an int, a torch.Generator or a (B,) integer tensor of per-row seeds, got {seed!r} "
            f"({type(seed).__name__}); pass e.g. seed=0"
        )
    return seed


def _mul32(x: Tensor, c: int) -> Tensor:
    """(x * c) mod 2^32 for int64 x in [0, 2^32) and a 32-bit constant c, without int64 overflow.

    c is split into 16-bit halves so that every intermediate product stays below 2^48.
    """
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _MASK32


def mix32(x: Tensor) -> Tensor:
    """A 32-bit integer mixing function (murmur3's finaliser) on int64 tensors holding values in [0, 2^32).

    It is a bijection of the 32-bit integers in which every input bit affects every output bit.
    """
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    x = x ^ (x >> 16)
    return x


def counter_uniform(seed: int | Tensor, *counters: Tensor | int, device: torch.device | str | None = None) -> Tensor:
    """Uniforms in [0, 1) (float64) hashed from (seed, *counters); seed and counters broadcast against each other.

    Counters are non-negative integers below 2^32 (stream ids, row/sample indices, positions). The seed may be any
    int or int64 tensor (taken modulo 2^64, two's complement). Equal inputs give equal outputs; any change of the seed
    or of one counter gives an (empirically) independent uniform.
    """
    if isinstance(seed, Tensor):
        seed = seed.to(device=device, dtype=torch.int64)
        lo, hi = seed & _MASK32, (seed >> 32) & _MASK32  # arithmetic shift + mask = the two's complement halves
    else:
        seed = seed % 2**64
        lo, hi = seed & _MASK32, seed >> 32
    h = torch.full((), 0x811C9DC5, dtype=torch.int64, device=device)
    values = [lo, hi, *counters]
    for i, v in enumerate(values):
        v = torch.as_tensor(v, dtype=torch.int64, device=device)
        salt = (_GOLDEN32 * (i + 1)) & _MASK32
        # Each slot gets its own salt, so (a, b) and (b, a) hash differently.
        h = mix32(h ^ mix32((v + salt) & _MASK32))
    return h.to(torch.float64) / 2.0**32


def _grid_uniform(seed: int | Tensor, stream: int, batch: int, samples: int, positions: Tensor) -> Tensor:
    """Uniforms of shape (batch, samples, len(positions)) indexed by (row, sample, position).

    With per-row seeds (a (B,) tensor) the row counter is 0: the row's own seed tells it apart.
    """
    device = positions.device
    ks = torch.arange(samples, device=device)[None, :, None]  # (1, K, 1)
    if isinstance(seed, Tensor):
        seeds = seed.to(device)[:, None, None]  # (B, 1, 1)
        return counter_uniform(seeds, stream, 0, ks, positions[None, None, :], device=device)  # (B, K, len)
    rows = torch.arange(batch, device=device)[:, None, None]  # (B, 1, 1)
    return counter_uniform(seed, stream, rows, ks, positions[None, None, :], device=device)  # (B, K, len)


def _completion_positions(width: int, device) -> Tensor:
    return torch.arange(width, device=device)  # (C,) counted from the completion start


def _prompt_positions(width: int, device) -> Tensor:
    return torch.arange(width - 1, -1, -1, device=device)  # (P,) counted from the prompt end


# ----------------------------------------------------------------------------------------------------------------------
# Validation


def _check_pair(prompt_mask: Tensor, completion_mask: Tensor) -> None:
    if prompt_mask.dim() != 2 or completion_mask.dim() != 2:
        raise ValueError(
            f"prompt_mask and completion_mask must be 2-D (B, P) and (B, C), got shapes {tuple(prompt_mask.shape)} and "
            f"{tuple(completion_mask.shape)}"
        )
    if prompt_mask.shape[0] != completion_mask.shape[0]:
        raise ValueError(
            f"prompt_mask and completion_mask must have the same batch size, got {prompt_mask.shape[0]} and "
            f"{completion_mask.shape[0]}"
        )
    if completion_mask.shape[1] == 0:
        raise ValueError("completion_mask has zero columns; pass at least one completion position")


def check_num_samples(num_samples, *, even: bool = False) -> None:
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    if even and num_samples % 2:
        raise ValueError(
            f"num_samples counts forward passes and must be even for coupled masks (one pass per mask and its "
            f"complement), got {num_samples}; pass e.g. num_samples={num_samples + 1}"
        )


def check_probability(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value!r}")


# ----------------------------------------------------------------------------------------------------------------------
# Samplers


@dataclass
class Masks:
    """Which tokens are replaced by the mask token in each of K samples (True = masked).

    prompt: (B, K, P) bool; completion: (B, K, C) bool; mask_prob: (B, K) the per-token masking probability of the
    completion in each sample (random-ratio sampler only); block: (B, K) index of the chosen block (block-random
    sampler only; the number of blocks when the row has no real token); fallback: (B, K) bool, True where the
    random-ratio draw masked no real token and one was masked by the at-least-one rule (random-ratio sampler only);
    weight: (B, K) float64 quadrature weight of each sample, summing to 1 per row (semi-deterministic sampler only).
    """

    prompt: Tensor
    completion: Tensor
    mask_prob: Tensor | None = None
    block: Tensor | None = None
    fallback: Tensor | None = None
    weight: Tensor | None = None


def prompt_masks(seed: Seed, prompt_mask: Tensor, num_samples: int, p_mask_prompt: float) -> Tensor:
    """(B, K, P) bool: each real prompt token masked independently with probability p_mask_prompt."""
    B, P = prompt_mask.shape
    seed = resolve_seed(seed, B)
    real = prompt_mask.bool()[:, None, :]  # (B, 1, P)
    if p_mask_prompt == 0.0 or P == 0:
        return torch.zeros(B, num_samples, P, dtype=torch.bool, device=prompt_mask.device)
    u = _grid_uniform(seed, STREAM_PROMPT, B, num_samples, _prompt_positions(P, prompt_mask.device))  # (B, K, P)
    return (u < p_mask_prompt) & real


def _select_lowest(scores: Tensor, candidates: Tensor, count: Tensor) -> Tensor:
    """Among `candidates` (bool, (..., C)), select the `count` (..., ) ones with the lowest scores in [0, 1).

    With i.i.d. uniform scores this is a uniformly random subset of the candidates of the given size. Non-candidates
    get score 2 so they rank after every candidate; ranks therefore ignore padding.
    """
    scores = torch.where(candidates, scores, torch.full_like(scores, 2.0))
    ranks = scores.argsort(dim=-1, stable=True).argsort(dim=-1)  # (..., C)
    return candidates & (ranks < count[..., None])


def _ensure_one_masked(seed: int | Tensor, masked: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
    """Where a sample masks no real completion token, mask one real token chosen uniformly (if the row has any).

    Returns the masks and a (B, K) bool telling which samples were completed this way.
    """
    B, K, C = masked.shape
    empty = ~masked.any(dim=-1) & real.any(dim=-1)  # (B, K)
    if not bool(empty.any()):
        return masked, empty
    u = _grid_uniform(seed, STREAM_FALLBACK, B, K, _completion_positions(C, masked.device))  # (B, K, C)
    pick = _select_lowest(u, real.expand(B, K, C), torch.ones(B, K, dtype=torch.long, device=masked.device))
    return masked | (pick & empty[..., None]), empty


def mean_field_masks(
    seed: Seed, prompt_mask: Tensor, completion_mask: Tensor, *, num_samples: int = 1, p_mask_prompt: float = 0.15
) -> Masks:
    """Every real completion token masked; real prompt tokens masked independently with probability p_mask_prompt."""
    _check_pair(prompt_mask, completion_mask)
    check_num_samples(num_samples)
    check_probability("p_mask_prompt", p_mask_prompt)
    seed = resolve_seed(seed, completion_mask.shape[0])
    B, C = completion_mask.shape
    completion = completion_mask.bool()[:, None, :].expand(B, num_samples, C).clone()  # (B, K, C)
    return Masks(prompt_masks(seed, prompt_mask, num_samples, p_mask_prompt), completion)


def random_ratio_masks(
    seed: Seed,
    prompt_mask: Tensor,
    completion_mask: Tensor,
    *,
    num_samples: int,
    t_sampling: str = "uniform",
    eps: float = 1e-3,
    p_mask_prompt: float = 0.0,
) -> Masks:
    """LLaDA / MDLM forward-process masks: one t per sample, each real completion token masked w.p. eps + (1-eps) t.

    t_sampling "uniform": t = 1 - u, uniform in (0, 1], independent across samples; "stratified": t_k = (k + 1 - u_k)/K,
    uniform in stratum ((k)/K, (k+1)/K], so the K samples cover (0, 1] evenly (each t_k is still uniform on (0, 1]
    when k is uniform, so the average over samples keeps the same expectation).
    A sample that masks no real token has one real token, chosen uniformly, masked instead: this avoids 0/0 in
    per-token means at the price of a small bias at small t (probability (1 - p)^n). `mask_prob` holds p per sample
    (B, K) and `fallback` marks the samples completed this way (B, K).
    """
    _check_pair(prompt_mask, completion_mask)
    check_num_samples(num_samples)
    check_probability("p_mask_prompt", p_mask_prompt)
    seed = resolve_seed(seed, completion_mask.shape[0])
    if t_sampling not in T_SAMPLINGS:
        raise ValueError(f"t_sampling must be one of {T_SAMPLINGS}, got {t_sampling!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= eps < 1.0:
        raise ValueError(f"eps (smallest masking probability) must be in [0, 1), got {eps!r}; LLaDA uses eps=1e-3")
    B, C = completion_mask.shape
    device = completion_mask.device
    real = completion_mask.bool()[:, None, :]  # (B, 1, C)
    u_t = _grid_uniform(seed, STREAM_TIME, B, num_samples, torch.zeros(1, dtype=torch.long, device=device))[..., 0]
    if t_sampling == "uniform":
        t = 1.0 - u_t  # (B, K) in (0, 1]
    else:
        k = torch.arange(num_samples, device=device, dtype=torch.float64)[None, :]  # (1, K)
        t = (k + 1.0 - u_t) / num_samples  # (B, K) in (k/K, (k+1)/K]
    p = eps + (1.0 - eps) * t  # (B, K)
    u = _grid_uniform(seed, STREAM_COMPLETION, B, num_samples, _completion_positions(C, device))  # (B, K, C)
    completion = (u < p[..., None]) & real
    completion, fallback = _ensure_one_masked(seed, completion, real)
    prompt = prompt_masks(seed, prompt_mask, num_samples, p_mask_prompt)
    return Masks(prompt, completion, mask_prob=p, fallback=fallback)


def _choose_blocks(seed: int | Tensor, real: Tensor, block_size: int, num: int):
    """The official block choice for `num` draws per row (see `block_random_masks`).

    real (B, C) bool. Returns chosen (B, num) block indices (NB for a row without real tokens), block_of (C,) the block
    of each completion column, real_per_block (B, NB) and NB.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}; SPG uses block_size=32")
    B, C = real.shape
    device = real.device
    block_of = _completion_positions(C, device) // block_size  # (C,)
    num_blocks = (C + block_size - 1) // block_size
    one_hot = block_of[:, None] == torch.arange(num_blocks, device=device)[None, :]  # (C, NB)
    real_per_block = (real[:, :, None] & one_hot[None]).sum(dim=1)  # (B, NB)
    has_real = real_per_block > 0  # (B, NB)
    n_blocks_real = has_real.sum(dim=-1)  # (B,)
    u_perm = _grid_uniform(seed, STREAM_BLOCK, B, 1, torch.arange(num_blocks, device=device))[:, 0]  # (B, NB)
    perm = u_perm.argsort(dim=-1, stable=True)  # (B, NB) a uniformly random permutation of the canvas blocks
    entry = perm[:, torch.arange(num, device=device) % num_blocks]  # (B, num)
    # index among the blocks holding real tokens, then the block it is (the (idx+1)-th such block)
    idx = entry % n_blocks_real[:, None].clamp(min=1)  # (B, num)
    rank_real = has_real.long().cumsum(dim=-1) - 1  # (B, NB): index of each real-holding block among them
    is_chosen = has_real[:, None, :] & (rank_real[:, None, :] == idx[..., None])  # (B, num, NB)
    chosen = torch.where(is_chosen.any(-1), is_chosen.long().argmax(-1), torch.full_like(idx, num_blocks))
    return chosen, block_of, real_per_block, num_blocks


def _block_random_layout(seed, prompt_mask, completion_mask, num_samples, block_size, p_mask_prompt, pairs: bool):
    """Shared body of `block_random_masks` (pairs=False) and `block_random_coupled_masks` (pairs=True)."""
    _check_pair(prompt_mask, completion_mask)
    check_num_samples(num_samples, even=pairs)
    check_probability("p_mask_prompt", p_mask_prompt)
    seed = resolve_seed(seed, completion_mask.shape[0])
    B, C = completion_mask.shape
    K = num_samples
    draws = K // 2 if pairs else K  # one block, count and subset per draw (a pair shares them)
    device = completion_mask.device
    real = completion_mask.bool()  # (B, C)
    pos = _completion_positions(C, device)
    chosen, block_of, real_per_block, num_blocks = _choose_blocks(seed, real, block_size, draws)  # (B, D)

    zero = torch.zeros(1, dtype=torch.long, device=device)
    n_in = torch.gather(real_per_block, 1, chosen.clamp(max=num_blocks - 1))  # (B, D) real tokens in the block
    n_in = torch.where(chosen < num_blocks, n_in, torch.zeros_like(n_in))
    u_count = _grid_uniform(seed, STREAM_COUNT, B, draws, zero)[..., 0]  # (B, D)
    count = torch.minimum((u_count * n_in).floor().long() + 1, n_in)  # (B, D) uniform in [1, n_in]
    u_subset = _grid_uniform(seed, STREAM_SUBSET, B, draws, pos)  # (B, D, C)
    inside = (block_of[None, None, :] == chosen[..., None]) & real[:, None, :]  # (B, D, C)
    in_block = _select_lowest(u_subset, inside, count)  # (B, D, C)
    if pairs:
        # pass 2q masks the complement of pass 2q+1's subset inside the block; a full block (count = n_in) is
        # masked in both passes, so each pass on its own has block_random's distribution
        second = torch.where((count == n_in)[..., None], in_block, inside & ~in_block)
        in_block = torch.stack([in_block, second], dim=2).reshape(B, K, C)  # (B, K, C)
        chosen = chosen.repeat_interleave(2, dim=1)  # (B, K)

    blk = block_of[None, None, :]  # (1, 1, C)
    real3 = real[:, None, :]  # (B, 1, C)
    later = (blk > chosen[..., None]) & real3  # (B, K, C)
    earlier = (blk < chosen[..., None]) & real3
    u_early = _grid_uniform(seed, STREAM_COMPLETION, B, K, pos)  # (B, K, C), one draw per pass
    completion = later | in_block | (earlier & (u_early < p_mask_prompt))
    return Masks(prompt_masks(seed, prompt_mask, K, p_mask_prompt), completion, block=chosen)


def block_random_masks(
    seed: Seed,
    prompt_mask: Tensor,
    completion_mask: Tensor,
    *,
    num_samples: int,
    block_size: int = 32,
    p_mask_prompt: float = 0.15,
) -> Masks:
    """SPG's block-random masks (the official StableDRL code).

    Completion positions are cut into NB = ceil(C / block_size) blocks of block_size from the completion start (for
    a diffusion rollout, the fixed canvas: 256 / 32 = 8 blocks in the official recipe). Block choice, as the official
    code: one uniformly random permutation pi of the NB blocks per row; sample k takes

        chosen_k = (pi[k mod NB] mod c)-th block holding real tokens,   c = number of such blocks,

    so with c = NB the first NB samples never share a block (antithetic), and with c < NB block b gets probability
    |{e < NB : e mod c = b}| / NB (c = 3, NB = 8: 3/8, 3/8, 2/8). Then: mask every real token of the later blocks;
    inside the chosen block mask a uniformly random count k in [1, real tokens of the block] of its real positions (a
    uniformly random subset of that size); mask real tokens of earlier blocks and real prompt tokens independently
    with probability p_mask_prompt.
    """
    return _block_random_layout(seed, prompt_mask, completion_mask, num_samples, block_size, p_mask_prompt, False)


def block_random_coupled_masks(
    seed: Seed,
    prompt_mask: Tensor,
    completion_mask: Tensor,
    *,
    num_samples: int,
    block_size: int = 32,
    p_mask_prompt: float = 0.15,
) -> Masks:
    """Block-random masks in complementary pairs: the low-variance form of the official estimator's masks.

    Passes 2q and 2q+1 share one block, chosen as `block_random_masks` chooses the block of sample q (entry q of the
    row's permutation of the canvas blocks, so pairs take different blocks, antithetically), and mask every real
    token of the later blocks. Inside the block, a count l uniform in [1, n_b] (n_b its real tokens) and a uniformly
    random subset A of that size: pass 2q masks A, pass 2q+1 masks the block's other real tokens (for l = n_b, the
    whole block again). Earlier blocks and the prompt are masked independently per pass with probability
    p_mask_prompt. Each pass on its own has exactly `block_random_masks`' distribution (the complement of a uniform
    l-subset is a uniform (n_b - l)-subset, and n_b - l is uniform in [0, n_b - 1] with 0 replaced by n_b), so any
    average over passes keeps block_random's expectation; within a pair every in-block token is masked exactly once
    (l < n_b). num_samples counts passes and must be even.
    """
    return _block_random_layout(seed, prompt_mask, completion_mask, num_samples, block_size, p_mask_prompt, True)


def coupled_masks(
    seed: Seed, prompt_mask: Tensor, completion_mask: Tensor, *, num_samples: int, p_mask_prompt: float = 0.0
) -> Masks:
    """Complementary mask pairs: samples 2q and 2q+1 mask a random subset of the real completion tokens and its
    complement, so every real token is masked exactly once per pair.

    Per pair q: a count l uniform in [1, n_real - 1], then a uniformly random subset of l real tokens. When a row has
    a single real token (n_real = 1) there is no non-trivial split: both passes of the pair mask that token (the
    complement pass repeats the first one, with its own prompt mask). num_samples counts passes and must be even.
    Prompt masks are drawn per pass.
    """
    _check_pair(prompt_mask, completion_mask)
    check_num_samples(num_samples, even=True)
    check_probability("p_mask_prompt", p_mask_prompt)
    seed = resolve_seed(seed, completion_mask.shape[0])
    B, C = completion_mask.shape
    Q = num_samples // 2
    device = completion_mask.device
    real = completion_mask.bool()  # (B, C)
    n_real = real.sum(-1)  # (B,)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    u_count = _grid_uniform(seed, STREAM_COUNT, B, Q, zero)[..., 0]  # (B, Q)
    span = (n_real[:, None] - 1).clamp(min=1)  # (B, 1) choices of l
    count = torch.minimum((u_count * span).floor().long() + 1, span)  # (B, Q) uniform in [1, n_real - 1]
    u_subset = _grid_uniform(seed, STREAM_SUBSET, B, Q, _completion_positions(C, device))  # (B, Q, C)
    first = _select_lowest(u_subset, real[:, None, :].expand(B, Q, C), count)  # (B, Q, C)
    second = real[:, None, :] & ~first
    single = (n_real == 1)[:, None, None]  # (B, 1, 1)
    second = torch.where(single, first, second)
    completion = torch.stack([first, second], dim=2).reshape(B, num_samples, C)  # (B, K, C): pass 2q, 2q+1
    return Masks(prompt_masks(seed, prompt_mask, num_samples, p_mask_prompt), completion)


SDMC_MAX_NODES = 5


def gauss_legendre_times(nodes: int) -> tuple[Tensor, Tensor]:
    """Gauss-Legendre nodes mapped to t in (0, 1) and their weights (summing to 1), both (nodes,) float64.

    t_i = (x_i + 1) / 2 and w_i / 2 for the n-point rule (x_i, w_i) on [-1, 1] (numpy.polynomial.legendre.leggauss).
    """
    import numpy as np

    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= SDMC_MAX_NODES:
        raise ValueError(
            f"nodes must be an int in [1, {SDMC_MAX_NODES}] (Gauss-Legendre points over t), got {nodes!r}"
        )
    x, w = np.polynomial.legendre.leggauss(nodes)
    return torch.from_numpy((x + 1.0) / 2.0), torch.from_numpy(w / 2.0)


def sdmc_counts(n_real: Tensor, nodes: int, *, coupled: bool = False) -> Tensor:
    """(B, nodes) number of real completion tokens masked at each node: round(t_i * n_real), at least 1.

    Rounding is half up (floor(x + 1/2)). With `coupled`, a node's pass and its complement must both mask something,
    so the count is also at most n_real - 1 (a row with one real token masks it in both passes).
    """
    t, _ = gauss_legendre_times(nodes)
    n = n_real.to(torch.float64)[:, None]  # (B, 1)
    count = torch.floor(t.to(n.device)[None, :] * n + 0.5).long()  # (B, nodes)
    upper = (n_real[:, None] - 1).clamp(min=1) if coupled else n_real[:, None].clamp(min=1)
    return torch.minimum(count.clamp(min=1), upper)


def sdmc_masks(
    seed: Seed,
    prompt_mask: Tensor,
    completion_mask: Tensor,
    *,
    num_samples: int | None = None,
    nodes: int = 3,
    coupled: bool = False,
    p_mask_prompt: float = 0.0,
) -> Masks:
    """Semi-deterministic Monte-Carlo masks (GDPO; Block-R1, NeMo-RL): fixed Gauss-Legendre times t_i, random positions.

    One repeat is one pass per node (two with `coupled`); num_samples counts passes and must be a multiple of that
    (None: one repeat). Pass layout: k = (r * nodes + i) * h + j, r the repeat, i the node, h = 2 if coupled else 1,
    j the half of the pair. At node i a uniformly random subset of `sdmc_counts` real completion tokens is masked;
    with `coupled` the second pass of the node masks the complement (every real token masked exactly once per pair).
    `weight` (B, K) holds each pass's quadrature weight w_i / (h * R) (summing to 1 per row): the estimate is
    sum_k weight_k * (mean of log p over the pass's masked real tokens). Real prompt tokens are masked per pass with
    probability p_mask_prompt.
    """
    _check_pair(prompt_mask, completion_mask)
    check_probability("p_mask_prompt", p_mask_prompt)
    _, w = gauss_legendre_times(nodes)
    per_repeat = nodes * (2 if coupled else 1)
    if num_samples is None:
        num_samples = per_repeat
    check_num_samples(num_samples)
    if num_samples % per_repeat:
        raise ValueError(
            f"num_samples={num_samples} must be a multiple of {per_repeat} ({nodes} nodes"
            f"{' x 2 coupled passes' if coupled else ''}, one repeat); pass e.g. num_samples={per_repeat}"
        )
    seed = resolve_seed(seed, completion_mask.shape[0])
    B, C = completion_mask.shape
    R = num_samples // per_repeat
    device = completion_mask.device
    real = completion_mask.bool()  # (B, C)
    count = sdmc_counts(real.sum(-1), nodes, coupled=coupled)  # (B, n)
    count = count[:, None, :].expand(B, R, nodes).reshape(B, R * nodes)  # (B, R*n)
    u_subset = _grid_uniform(seed, STREAM_SUBSET, B, R * nodes, _completion_positions(C, device))  # (B, R*n, C)
    first = _select_lowest(u_subset, real[:, None, :].expand(B, R * nodes, C), count)  # (B, R*n, C)
    weight = w.to(device=device, dtype=torch.float64).repeat(R) / R  # (R*n,)
    if coupled:
        single = (real.sum(-1) == 1)[:, None, None]  # (B, 1, 1): one real token, masked in both passes
        second = torch.where(single, first, real[:, None, :] & ~first)
        completion = torch.stack([first, second], dim=2).reshape(B, num_samples, C)
        weight = weight.repeat_interleave(2) / 2
    else:
        completion = first
    weight = weight[None, :].expand(B, num_samples).clone()  # (B, K)
    return Masks(prompt_masks(seed, prompt_mask, num_samples, p_mask_prompt), completion, weight=weight)
