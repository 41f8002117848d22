"""Tests of LLaDA's masked-diffusion sampler (stabledrl_trl.diffusion.llada_sampler).

The sampler is compared token for token with a literal, unbatched transcription of LLaDA's reference algorithm
(written below, computing over the whole sequence), on a tiny seeded bidirectional toy model and on the LLaDA
fixture checkpoint; the rest checks invariances (padding, batching, seeds), the reveal schedule, the completion
mask, the sampling distribution and argument errors.
"""

from __future__ import annotations

import math

import pytest
import torch

from stabledrl_trl.diffusion.llada_sampler import (
    SamplerOutput,
    completion_mask_from_ids,
    generate,
    uniform_reveal_schedule,
    validate_sampler_args,
)

# Toy model ids follow the tiny tokenizer's conventions: 0 = EOS and pad, 1 = mask.
TOY_VOCAB, TOY_EOS, TOY_MASK = 24, 0, 1


class ToyBidirectionalLM:
    """A tiny seeded model: embedding, one bidirectional attention layer with a relative-position bias, a head.

    Pad keys are masked out of attention, and positions enter only through relative offsets, so a left-padded row
    gives the same logits as the row alone (as LLaDA with RoPE does).
    """

    def __init__(self, vocab_size=TOY_VOCAB, dim=16, max_offset=128, seed=0, dtype=torch.float32):
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.randn(vocab_size, dim, generator=g, dtype=torch.float64).to(dtype)  # (V, d)
        self.wq, self.wk, self.wv = (
            (torch.randn(dim, dim, generator=g, dtype=torch.float64) / math.sqrt(dim)).to(dtype) for _ in range(3)
        )
        self.rel_bias = torch.randn(2 * max_offset + 1, generator=g, dtype=torch.float64).to(dtype)  # (2M+1,)
        self.head = (2.0 * torch.randn(dim, vocab_size, generator=g, dtype=torch.float64)).to(dtype)  # (d, V)
        self.max_offset = max_offset
        self.dim = dim

    def __call__(self, input_ids, attention_mask=None):
        h = self.embed[input_ids]  # (B, L, d)
        q, k, v = h @ self.wq, h @ self.wk, h @ self.wv  # (B, L, d) each
        length = input_ids.shape[1]
        pos = torch.arange(length)
        offset = (pos[:, None] - pos[None, :]).clamp(-self.max_offset, self.max_offset) + self.max_offset  # (L, L)
        scores = q @ k.transpose(1, 2) / math.sqrt(self.dim) + self.rel_bias[offset]  # (B, L, L)
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask.bool()[:, None, :], -torch.inf)  # pad keys unseen
        h = torch.tanh(h + torch.softmax(scores, dim=-1) @ v)  # (B, L, d)
        return h @ self.head  # (B, L, V)


class Recorder:
    """Wraps a logits_fn and records every input it is fed."""

    def __init__(self, fn):
        self.fn = fn
        self.inputs, self.masks = [], []

    def __call__(self, input_ids, attention_mask=None):
        self.inputs.append(input_ids.clone())
        self.masks.append(None if attention_mask is None else attention_mask.clone())
        return self.fn(input_ids, attention_mask)


def reference_generate(
    logits_fn, prompt, *, mask_id, gen_length, block_length, steps, temperature, remasking, cfg_scale, generator
):
    """LLaDA's generation algorithm written out literally for one prompt (1, P), over the whole sequence.

    Two deliberate, documented choices of the sampler under test are mirrored: the mask token's logit is set to
    -inf (it is never a candidate), and random numbers are drawn for the current block's positions only, in float64,
    in the sampler's order (Gumbel uniforms, then remasking scores) so both consume the same stream. The values used
    elsewhere are placeholders that never matter: earlier blocks hold no mask tokens and later blocks get -inf.
    The row's random numbers come from its own generator, seeded by one int64 draw from `generator` (the sampler
    gives every row such a generator).
    """
    if generator is not None:
        generator = torch.Generator().manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
    prompt_len = prompt.shape[1]
    x = torch.full((1, prompt_len + gen_length), mask_id, dtype=torch.long)
    x[:, :prompt_len] = prompt.clone()
    prompt_index = x != mask_id
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        start = prompt_len + num_block * block_length
        end = prompt_len + (num_block + 1) * block_length
        block_mask_index = x[:, start:end] == mask_id
        mask_num = int(block_mask_index.sum())
        num_transfer_tokens = [mask_num // steps + (1 if i < mask_num % steps else 0) for i in range(steps)]
        for i in range(steps):
            mask_index = x == mask_id
            if cfg_scale > 0.0:
                un_x = x.clone()
                un_x[prompt_index] = mask_id
                logits = logits_fn(torch.cat([x, un_x], dim=0), None)
                logits, un_logits = torch.chunk(logits, 2, dim=0)
                logits = un_logits + (cfg_scale + 1) * (logits - un_logits)
            else:
                logits = logits_fn(x, None)
            logits = logits.clone()
            logits[:, :, mask_id] = -torch.inf
            if temperature > 0:
                noise = torch.full(logits.shape, 0.5, dtype=torch.float64)
                noise[:, start:end] = torch.rand(
                    (1, block_length, logits.shape[2]), generator=generator, dtype=torch.float64
                )
                gumbel_noise = (-torch.log(noise)) ** temperature
                logits_with_noise = logits.to(torch.float64).exp() / gumbel_noise
            else:
                logits_with_noise = logits
            x0 = torch.argmax(logits_with_noise, dim=-1)
            if remasking == "low_confidence":
                p = torch.softmax(logits, dim=-1)
                x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1).double()
            else:
                x0_p = torch.full(x0.shape, 0.5, dtype=torch.float64)
                x0_p[:, start:end] = torch.rand((1, block_length), generator=generator, dtype=torch.float64)
            x0_p[:, end:] = -math.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -math.inf)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select_index = torch.topk(confidence[j], k=num_transfer_tokens[i])
                transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
    return x[:, prompt_len:]


