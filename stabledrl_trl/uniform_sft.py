"""Uniform-noise SFT for DiffusionGemma (TRL's SFT example's loss) and the tiny DiffusionGemma warm-up.

DiffusionGemma has no mask token, so LLaDA's masked SFT (`stabledrl_trl.sft`) does not apply to it. Its training
loss, as TRL's `examples/scripts/sft_diffusion_gemma.py` computes it, is per example: one completion canvas of C
tokens chosen uniformly among the canvases the completion occupies (EOS-filled past the response), t ~ U(eps, 1),
each canvas position replaced with probability t by a uniform-random token, self-conditioning on a first no-grad
decoder pass with probability 0.5, and the flat cross-entropy over the canvas:

    loss = (1 / B) sum_b -(1 / C) sum_{i in canvas of b} log p_theta(y_i | x_t, prompt, earlier canvases)

That is the negative of the uniform-noise estimate the RL trainer uses (`diffusion.uniform_estimators`), with one
sample per row, TRL's self-conditioning rule ("training") and the scale undone: the estimate of one sample sums
n_b * sum_i log p over the chosen canvas, so the loss is -token_logps.sum(-1) / (n_b C). `uniform_noise_sft_loss`
computes it through `uniform_noise_estimate` (one implementation of the corruption and the loss).

Data and batching are the masked SFT's (`tokenize_sft_dataset`, `MaskedDiffusionSFTCollator`: prompt left-padded,
completion EOS-padded to `completion_length`, which must be a multiple of `canvas_length`); the config is
`MaskedDiffusionSFTConfig` (its `mask_eps` is the smallest corruption level eps; `mask_token_id` must stay unset).
The per-row seeds come from a `torch.Generator` seeded with `args.seed + process_index`.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import Trainer

from .diffusion.uniform_estimators import uniform_noise_estimate
from .sft import MaskedDiffusionSFTCollator, MaskedDiffusionSFTConfig, tokenize_sft_dataset


def split_sft_batch(input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, eos_token_id: int) -> dict:
    """The masked SFT collator's batch (B, P + L) -> prompt_ids / prompt_mask (B, P) and completion_ids /
    completion_mask (B, L), the completion mask 1 up to and including the first EOS (as the RL trainer's)."""
    L = int(completion_mask[0].sum())
    prompt_ids, completion_ids = input_ids[:, :-L], input_ids[:, -L:]
    is_eos = completion_ids == eos_token_id
    before_eos = (is_eos.long().cumsum(-1) - is_eos.long()) == 0  # (B, L) positions up to the first EOS
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": attention_mask[:, :-L],
        "completion_ids": completion_ids,
        "completion_mask": before_eos.long(),
    }


