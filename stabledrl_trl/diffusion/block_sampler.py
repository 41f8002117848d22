"""SDAR's block-diffusion sampler with an exact key/value cache of the committed blocks.

A block-diffusion LM (SDAR, TraDo; stabledrl_trl.models.sdar) attends block-causally with blocks aligned at absolute
position 0, so the keys and values of a finished block never change and can be cached exactly (SDAR, arXiv
2510.06303; TraceRL, arXiv 2509.06949). Generation of one row with real prompt length p and block size bs:

1. prefill: the block-aligned part of the prompt, positions [0, bs * (p // bs)), one forward storing its KV cache;
2. for each block b = p // bs, p // bs + 1, ...: the block holds the prompt's tail (first block only) and mask tokens;
   repeat: one forward of the block against the cache (its own keys are not stored: the cache is cropped back),
   draw a candidate x0 and its probability for every position, reveal some masked positions:
     - "low_confidence_static": the k_s most confident, k_s = SDAR's schedule (bs // steps, the first bs % steps
       steps one more);
     - "low_confidence_dynamic": every position with probability > threshold, at least k_s (TraceRL / SDAR);
   until the block is clean; then one more forward stores the clean block's keys/values;
3. stop after a block that contains an EOS token, or when `gen_length` new positions are filled.
A finished row leaves the working batch (its rows of the KV cache are dropped), so later forwards run only the rows
still generating; rows are independent, so this changes no token.

Candidates follow SDAR's `sample_with_temperature_topk_topp`: logits / temperature, top-k, top-p, one categorical
draw, confidence = the drawn token's probability. At temperature 0 the candidate is the argmax and its confidence its
probability under the top-k / top-p filtered softmax at temperature 1.

Batching. Prompts are left-padded. Every row's blocks are laid out so that all rows denoise their current block in the
same columns: a row's prefill is left-padded by a whole number of blocks to the longest prefill, its prompt tail sits
at the start of the first generated block. Positions count real tokens (the model derives them from the 2-D
attention mask), so a batched row sees exactly the keys, positions and blocks it sees alone. A row stops being
updated once it is finished; generation stops when every row is.

Differences from SDAR's `block_diffusion_generate` (none changes a single-row result at temperature 0):
- exactly `gen_length` positions are generated: the last block is cut at p + gen_length (its missing columns are
  hidden padding) instead of being filled up to the block boundary;
- only masked positions are revealed: SDAR's top-k over the block may pick an already revealed (e.g. prompt) position
  when the schedule asks for more tokens than remain masked, and overwrite it;
- the mask token is never a candidate (its logit is -inf); categorical draws use inverse-CDF sampling on counter-based
  uniforms hashed from (row seed, step, position) (stabledrl_trl.diffusion.masking.counter_uniform) instead of
  `torch.multinomial`, so a row's draws do not depend on the other rows of the batch. The row seeds come from the
  explicit `generator` (one int per row) or are given as a (B,) tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from transformers import DynamicCache

from .filtering import filter_logits, validate_filter_args
from .masking import counter_uniform

REMASKING_STRATEGIES = ("low_confidence_static", "low_confidence_dynamic")
STREAM_SAMPLE = 11  # counter stream of the categorical draws


@dataclass
class BlockSamplerOutput:
    """What `block_generate` returns.

    completion_ids: (B, gen_length) long; positions after the block holding the first EOS are `pad_token_id`.
    completion_mask: (B, gen_length) long; 1 up to and including the first EOS, 0 after.
    context_mask: (B, gen_length) long; 1 on every generated position (including the rest of the EOS block, which
        the model saw while denoising it), 0 on the never-generated tail.
    num_forwards: number of model forwards (prefill, denoising steps and commits) the batch ran.
    """

    completion_ids: Tensor
    completion_mask: Tensor
    context_mask: Tensor
    num_forwards: int


def transfer_schedule(block_size: int, steps: int) -> Tensor:
    """SDAR's per-step reveal counts for a block: bs // steps each, the first bs % steps steps one more. (steps,)."""
    counts = torch.full((steps,), block_size // steps, dtype=torch.long)
    counts[: block_size % steps] += 1
    return counts


def sample_candidates(
    logits: Tensor, uniforms: Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None
) -> tuple[Tensor, Tensor]:
    """A candidate token and its probability per position, as SDAR's sampler draws them.

    logits (B, N, V) float32; uniforms (B, N) float64 in [0, 1). Returns tokens (B, N) long and probabilities (B, N).
    temperature > 0: p = softmax(filter(logits / T)), token = inverse-CDF draw of p with the uniform;
    temperature 0: p = softmax(filter(logits)), token = argmax.
    """
    scaled = logits / temperature if temperature > 0 else logits
    probs = torch.softmax(filter_logits(scaled, top_k, top_p).double(), dim=-1)  # (B, N, V)
    if temperature > 0:
        cdf = probs.cumsum(-1)  # (B, N, V)
        tokens = (cdf <= uniforms[..., None]).sum(-1).clamp(max=probs.shape[-1] - 1)  # (B, N)
        # never land on a zero-probability token through rounding at the top of the CDF
        tokens = torch.where(probs.gather(-1, tokens[..., None])[..., 0] > 0, tokens, probs.argmax(-1))
    else:
        tokens = probs.argmax(-1)
    return tokens, probs.gather(-1, tokens[..., None])[..., 0]


def sample_candidates_multinomial(
    logits: Tensor,
    generators,
    temperature: float,
    top_k: int | None = None,
    top_p: float | None = None,
    active: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """LLaDA2's draw: a candidate token and its probability per position, one `torch.multinomial` per row.

    logits (B, N, V) float32; generators: one torch.Generator per row. p = softmax(filter(logits / T)) in float32,
    token = torch.multinomial(p[b], 1, generator=generators[b]) (N draws per row and call, as LLaDA2's `generate`
    makes for its one row); temperature 0 = argmax. active (B,) bool: rows that draw (default all); the others keep
    their generator untouched (their candidates are the argmax), so a row's stream does not depend on the batch.
    Returns tokens (B, N) long and probabilities (B, N).
    """
    scaled = logits / temperature if temperature > 0 else logits
    probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)  # (B, N, V) float32
    tokens = probs.argmax(-1)  # (B, N)
    if temperature > 0:
        for b, g in enumerate(generators):
            if active is None or bool(active[b]):
                tokens[b] = torch.multinomial(probs[b], 1, generator=g)[:, 0]
    return tokens, probs.gather(-1, tokens[..., None])[..., 0]


def choose_reveals(confidence: Tensor, masked: Tensor, count: Tensor, strategy: str, threshold: float) -> Tensor:
    """Which masked positions to reveal this step. confidence (B, N), masked (B, N) bool, count (B,) long >= 1.

    static: the `count` most confident masked positions; dynamic: all masked positions with confidence > threshold,
    or the `count` most confident when fewer pass. Never more than the masked positions. Returns (B, N) bool.
    """
    conf = torch.where(masked, confidence, torch.full_like(confidence, -1.0))  # unmasked rank last
    count = torch.minimum(count, masked.sum(-1))  # (B,)
    ranks = conf.argsort(dim=-1, descending=True, stable=True).argsort(dim=-1)  # (B, N)
    top = (ranks < count[:, None]) & masked
    if strategy == "low_confidence_static":
        return top
    high = masked & (confidence > threshold)
    return torch.where((high.sum(-1) >= count)[:, None], high, top)


def validate_block_sampler_args(gen_length, block_size, steps, temperature, top_k, top_p, remasking, threshold):
    """Raise a ValueError naming the argument, its value and the fix for an invalid block-sampler setting."""
    for name, value in (("gen_length", gen_length), ("block_size", block_size), ("denoising_steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")
    if steps > block_size:
        raise ValueError(
            f"denoising_steps={steps} exceeds block_size={block_size}: each step reveals at least one token of the "
            f"block; use denoising_steps <= {block_size} (SDAR / TraDo use denoising_steps = block_size)."
        )
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature < 0:
        raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {temperature!r}.")
    validate_filter_args(top_k, top_p)
    if remasking not in REMASKING_STRATEGIES:
        raise ValueError(f"remasking={remasking!r} is not one of {REMASKING_STRATEGIES}.")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise ValueError(f"confidence_threshold must be in [0, 1] (TraceRL uses 0.9), got {threshold!r}.")


@dataclass
class BlockLayout:
    """Column layout of a batch on the block-aligned canvas (see the module docstring).

    canvas (B, W) long: prompt tokens, mask tokens on the positions to generate, pad elsewhere; attention (B, W) long;
    prefill_width S (columns of the prefill, a multiple of the block size); completion_start (B,) first completion
    column of each row; first_column (B,) the column of each row's position 0; num_blocks: generated blocks of the
    longest row.
    """

    canvas: Tensor
    attention: Tensor
    prefill_width: int
    completion_start: Tensor
    first_column: Tensor
    num_blocks: int


def block_layout(
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    gen_length: int,
    block_size: int,
    mask_token_id: int,
    pad_token_id: int,
    whole_blocks: bool = False,
) -> BlockLayout:
    """Lay a left-padded prompt batch out so that every row's current block sits in the same columns.

    whole_blocks: generate every row's last block in full (LLaDA2: the canvas is rounded up to whole blocks, then the
    completion is cut at gen_length) instead of hiding its columns beyond p + gen_length (SDAR).
    """
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    real = prompt_mask.bool()
    lengths = real.sum(-1)  # (B,) real prompt tokens p
    prefill_blocks = torch.div(lengths, block_size, rounding_mode="floor")  # (B,)
    tails = lengths - prefill_blocks * block_size  # (B,) prompt tokens in the first generated block
    S = int(prefill_blocks.max()) * block_size if B else 0
    num_blocks = int(torch.div(tails + gen_length + block_size - 1, block_size, rounding_mode="floor").max())
    W = S + num_blocks * block_size
    start = S - prefill_blocks * block_size  # (B,) first real column
    cols = torch.arange(W, device=device)[None]  # (1, W)
    rel = cols - start[:, None]  # (B, W) real position of each column
    prompt_cols = (rel >= 0) & (rel < lengths[:, None])
    gen_end = lengths + gen_length  # (B,)
    if whole_blocks:
        gen_end = torch.div(gen_end + block_size - 1, block_size, rounding_mode="floor") * block_size
    gen_cols = (rel >= lengths[:, None]) & (rel < gen_end[:, None])
    # the i-th real prompt token of a row, wherever its left padding
    order = torch.where(real, real.long().cumsum(-1) - 1, torch.full_like(lengths[:, None], -1).expand_as(real))
    packed = torch.full((B, max(int(lengths.max()) if B else 0, 1)), pad_token_id, dtype=torch.long, device=device)
    rows, where = real.nonzero(as_tuple=True)
    packed[rows, order[rows, where]] = prompt_ids[rows, where].long()
    canvas = torch.full((B, W), pad_token_id, dtype=torch.long, device=device)
    canvas = torch.where(prompt_cols, packed.gather(1, rel.clamp(0, packed.shape[1] - 1)), canvas)
    canvas = torch.where(gen_cols, torch.full_like(canvas, mask_token_id), canvas)
    attention = (prompt_cols | gen_cols).long()
    return BlockLayout(canvas, attention, S, S + tails, start, num_blocks)


def _logits(model: nn.Module, ids: Tensor, attention: Tensor, cache: DynamicCache, keep: int | None = None) -> Tensor:
    """One forward of `ids` (B, n) against `cache`, appending their keys; attention (B, cached + n)."""
    positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, -ids.shape[1] :]  # (B, n)
    kwargs = {} if keep is None else {"logits_to_keep": keep}
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True, **kwargs)
    return out.logits