def _toy_prompts(lengths, seed=0, low=2, high=TOY_VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(low, high, (n,), generator=g) for n in lengths]


def _left_pad(prompts, pad_id):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    return ids, mask


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------------------------
# The LLaDA fixture checkpoint (saved by LLaDA's own code), through the project's native LLaDA model.

LLADA_VOCAB, LLADA_MASK, LLADA_EOS = 320, 317, 316


@pytest.fixture(scope="module")
def llada_logits_fn(llada_fixture_dir):
    from transformers import AutoModelForCausalLM

    import stabledrl_trl  # noqa: F401  (registers LLaDA with transformers' Auto classes)

    model = AutoModelForCausalLM.from_pretrained(str(llada_fixture_dir)).eval()
    assert model.config.vocab_size == LLADA_VOCAB
    return lambda ids, am: model(input_ids=ids, attention_mask=am).logits


# ----------------------------------------------------------------------------------------------------------------
# Token-for-token agreement with the literal reference.

REFERENCE_CASES = [
    # (gen_length, block_length, steps, temperature, remasking, cfg_scale)
    (16, 8, 16, 0.0, "low_confidence", 0.0),
    (24, 8, 9, 0.0, "low_confidence", 0.0),  # 3 steps per block: 8 tokens revealed as 3, 3, 2
    (16, 16, 5, 0.0, "low_confidence", 1.5),
    (16, 4, 8, 0.0, "random", 0.0),
    (16, 8, 8, 0.7, "low_confidence", 0.0),
    (16, 8, 6, 1.0, "random", 0.5),
    (12, 12, 4, 0.9, "low_confidence", 2.0),
]


# Fewer steps on the LLaDA fixture (each step is a full forward of the checkpoint); same coverage of the options.
LLADA_REFERENCE_CASES = [
    (16, 8, 8, 0.0, "low_confidence", 0.0),
    (24, 8, 9, 0.0, "low_confidence", 0.0),
    (16, 16, 5, 0.0, "low_confidence", 1.5),
    (16, 4, 4, 0.0, "random", 0.0),
    (16, 8, 4, 0.7, "low_confidence", 0.0),
    (16, 8, 6, 1.0, "random", 0.5),
]


@pytest.mark.parametrize("case", REFERENCE_CASES)
def test_matches_literal_reference_on_toy_model(case):
    gen_length, block_length, steps, temperature, remasking, cfg_scale = case
    model = ToyBidirectionalLM(seed=1)
    for i, prompt in enumerate(_toy_prompts([3, 7, 1], seed=2)):
        kwargs = dict(gen_length=gen_length, block_length=block_length, steps=steps, temperature=temperature)
        kwargs.update(remasking=remasking, cfg_scale=cfg_scale)
        expected = reference_generate(model, prompt[None], mask_id=TOY_MASK, generator=_gen(10 + i), **kwargs)
        out = generate(model, prompt[None], mask_token_id=TOY_MASK, generator=_gen(10 + i), **kwargs)
        assert torch.equal(out.completion_ids, expected), (i, out.completion_ids, expected)
        assert not (out.completion_ids == TOY_MASK).any()


@pytest.mark.parametrize("case", LLADA_REFERENCE_CASES)
def test_matches_literal_reference_on_llada_fixture(case, llada_logits_fn):
    gen_length, block_length, steps, temperature, remasking, cfg_scale = case
    prompts = _toy_prompts([9, 2], seed=3, low=0, high=LLADA_EOS)
    for i, prompt in enumerate(prompts):
        kwargs = dict(gen_length=gen_length, block_length=block_length, steps=steps, temperature=temperature)
        kwargs.update(remasking=remasking, cfg_scale=cfg_scale)
        expected = reference_generate(llada_logits_fn, prompt[None], mask_id=LLADA_MASK, generator=_gen(i), **kwargs)
        out = generate(llada_logits_fn, prompt[None], mask_token_id=LLADA_MASK, generator=_gen(i), **kwargs)
        assert torch.equal(out.completion_ids, expected), (i, out.completion_ids, expected)


# ----------------------------------------------------------------------------------------------------------------
# Batching and padding invariance.


def _rows_alone(logits_fn, prompts, mask_id, **kwargs):
    return [generate(logits_fn, p[None], mask_token_id=mask_id, **kwargs).completion_ids[0] for p in prompts]


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0])
def test_padded_batch_rows_equal_rows_alone_at_temperature_zero(cfg_scale):
    model = ToyBidirectionalLM(seed=4)
    prompts = _toy_prompts([3, 8, 5, 1], seed=5)
    ids, mask = _left_pad(prompts, TOY_EOS)
    kwargs = dict(gen_length=16, block_length=8, steps=8, cfg_scale=cfg_scale)
    batch = generate(model, ids, mask, mask_token_id=TOY_MASK, **kwargs)
    for row, alone in enumerate(_rows_alone(model, prompts, TOY_MASK, **kwargs)):
        assert torch.equal(batch.completion_ids[row], alone), row


