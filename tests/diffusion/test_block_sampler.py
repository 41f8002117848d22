"""SDAR's block sampler: the fixture's recorded run, cached vs recomputed prefix, batching, EOS, schedules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

import stabledrl_trl  # noqa: F401
from stabledrl_trl.diffusion import block_sampler
from stabledrl_trl.diffusion.block_sampler import (
    block_generate,
    choose_reveals,
    sample_candidates,
    transfer_schedule,
)
from stabledrl_trl.diffusion.filtering import filter_logits

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sdar-tiny"
FIX = dict(mask_token_id=95, eos_token_ids=[94], pad_token_id=94, block_size=4)




class Recorder(torch.nn.Module):
    """Calls the model and records the (new tokens, logits) of every forward returning logits for all new tokens
    (the denoising steps; prefill and commits ask for one logit only)."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls, self.commits = model, [], []

    def forward(self, input_ids, **kwargs):
        out = self.model(input_ids=input_ids, **kwargs)
        if out.logits.shape[1] == input_ids.shape[1]:
            self.calls.append((input_ids.clone(), out.logits.detach().clone()))
        else:
            self.commits.append(
                (len(self.calls), input_ids.clone())
            )  # prefill / commit after this many denoising calls
        return out


def padded_batch(rows, pad):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def test_replays_the_fixture_run_of_sdars_own_sampler(monkeypatch):
    """Driven through SDAR's recorded reveal order (its ties were broken arbitrarily), every denoising forward of the
    cached sampler gives the recorded logits and the final sequence is SDAR's."""
    model = transformers.AutoModelForCausalLM.from_pretrained(FIXTURE).eval()
    ref = load_file(FIXTURE / "reference.safetensors")
    x, prompt = ref["x"], ref["prompt"]
    states = [ref[f"step{i}_ids"] for i in range(14)]
    starts = [int(ref[f"step{i}_pos"][0, 0]) for i in range(14)]
    # the positions SDAR revealed at step i: where the next state of the same block (or the final block) differs
    reveals = []
    for i in range(14):
        nxt = states[i + 1] if i + 1 < 14 and starts[i + 1] == starts[i] else x[:, starts[i] : starts[i] + 4]
        reveals.append((states[i] == 95) & (nxt != 95))
    calls = iter(reveals)
    monkeypatch.setattr(block_sampler, "choose_reveals", lambda *args: next(calls))
    recorder = Recorder(model)
    out = block_generate(recorder, prompt, torch.ones_like(prompt), gen_length=14, denoising_steps=4,
                         temperature=1.0, top_k=1, remasking="low_confidence_static",
                         generator=torch.Generator().manual_seed(0), **FIX)  # fmt: skip
    assert torch.equal(out.completion_ids, x[:, 6:]) and out.completion_mask.all()
    # prefill, 14 denoising steps, 3 commits (the last block is not stored): commits and prefill keep one logit
    assert out.num_forwards == 1 + 14 + 3 and len(recorder.calls) == 14
    for i, (ids, logits) in enumerate(recorder.calls):
        assert torch.equal(ids, states[i])
        assert (logits - ref[f"step{i}_logits"]).abs().max() <= 1e-5, i


@pytest.mark.parametrize("remasking", ["low_confidence_static", "low_confidence_dynamic"])
@pytest.mark.parametrize("steps", [4, 2])
def test_cached_equals_recomputing_the_prefix(remasking, steps, tiny_sdar):
    """T = 0: the exact KV cache gives the tokens of a sampler that reruns the whole prefix at every step."""
    model = tiny_sdar(seed=1, num_key_value_heads=2)
    ids, mask = padded_batch([[5, 6, 7, 8, 9, 10, 11], [12, 13], [20, 21, 22, 23, 24], [30, 31, 32, 33]], pad=0)
    kwargs = dict(mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4, gen_length=13,
                  denoising_steps=steps, temperature=0.0, remasking=remasking, confidence_threshold=0.3)  # fmt: skip
    fast = block_generate(model, ids, mask, **kwargs)
    slow = block_generate(model, ids, mask, use_cache=False, **kwargs)
    assert torch.equal(fast.completion_ids, slow.completion_ids)
    assert torch.equal(fast.completion_mask, slow.completion_mask)
    assert (fast.completion_ids != 1).all()


