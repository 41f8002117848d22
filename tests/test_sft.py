"""Tests for masked-diffusion SFT: data layout, the loss against a hand computation, training, and the cache."""

from __future__ import annotations

import math
import os

import pytest
import torch

from stabledrl_trl.sft import (
    MaskedDiffusionSFTCollator,
    MaskedDiffusionSFTConfig,
    MaskedDiffusionSFTTrainer,
    build_tiny_model,
    masked_diffusion_sft_loss,
    prepare_sft_model,
    run_sft,
    sample_completion_masks,
    tokenize_sft_example,
)

EOS, MASK, EOT, USER, ASSISTANT = 0, 1, 2, 3, 4


def _char_ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tokenize_example_renders_chat_and_pads_with_eos(tiny_tokenizer):
    row = {"prompt": [{"role": "user", "content": "ab"}], "answer": "xy"}
    out = tokenize_sft_example(row, tiny_tokenizer, completion_length=6)
    assert out["prompt_ids"] == [USER, *_char_ids(tiny_tokenizer, "ab"), EOT, ASSISTANT]
    # answer, end of turn, then EOS up to the fixed length
    assert out["completion_ids"] == [*_char_ids(tiny_tokenizer, "xy"), EOT, EOS, EOS, EOS]


def test_tokenize_example_plain_text_prompt(tiny_tokenizer):
    out = tokenize_sft_example({"prompt": "q:", "answer": 7}, tiny_tokenizer, completion_length=3)
    assert out["prompt_ids"] == _char_ids(tiny_tokenizer, "q:")
    assert out["completion_ids"] == [*_char_ids(tiny_tokenizer, "7"), EOS, EOS]


def test_tokenize_example_rejects_short_completion_length(tiny_tokenizer):
    row = {"prompt": [{"role": "user", "content": "ab"}], "answer": "xyz"}
    with pytest.raises(ValueError, match="completion_length=3"):
        tokenize_sft_example(row, tiny_tokenizer, completion_length=3)  # xyz + end of turn = 4 tokens


def test_collator_left_pads_prompts():
    collate = MaskedDiffusionSFTCollator(pad_token_id=EOS)
    batch = collate(
        [
            {"prompt_ids": [5, 6, 7], "completion_ids": [8, 0]},
            {"prompt_ids": [9], "completion_ids": [10, 11]},
        ]
    )
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 0], [0, 0, 9, 10, 11]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert batch["completion_mask"].tolist() == [[0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match="completion_ids"):
        collate([{"prompt_ids": [5], "completion_ids": [1]}, {"prompt_ids": [5], "completion_ids": [1, 2]}])


def test_sample_masks_only_completion_and_seeded():
    completion_mask = torch.tensor([[0, 0, 1, 1, 1, 1]] * 500)  # (B, L)
    masked, t = sample_completion_masks(completion_mask, torch.Generator().manual_seed(3), eps=0.01)
    assert masked.shape == (500, 6) and t.shape == (500,)
    assert not masked[:, :2].any()  # the prompt is never masked
    assert bool(((t > 0.01) & (t <= 1.0)).all())
    # per-row masking rate follows t: the masked count's mean is 4 * E[t] = 4 * (1 + 0.01) / 2
    assert masked.sum(1).float().mean().item() == pytest.approx(4 * 1.01 / 2, abs=0.15)
    # correlation between t and the row's masked fraction is strong
    frac = masked[:, 2:].float().mean(1)
    assert torch.corrcoef(torch.stack([frac, t]))[0, 1] > 0.7
    again, t_again = sample_completion_masks(completion_mask, torch.Generator().manual_seed(3), eps=0.01)
    assert torch.equal(masked, again) and torch.equal(t, t_again)
    with pytest.raises(ValueError, match="eps"):
        sample_completion_masks(completion_mask, torch.Generator(), eps=0.0)


def test_loss_matches_hand_computation():
    # Two rows, L = 4, V = 3; row 0 has completion positions 1..3, row 1 positions 2..3.
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [0.5, -1.0, 0.0], [2.0, 0.0, 1.0]],
            [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [3.0, 1.0, 0.0], [0.0, 4.0, 1.0]],
        ]
    )
    targets = torch.tensor([[0, 2, 1, 0], [1, 1, 0, 2]])
    completion_mask = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    masked = torch.tensor([[False, True, False, True], [False, False, True, True]])
    t = torch.tensor([0.5, 0.25])

    def ce(row, pos):
        z = logits[row, pos].tolist()
        return math.log(sum(math.exp(v) for v in z)) - z[targets[row, pos]]

    row0 = (ce(0, 1) / 0.5 + ce(0, 3) / 0.5) / 3  # 3 completion tokens
    row1 = (ce(1, 2) / 0.25 + ce(1, 3) / 0.25) / 2  # 2 completion tokens
    expected = (row0 + row1) / 2
    loss = masked_diffusion_sft_loss(logits, targets, masked, t, completion_mask)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # nothing masked: zero loss
    none = torch.zeros_like(masked)
    assert masked_diffusion_sft_loss(logits, targets, none, t, completion_mask).item() == 0.0