@pytest.mark.parametrize("cfg_scale", [0.0, 1.0])
def test_padded_batch_rows_equal_rows_alone_on_llada_fixture(cfg_scale, llada_logits_fn):
    prompts = _toy_prompts([2, 7, 4], seed=6, low=0, high=LLADA_EOS)
    ids, mask = _left_pad(prompts, LLADA_EOS)
    kwargs = dict(gen_length=16, block_length=8, steps=8, cfg_scale=cfg_scale)
    batch = generate(llada_logits_fn, ids, mask, mask_token_id=LLADA_MASK, **kwargs)
    for row, alone in enumerate(_rows_alone(llada_logits_fn, prompts, LLADA_MASK, **kwargs)):
        assert torch.equal(batch.completion_ids[row], alone), row


@pytest.mark.parametrize(
    "temperature, remasking, cfg_scale", [(1.0, "low_confidence", 0.0), (0.8, "random", 0.0), (1.0, "random", 1.0)]
)
def test_row_output_independent_of_other_rows_at_positive_temperature(temperature, remasking, cfg_scale):
    model = ToyBidirectionalLM(seed=7)
    first = _toy_prompts([4], seed=8)[0]
    kwargs = dict(gen_length=16, block_length=8, steps=8, temperature=temperature, remasking=remasking)
    kwargs.update(cfg_scale=cfg_scale, mask_token_id=TOY_MASK)
    outputs = []
    # Other rows change in content and length, so row 0's left padding changes too (0, 6 and 2 pads).
    for others in ([3, 2], [10, 1], [6, 5]):
        ids, mask = _left_pad([first] + _toy_prompts(others, seed=sum(others)), TOY_EOS)
        outputs.append(generate(model, ids, mask, generator=_gen(123), **kwargs).completion_ids)
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][0], outputs[2][0])
    # The other rows did change (guards against a sampler that ignores its input).
    assert not torch.equal(outputs[0][1:], outputs[1][1:])


def test_attention_mask_passed_to_logits_fn_and_cfg_unconditional_input():
    model = Recorder(ToyBidirectionalLM(seed=9))
    prompts = _toy_prompts([2, 5], seed=10)
    ids, mask = _left_pad(prompts, TOY_EOS)
    generate(model, ids, mask, mask_token_id=TOY_MASK, gen_length=8, block_length=4, steps=4, cfg_scale=1.0)
    expected_mask = torch.cat([mask, torch.ones(2, 8, dtype=torch.long)], dim=1)  # (2, 13)
    for inp, am in zip(model.inputs, model.masks):
        assert inp.shape == (4, 13)
        assert torch.equal(am, torch.cat([expected_mask, expected_mask], dim=0))
        cond, uncond = inp[:2], inp[2:]
        assert torch.equal(cond[:, :5], ids)
        # Unconditional rows: real prompt tokens masked, pads kept, completion identical to the conditional rows.
        assert torch.equal(uncond[:, :5], torch.where(mask.bool(), torch.full_like(ids, TOY_MASK), ids))
        assert torch.equal(uncond[:, 5:], cond[:, 5:])
    # Without padding information the model gets no attention mask at all (as LLaDA's reference).
    model = Recorder(ToyBidirectionalLM(seed=9))
    generate(model, ids, None, mask_token_id=TOY_MASK, gen_length=8, block_length=4, steps=4)
    assert all(am is None for am in model.masks)


# ----------------------------------------------------------------------------------------------------------------
# Seeds and randomness.


@pytest.mark.parametrize("remasking", ["low_confidence", "random"])
def test_seed_determinism_and_global_rng_untouched(remasking):
    model = ToyBidirectionalLM(seed=11)
    ids, mask = _left_pad(_toy_prompts([3, 6], seed=12), TOY_EOS)
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=16, block_length=8, steps=8, temperature=1.0, remasking=remasking)
    torch.manual_seed(0)
    rng_state = torch.get_rng_state()
    a = generate(model, ids, mask, generator=_gen(5), **kwargs).completion_ids
    assert torch.equal(torch.get_rng_state(), rng_state)  # the global RNG is never drawn from
    torch.manual_seed(999)  # a different global state changes nothing
    b = generate(model, ids, mask, generator=_gen(5), **kwargs).completion_ids
    c = generate(model, ids, mask, generator=_gen(6), **kwargs).completion_ids
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_random_remasking_at_temperature_zero_reveals_argmax_tokens_in_seed_dependent_order():
    model = Recorder(ToyBidirectionalLM(seed=13))
    prompt = _toy_prompts([4], seed=14)[0][None]
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=8, block_length=8, steps=8, remasking="random")
    orders = []
    for seed in (0, 1):
        model.inputs.clear()
        out = generate(model, prompt, generator=_gen(seed), **kwargs).completion_ids
        states = [s[0, 4:] for s in model.inputs] + [out[0]]
        # Every revealed token is the argmax of the logits at the step it was revealed.
        order = []
        for before, after, inp in zip(states[:-1], states[1:], model.inputs):
            newly = ((before == TOY_MASK) & (after != TOY_MASK)).nonzero().flatten()
            assert newly.numel() == 1
            logits = model.fn(inp, None)[0, 4:]  # (8, V)
            logits[:, TOY_MASK] = -torch.inf
            assert after[newly] == logits[newly].argmax(-1)
            order.append(int(newly))
        orders.append(order)
    assert sorted(orders[0]) == list(range(8)) and orders[0] != orders[1]