def test_every_cached_forward_matches_a_full_forward(tiny_sdar):
    """The logits of each denoising forward against the cache equal a full block-causal forward of the prefix."""
    model = tiny_sdar(seed=2)
    ids, mask = padded_batch([[5, 6, 7, 8, 9, 10], [12, 13, 14]], pad=0)
    recorder = Recorder(model)
    block_generate(recorder, ids, mask, mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4,
                   gen_length=9, temperature=0.7, generator=torch.tensor([3, 4]))  # fmt: skip
    out = block_generate(model, ids, mask, mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4,
                         gen_length=9, temperature=0.7, generator=torch.tensor([3, 4]), use_cache=False)  # fmt: skip
    # rebuild each state's full canvas from the recorded blocks: the layout puts row 0's prefill in columns 0..3
    layout = block_sampler.block_layout(ids, mask, 9, 4, 1, 0)
    canvas = layout.canvas.clone()
    S = layout.prefill_width
    assert recorder.commits[0][0] == 0 and torch.equal(recorder.commits[0][1], canvas[:, :S])  # the prefill
    commits = dict(recorder.commits[1:])
    end = S
    for i, (block_ids, logits) in enumerate(recorder.calls):
        if i in commits:  # the previous block was committed: it is final
            canvas[:, end : end + 4] = commits[i]
            end += 4
        canvas[:, end : end + 4] = block_ids
        with torch.no_grad():
            full = model(canvas[:, : end + 4], attention_mask=layout.attention[:, : end + 4]).logits[:, end:]
        real = layout.attention[:, end : end + 4].bool()
        assert (full - logits)[real].abs().max() <= 1e-5
    assert out.completion_ids.shape == (2, 9)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_row_equals_row_alone(temperature, tiny_sdar):
    model = tiny_sdar(seed=3)
    rows = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [20, 21, 22, 23, 24, 25, 26, 27, 28]]
    ids, mask = padded_batch(rows, pad=0)
    seeds = torch.tensor([11, 22, 33])
    kwargs = dict(mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4, gen_length=10,
                  temperature=temperature, top_p=0.9, top_k=20)  # fmt: skip
    batched = block_generate(model, ids, mask, generator=seeds, **kwargs)
    for i, r in enumerate(rows):
        alone = block_generate(model, torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long),
                               generator=seeds[i : i + 1], **kwargs)  # fmt: skip
        assert torch.equal(batched.completion_ids[i], alone.completion_ids[0]), i
        assert torch.equal(batched.completion_mask[i], alone.completion_mask[0]), i


def test_stops_after_the_block_holding_eos(tiny_sdar):
    """A model pushed to write EOS at the 6th generated position: the block holding it is finished, nothing after."""
    model = tiny_sdar(seed=4)
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])  # 6 tokens: the first generated block holds 2 of them

    class EosAt(torch.nn.Module):
        def __init__(self, model, position):
            super().__init__()
            self.model, self.position = model, position

        def forward(self, input_ids, position_ids, **kwargs):
            out = self.model(input_ids=input_ids, position_ids=position_ids, **kwargs)
            if out.logits.shape[1] == input_ids.shape[1]:
                hit = position_ids == self.position  # (B, n)
                out.logits[..., 0] = torch.where(hit, 1e4, -1e4)
            return out

    out = block_generate(EosAt(model, 6 + 5), prompt, torch.ones_like(prompt), mask_token_id=1, eos_token_ids=[0],
                         pad_token_id=0, block_size=4, gen_length=20, temperature=0.0)  # fmt: skip
    # generated positions 6, 7 | 8..11 (EOS at 11) | stop: 6 generated tokens, the EOS the last scored one
    assert out.completion_mask[0].tolist() == [1] * 6 + [0] * 14
    assert out.context_mask[0].tolist() == [1] * 6 + [0] * 14
    assert out.completion_ids[0, 5] == 0 and (out.completion_ids[0, 6:] == 0).all()
    assert out.num_forwards == 1 + 2 + 1 + 4  # prefill, block 1 (2 steps), its commit, block 2 (4 steps)


