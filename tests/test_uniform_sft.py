"""Uniform-noise SFT (the tiny DiffusionGemma's warm-up): the loss against TRL's SFT loss computed by hand, the batch
split, refusals, a few warm-up steps lowering the loss, and the cached warm-up through `prepare_sft_model`."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset

from stabledrl_trl.diffusion.uniform_estimators import draw_samples
from stabledrl_trl.sft import MaskedDiffusionSFTCollator, MaskedDiffusionSFTConfig, tokenize_sft_dataset
from stabledrl_trl.tiny import build_tiny_tokenizer
from stabledrl_trl.uniform_sft import (
    UniformNoiseSFTTrainer,
    build_tiny_gemma_model,
    split_sft_batch,
    uniform_noise_sft_loss,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def digit_rows(n=64):
    rows = []
    for i in range(n):
        digits = [(7 * i + 3 * k) % 10 for k in range(3)]
        rows.append({"prompt": [{"role": "user", "content": "".join(map(str, digits))}],
                     "answer": "".join(map(str, sorted(digits)))})  # fmt: skip
    return Dataset.from_list(rows)


def test_split_batch_masks_up_to_the_first_eos():
    input_ids = torch.tensor([[0, 9, 9, 5, 6, 0, 0], [9, 9, 9, 5, 6, 7, 0]])
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    completion = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]])
    out = split_sft_batch(input_ids, attention, completion, eos_token_id=0)
    assert out["prompt_ids"].tolist() == [[0, 9, 9], [9, 9, 9]]
    assert out["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert out["completion_ids"].tolist() == [[5, 6, 0, 0], [5, 6, 7, 0]]
    assert out["completion_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def _trl_loss_by_hand(model, prompts, completions, draws):
    """TRL's DiffusionGemma SFT loss for one-canvas completions and unpadded prompts, its draws given: corrupt the
    canvas, a no-grad first decoder pass, the second pass self-conditioned where sc is set, the mean cross-entropy."""
    B, P = prompts.shape
    C = completions.shape[1]
    t, u, tok, sc = draws["t"][0], draws["u"][0], draws["tokens"][0], draws["sc"][0]
    canvas = torch.where(u < t[:, None], tok, completions)
    ids = torch.cat([prompts, completions], 1)
    kw = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "decoder_input_ids": canvas,
        # the decoder sees the prompt only (the first canvas) and its own canvas
        "decoder_attention_mask": torch.cat([torch.ones(B, P), torch.zeros(B, C), torch.ones(B, C)], 1).long(),
        "decoder_position_ids": P + torch.arange(C)[None].expand(B, -1),
    }
    with torch.no_grad():
        kw["self_conditioning_logits"] = model(**kw).logits
    kw["self_conditioning_mask"] = sc
    logits = model(**kw).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), completions.flatten())


def test_loss_equals_trl_sft_loss_by_hand(tokenizer):
    model = build_tiny_gemma_model(tokenizer, seed=0).eval()
    eos = tokenizer.eos_token_id
    prompts = torch.tensor([[3, 10, 11, 12, 4], [3, 13, 14, 15, 4]])
    completions = torch.tensor([[20, 21, 22, 2, eos, eos, eos, eos], [23, 24, 25, 26, 27, 2, eos, eos]])
    batch = {"prompt_ids": prompts, "prompt_mask": torch.ones_like(prompts), "completion_ids": completions,
             "completion_mask": torch.tensor([[1] * 5 + [0] * 3, [1] * 7 + [0]])}  # fmt: skip
    seeds = torch.tensor([5, 6])
    ours = uniform_noise_sft_loss(model, batch, seeds, eos)
    V = model.config.text_config.vocab_size
    draws = draw_samples(seeds, torch.tensor([1, 1]), 8, V, 1, False, "training")
    ref = _trl_loss_by_hand(model, prompts, completions, draws)
    assert abs(float(ours) - float(ref)) < 1e-5
    assert 2.0 < float(ref) < 10.0  # about log V for a random model: a real loss
    # another seed draws another corruption: a different loss (the seeds are used)
    assert abs(float(uniform_noise_sft_loss(model, batch, torch.tensor([7, 8]), eos)) - float(ours)) > 1e-4


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "sft"), max_steps=40, learning_rate=3e-3, per_device_train_batch_size=16,
                completion_length=8, seed=0, use_cpu=True, report_to="none", logging_steps=40, disable_tqdm=True,
                save_strategy="no")  # fmt: skip
    base.update(kw)
    return MaskedDiffusionSFTConfig(**base)


def test_refusals(tmp_path, tokenizer):
    model = build_tiny_gemma_model(tokenizer, seed=0)
    with pytest.raises(ValueError, match="mask_token_id=1"):
        UniformNoiseSFTTrainer(model, _args(tmp_path, mask_token_id=1), processing_class=tokenizer)
    with pytest.raises(ValueError, match="completion_length=12 must be a multiple of the model's canvas_length=8"):
        UniformNoiseSFTTrainer(model, _args(tmp_path, completion_length=12), processing_class=tokenizer)


def test_warm_up_steps_lower_the_loss(tmp_path, tokenizer):
    torch.set_num_threads(1)
    model = build_tiny_gemma_model(tokenizer, seed=0)
    data = digit_rows()
    tokenized = tokenize_sft_dataset(data, tokenizer, 8)
    collate = MaskedDiffusionSFTCollator(pad_token_id=tokenizer.pad_token_id)
    raw = collate([tokenized[i] for i in range(32)])
    batch = split_sft_batch(raw["input_ids"], raw["attention_mask"], raw["completion_mask"], tokenizer.eos_token_id)
    seeds = torch.arange(32)  # the same corruption before and after

    def loss():
        model.eval()
        with torch.no_grad():
            return float(uniform_noise_sft_loss(model, batch, seeds, tokenizer.eos_token_id))

    before = loss()
    trainer = UniformNoiseSFTTrainer(model, _args(tmp_path), train_dataset=data, processing_class=tokenizer)
    trainer.train()
    after = loss()
    assert before > 4.0  # about log(104) = 4.64 at initialisation
    assert after < before - 1.5, (before, after)


def test_prepare_sft_model_warms_up_a_tiny_gemma(tmp_path):
    from transformers import DiffusionGemmaForBlockDiffusion

    from stabledrl_trl.diffusion.family import detect_family
    from stabledrl_trl.sft import prepare_sft_model

    path = prepare_sft_model(str(tmp_path / "cache"), task="digit_sort", seed=0, num_samples=64, max_steps=3,
                             completion_length=8, architecture="diffusion_gemma", progress=False)  # fmt: skip
    with open(os.path.join(path, "sft_settings.json")) as f:
        record = json.load(f)
    assert record["settings"]["architecture"] == "diffusion_gemma"
    assert record["metrics"]["train_loss"] > 0
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(path)
    assert detect_family(model) == "diffusion_gemma"
    assert model.config.text_config.hidden_size == 64  # TINY_SFT_GEMMA_MODEL
    # cached: the second call returns the same folder without training
    again = prepare_sft_model(str(tmp_path / "cache"), task="digit_sort", seed=0, num_samples=64, max_steps=3,
                              completion_length=8, architecture="diffusion_gemma", progress=False)  # fmt: skip
    assert again == path