# ----------------------------------------------------------------------------------------------------------------
# Reveal schedule.


def test_uniform_reveal_schedule_by_hand():
    assert uniform_reveal_schedule(torch.tensor([8]), 3).tolist() == [[3, 3, 2]]
    assert uniform_reveal_schedule(torch.tensor([7, 3, 0, 9]), 3).tolist() == [
        [3, 2, 2],
        [1, 1, 1],
        [0, 0, 0],
        [3, 3, 3],
    ]
    assert uniform_reveal_schedule(torch.tensor([2]), 5).tolist() == [[1, 1, 0, 0, 0]]


@pytest.mark.parametrize(
    "gen_length, block_length, steps, per_step, remasking, temperature",
    [
        (24, 8, 9, [3, 3, 2], "low_confidence", 0.0),
        (12, 12, 5, [3, 3, 2, 2, 2], "random", 0.0),
        (16, 4, 4, [4], "low_confidence", 1.0),
        (8, 4, 8, [1, 1, 1, 1], "random", 1.0),
        (6, 2, 9, [1, 1, 0], "low_confidence", 0.5),  # more steps than tokens: trailing steps reveal nothing
    ],
)
def test_reveal_schedule_and_block_order(gen_length, block_length, steps, per_step, remasking, temperature):
    model = Recorder(ToyBidirectionalLM(seed=15))
    ids, mask = _left_pad(_toy_prompts([2, 5], seed=16), TOY_EOS)
    prompt_len = ids.shape[1]
    out = generate(
        model, ids, mask, mask_token_id=TOY_MASK, gen_length=gen_length, block_length=block_length, steps=steps,
        remasking=remasking, temperature=temperature, generator=_gen(0),
    )  # fmt: skip
    assert len(model.inputs) == steps
    for inp in model.inputs:
        assert torch.equal(inp[:, :prompt_len], ids)  # the prompt is never touched
    states = [inp[:, prompt_len:] for inp in model.inputs] + [out.completion_ids]  # (B, G) before each step, final
    steps_per_block = steps // (gen_length // block_length)
    for t, (before, after) in enumerate(zip(states[:-1], states[1:])):
        block = t // steps_per_block
        was_revealed = before != TOY_MASK
        assert torch.equal(after[was_revealed], before[was_revealed])  # revealed tokens never change
        newly = (before == TOY_MASK) & (after != TOY_MASK)  # (B, G)
        assert newly.sum(dim=1).tolist() == [per_step[t % steps_per_block]] * 2
        lo, hi = block * block_length, (block + 1) * block_length
        assert not newly[:, :lo].any() and not newly[:, hi:].any()  # only the current block
        assert (after[:, :lo] != TOY_MASK).all()  # earlier blocks are complete
        assert (after[:, hi:] == TOY_MASK).all()  # later blocks untouched
    assert not (out.completion_ids == TOY_MASK).any()


# ----------------------------------------------------------------------------------------------------------------
# Completion mask.


def test_completion_mask_from_ids_by_hand():
    ids = torch.tensor([[5, 0, 7, 0], [5, 6, 7, 8], [0, 9, 9, 9], [5, 2, 0, 7]])
    assert completion_mask_from_ids(ids, (0,)).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
    assert completion_mask_from_ids(ids, (0, 2)).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    assert completion_mask_from_ids(ids, ()).tolist() == [[1] * 4] * 4
    assert completion_mask_from_ids(ids, (0,)).dtype == torch.long


def test_completion_mask_with_planted_eos():
    vocab, eot = 12, 2

    def planted(input_ids, attention_mask):
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, vocab)
        logits[:, :, 7] = 3.0
        prompt_len = length - 10
        logits[0, prompt_len + 4, TOY_EOS] = 9.0  # row 0: EOS at completion position 4
        logits[1, prompt_len + 2, eot] = 9.0  # row 1: EoT at 2, EOS at 6
        logits[1, prompt_len + 6, TOY_EOS] = 9.0
        return logits

    ids = torch.full((3, 3), 5, dtype=torch.long)
    # The planted logits depend on the batch index, so rows must not leave the batch: no early stop here.
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=10, block_length=5, steps=4, early_stop=False)
    out = generate(planted, ids, eos_token_ids=(TOY_EOS, eot), **kwargs)
    assert isinstance(out, SamplerOutput)
    assert out.completion_ids.dtype == torch.long and out.completion_mask.dtype == torch.long
    assert out.completion_ids.tolist() == [
        [7, 7, 7, 7, 0, 7, 7, 7, 7, 7],
        [7, 7, 2, 7, 7, 7, 0, 7, 7, 7],
        [7] * 10,
    ]
    assert out.completion_mask.tolist() == [[1] * 5 + [0] * 5, [1] * 3 + [0] * 7, [1] * 10]
    only_eos = generate(planted, ids, eos_token_ids=TOY_EOS, **kwargs).completion_mask  # a single int works too
    assert only_eos.tolist() == [[1] * 5 + [0] * 5, [1] * 7 + [0] * 3, [1] * 10]
    assert generate(planted, ids, **kwargs).completion_mask.tolist() == [[1] * 10] * 3


# ----------------------------------------------------------------------------------------------------------------
# Sampling distribution of the Gumbel-max draw.


