"""The family interface: every diffusion family the adapter detects is registered, and the full-attention family's
generate / estimate give what the sampler and the estimator give when called directly."""

from __future__ import annotations

import pytest
import torch

from stabledrl_trl import StableDRLConfig
from stabledrl_trl.diffusion.estimators import estimate_likelihood
from stabledrl_trl.diffusion.family import FAMILIES, DiffusionFamily, as_diffusion_lm, get_family
from stabledrl_trl.diffusion.llada_sampler import generate


def test_the_built_in_families_are_registered_in_detection_order():
    assert list(FAMILIES) == ["llada", "dream", "sdar", "llada2", "masked_lm", "diffusion_gemma"]
    for name, family in FAMILIES.items():
        assert isinstance(family, DiffusionFamily) and family.name == name and get_family(name) is family
    # the fallback (any transformers masked LM) is tried last
    assert [f.name for f in FAMILIES.values() if f.fallback] == ["masked_lm"]
    with pytest.raises(ValueError, match="no diffusion family 'gpt'"):
        get_family("gpt")


def _args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path),
        max_completion_length=8,
        block_length=4,
        diffusion_steps=4,
        num_generations=2,
        per_device_train_batch_size=2,
        report_to="none",
        use_cpu=True,
        bf16=False,
    )
    base.update(kw)
    return StableDRLConfig(**base)


def test_llada_family_generate_matches_the_sampler(tiny_llada, tiny_tokenizer, tmp_path):
    args = _args(tmp_path, temperature=0.9)
    adapter = as_diffusion_lm(tiny_llada, tokenizer=tiny_tokenizer)
    prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])  # row 0 left-padded with pad id 0
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    out = get_family("llada").generate(
        adapter, prompt, mask, args, eos_token_ids=adapter.eos_token_ids, generator=torch.Generator().manual_seed(3)
    )
    ref = generate(
        adapter,
        prompt,
        mask,
        mask_token_id=adapter.mask_token_id,
        gen_length=8,
        block_length=4,
        steps=4,
        temperature=0.9,
        eos_token_ids=adapter.eos_token_ids,
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.completion_mask, ref.completion_mask)


def test_llada_family_estimate_scores_the_canvas_with_a_visible_tail(tiny_llada, tiny_tokenizer, tmp_path):
    args = _args(tmp_path, likelihood_estimator="mc_elbo", mc_samples=2, max_completion_length=8)
    adapter = as_diffusion_lm(tiny_llada, tokenizer=tiny_tokenizer)
    eos = tiny_tokenizer.eos_token_id
    prompt, pmask = torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long)
    comp = torch.tensor([[12, 13, eos, 0, 0]])  # TRL's completion: cut after the first EOS, right-padded
    cmask = torch.tensor([[1, 1, 1, 0, 0]])
    seeds = torch.tensor([11])
    with torch.no_grad():
        est = get_family("llada").estimate(adapter, prompt, pmask, comp, cmask, args, seeds=seeds, fill_token_id=eos)
        canvas = torch.tensor([[12, 13, eos, eos, eos, eos, eos, eos]])  # the sampler's full 8-position canvas
        scored = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0]])
        ref = estimate_likelihood(
            "mc_elbo",
            adapter,
            prompt,
            pmask,
            canvas,
            scored,
            mask_token_id=adapter.mask_token_id,
            seed=seeds,
            num_samples=2,
            context_mask=torch.ones_like(scored),
        )
    assert est.token_logps.shape == (1, 5)
    torch.testing.assert_close(est.token_logps, ref.token_logps[:, :5], rtol=0, atol=0)
    assert float(est.token_logps[0, 3:].abs().sum()) == 0.0  # padding after the EOS is never scored
    assert get_family("llada").estimator_passes(args) == 2


