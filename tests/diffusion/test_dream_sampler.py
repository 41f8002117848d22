"""Dream's sampler (stabledrl_trl.diffusion.dream_sampler) against the outputs of Dream's original code.

tests/fixtures/dream-tiny holds a tiny random Dream checkpoint and what Dream's own `diffusion_generate` produced
with it (its README explains every tensor): every `gen_*` setting for each prompt alone (final sequences, the state
after each step, the reveal counts), two left-padded batches, and the shifted logits the sampler saw at each step.
The trajectories are compared token for token after checking that no step of them hinges on a near-tie (float32
noise could flip such an order); the teacher-forced checks feed the recorded logits to one step of our sampler. The
rest checks hand-computed confidences and filters, invariances (padding, batching, seeds), sampling laws and errors.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

import stabledrl_trl  # noqa: F401  (registers Dream)
from stabledrl_trl.diffusion.dream_sampler import (
    DreamSamplerOutput,
    dream_candidates,
    dream_reveal_count,
    dream_step,
    dream_timesteps,
    filter_logits,
    generate,
    validate_dream_sampler_args,
)
from stabledrl_trl.diffusion.family import as_diffusion_lm
from stabledrl_trl.diffusion.llada_sampler import SamplerOutput

MASK, EOS, GEN = 95, 94, 16
TIE_GAP = 1e-4  # confidence gaps below this could be reordered by float32 noise (the fixture README says ~1e-5)


@pytest.fixture(scope="module")
def dream_dir(request):
    from pathlib import Path

    return Path(request.fspath).parent.parent / "fixtures" / "dream-tiny"


@pytest.fixture(scope="module")
def reference(dream_dir):
    return load_file(dream_dir / "reference.safetensors")


@pytest.fixture(scope="module")
def settings(dream_dir):
    with safe_open(dream_dir / "reference.safetensors", "pt") as f:
        return json.loads(f.metadata()["generation_settings"])


@pytest.fixture(scope="module")
def dream_lm(dream_dir):
    model = transformers.AutoModel.from_pretrained(dream_dir).eval()
    return as_diffusion_lm(model)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _kwargs(setting):
    return dict(steps=setting["steps"], alg=setting["alg"], eps=setting["eps"], alg_temp=setting["alg_temp"])


SETTINGS = ("maskgit_plus_s16", "maskgit_plus_s4", "maskgit_plus_s1", "entropy_s8", "topk_margin_s8")


# ----------------------------------------------------------------------------------------------------------------
# The schedule


def test_reveal_counts_by_hand():
    # floor(n * (1 - t[s+1]/t[s])) on t = linspace(1, 1e-3, steps + 1), all the rest at the last step, e.g. steps 4:
    # t = 1, .75025, .5005, .25075, .001: 16 * .24975 -> 3; 13 * .3329 -> 4; 9 * .499 -> 4; the last 5.
    expected = {16: [0] + [1] * 14 + [2], 4: [3, 4, 4, 5], 8: [1, 2, 2, 2, 2, 2, 2, 3], 1: [16]}
    for steps, counts in expected.items():
        t = dream_timesteps(steps, 1e-3)
        left, got = torch.tensor([16]), []
        for s in range(steps):
            k = dream_reveal_count(left, s, t)
            by_hand = 16 - sum(got) if s == steps - 1 else math.floor(int(left) * (1 - float(t[s + 1]) / float(t[s])))
            assert int(k) == by_hand
            got.append(int(k))
            left = left - k
        assert got == counts, steps


# ----------------------------------------------------------------------------------------------------------------
# Against Dream's original code


def _tie_free(dream_lm, prompt, history, setting):
    """The smallest gap, over the recorded trajectory, between the last revealed and the first kept confidence and
    between each revealed position's top-1 and top-2 probability (a smaller one could flip in float32)."""
    t = dream_timesteps(setting["steps"], setting["eps"])
    state, gaps = torch.full((1, GEN), MASK), [math.inf]
    for s in range(setting["steps"]):
        with torch.no_grad():
            logits = dream_lm(torch.cat([prompt, state], dim=1))[0, prompt.shape[1] :]  # (G, V)
        masked = state[0] == MASK
        confidence, _ = dream_candidates(logits[masked], setting["alg"], 0.0, None, None)
        k = int(dream_reveal_count(masked.sum()[None], s, t))
        ranked = confidence.sort(descending=True).values
        if 0 < k < ranked.numel():
            gaps.append(float(ranked[k - 1] - ranked[k]))
        top2 = torch.softmax(logits[masked], -1).topk(2, dim=-1).values
        gaps.append(float((top2[:, 0] - top2[:, 1]).min()))
        state = history[s][None]
    return min(gaps)