def _fixed_logits_fn(logit_row):
    def fn(input_ids, attention_mask):
        return logit_row.expand(input_ids.shape[0], input_ids.shape[1], -1)

    return fn


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0, 1e4])
@pytest.mark.parametrize("shift", [0.0, 1000.0])
def test_gumbel_draws_follow_softmax(temperature, shift):
    # Vocabulary of 5 whose last id is the mask token (never drawn). 2500 rows x 8 positions revealed in one step
    # (no selection among positions, so each position is one independent draw) = 20000 draws. Each token count is
    # binomial; |count - n p| <= 5 standard errors fails by chance with probability < 4 * 6e-7.
    # shift = 1000 and temperature = 1e4 overflow LLaDA's literal exp(logits) / (-log u)^T; the log form must not.
    mask_id = 4
    base = torch.tensor([1.0, 0.0, -0.5, 0.4, 0.0], dtype=torch.float64)
    logits = base + shift
    logits[mask_id] = 2.0 + shift  # highest logit: would dominate if the mask token were a candidate
    prompt = torch.full((2500, 1), 3, dtype=torch.long)
    kwargs = dict(mask_token_id=mask_id, gen_length=8, block_length=8, steps=1, temperature=temperature)
    draws = generate(_fixed_logits_fn(logits), prompt, generator=_gen(7), **kwargs).completion_ids
    n = draws.numel()
    counts = torch.bincount(draws.flatten(), minlength=5).double()
    assert counts[mask_id] == 0
    p = torch.softmax(base[:4] / temperature, dim=0)
    stderr = torch.sqrt(n * p * (1 - p))
    assert (counts[:4] - n * p).abs().le(5 * stderr).all(), (counts, n * p)
    if shift:  # shift invariance: the same uniforms give the same tokens
        unshifted = base.clone()
        unshifted[mask_id] = 2.0
        same = generate(_fixed_logits_fn(unshifted), prompt, generator=_gen(7), **kwargs).completion_ids
        assert torch.equal(draws, same)


# ----------------------------------------------------------------------------------------------------------------
# Argument errors.

VALID = dict(gen_length=32, block_length=8, steps=8, temperature=0.0, remasking="low_confidence", cfg_scale=0.0)


@pytest.mark.parametrize(
    "override, match",
    [
        (dict(gen_length=0), "gen_length"),
        (dict(gen_length=8.0), "gen_length"),
        (dict(block_length=0), "block_length"),
        (dict(block_length=5), "block_length=5 must divide gen_length=32"),
        (dict(steps=0), "steps"),
        (dict(steps=3), "steps=3 is fewer than the number of blocks"),
        (dict(steps=6), "steps=6 must be divisible by the number of blocks"),
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(remasking="high_confidence"), "remasking"),
        (dict(cfg_scale=-1.0), "cfg_scale"),
        (dict(mask_token_id=None), "mask_token_id is None"),
        (dict(mask_token_id=-3), "mask_token_id"),
    ],
)
def test_invalid_sampler_args(override, match):
    args = {**VALID, "mask_token_id": TOY_MASK, **override}
    with pytest.raises(ValueError, match=match):
        validate_sampler_args(**args)
    # generate validates the same arguments before calling the model.
    model = Recorder(ToyBidirectionalLM())
    prompt = torch.tensor([[3, 4]])
    with pytest.raises(ValueError, match=match):
        generate(model, prompt, **args)
    assert not model.inputs


def test_valid_sampler_args_pass():
    validate_sampler_args(**VALID, mask_token_id=TOY_MASK)
    validate_sampler_args(16, 16, 1, 0.9, "random", 2.0, 0)


@pytest.mark.parametrize(
    "prompt_ids, prompt_mask, extra, match",
    [
        (torch.tensor([[3.0, 4.0]]), None, {}, "prompt_ids must be a"),
        (torch.tensor([3, 4]), None, {}, "prompt_ids must be a"),
        (torch.zeros((0, 2), dtype=torch.long), None, {}, "empty batch"),
        (torch.tensor([[3, 4]]), torch.tensor([[1, 1, 1]]), {}, "prompt_mask must be a tensor"),
        (torch.tensor([[3, 4]]), torch.tensor([[1, 2]]), {}, "only 0"),
        (torch.tensor([[3, 4, 0]]), torch.tensor([[1, 1, 0]]), {}, "not left-padded"),
        (torch.tensor([[3, TOY_MASK]]), None, {}, "contains mask_token_id"),
        (torch.tensor([[3, 4]]), None, dict(temperature=0.5), "generator is None"),
        (torch.tensor([[3, 4]]), None, dict(remasking="random"), "generator is None"),
        (torch.tensor([[3, 4]]), None, dict(eos_token_ids=["a"]), "eos_token_ids"),
    ],
)
def test_invalid_generate_inputs(prompt_ids, prompt_mask, extra, match):
    model = Recorder(ToyBidirectionalLM())
    with pytest.raises(ValueError, match=match):
        generate(
            model, prompt_ids, prompt_mask, mask_token_id=TOY_MASK, gen_length=8, block_length=8, steps=2, **extra
        )
    assert not model.inputs