def test_sdar_family_uses_the_block_sampler_and_staircase_estimates(tiny_tokenizer, tmp_path):
    from stabledrl_trl.diffusion.block_estimators import staircase_estimate
    from stabledrl_trl.diffusion.block_sampler import block_generate
    from stabledrl_trl.diffusion.family import detect_family
    from stabledrl_trl.sft import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=2, architecture="sdar").eval()
    assert detect_family(model) == "sdar"
    args = _args(tmp_path, temperature=0.8, top_k=30, block_remasking="low_confidence_static",
                 likelihood_estimator="mc_elbo_inv_t", mc_samples=3)  # fmt: skip
    adapter = as_diffusion_lm(model, tokenizer=tiny_tokenizer)
    prompt = torch.tensor([[0, 5, 6, 7, 9], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    family = get_family("sdar")
    out = family.generate(adapter, prompt, mask, args, eos_token_ids=adapter.eos_token_ids,
                          generator=torch.Generator().manual_seed(4))  # fmt: skip
    ref = block_generate(model, prompt, mask, mask_token_id=adapter.mask_token_id, eos_token_ids=adapter.eos_token_ids,
                         pad_token_id=adapter.pad_token_id, block_size=4, gen_length=8, temperature=0.8, top_k=30,
                         remasking="low_confidence_static", generator=torch.Generator().manual_seed(4))  # fmt: skip
    assert torch.equal(out.completion_ids, ref.completion_ids) and torch.equal(
        out.completion_mask, ref.completion_mask
    )
    seeds = torch.tensor([3, 4])
    with torch.no_grad():
        est = family.estimate(adapter, prompt, mask, out.completion_ids, out.completion_mask, args, seeds=seeds,
                              fill_token_id=0)  # fmt: skip
        expected = staircase_estimate("mc_elbo_inv_t", model, prompt, mask, out.completion_ids, out.completion_mask,
                                      block_size=4, mask_token_id=adapter.mask_token_id, seed=seeds, num_samples=3)  # fmt: skip
    torch.testing.assert_close(est.token_logps, expected.token_logps, rtol=0, atol=0)
    assert family.estimator_passes(args) == 3
    # the estimators' own options reach the staircase estimate: sdmc's nodes, block_random_coupled's blocks
    for kw, own in (
        (dict(likelihood_estimator="sdmc", sdmc_nodes=2), dict(nodes=2, num_samples=2)),
        (dict(likelihood_estimator="block_random_coupled", estimator_block_size=2), dict(estimator_block_size=2)),
    ):
        args = _args(tmp_path, **kw)
        with torch.no_grad():
            est = family.estimate(adapter, prompt, mask, out.completion_ids, out.completion_mask, args, seeds=seeds,
                                  fill_token_id=0)  # fmt: skip
            expected = staircase_estimate(kw["likelihood_estimator"], model, prompt, mask, out.completion_ids,
                                          out.completion_mask, block_size=4, mask_token_id=adapter.mask_token_id,
                                          seed=seeds, **own)  # fmt: skip
        torch.testing.assert_close(est.token_logps, expected.token_logps, rtol=0, atol=0)
        assert family.estimator_passes(args) == 2


def _tiny_dream():
    """A tiny Dream on the tiny tokenizer's ids (mask 1, EOS / pad 0), weights from seed 0 (global RNG untouched)."""
    from stabledrl_trl.models.dream import DreamConfig, DreamModel

    config = DreamConfig(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        mask_token_id=1,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=0,
        rope_theta=1e6,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return DreamModel(config).eval()


def test_dream_family_uses_dreams_sampler_by_default(tiny_tokenizer, tmp_path):
    from stabledrl_trl.diffusion.dream_sampler import generate as dream_generate

    args = _args(tmp_path, temperature=0.9, top_p=0.95, diffusion_steps=4)
    adapter = as_diffusion_lm(_tiny_dream(), tokenizer=tiny_tokenizer)
    prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    family = get_family("dream")
    assert family.sampler_name(args) == "dream" and get_family("llada").sampler_name(args) == "llada"
    out = family.generate(
        adapter, prompt, mask, args, eos_token_ids=adapter.eos_token_ids, generator=torch.Generator().manual_seed(3)
    )
    ref = dream_generate(
        adapter,
        prompt,
        mask,
        mask_token_id=1,
        gen_length=8,
        steps=4,
        alg="entropy",
        eps=1e-3,
        temperature=0.9,
        top_p=0.95,
        eos_token_ids=adapter.eos_token_ids,
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(out.completion_ids, ref.completion_ids)
    assert torch.equal(out.completion_mask, ref.completion_mask)
    # diffusion_sampler overrides the family's choice, both ways
    llada_args = _args(tmp_path, temperature=0.9, diffusion_sampler="llada")
    out = family.generate(
        adapter,
        prompt,
        mask,
        llada_args,
        eos_token_ids=adapter.eos_token_ids,
        generator=torch.Generator().manual_seed(3),
    )
    ref = generate(
        adapter,
        prompt,
        mask,
        mask_token_id=1,
        gen_length=8,
        block_length=4,
        steps=4,
        temperature=0.9,
        eos_token_ids=adapter.eos_token_ids,
        generator=torch.Generator().manual_seed(3),
    )
    assert torch.equal(out.completion_ids, ref.completion_ids)
    dream_args = _args(tmp_path, diffusion_sampler="dream", dream_alg="maskgit_plus", temperature=0.0, block_length=None)
    assert get_family("llada").sampler_name(dream_args) == "dream"


@pytest.mark.parametrize(
    "family, kwargs, match",
    [
        ("llada", dict(dream_alg="origin"), "dream_alg"),
        ("masked_lm", dict(dream_eps=0.01), "dream_eps"),
        ("dream", dict(remasking="random"), "remasking"),
        ("dream", dict(cfg_scale=0.5), "cfg_scale"),
    ],
)
def test_family_rejects_settings_its_sampler_ignores(tmp_path, family, kwargs, match):
    args = _args(tmp_path, block_length=None, **kwargs)  # "auto": valid at construction, the family decides
    with pytest.raises(ValueError, match=match):
        get_family(family).check(args, None)
    get_family("llada" if family == "dream" else "dream").check(args, None)  # the other family's sampler reads them


def test_every_sampler_reads_every_off_value_as_no_filtering(tiny_llada, tiny_sdar, tiny_tokenizer, tmp_path):
    """top_k None or 0 and top_p None or 1.0 (None as a Python user may pass it; GRPOConfig allows top_k None) decode
    exactly alike with LLaDA's, Dream's and the block-diffusion sampler; top_k=1 does filter."""
    prompt = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    for name, model in (("dream", _tiny_dream()), ("llada", tiny_llada), ("sdar", tiny_sdar(seed=0))):
        adapter = as_diffusion_lm(model, tokenizer=tiny_tokenizer)
        outs = []
        for top_k, top_p in ((0, 1.0), (None, None), (None, 1.0), (0, None), (1, None)):
            args = _args(tmp_path, temperature=1.5, diffusion_steps=4)
            args.top_k, args.top_p = top_k, top_p  # set after construction: the config itself stores its defaults
            out = get_family(name).generate(
                adapter, prompt, mask, args, eos_token_ids=adapter.eos_token_ids, generator=torch.Generator().manual_seed(5)
            )
            outs.append(out.completion_ids)
        assert all(torch.equal(outs[0], o) for o in outs[1:4]), name
        assert not torch.equal(outs[0], outs[4]), name  # the settings do reach the sampler


# ----------------------------------------------------------------------------------------------------------------------
# Left padding: a row is scored as the row alone, whatever the EOS-tail mode (the official code never pads)


def _tiny_bert():
    """A tiny BERT masked LM (absolute positions) on the tiny tokenizer's ids, weights from seed 0."""
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return BertForMaskedLM(config).eval()


def _padded_and_alone(family, adapter, args, eos):
    """Row 0 in a batch where it carries 7 pad tokens (row 1 has the longer prompt), and row 0 alone (no padding,
    TRL's completion width for it); same per-row seed. Both completions end before the 8-position canvas does."""
    prompt = torch.tensor([[0] * 7 + [5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]])  # (2, 11)
    pmask = torch.tensor([[0] * 7 + [1] * 4, [1] * 11])
    comp = torch.tensor([[12, 13, eos, 0, 0], [14, 15, 16, 17, eos]])  # TRL's: cut after the first EOS, right-padded
    cmask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    seeds = torch.tensor([21, 22])
    batch = family.estimate(adapter, prompt, pmask, comp, cmask, args, seeds=seeds, fill_token_id=eos)
    alone = family.estimate(
        adapter, prompt[:1, 7:], pmask[:1, 7:], comp[:1, :3], cmask[:1, :3], args, seeds=seeds[:1], fill_token_id=eos
    )
    return batch, alone


def _assert_row_equals_alone(batch, alone):
    torch.testing.assert_close(batch.seq_logps[:1], alone.seq_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(batch.token_logps[:1, :3], alone.token_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(batch.token_entropy[:1, :3], alone.token_entropy, rtol=0, atol=1e-5)
    if alone.eubo is not None:
        torch.testing.assert_close(batch.eubo[:1], alone.eubo, rtol=0, atol=1e-5)


@pytest.mark.parametrize("tail", ["visible", "masked"])
@pytest.mark.parametrize("estimator", ["mean_field", "mc_elbo", "mc_elbo_inv_t", "block_random", "coupled"])
@pytest.mark.parametrize("family_name", ["llada", "dream", "masked_lm"])
def test_left_padding_changes_no_estimate_in_either_tail_mode(
    family_name, estimator, tail, tiny_llada, tiny_tokenizer, tmp_path
):
    model = {"llada": tiny_llada, "dream": _tiny_dream(), "masked_lm": _tiny_bert()}[family_name]
    adapter = as_diffusion_lm(model, tokenizer=tiny_tokenizer)
    args = _args(
        tmp_path, likelihood_estimator=estimator, mc_samples=1 if estimator == "mean_field" else 2,
        estimator_block_size=4, p_mask_prompt=0.3, eos_tail=tail,
    )  # fmt: skip
    family, eos = get_family(family_name), tiny_tokenizer.eos_token_id
    with torch.no_grad():
        batch, alone = _padded_and_alone(family, adapter, args, eos)
    _assert_row_equals_alone(batch, alone)
    assert batch.seq_logps[0] != batch.seq_logps[1]  # the rows are scored, not constant
    if estimator == "block_random":  # the sandwich's EUBO too (computed with gradients on)
        sandwich = _args(
            tmp_path, likelihood_estimator=estimator, estimator_block_size=4, p_mask_prompt=0.3, eos_tail=tail,
            loss_type="stable_drl", sandwich=True,
        )  # fmt: skip
        batch, alone = _padded_and_alone(family, adapter, sandwich, eos)
        assert alone.eubo is not None
        _assert_row_equals_alone(batch, alone)


@pytest.mark.parametrize("estimator", ["mean_field", "mc_elbo", "mc_elbo_inv_t", "block_random", "coupled"])
def test_block_diffusion_left_padding_changes_no_estimate(estimator, tiny_sdar, tiny_tokenizer, tmp_path):
    # SDAR has no masked EOS tail (refused at construction): its staircase estimate is checked with the visible one.
    adapter = as_diffusion_lm(tiny_sdar(), tokenizer=tiny_tokenizer)
    args = _args(
        tmp_path, likelihood_estimator=estimator, mc_samples=1 if estimator == "mean_field" else 2,
        estimator_block_size=4, p_mask_prompt=0.3,
    )  # fmt: skip
    with torch.no_grad():
        batch, alone = _padded_and_alone(get_family("sdar"), adapter, args, tiny_tokenizer.eos_token_id)
    _assert_row_equals_alone(batch, alone)
    assert batch.seq_logps[0] != batch.seq_logps[1]