@pytest.mark.parametrize("name", SETTINGS)
@pytest.mark.parametrize("b", [0, 1, 2])
def test_each_prompt_alone_matches_dream_token_for_token(dream_lm, reference, settings, name, b):
    setting = settings[name]
    prompt = reference[f"prompt{b}_ids"][None]  # (1, P)
    history = reference[f"gen_{name}_prompt{b}_history"][:, prompt.shape[1] :]  # (steps, G)
    assert _tie_free(dream_lm, prompt, history, setting) > TIE_GAP  # else the comparison below would be ambiguous
    out = generate(dream_lm, prompt, mask_token_id=MASK, gen_length=GEN, return_history=True, **_kwargs(setting))
    assert isinstance(out, SamplerOutput)
    assert torch.equal(torch.cat([prompt[0], out.completion_ids[0]]), reference[f"gen_{name}_prompt{b}_sequences"])
    assert torch.equal(out.history[:, 0], history)
    revealed = (out.history[:, 0] != MASK).sum(dim=1)
    counts = torch.diff(revealed, prepend=torch.zeros(1, dtype=torch.long))
    assert torch.equal(counts, reference[f"gen_{name}_prompt{b}_reveal_counts"])


@pytest.mark.parametrize("name", ["maskgit_plus_s4", "entropy_s8"])
@pytest.mark.parametrize("b", [0, 1, 2])
def test_teacher_forced_steps_match_dream(dream_lm, reference, settings, name, b):
    setting = settings[name]
    prompt = reference[f"prompt{b}_ids"][None]
    p = prompt.shape[1]
    history = reference[f"gen_{name}_prompt{b}_history"][:, p:]
    step_logits = reference[f"gen_{name}_prompt{b}_step_logits"]  # (steps, P + G, V), Dream's shifted logits
    t = dream_timesteps(setting["steps"], setting["eps"])
    state = torch.full((1, GEN), MASK)
    for s in range(setting["steps"]):
        # our realigned logits on the state Dream saw (position 0 is never a predicted position)
        with torch.no_grad():
            ours = dream_lm(torch.cat([prompt, state], dim=1))[0]
        assert (ours[1:] - step_logits[s, 1:]).abs().max() <= 1e-5
        # one step of our sampler on Dream's own logits gives Dream's next state exactly
        new = dream_step(step_logits[s][None, p:], state, s, t, mask_token_id=MASK, alg=setting["alg"])
        assert torch.equal(new[0], history[s]), s
        state = history[s][None]


@pytest.mark.parametrize("name", ["entropy_s8", "maskgit_plus_s4"])
def test_left_padded_batch_matches_dream_and_rows_alone(dream_lm, reference, settings, name):
    ids, mask = reference["batch_prompt_ids"], reference["batch_prompt_mask"]
    assert bool((mask == 0).any())  # the batch is padded
    out = generate(dream_lm, ids, mask, mask_token_id=MASK, gen_length=GEN, **_kwargs(settings[name]))
    assert torch.equal(torch.cat([ids, out.completion_ids], dim=1), reference[f"batchgen_{name}_sequences"])
    for b in range(3):
        alone = reference[f"gen_{name}_prompt{b}_sequences"][-GEN:]
        assert torch.equal(out.completion_ids[b], alone)


# ----------------------------------------------------------------------------------------------------------------
# Confidences and filters by hand