def test_pad_equal_to_mask_is_allowed_with_prompt_mask():
    model = ToyBidirectionalLM(seed=17)
    prompts = _toy_prompts([2, 4], seed=18)
    ids, mask = _left_pad(prompts, TOY_MASK)  # pad id == mask id: fine, the pads are known from the mask
    out = generate(model, ids, mask, mask_token_id=TOY_MASK, gen_length=8, block_length=8, steps=4)
    for row, alone in enumerate(_rows_alone(model, prompts, TOY_MASK, gen_length=8, block_length=8, steps=4)):
        assert torch.equal(out.completion_ids[row], alone)


def test_bad_logits_fn_output():
    prompt = torch.tensor([[3, 4]])
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=4, block_length=4, steps=2)
    with pytest.raises(ValueError, match="one logit vector per input position"):
        generate(lambda ids, am: torch.zeros(ids.shape[0], ids.shape[1] - 1, 8), prompt, **kwargs)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate(lambda ids, am: torch.zeros(*ids.shape, 8), prompt, **dict(kwargs, mask_token_id=8))
    with pytest.raises(ValueError, match="batch, length, vocab"):
        generate(lambda ids, am: torch.zeros(*ids.shape), prompt, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Exact speedups: output head on the current block only, early stop, per-row noise.


class EosBiased:
    """The toy model with a content-dependent EOS bias: rows whose prompt starts with an even id favour EOS.

    The bias depends on each row's own tokens only (never on its batch index), so rows stay independent.
    """

    def __init__(self, fn, bias=10.0):
        self.fn, self.bias = fn, bias

    def __call__(self, input_ids, attention_mask=None):
        logits = self.fn(input_ids, attention_mask).clone()
        start = attention_mask.argmax(dim=1) if attention_mask is not None else torch.zeros_like(input_ids[:, 0])
        first = input_ids.gather(1, start[:, None])  # (B, 1) each row's first real token
        favour = (first[:, 0] % 2 == 0).to(logits.dtype)  # (B,)
        logits[..., TOY_EOS] += self.bias * favour[:, None]
        return logits


class KeepingFn:
    """A logits_fn that honours `logits_to_keep` (as DiffusionAdapter does) and records the kept positions."""

    accepts_logits_to_keep = True

    def __init__(self, fn):
        self.fn, self.kept, self.rows = fn, [], []

    def __call__(self, input_ids, attention_mask=None, logits_to_keep=None):
        self.kept.append(logits_to_keep.clone())
        self.rows.append(input_ids.shape[0])
        return self.fn(input_ids, attention_mask)[:, logits_to_keep]


@pytest.mark.parametrize("temperature, remasking, cfg_scale", [(0.0, "low_confidence", 0.0), (0.9, "low_confidence", 0.0), (1.0, "random", 1.0)])  # noqa: E501
def test_block_logits_and_early_stop_are_exact(temperature, remasking, cfg_scale):
    model = EosBiased(ToyBidirectionalLM(seed=31))
    ids, mask = _left_pad(_toy_prompts([3, 6, 2, 5, 4, 7], seed=32), TOY_EOS)
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=24, block_length=8, steps=12, temperature=temperature)
    kwargs.update(remasking=remasking, cfg_scale=cfg_scale, eos_token_ids=TOY_EOS)
    slow = generate(model, ids, mask, generator=_gen(3), early_stop=False, **kwargs)
    keeping = KeepingFn(model)
    fast = generate(keeping, ids, mask, generator=_gen(3), **kwargs)
    assert torch.equal(fast.completion_mask, slow.completion_mask)
    keep = slow.completion_mask.bool()
    assert torch.equal(fast.completion_ids[keep], slow.completion_ids[keep])  # identical up to the first EOS
    assert not (fast.completion_ids == TOY_MASK).any()  # finished rows' undecoded tails are EOS, never mask tokens
    # Some rows finished early and left the batch; the kept positions were always the current block.
    assert min(keeping.rows) < max(keeping.rows) and fast.model_calls <= slow.model_calls
    width = ids.shape[1]
    for call, kept in enumerate(keeping.kept):
        block = call // 4
        assert torch.equal(kept, torch.arange(width + 8 * block, width + 8 * block + 8))
    factor = 2 if cfg_scale else 1
    assert int(slow.forward_passes.sum()) == factor * 12 * 6 and int(fast.forward_passes.sum()) < factor * 12 * 6


def test_finished_rows_leaving_do_not_change_other_rows_draws():
    # Row 0 never finishes; the other rows change (and finish at different blocks): row 0's sample is unchanged.
    model = EosBiased(ToyBidirectionalLM(seed=33), bias=8.0)
    first = torch.tensor([5, 9, 3])  # odd first id: no EOS bias
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=24, block_length=8, steps=12, temperature=1.0)
    kwargs.update(eos_token_ids=TOY_EOS)
    outs = []
    for others in ([4, 2, 6], [2], [8, 10, 12, 14]):  # even first ids: these rows finish early
        prompts = [first] + [torch.tensor([o, 7, 7]) for o in others]
        ids, mask = _left_pad(prompts, TOY_EOS)
        outs.append(generate(model, ids, mask, generator=_gen(4), **kwargs))
    assert torch.equal(outs[0].completion_ids[0], outs[1].completion_ids[0])
    assert torch.equal(outs[0].completion_ids[0], outs[2].completion_ids[0])
    assert any(int(o.forward_passes[1:].min()) < 12 for o in outs)  # some rows did leave early


# ----------------------------------------------------------------------------------------------------------------
# top-k / top-p candidate filters.