def test_finished_rows_leave_the_batch(tiny_sdar):
    """Rows that wrote EOS stop being run (the batch shrinks, cache rows dropped); every row equals the row alone."""
    model = tiny_sdar(seed=5)

    class EosAt(torch.nn.Module):  # EOS at absolute position 11 for every row, recording the batch sizes
        def __init__(self, model):
            super().__init__()
            self.model, self.sizes = model, []

        def forward(self, input_ids, position_ids, **kwargs):
            self.sizes.append(input_ids.shape[0])
            out = self.model(input_ids=input_ids, position_ids=position_ids, **kwargs)
            if out.logits.shape[1] == input_ids.shape[1]:
                out.logits[..., 0] = torch.where(position_ids == 11, 1e4, -1e4)
            return out

    rows = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14], [12, 13], [20, 21, 22, 23, 24, 25]]  # EOS at 11 is generated by all
    ids, mask = padded_batch(rows, pad=0)
    kwargs = dict(mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4, gen_length=16, temperature=0.0)
    wrapped = EosAt(model)
    batched = block_generate(wrapped, ids, mask, **kwargs)
    assert wrapped.sizes[0] == 3 and wrapped.sizes[-1] == 1 and sorted(wrapped.sizes, reverse=True) == wrapped.sizes
    for i, r in enumerate(rows):
        alone = block_generate(EosAt(model), torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long), **kwargs)
        assert torch.equal(batched.completion_ids[i], alone.completion_ids[0]), i
        assert torch.equal(batched.completion_mask[i], alone.completion_mask[0]), i
        assert int(batched.completion_mask[i].sum()) == 11 - len(r) + 1  # up to and including the EOS at 11


def test_schedule_filters_and_reveals_by_hand():
    assert transfer_schedule(4, 4).tolist() == [1, 1, 1, 1]
    assert transfer_schedule(4, 3).tolist() == [2, 1, 1]
    assert transfer_schedule(5, 2).tolist() == [3, 2]
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.45)).tolist() == [[False, True, True, True]]
    # inverse CDF: u in [0, 0.5) -> 0, [0.5, 0.8) -> 1, ...
    tokens, probs = sample_candidates(logits.expand(4, 4)[None], torch.tensor([[0.1, 0.6, 0.9, 0.99]]).double(), 1.0)
    assert tokens.tolist() == [[0, 1, 2, 3]] and torch.allclose(probs, torch.tensor([[0.5, 0.3, 0.15, 0.05]]).double())
    tokens, probs = sample_candidates(logits[None].expand(1, 2, 4), torch.zeros(1, 2).double(), 0.0)
    assert tokens.tolist() == [[0, 0]] and torch.allclose(probs, torch.full((1, 2), 0.5).double())
    conf = torch.tensor([[0.95, 0.2, 0.92, 0.5], [0.3, 0.4, 0.1, 0.2]])
    masked = torch.tensor([[True, True, True, False], [True, True, True, True]])
    one = torch.ones(2, dtype=torch.long)
    static = choose_reveals(conf, masked, one, "low_confidence_static", 0.9)
    assert static.tolist() == [[True, False, False, False], [False, True, False, False]]
    dynamic = choose_reveals(conf, masked, one, "low_confidence_dynamic", 0.9)
    assert dynamic.tolist() == [[True, False, True, False], [False, True, False, False]]  # at least one per row
    assert choose_reveals(conf, masked, torch.tensor([5, 5]), "low_confidence_static", 0.9).tolist() == masked.tolist()


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"gen_length": 0}, "gen_length"),
        ({"denoising_steps": 5}, "denoising_steps=5 exceeds block_size=4"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"remasking": "random"}, "remasking"),
        ({"confidence_threshold": 2.0}, "confidence_threshold"),
        ({"temperature": 0.5, "generator": None}, "generator"),
    ],
)
def test_bad_arguments_raise(overrides, match, tiny_sdar):
    kwargs = dict(mask_token_id=1, eos_token_ids=[0], pad_token_id=0, block_size=4, gen_length=4, temperature=0.0)
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=match):
        block_generate(tiny_sdar(), torch.tensor([[5, 6]]), torch.ones(1, 2, dtype=torch.long), **kwargs)