def uniform_noise_sft_loss(model, batch: dict, seeds: Tensor, eos_token_id: int, eps: float = 1e-3) -> Tensor:
    """TRL's DiffusionGemma SFT loss (module docstring) on a split batch (`split_sft_batch`), one sample per row.

    seeds (B,): row b's block, t, corruption, replacement tokens and self-conditioning draw. Returns a scalar."""
    from .diffusion.adapter import unwrap_model
    from .diffusion.uniform_estimators import draw_samples

    C = int(unwrap_model(model).config.canvas_length)
    V = int(unwrap_model(model).config.text_config.vocab_size)
    mask = batch["completion_mask"].bool()
    n_blocks = ((mask.sum(-1) - 1).clamp(min=0) // C + 1).cpu()  # (B,)
    draws = draw_samples(seeds.cpu(), n_blocks, C, V, 1, False, "training", eps=eps)
    est = uniform_noise_estimate(
        model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"],
        seeds=seeds, fill_token_id=eos_token_id, num_samples=1, self_conditioning="training", draws=draws,
    )  # fmt: skip
    per_row = est.token_logps.sum(-1) / (n_blocks.to(est.token_logps.device) * C)  # (B,) mean log p over the canvas
    return -per_row.mean()


class UniformNoiseSFTTrainer(Trainer):
    """A `Trainer` whose loss is `uniform_noise_sft_loss` (TRL's DiffusionGemma SFT loss) on masked-SFT batches."""

    loss_is_scaled_for_ga = False  # compute_loss returns a per-batch mean

    def __init__(self, model, args: MaskedDiffusionSFTConfig, train_dataset=None, processing_class=None, **kwargs):
        if not isinstance(args, MaskedDiffusionSFTConfig):
            raise ValueError(f"args must be a MaskedDiffusionSFTConfig, got {type(args).__name__}.")
        if args.mask_token_id is not None:
            raise ValueError(
                f"mask_token_id={args.mask_token_id}: uniform-noise SFT corrupts with uniform-random tokens, not a "
                "mask token; leave mask_token_id unset."
            )
        if processing_class is None or processing_class.eos_token_id is None:
            raise ValueError("processing_class: pass a tokenizer with an eos_token_id (it fills the canvas).")
        C = int(model.config.canvas_length)
        if args.completion_length % C:
            raise ValueError(
                f"completion_length={args.completion_length} must be a multiple of the model's canvas_length={C} "
                "(the loss scores whole canvases)."
            )
        if train_dataset is not None and "completion_ids" not in train_dataset.column_names:
            train_dataset = tokenize_sft_dataset(
                train_dataset, processing_class, args.completion_length, args.answer_column
            )
        pad = (
            processing_class.pad_token_id
            if processing_class.pad_token_id is not None
            else processing_class.eos_token_id
        )
        kwargs.setdefault("data_collator", MaskedDiffusionSFTCollator(pad_token_id=pad))
        super().__init__(model=model, args=args, train_dataset=train_dataset, processing_class=processing_class,
                         **kwargs)  # fmt: skip
        self.eos_token_id = int(processing_class.eos_token_id)
        self._seed_generator = torch.Generator().manual_seed(args.seed + args.process_index)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        batch = split_sft_batch(inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"],
                                self.eos_token_id)  # fmt: skip
        seeds = torch.randint(0, 2**62, (batch["prompt_ids"].shape[0],), generator=self._seed_generator)
        loss = uniform_noise_sft_loss(model, batch, seeds, self.eos_token_id, eps=self.args.mask_eps)
        return (loss, None) if return_outputs else loss


def build_tiny_gemma_model(tokenizer, seed: int = 0, **text_overrides):
    """A freshly initialised tiny `DiffusionGemmaForBlockDiffusion` (`tiny.tiny_diffusion_gemma_config` with the
    text overrides, e.g. `sft.TINY_SFT_GEMMA_MODEL`), its vocabulary the tokenizer's plus the three image ids, EOS / pad
    the tokenizer's. Initialised from `seed` inside `torch.random.fork_rng` (the global RNG is left untouched)."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from .tiny import tiny_diffusion_gemma_config

    text_overrides = dict(text_overrides)
    canvas_length = text_overrides.pop("canvas_length", 8)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    config = tiny_diffusion_gemma_config(
        vocab_size=len(tokenizer) + 3, canvas_length=canvas_length,
        **{"eos_token_id": tokenizer.eos_token_id, "pad_token_id": pad, **text_overrides},
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return DiffusionGemmaForBlockDiffusion(config)


def run_uniform_sft(model, tokenizer, train_dataset, args: MaskedDiffusionSFTConfig, *, callbacks=None) -> dict:
    """Train `model` with uniform-noise SFT and save model + tokenizer to `args.output_dir` (as `sft.run_sft`)."""
    trainer = UniformNoiseSFTTrainer(
        model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer, callbacks=callbacks
    )
    result = trainer.train()
    trainer.save_model(args.output_dir)
    if args.should_save:
        tokenizer.save_pretrained(args.output_dir)
    return dict(result.metrics)