@pytest.mark.parametrize("top_k, top_p, support", [(2, None, [0, 3]), (None, 0.7, [0, 3]), (1, None, [0])])
def test_filtered_draws_follow_the_renormalised_softmax(top_k, top_p, support):
    mask_id = 4
    base = torch.tensor([1.0, 0.0, -0.5, 0.4, 3.0], dtype=torch.float64)  # mask token highest: never drawn
    prompt = torch.full((2000, 1), 3, dtype=torch.long)
    kwargs = dict(mask_token_id=mask_id, gen_length=8, block_length=8, steps=1, temperature=1.0)
    draws = generate(_fixed_logits_fn(base), prompt, generator=_gen(8), top_k=top_k, top_p=top_p, **kwargs)
    counts = torch.bincount(draws.completion_ids.flatten(), minlength=5).double()
    n = counts.sum()
    p = torch.zeros(5, dtype=torch.float64)
    p[support] = torch.softmax(base[support], dim=0)
    assert counts[[i for i in range(5) if i not in support]].sum() == 0
    stderr = torch.sqrt(n * p * (1 - p)).clamp(min=1e-9)
    assert (counts - n * p).abs().le(5 * stderr + 1e-9).all(), (counts, n * p)


def test_top_k_one_is_greedy():
    model = ToyBidirectionalLM(seed=34)
    ids, mask = _left_pad(_toy_prompts([3, 5], seed=35), TOY_EOS)
    kwargs = dict(mask_token_id=TOY_MASK, gen_length=16, block_length=8, steps=8)
    greedy = generate(model, ids, mask, **kwargs).completion_ids
    sampled = generate(model, ids, mask, temperature=1.5, top_k=1, generator=_gen(0), **kwargs).completion_ids
    assert torch.equal(greedy, sampled)


# ----------------------------------------------------------------------------------------------------------------
# Approximate modes: canvas cache (prefix / dual) and confidence-threshold decoding, on the native LLaDA.


@pytest.fixture
def tiny_adapter(tiny_llada, tiny_tokenizer):
    from stabledrl_trl.diffusion.family import as_diffusion_lm

    return as_diffusion_lm(tiny_llada, tiny_tokenizer)


def _llada_prompts(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 101, (n,), generator=g) for n in lengths]


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_with_one_step_per_block_is_exact(tiny_adapter, cache):
    # One step per block: every step is the block's full forward, so nothing stale is ever read.
    ids, mask = _left_pad(_llada_prompts([4, 9, 6], seed=36), 0)
    kwargs = dict(mask_token_id=1, gen_length=24, block_length=8, steps=3, temperature=0.8, generator=None)
    exact = generate(tiny_adapter, ids, mask, **{**kwargs, "generator": _gen(1)})
    cached = generate(tiny_adapter, ids, mask, cache=cache, **{**kwargs, "generator": _gen(1)})
    assert torch.equal(exact.completion_ids, cached.completion_ids)


@pytest.mark.parametrize(
    "cache, threshold, cap", [("prefix", None, None), ("dual", None, None), ("dual", 0.05, 3), ("none", 0.05, None)]
)
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_approximate_modes_padded_rows_equal_rows_alone(tiny_adapter, cache, threshold, cap, temperature):
    prompts = _llada_prompts([3, 10, 6], seed=37)
    ids, mask = _left_pad(prompts, 0)
    kwargs = dict(mask_token_id=1, gen_length=16, block_length=8, steps=8, temperature=temperature)
    kwargs.update(cache=cache, threshold=threshold, max_tokens_per_step=cap, eos_token_ids=0)
    batch = generate(tiny_adapter, ids, mask, generator=_gen(2), **kwargs)
    for row, prompt in enumerate(prompts):
        # the row alone, with the generator state the batch gave it (row generators are seeded in batch order)
        alone_gen = _gen(2)
        torch.randint(0, 2**62, (row,), generator=alone_gen)  # skip the seeds of the rows before it
        alone = generate(tiny_adapter, prompt[None], generator=alone_gen, **kwargs)
        keep = batch.completion_mask[row].bool()
        assert torch.equal(batch.completion_mask[row], alone.completion_mask[0]), row
        assert torch.equal(batch.completion_ids[row][keep], alone.completion_ids[0][keep]), row
    assert not (batch.completion_ids == 1).any()


def test_cache_calls_see_windows_and_fewer_positions(tiny_adapter):
    from stabledrl_trl.models.bidirectional import CanvasCache

    seen = []

    def spy(input_ids, attention_mask=None, logits_to_keep=None, cache=None):
        seen.append((input_ids.shape[1], None if cache is None else cache.window_start, logits_to_keep.tolist()))
        return tiny_adapter(input_ids, attention_mask, logits_to_keep=logits_to_keep, cache=cache)

    spy.accepts_logits_to_keep = spy.supports_canvas_cache = True
    prompt = _llada_prompts([5], seed=38)[0][None]
    for cache, window_len in (("prefix", lambda b: 16 - 8 * b), ("dual", lambda b: 8)):
        seen.clear()
        generate(spy, prompt, mask_token_id=1, gen_length=16, block_length=8, steps=8, cache=cache)
        assert len(seen) == 8
        for call, (length, window_start, kept) in enumerate(seen):
            block, step = divmod(call, 4)
            if step == 0:  # the block's full forward records the cache
                assert (length, window_start, kept) == (21, None, list(range(5 + 8 * block, 13 + 8 * block)))
            else:
                assert (length, window_start, kept) == (window_len(block), 5 + 8 * block, list(range(8)))
    assert CanvasCache  # the class the sampler uses