def _finish(canvas, layout, gen_length, eos_ids, pad_token_id, generated) -> tuple[Tensor, Tensor, Tensor]:
    """Completion ids, EOS-terminated mask and generated-context mask (B, gen_length) from the canvas."""
    cols = layout.completion_start[:, None] + torch.arange(gen_length, device=canvas.device)[None]  # (B, G)
    ids = canvas.gather(1, cols)  # (B, G)
    context = generated.gather(1, cols)  # (B, G) bool
    ids = torch.where(context, ids, torch.full_like(ids, pad_token_id))
    is_eos = torch.isin(ids, eos_ids) & context
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # strictly after the first EOS
    mask = (context & ~after_eos).long()
    return ids, mask, context.long()


@torch.no_grad()
def block_generate(
    model: nn.Module,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    *,
    mask_token_id: int,
    eos_token_ids,
    pad_token_id: int,
    block_size: int,
    gen_length: int,
    denoising_steps: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    remasking: str = "low_confidence_dynamic",
    confidence_threshold: float = 0.9,
    generator: torch.Generator | Tensor | list[torch.Generator] | None = None,
    use_cache: bool = True,
    whole_blocks: bool = False,
    mask_candidate: bool = False,
) -> BlockSamplerOutput:
    """Generate up to `gen_length` tokens after each prompt with SDAR's block-diffusion sampler.

    model: an SDAR-like transformers model (possibly PEFT / DDP wrapped) taking input_ids, a 2-D attention_mask over
        (cached + new) columns, position_ids and a `cache`, returning `.logits` (B, n, V) with logits[:, i] for token i.
    prompt_ids, prompt_mask: (B, P), left-padded (1 = real token).
    denoising_steps: steps per block, None = block_size (SDAR / TraDo's default).
    top_k, top_p: candidate filters, top-k then top-p (`diffusion.filtering.filter_logits`); top_k None or 0 and
        top_p None or 1.0 = off.
    generator: torch.Generator giving one seed per row, or a (B,) integer tensor of row seeds (then a row's draws are
        the same wherever it sits in the batch); required when temperature > 0. A list of B torch.Generators draws
        each row with `torch.multinomial` from its own generator instead (`sample_candidates_multinomial`, LLaDA2's
        draw: seeded like LLaDA2's `generate`, it reproduces its runs).
    use_cache: False recomputes the whole prefix at every forward instead (the slow reference; same result).
    whole_blocks: the last block is generated in full, then cut at gen_length (LLaDA2); False hides its columns past
        p + gen_length (SDAR). The extra positions influence their block (bidirectional inside a block).
    mask_candidate: the mask token may be a candidate (LLaDA2's sampler ranks the full softmax); False gives it
        probability 0 (SDAR).
    Returns a `BlockSamplerOutput` with (B, gen_length) completions.
    """
    steps = block_size if denoising_steps is None else denoising_steps
    validate_block_sampler_args(gen_length, block_size, steps, temperature, top_k, top_p, remasking,
                                confidence_threshold)  # fmt: skip
    if prompt_ids.dim() != 2 or prompt_ids.shape != prompt_mask.shape:
        raise ValueError(
            f"prompt_ids and prompt_mask must be (batch, length) of one shape, got {tuple(prompt_ids.shape)} and "
            f"{tuple(prompt_mask.shape)}."
        )
    B = prompt_ids.shape[0]
    device = prompt_ids.device
    if bool((prompt_mask.sum(-1) == 0).any()):
        raise ValueError("every prompt needs at least one real token (prompt_mask has an all-zero row).")
    if temperature > 0 and generator is None:
        raise ValueError("temperature > 0 draws random tokens: pass generator=torch.Generator().manual_seed(...).")
    row_generators = None
    if isinstance(generator, (list, tuple)):
        if len(generator) != B or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(f"generator as a list must hold one torch.Generator per row ({B}), got {generator!r}.")
        row_generators, generator = list(generator), None
        seeds = torch.zeros(B, dtype=torch.long, device=device)
    elif isinstance(generator, torch.Generator):
        seeds = torch.randint(0, 2**62, (B,), generator=generator, device=generator.device).to(device)
    elif generator is None:
        seeds = torch.zeros(B, dtype=torch.long, device=device)
    else:
        if generator.shape != (B,) or generator.dtype.is_floating_point:
            raise ValueError(f"generator as a tensor must hold one integer seed per row, shape ({B},).")
        seeds = generator.to(device=device, dtype=torch.long)
    eos_ids = torch.as_tensor(sorted({int(t) for t in eos_token_ids}), dtype=torch.long, device=device)
    if eos_ids.numel() == 0:
        raise ValueError("eos_token_ids is empty: pass the tokenizer's EOS id(s).")

    layout = block_layout(prompt_ids, prompt_mask, gen_length, block_size, mask_token_id, pad_token_id, whole_blocks)
    canvas, S = layout.canvas.clone(), layout.prefill_width  # (B, W)
    generated = torch.zeros_like(canvas, dtype=torch.bool)  # (B, W) positions whose token was revealed
    schedule = transfer_schedule(block_size, steps).to(device)
    cache = DynamicCache()
    forwards = 0
    # The working batch: rows still generating. A finished row (EOS in its last block, or no position left) leaves
    # it, and its cache rows are dropped, so later forwards only run the rows that need them.
    rows = torch.arange(B, device=device)
    work, attention, done = canvas.clone(), layout.attention, generated.clone()  # (b, W) each
    row_seeds, first_column = seeds, layout.first_column

    def forward(end: int, keep_logits: bool) -> Tensor | None:
        nonlocal forwards
        forwards += 1
        start = end - block_size
        if use_cache:
            return _logits(model, work[:, start:end], attention[:, :end], cache, None if keep_logits else 1)
        fresh = DynamicCache()
        return _logits(model, work[:, :end], attention[:, :end], fresh)[:, start:end]

    if S > 0 and use_cache:
        forwards += 1
        _logits(model, work[:, :S], attention[:, :S], cache, keep=1)
    for b in range(layout.num_blocks):
        c0, c1 = S + b * block_size, S + (b + 1) * block_size
        n = rows.shape[0]
        block_positions = torch.arange(c0, c1, device=device)[None] - first_column[:, None]  # (n, bs)
        for step in range(block_size + 1):
            masked = (work[:, c0:c1] == mask_token_id) & attention[:, c0:c1].bool()  # (n, bs)
            if not bool(masked.any()):
                break
            logits = forward(c1, keep_logits=True).float()  # (n, bs, V)
            if use_cache:
                cache.crop(-block_size)  # the block's own keys are not stored while it is noisy
            if not mask_candidate:
                logits[..., mask_token_id] = float("-inf")
            if row_generators is not None:
                tokens, confidence = sample_candidates_multinomial(
                    logits,
                    [row_generators[int(r)] for r in rows],
                    float(temperature),
                    top_k,
                    top_p,
                    active=masked.any(-1),
                )
            else:
                # keyed by the row seed, the step and the real position: independent of the batch layout
                u = counter_uniform(row_seeds[:, None], STREAM_SAMPLE, step, block_positions.clamp(min=0),
                                    device=device)  # fmt: skip
                tokens, confidence = sample_candidates(logits, u, float(temperature), top_k, top_p)
            count = schedule[min(step, steps - 1)].expand(n)
            reveal = choose_reveals(confidence, masked, count, remasking, float(confidence_threshold))
            work[:, c0:c1] = torch.where(reveal, tokens, work[:, c0:c1])
            done[:, c0:c1] |= reveal
        has_eos = (torch.isin(work[:, c0:c1], eos_ids) & done[:, c0:c1]).any(-1)  # (n,)
        keep = ~has_eos & attention[:, c1:].bool().any(-1)  # (n,) rows with positions left to generate
        canvas[rows], generated[rows] = work, done
        if not bool(keep.any()):
            break
        if not bool(keep.all()):
            index = keep.nonzero(as_tuple=True)[0]
            rows, work, attention, done = rows[index], work[index], attention[index], done[index]
            row_seeds, first_column = row_seeds[index], first_column[index]
            if use_cache:
                cache.batch_select_indices(index)
        if use_cache:
            forward(c1, keep_logits=False)  # commit the clean block's keys / values
    ids, mask, context = _finish(canvas, layout, gen_length, eos_ids, pad_token_id, generated)
    return BlockSamplerOutput(ids, mask, context, forwards)