def test_confidences_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.5]])
    p = torch.softmax(logits, -1)
    for alg, expected in (
        ("maskgit_plus", p.max(-1).values),
        ("topk_margin", p.sort(-1, descending=True).values[:, 0] - p.sort(-1, descending=True).values[:, 1]),
        ("entropy", (p * torch.log(p + 1e-10)).sum(-1)),
    ):
        confidence, tokens = dream_candidates(logits, alg, 0.0, None, None)
        assert torch.equal(tokens, torch.tensor([0, 2]))
        torch.testing.assert_close(confidence, expected, rtol=0, atol=1e-7)
    # row 0 by hand: p = e^(2,1,0,-1) / (e^2 + e + 1 + e^-1)
    z = math.exp(2) + math.exp(1) + 1 + math.exp(-1)
    q = [math.exp(v) / z for v in (2, 1, 0, -1)]
    conf, _ = dream_candidates(logits, "entropy", 0.0, None, None)
    assert float(conf[0]) == pytest.approx(sum(v * math.log(v + 1e-10) for v in q), abs=1e-6)
    conf, _ = dream_candidates(logits, "topk_margin", 0.0, None, None)
    assert float(conf[0]) == pytest.approx(q[0] - q[1], abs=1e-6)


def test_softmax_covers_the_mask_token():
    logits = torch.tensor([[2.0, 0.0, 1.0]])  # id 2 is the mask token: it takes part of the probability mass
    confidence, tokens = dream_candidates(logits, "maskgit_plus", 0.0, None, None)
    assert int(tokens) == 0
    assert float(confidence) == pytest.approx(math.exp(2) / (math.exp(2) + 1 + math.exp(1)), abs=1e-7)


def test_top_p_and_top_k_filters_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lowest = torch.finfo(torch.float32).min
    # top-p 0.7: cumulative 0.5, 0.8 -> the token crossing 0.7 is kept, the rest removed
    assert torch.equal(filter_logits(logits, 0.0, 0.7, None)[0, 2:], torch.tensor([lowest, lowest]))
    assert torch.equal(filter_logits(logits, 0.0, 0.7, None)[0, :2], logits[0, :2])
    assert torch.equal(filter_logits(logits, 0.0, 0.4, None)[0, 1:], torch.full((3,), lowest))  # top-1 always kept
    assert torch.equal(filter_logits(logits, 0.0, 1.0, None), logits)
    assert torch.equal(filter_logits(logits, 0.0, None, 3)[0], torch.cat([logits[0, :3], torch.tensor([lowest])]))
    # temperature first: 2.0 halves the logits before the filters
    torch.testing.assert_close(filter_logits(logits, 2.0, None, None), logits / 2)
    probs = torch.softmax(filter_logits(logits, 0.0, 0.7, None), -1)
    torch.testing.assert_close(probs[0], torch.tensor([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]))


# ----------------------------------------------------------------------------------------------------------------
# Randomness, padding and batching on the fixture model


def _pad_left(prompts, pad=EOS):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], mask[i, width - len(p) :] = p, 1
    return ids, mask


RANDOM_CASES = [
    dict(alg="entropy", temperature=0.8, top_p=0.9),
    dict(alg="maskgit_plus", temperature=1.0, top_k=5, alg_temp=0.5),
    dict(alg="topk_margin", temperature=0.0, alg_temp=0.1),
    dict(alg="origin", temperature=0.7),
    dict(alg="origin", temperature=0.0),
]


@pytest.mark.parametrize("case", RANDOM_CASES)
def test_random_row_independent_of_other_rows_and_padding(dream_lm, reference, case):
    first, p1, p2 = reference["prompt0_ids"], reference["prompt1_ids"], reference["prompt2_ids"]
    outputs = []
    # Same batch size, other rows of other contents and lengths: row 0 gets 0, 4 and 2 pads.
    for others in ([p1[:2], p2[:3]], [p1, p2], [p2[:6], p1[1:3]]):
        ids, mask = _pad_left([first, *others])
        out = generate(dream_lm, ids, mask, mask_token_id=MASK, gen_length=8, steps=4, generator=_gen(3), **case)
        outputs.append(out.completion_ids)
        assert not bool((out.completion_ids == MASK).any())
    assert torch.equal(outputs[0][0], outputs[1][0]) and torch.equal(outputs[0][0], outputs[2][0])
    assert not torch.equal(outputs[0][1:], outputs[1][1:])  # the other rows did change