def test_threshold_reveals_confident_positions_capped_and_ends_blocks_early():
    # Fixed logits: positions 0-4 of each block are confident (p ~ 0.99), positions 5-7 are not.
    vocab, mask_id = 6, 1

    def fn(input_ids, attention_mask=None):
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, vocab)
        offset = (torch.arange(length) - 2) % 8  # position within the block (prompt of length 2)
        logits[:, offset < 5, 3] = 8.0
        return logits

    recorder = Recorder(fn)
    prompt = torch.tensor([[4, 5]])
    out = generate(recorder, prompt, mask_token_id=mask_id, gen_length=16, block_length=8, steps=8, threshold=0.9,
                   max_tokens_per_step=3)  # fmt: skip
    states = [i[0, 2:] for i in recorder.inputs] + [out.completion_ids[0]]
    revealed = [int(((b == mask_id) & (a != mask_id)).sum()) for b, a in zip(states[:-1], states[1:])]
    # per block (8 tokens in 4 steps, schedule 2 per step): 3 confident (the cap), the other 2 confident, then the
    # schedule's 2 and the last one
    assert revealed == [3, 2, 2, 1] * 2
    # without a cap: the 5 confident at once, then the schedule's 2, then the last one: the block ends after 3 steps
    recorder = Recorder(fn)
    out = generate(recorder, prompt, mask_token_id=mask_id, gen_length=16, block_length=8, steps=8, threshold=0.9)
    states = [i[0, 2:] for i in recorder.inputs] + [out.completion_ids[0]]
    revealed = [int(((b == mask_id) & (a != mask_id)).sum()) for b, a in zip(states[:-1], states[1:])]
    assert revealed == [5, 2, 1] * 2 and out.model_calls == 6


@pytest.mark.parametrize(
    "extra, match",
    [
        (dict(top_k=-1), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(cache="full"), "cache must be one of"),
        (dict(threshold=1.0), "threshold"),
        (dict(threshold=0.9, max_tokens_per_step=0), "max_tokens_per_step"),
        (dict(max_tokens_per_step=4), "only caps confidence-threshold"),
        (dict(cache="prefix"), "needs a model with a key/value cache path"),
    ],
)
def test_invalid_fast_args(extra, match):
    model = Recorder(ToyBidirectionalLM())
    with pytest.raises(ValueError, match=match):
        generate(model, torch.tensor([[3, 4]]), mask_token_id=TOY_MASK, gen_length=8, block_length=8, steps=2, **extra)
    assert not model.inputs


def test_cache_under_peft_equals_the_base_model(tiny_llada, tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    from stabledrl_trl.diffusion.family import as_diffusion_lm

    ids, mask = _left_pad(_llada_prompts([4, 7], seed=39), 0)
    kwargs = dict(mask_token_id=1, gen_length=16, block_length=8, steps=8, cache="dual", threshold=0.05)
    base = generate(as_diffusion_lm(tiny_llada, tiny_tokenizer), ids, mask, **kwargs).completion_ids
    lora = get_peft_model(tiny_llada, LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj"]))
    wrapped = generate(as_diffusion_lm(lora, tiny_tokenizer), ids, mask, **kwargs).completion_ids
    assert torch.equal(base, wrapped)  # LoRA starts as the identity (B = 0)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    moved = generate(as_diffusion_lm(lora, tiny_tokenizer), ids, mask, **kwargs).completion_ids
    assert not torch.equal(base, moved)  # the LoRA weights are used inside the cached forwards


# ----------------------------------------------------------------------------------------------------------------
# One sampling step, by hand.


def test_sampling_step_by_hand():
    from stabledrl_trl.diffusion.llada_sampler import sampling_step

    m = TOY_MASK
    # one row, a block of 4 positions, vocabulary of 4 (the mask token id 1 at -inf, as generate passes it)
    probs = torch.tensor([[[0.7, 0.0, 0.2, 0.1], [0.1, 0.0, 0.3, 0.6], [0.2, 0.0, 0.75, 0.05], [0.4, 0.0, 0.5, 0.1]]])
    logits = probs.log()  # (1, 4, 4); log 0 = -inf for the mask token
    block = torch.tensor([[m, m, 3, m]])  # position 2 already revealed
    before = logits.clone()
    # argmax candidates [0, 3, 2, 2] with confidences [0.7, 0.6, -, 0.5]: reveal the two most confident masked ones
    out = sampling_step(logits, block, torch.tensor([2]), mask_token_id=m)
    assert out.tolist() == [[0, 3, 3, m]]
    assert torch.equal(logits, before)  # the logits are not modified
    # a threshold raises the count to the positions above it (0.55: two), capped by max_tokens_per_step, never lowers it
    assert sampling_step(logits, block, torch.tensor([0]), mask_token_id=m, threshold=0.55).tolist() == [[0, 3, 3, m]]
    capped = sampling_step(logits, block, torch.tensor([0]), mask_token_id=m, threshold=0.55, max_tokens_per_step=1)
    assert capped.tolist() == [[0, m, 3, m]]
    assert sampling_step(logits, block, torch.tensor([3]), mask_token_id=m, threshold=0.99).tolist() == [[0, 3, 3, 2]]
    # more requested than masked: every masked position, and the revealed one unchanged
    assert sampling_step(logits, block, torch.tensor([4]), mask_token_id=m).tolist() == [[0, 3, 3, 2]]