def test_trainer_compute_loss_equals_loss_on_its_masks(tiny_tokenizer, tmp_path):
    model = build_tiny_model(tiny_tokenizer, seed=0)
    rows = [{"prompt": [{"role": "user", "content": c}], "answer": c * 2} for c in "abcd"]
    args = MaskedDiffusionSFTConfig(output_dir=str(tmp_path), completion_length=4, seed=11, use_cpu=True)
    trainer = MaskedDiffusionSFTTrainer(model, args, train_dataset=_dataset(rows), processing_class=tiny_tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    loss = trainer.compute_loss(model, batch)
    # same masks from a generator seeded like the trainer's (seed + process index 0)
    masked, t = sample_completion_masks(batch["completion_mask"], torch.Generator().manual_seed(11), args.mask_eps)
    noisy = batch["input_ids"].masked_fill(masked, MASK)
    logits = model(input_ids=noisy, attention_mask=batch["attention_mask"]).logits
    expected = masked_diffusion_sft_loss(logits, batch["input_ids"], masked, t, batch["completion_mask"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def _dataset(rows):
    from datasets import Dataset

    return Dataset.from_list(rows)


def test_build_tiny_model_is_seeded_and_keeps_global_rng(tiny_tokenizer):
    state = torch.random.get_rng_state()
    a = build_tiny_model(tiny_tokenizer, seed=1, d_model=32, n_layers=1, mlp_hidden_size=64)
    b = build_tiny_model(tiny_tokenizer, seed=1, d_model=32, n_layers=1, mlp_hidden_size=64)
    c = build_tiny_model(tiny_tokenizer, seed=2, d_model=32, n_layers=1, mlp_hidden_size=64)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.config.model_type == "llada" and a.config.hidden_size == 32 and a.config.num_hidden_layers == 1
    assert a.config.mask_token_id == MASK and a.config.vocab_size == len(tiny_tokenizer)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def _fixed_mask_loss(model, tokenizer, rows, completion_length):
    """The SFT loss of `rows` on masks from a fixed seed (the same masks before and after training)."""
    features = [tokenize_sft_example(r, tokenizer, completion_length) for r in rows]
    batch = MaskedDiffusionSFTCollator(pad_token_id=EOS)(features)
    masked, t = sample_completion_masks(batch["completion_mask"].repeat(8, 1), torch.Generator().manual_seed(0))
    ids = batch["input_ids"].repeat(8, 1)
    with torch.no_grad():
        logits = model(input_ids=ids.masked_fill(masked, MASK), attention_mask=batch["attention_mask"].repeat(8, 1))
    return masked_diffusion_sft_loss(logits.logits, ids, masked, t, batch["completion_mask"].repeat(8, 1)).item()


def _exact_match(prompts, completions, answer, **kwargs):
    return [float(c[0]["content"] == a) for c, a in zip(completions, answer)]


@pytest.fixture
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and spinning threads slow down badly on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_short_sft_lowers_loss_and_learns_a_trivial_task(tiny_tokenizer, tmp_path, one_thread):
    from stabledrl_trl.evaluation import evaluate_model

    # Trivial task: answer the letter of the prompt twice.
    rows = [{"prompt": [{"role": "user", "content": c}], "answer": c * 2} for c in "abcdefgh"]
    model = build_tiny_model(tiny_tokenizer, seed=0)
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings

    sampler = SamplerSettings.from_fields(max_completion_length=4, block_length=4, diffusion_steps=4, temperature=0.0)
    settings = dict(settings=sampler, batch_size=8, progress=False)
    before = evaluate_model(model, tiny_tokenizer, rows, _exact_match, **settings)["accuracy"]
    loss_before = _fixed_mask_loss(model, tiny_tokenizer, rows, 4)
    args = MaskedDiffusionSFTConfig(
        output_dir=str(tmp_path / "out"),
        completion_length=4,
        max_steps=60,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        per_device_train_batch_size=16,
        seed=0,
        use_cpu=True,
        disable_tqdm=True,
    )
    metrics = run_sft(model, tiny_tokenizer, _dataset(rows * 8), args)
    assert metrics["train_loss"] > 0
    loss_after = _fixed_mask_loss(model, tiny_tokenizer, rows, 4)
    after = evaluate_model(model, tiny_tokenizer, rows, _exact_match, **settings)["accuracy"]
    assert loss_after < 0.5 * loss_before
    assert before == 0.0 and after >= 0.75
    # saved model and tokenizer load back and give the same answers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "out"))
    assert evaluate_model(reloaded, tokenizer, rows, _exact_match, **settings)["accuracy"] == after


def test_prepare_sft_model_caches(tmp_path, monkeypatch):
    import stabledrl_trl.sft as sft

    small = {"d_model": 32, "n_layers": 1, "mlp_hidden_size": 64}
    kwargs = dict(num_samples=16, max_steps=2, batch_size=4, model_overrides=small, progress=False)
    path = prepare_sft_model(str(tmp_path), "digit_sort", 0, **kwargs)
    weights = os.path.join(path, "model.safetensors")
    assert os.path.isfile(weights) and os.path.isfile(os.path.join(path, "tokenizer_config.json"))
    stamp = os.stat(weights).st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached checkpoint must be reused")

    monkeypatch.setattr(sft, "run_sft", no_training)
    assert prepare_sft_model(str(tmp_path), "digit_sort", 0, **kwargs) == path
    assert os.stat(weights).st_mtime_ns == stamp
    # other settings -> another checkpoint (training runs, so it hits the patched run_sft)
    with pytest.raises(AssertionError, match="cached"):
        prepare_sft_model(str(tmp_path), "digit_sort", 1, **kwargs)
    # the failed run leaves nothing half-written behind
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]


def test_sft_script_trains_saves_and_evaluates(tmp_path, load_script):
    script = load_script("sft")
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"output_dir: {tmp_path / 'out'}\nmax_steps: 2\nper_device_train_batch_size: 4\nnum_train_samples: 8\n"
        "tiny_d_model: 32\ntiny_n_layers: 1\ntiny_mlp_hidden_size: 64\nuse_cpu: true\n"
    )
    results = script.main(argv=["--config", str(config), "--eval_num_samples", "3", "--disable_tqdm", "true"])
    assert results["train"]["train_loss"] > 0
    assert results["eval"]["n"] == 3
    for name in ("model.safetensors", "config.json", "tokenizer_config.json", "sft_eval.json"):
        assert os.path.isfile(tmp_path / "out" / name)
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_stepz: 2\n")
    with pytest.raises(ValueError, match="max_stepz"):
        script.make_parser().parse_args_and_config(["--config", str(bad)])


@pytest.mark.parametrize("architecture", ["sdar", "llada2"])
def test_block_diffusion_sft_loss_conditions_each_block_on_the_clean_history(tiny_tokenizer, tmp_path, architecture):
    """On SDAR and LLaDA2 the SFT loss is SDAR's: each masked token scored by a forward of the clean earlier blocks
    followed by its own noisy block (checked with one plain block-causal forward per block)."""
    model = build_tiny_model(tiny_tokenizer, seed=0, architecture=architecture)
    rows = [{"prompt": [{"role": "user", "content": c * (i + 1)}], "answer": c * 3} for i, c in enumerate("abc")]
    args = MaskedDiffusionSFTConfig(output_dir=str(tmp_path), completion_length=6, seed=5, use_cpu=True)
    trainer = MaskedDiffusionSFTTrainer(model, args, train_dataset=_dataset(rows), processing_class=tiny_tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    loss = trainer.compute_loss(model, batch)
    masked, t = sample_completion_masks(batch["completion_mask"], torch.Generator().manual_seed(5), args.mask_eps)
    assert masked.any()
    noisy = batch["input_ids"].masked_fill(masked, MASK)
    bs = model.config.block_size
    total = 0.0
    for b in range(3):
        real = batch["attention_mask"][b].bool()
        clean, noise, hit = batch["input_ids"][b][real], noisy[b][real], masked[b][real]
        ce_sum = 0.0
        for start in range(0, len(clean), bs):
            ids = torch.cat([clean[:start], noise[start : start + bs]])[None]
            with torch.no_grad():
                logp = model(ids).logits[0, start:].log_softmax(-1)
            for j in range(start, min(start + bs, len(clean))):
                if hit[j]:
                    ce_sum += -logp[j - start, clean[j]].item()
        total += ce_sum / t[b].item() / int(batch["completion_mask"][b].sum())
    assert loss.item() == pytest.approx(total / 3, rel=1e-5)


def test_dream_sft_loss_reads_realigned_logits(tiny_tokenizer, tmp_path):
    """Dream's output i-1 predicts token i: the SFT loss scores each masked token with the output before it (as
    Dream's own sampler reads it), checked row by row on unpadded inputs, and differs from the raw-logit loss."""
    from stabledrl_trl.models.dream import DreamConfig, DreamModel

    vocab = len(tiny_tokenizer)
    config = DreamConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, mask_token_id=MASK, bos_token_id=EOS, eos_token_id=EOS,
        pad_token_id=EOS, tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DreamModel(config).eval()
    rows = [{"prompt": [{"role": "user", "content": c * (i + 1)}], "answer": c * 3} for i, c in enumerate("abc")]
    args = MaskedDiffusionSFTConfig(output_dir=str(tmp_path), completion_length=6, seed=3, use_cpu=True)
    trainer = MaskedDiffusionSFTTrainer(model, args, train_dataset=_dataset(rows), processing_class=tiny_tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
    with torch.no_grad():
        loss = trainer.compute_loss(model, batch)
    masked, t = sample_completion_masks(batch["completion_mask"], torch.Generator().manual_seed(3), args.mask_eps)
    assert masked.any()
    noisy = batch["input_ids"].masked_fill(masked, MASK)
    realigned, raw = [], []
    with torch.no_grad():
        for b in range(3):
            real = batch["attention_mask"][b].bool()
            out = model(input_ids=noisy[b][real][None]).logits  # (1, n, V), the row alone
            row_realigned = torch.cat([out[:, :1], out[:, :-1]], dim=1)  # Dream's sampler: output i-1 at position i
            pad = (~real).sum().item()
            fill = torch.zeros(1, pad, out.shape[-1])
            realigned.append(torch.cat([fill, row_realigned], 1))
            raw.append(torch.cat([fill, out], 1))
    expected = masked_diffusion_sft_loss(torch.cat(realigned), batch["input_ids"], masked, t, batch["completion_mask"])
    unshifted = masked_diffusion_sft_loss(torch.cat(raw), batch["input_ids"], masked, t, batch["completion_mask"])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    assert abs(unshifted.item() - expected.item()) > 1e-2  # the shift matters on this model