@pytest.mark.parametrize("case", RANDOM_CASES[:2] + [dict(alg="entropy", temperature=0.0)])
def test_chunked_positions_give_the_same_result(dream_lm, reference, monkeypatch, case):
    from stabledrl_trl.diffusion import dream_sampler

    ids, mask = _pad_left([reference["prompt0_ids"], reference["prompt1_ids"]])
    kwargs = dict(mask_token_id=MASK, gen_length=10, steps=3, **case)
    whole = generate(dream_lm, ids, mask, generator=_gen(8), **kwargs).completion_ids
    monkeypatch.setattr(dream_sampler, "CHUNK_ELEMENTS", 3 * 96)  # 3 positions per chunk, 20 masked at step 0
    assert torch.equal(generate(dream_lm, ids, mask, generator=_gen(8), **kwargs).completion_ids, whole)


def test_seed_determinism_and_global_rng_untouched(dream_lm, reference):
    ids, mask = _pad_left([reference["prompt0_ids"], reference["prompt1_ids"]])
    kwargs = dict(mask_token_id=MASK, gen_length=12, steps=6, alg="entropy", temperature=1.0)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    a = generate(dream_lm, ids, mask, generator=_gen(5), **kwargs).completion_ids
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)
    b = generate(dream_lm, ids, mask, generator=_gen(5), **kwargs).completion_ids
    c = generate(dream_lm, ids, mask, generator=_gen(6), **kwargs).completion_ids
    assert torch.equal(a, b) and not torch.equal(a, c)


# ----------------------------------------------------------------------------------------------------------------
# Sampling laws on fixed logits


def _fixed_logits_fn(logits_row):
    """A model whose logits are `logits_row` (V,) at every position."""

    def fn(input_ids, attention_mask=None):
        return logits_row.expand(*input_ids.shape, -1).clone()

    return fn


