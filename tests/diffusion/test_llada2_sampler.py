"""LLaDA2's generate algorithm (the "llada2" family) against runs of LLaDA2's original `generate` (fixture)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import stabledrl_trl  # noqa: F401  (registers "llada2_moe")
from stabledrl_trl.diffusion.block_sampler import block_generate
from stabledrl_trl.diffusion.family import as_diffusion_lm, detect_family, get_family

FIXTURE = Path(__file__).parent.parent / "fixtures" / "llada2-tiny"
EOS, MASK = 120, 123
META = json.loads((FIXTURE / "reference.json").read_text())
GREEDY = sorted(r for r in META["gen"] if r.startswith("gen_greedy"))
SAMPLED = sorted(r for r in META["gen"] if not r.startswith("gen_greedy"))  # the original's multinomial draws


@pytest.fixture(scope="module")
def ref() -> dict:
    return load_file(str(FIXTURE / "reference.safetensors"))


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(FIXTURE).eval()


def settings(run: str) -> dict:
    """block_generate arguments of a recorded run (steps capped as the original caps them)."""
    kw = META["gen"][run]["kwargs"]
    temperature = kw["temperature"]
    if not run.startswith("gen_greedy") and temperature == 0:
        temperature = 1.0  # LLaDA2.0's generate samples from softmax(logits) at temperature 0
    return dict(
        mask_token_id=MASK, eos_token_ids=[EOS], pad_token_id=EOS, block_size=kw["block_length"],
        gen_length=kw["gen_length"], denoising_steps=min(kw["steps"], kw["gen_length"] // kw["minimal_topk"]),
        temperature=temperature, top_k=kw.get("top_k") or 0, top_p=kw.get("top_p") or 1.0,
        confidence_threshold=kw["threshold"], whole_blocks=True, mask_candidate=True,
    )  # fmt: skip


def recorded_answer(ref, run: str) -> list[int]:
    """The answer the original returned: up to and including the first EOS, else gen_length tokens."""
    out = ref[f"{run}_out"]
    if META["gen"][run]["return_path"].startswith("early"):
        out = out[META["gen"][run]["prompt_len"] :]  # early stop returns prompt + answer
    return out.tolist()


def answer(out, row: int = 0) -> list[int]:
    return out.completion_ids[row, : int(out.completion_mask[row].sum())].tolist()


@pytest.mark.parametrize(
    ("run", "use_cache"), [(r, True) for r in GREEDY] + [(r, False) for r in GREEDY if r.endswith("_p0")]
)
def test_greedy_reproduces_the_original_token_for_token(ref, model, run, use_cache):
    kw = settings(run)
    model.config.block_size = kw["block_size"]
    prompt = ref[f"gen_prompt{run[-1]}"][None]
    out = block_generate(model, prompt, torch.ones_like(prompt), use_cache=use_cache, **kw)
    assert answer(out) == recorded_answer(ref, run)
    assert (EOS in answer(out)) == META["gen"][run]["eos_in_out"]
    if not use_cache:  # the recomputing path makes the original's model calls (the early-stop runs return earlier)
        assert out.num_forwards >= META["gen"][run]["n_forwards"]


@pytest.mark.parametrize("setting", ["b4s2", "b8mt4", "b8s4", "b8s8"])
def test_greedy_rows_of_a_left_padded_batch(ref, model, setting):
    runs = [f"gen_greedy_{setting}_p{k}" for k in range(3)]
    kw = settings(runs[0])
    model.config.block_size = kw["block_size"]
    prompts = [ref[f"gen_prompt{k}"] for k in range(3)]
    width = max(len(p) for p in prompts)
    ids = torch.full((3, width), EOS, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :], mask[row, width - len(p) :] = p, 1
    out = block_generate(model, ids, mask, **kw)
    for row, run in enumerate(runs):
        assert answer(out, row) == recorded_answer(ref, run)


@pytest.mark.parametrize("run", SAMPLED)
def test_seeded_runs_reproduce_the_originals_draws(ref, model, run):
    """A row's torch.Generator seeded as the original's global one gives exactly the original's sampled run."""
    kw = settings(run)
    model.config.block_size = kw["block_size"]
    prompt = ref[f"gen_prompt{run[-1]}"][None]
    generators = [torch.Generator().manual_seed(META["gen"][run]["seed"])]
    out = block_generate(model, prompt, torch.ones_like(prompt), generator=generators, **kw)
    assert answer(out) == recorded_answer(ref, run)