def test_temperature_draws_follow_filtered_softmax():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -3.0, 0.0])  # id 5 = mask (a candidate until the last step)
    n_rows, temperature, top_k = 2000, 0.7, 4
    prompt = torch.full((n_rows, 1), 0, dtype=torch.long)
    out = generate(
        _fixed_logits_fn(logits), prompt, mask_token_id=5, gen_length=1, steps=1,
        alg="maskgit_plus", temperature=temperature, top_k=top_k, generator=_gen(11),
    )  # fmt: skip
    counts = torch.bincount(out.completion_ids[:, 0], minlength=6).double()
    filtered = torch.tensor([1.0, 0.5, 0.0, -0.5, -math.inf, -math.inf])  # top-4 of the non-mask (last step) logits
    expected = torch.softmax(filtered / temperature, -1) * n_rows
    assert counts[4:].sum() == 0
    chi2 = float(((counts[:4] - expected[:4]) ** 2 / expected[:4]).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


def test_origin_reveals_binomial_counts_and_fills_at_the_last_step():
    logits = torch.tensor([0.0, 1.0, 0.5, -1.0])  # id 3 = mask
    n_rows, gen, steps = 400, 10, 4
    prompt = torch.zeros(n_rows, 1, dtype=torch.long)
    out = generate(
        _fixed_logits_fn(logits), prompt, mask_token_id=3, gen_length=gen, steps=steps, alg="origin",
        generator=_gen(2), return_history=True,
    )  # fmt: skip
    t = dream_timesteps(steps, 1e-3)
    p0 = 1 - float(t[1] / t[0])
    revealed = (out.history[0] != 3).sum(dim=1).double()  # (rows,) after step 0: Binomial(gen, p0)
    assert abs(float(revealed.mean()) - gen * p0) < 4 * math.sqrt(gen * p0 * (1 - p0) / n_rows)
    assert not bool((out.completion_ids == 3).any())
    assert torch.equal(out.completion_ids, torch.ones_like(out.completion_ids))  # argmax token everywhere


def test_alg_temp_draws_positions_from_softmax_of_confidences():
    # One reveal at step 0 (16 masks, 16 steps reveal 0 then 1); confidences differ by position through the logits.
    gen, rows, alg_temp = 4, 3000, 0.05
    scale = torch.tensor([0.0, 0.5, 1.0, 1.5])  # position j's logits are j-dependent

    def fn(input_ids, attention_mask=None):
        base = torch.tensor([0.0, 2.0, -1.0])  # id 2 = mask
        logits = torch.zeros(*input_ids.shape, 3)
        logits[:, -gen:] = base * (1 + scale[:, None])
        return logits

    prompt = torch.zeros(rows, 1, dtype=torch.long)
    out = generate(
        fn, prompt, mask_token_id=2, gen_length=gen, steps=2, alg="maskgit_plus", alg_temp=alg_temp,
        generator=_gen(4), return_history=True,
    )  # fmt: skip
    first = out.history[0] != 2  # (rows, gen): step 0 reveals floor(4 * (1 - .0005/1)) = ... positions
    k = int(dream_reveal_count(torch.tensor([gen]), 0, dream_timesteps(2, 1e-3)))
    assert k == 1 and bool((first.sum(1) == 1).all())
    confidence = torch.softmax(fn(torch.zeros(1, gen + 1, dtype=torch.long))[0, 1:], -1).max(-1).values  # (gen,)
    expected = torch.softmax(confidence.double() / alg_temp, 0) * rows
    counts = first.sum(0).double()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


def test_mask_candidate_stays_masked_until_the_last_step():
    logits = torch.tensor([0.0, 1.0, 3.0])  # the mask token (2) is the argmax everywhere
    out = generate(
        _fixed_logits_fn(logits), torch.zeros(1, 2, dtype=torch.long), mask_token_id=2, gen_length=6, steps=3,
        alg="maskgit_plus", return_history=True,
    )  # fmt: skip
    assert bool((out.history[:-1] == 2).all())  # "revealed" mask tokens leave the positions masked, as in Dream
    assert torch.equal(out.completion_ids, torch.ones(1, 6, dtype=torch.long))  # the last step fills every position


def test_completion_mask_ends_at_any_end_token():
    # token 1 wins at position 2, token 3 at position 4: with both as end ids the completion ends at position 2
    table = torch.full((6, 5), -5.0)
    table[:, 0] = 0.0
    table[2, 1] = 4.0
    table[4, 3] = 4.0

    def fn(input_ids, attention_mask=None):
        return table[-input_ids.shape[1] :][None].expand(input_ids.shape[0], -1, -1).clone()

    prompt = torch.zeros(1, 1, dtype=torch.long)
    kwargs = dict(mask_token_id=4, gen_length=5, steps=5, alg="entropy")
    out = generate(fn, prompt, eos_token_ids=(1, 3), **kwargs)
    assert out.completion_ids.tolist() == [[0, 1, 0, 3, 0]]
    assert out.completion_mask.tolist() == [[1, 1, 0, 0, 0]]
    assert generate(fn, prompt, eos_token_ids=3, **kwargs).completion_mask.tolist() == [[1, 1, 1, 1, 0]]
    assert isinstance(out, DreamSamplerOutput) and out.history is None


# ----------------------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "override, match",
    [
        (dict(gen_length=0), "gen_length"),
        (dict(steps=0), "steps"),
        (dict(alg="low_confidence"), "alg must be one of"),
        (dict(alg_temp=-1.0), "alg_temp"),
        (dict(alg="origin", alg_temp=0.5), "no effect with alg='origin'"),
        (dict(eps=1.0), "eps"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=0), "top_k"),
    ],
)
def test_invalid_args(override, match):
    args = dict(gen_length=8, steps=4, alg="entropy", alg_temp=0.0, eps=1e-3, temperature=0.0, top_p=None, top_k=None)
    args.update(override)
    with pytest.raises(ValueError, match=match):
        validate_dream_sampler_args(**args)


def test_invalid_generate_inputs():
    fn = _fixed_logits_fn(torch.zeros(4))
    prompt = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="generator is None"):
        generate(fn, prompt, mask_token_id=3, gen_length=2, steps=2, temperature=1.0)
    with pytest.raises(ValueError, match="generator is None"):
        generate(fn, prompt, mask_token_id=3, gen_length=2, steps=2, alg="origin")
    with pytest.raises(ValueError, match="mask_token_id=3 at real prompt"):
        generate(fn, torch.tensor([[0, 3]]), mask_token_id=3, gen_length=2, steps=2)
    with pytest.raises(ValueError, match="left-padded"):
        generate(fn, prompt, torch.tensor([[1, 0]]), mask_token_id=3, gen_length=2, steps=2)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        generate(fn, prompt, mask_token_id=7, gen_length=2, steps=2)
    with pytest.raises(ValueError, match="must return"):
        generate(lambda ids, mask: torch.zeros(1, 3, 4), prompt, mask_token_id=3, gen_length=2, steps=2)