def test_sampled_rows_are_batch_invariant_and_cached_equals_recomputed(ref, model):
    kw = settings("gen_sampled_p0")
    model.config.block_size = kw["block_size"]
    prompts = [ref[f"gen_prompt{k}"] for k in range(3)]
    ids = torch.full((3, 11), EOS, dtype=torch.long)
    mask = torch.zeros(3, 11, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, 11 - len(p) :], mask[row, 11 - len(p) :] = p, 1
    seeds = [7, 8, 9]
    batch = block_generate(model, ids, mask, generator=[torch.Generator().manual_seed(s) for s in seeds], **kw)
    slow = block_generate(model, ids, mask, generator=[torch.Generator().manual_seed(s) for s in seeds],
                          use_cache=False, **kw)  # fmt: skip
    assert torch.equal(batch.completion_ids, slow.completion_ids)
    for row, p in enumerate(prompts):
        alone = block_generate(model, p[None], torch.ones_like(p)[None],
                               generator=[torch.Generator().manual_seed(seeds[row])], **kw)  # fmt: skip
        assert answer(alone) == answer(batch, row)
    other = block_generate(model, ids, mask, generator=[torch.Generator().manual_seed(s + 100) for s in seeds], **kw)
    assert not torch.equal(other.completion_ids, batch.completion_ids)  # the draws really come from the generators


def test_whole_block_canvas_changes_the_last_block(ref, model):
    """Rounding the canvas up to whole blocks generates extra positions that the last block attends to."""
    kw = settings("gen_greedy_b8s8_p0")  # prompt 5 + 24 = 29 positions -> 32: three extra positions
    model.config.block_size = kw["block_size"]
    prompt = ref["gen_prompt0"][None]
    whole = block_generate(model, prompt, torch.ones_like(prompt), **kw)
    cut = block_generate(model, prompt, torch.ones_like(prompt), **{**kw, "whole_blocks": False})
    assert answer(whole) == recorded_answer(ref, "gen_greedy_b8s8_p0")
    assert answer(cut) != answer(whole)


def test_family_generates_with_llada2_rules(ref, model):
    model.config.block_size = 4
    assert detect_family(model) == "llada2"
    family = get_family("llada2")
    assert family.uses_every_parameter is False  # routed experts without tokens get no gradient
    lm = as_diffusion_lm(model, mask_token_id=MASK, eos_token_ids=[EOS])
    args = SimpleNamespace(max_completion_length=16, block_denoising_steps=2, temperature=0.0, top_k=0, top_p=1.0,
                           block_remasking="low_confidence_dynamic", block_confidence_threshold=0.95)  # fmt: skip
    prompt = ref["gen_prompt0"][None]
    out = family.generate(lm, prompt, torch.ones_like(prompt), args, eos_token_ids=(EOS,),
                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    n = int(out.completion_mask[0].sum())
    assert out.completion_ids[0, :n].tolist() == recorded_answer(ref, "gen_greedy_b4s2_p0")
    args.temperature = 1.0
    draws = [
        family.generate(
            lm,
            prompt,
            torch.ones_like(prompt),
            args,
            eos_token_ids=(EOS,),
            generator=torch.Generator().manual_seed(seed),
        ).completion_ids  # fmt: skip
        for seed in (0, 0, 1)
    ]
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
