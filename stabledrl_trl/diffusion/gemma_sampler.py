"""DiffusionGemma rollouts: the model's own block-diffusion sampler, with one torch.Generator per row.

transformers' `DiffusionGemmaGenerationMixin.generate` (models/diffusion_gemma/generation_diffusion_gemma.py) draws
its random tokens from the global torch RNG, so the rows of a batch share one stream and a row's tokens depend on the
rows beside it. RL needs per-row seeds (a completion is reproducible from its own seed, whatever else is in the
batch), so this module runs the same algorithm with the same transformers components, and only the random draws
take a per-row generator:

    for each canvas (block) of `canvas_length` tokens:
        the causal encoder appends the prompt (first canvas) or the last committed canvas to the KV cache
        canvas <- uniform-random tokens                                  (torch.randint, row b's generator)
        for step n = N .. 1 (N = max_denoising_steps), while the row is not stopped:
            logits = decoder(canvas, self-conditioning logits, cache)    (model.forward, as generate calls it)
            logits <- logits / (t_min + (t_max - t_min) n / N)           (LinearTemperatureScheduleLogitsProcessor)
            proposal ~ softmax(logits)                                   (torch.multinomial, row b's generator)
            accept the lowest-entropy positions (EntropyBoundSampler.accept_canvas), renoise the rest with
            uniform-random tokens (row b's generator); adaptive stopping (StableAndConfidentStoppingCriteria)
        commit the argmax canvas; a row whose canvas holds an EOS stops, tokens after it become pad

A row seeded with s draws exactly what `torch.manual_seed(s); model.generate(row)` draws (same calls, same shapes,
same order; a stopped row draws nothing more), so seeded rows equal `model.generate` token for token, alone and
inside a left-padded batch (positions are counted from each row's first real token, as for the row alone).

RL settings map onto the sampler as follows (`DiffusionGemmaFamily.sampler_kwargs`):
- `max_completion_length` -> `max_new_tokens` (whole canvases: a multiple of `canvas_length`),
- `block_denoising_steps` -> `max_denoising_steps` (None: the model's generation config, else 48),
- `temperature` scales the model's temperature schedule (1.0: the schedule of `model.generate`, i.e. t_min / t_max
  of its generation config; 0: greedy proposals, the argmax instead of the multinomial draw; the initial canvas and
  the renoising stay random, as they are in the model's sampler).
The entropy bound, the schedule's t_min / t_max and the stopping thresholds are read from the model's generation
config (with transformers' defaults 0.1, 0.4, 0.8, 1, 0.005).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .llada_sampler import SamplerOutput, completion_mask_from_ids


@dataclass(frozen=True)
class GemmaSamplerSettings:
    """The settings of DiffusionGemma's sampler after the RL mapping (see the module docstring)."""

    max_new_tokens: int
    max_denoising_steps: int
    t_min: float  # temperature at the last step (already scaled by the RL temperature)
    t_max: float  # temperature at the first step
    entropy_bound: float
    stability_threshold: int | None
    confidence_threshold: float | None
    greedy: bool  # argmax proposals instead of multinomial draws (RL temperature 0)


def gemma_sampler_settings(model, *, max_new_tokens: int, max_denoising_steps: int | None = None,
                           temperature: float = 1.0) -> GemmaSamplerSettings:  # fmt: skip
    """The model's own generation settings (its generation config over transformers' defaults, resolved by the
    model's `_prepare_generation_config`, exactly as `generate` resolves them) with the RL settings mapped on."""
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0.")
    overrides = {"max_new_tokens": int(max_new_tokens)}
    if max_denoising_steps is not None:
        overrides["max_denoising_steps"] = int(max_denoising_steps)
    gc, _ = model._prepare_generation_config(None, **overrides)
    scale = 1.0 if temperature == 0 else float(temperature)
    t_min, t_max = gc.t_min, gc.t_max
    if t_min is None or t_max is None:
        raise ValueError("the model's generation config has no temperature schedule (t_min / t_max).")
    return GemmaSamplerSettings(
        max_new_tokens=gc.max_new_tokens,
        max_denoising_steps=gc.max_denoising_steps,
        t_min=t_min * scale if scale != 1.0 else t_min,
        t_max=t_max * scale if scale != 1.0 else t_max,
        entropy_bound=gc.sampler_config.entropy_bound,
        stability_threshold=gc.stability_threshold,
        confidence_threshold=gc.confidence_threshold,
        greedy=temperature == 0,
    )


def row_generators(generator: torch.Generator, batch_size: int, device) -> list[torch.Generator]:
    """One generator per row, seeded from `generator` (one draw of `batch_size` seeds)."""
    seeds = torch.randint(0, 2**62, (batch_size,), generator=generator, device=generator.device)
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds.tolist()]


@torch.no_grad()
def gemma_generate(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    settings: GemmaSamplerSettings,
    *,
    eos_token_ids: tuple[int, ...],
    pad_token_id: int,
    generators: list[torch.Generator],
) -> SamplerOutput:
    """prompt_ids, prompt_mask (B, P) left-padded -> SamplerOutput with completion_ids / completion_mask (B, n C).

    `model` is a `DiffusionGemmaForBlockDiffusion` (unwrapped); n = ceil(max_new_tokens / C) canvases of C =
    `config.canvas_length` tokens; after a row's first EOS every token is `pad_token_id` (as `generate` writes it).
    `generators[b]` draws every random token of row b.
    """
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        EntropyBoundSampler,
        EntropyBoundSamplerConfig,
        LinearTemperatureScheduleLogitsProcessor,
        StableAndConfidentStoppingCriteria,
    )

    B, P = prompt_ids.shape
    if len(generators) != B:
        raise ValueError(f"{len(generators)} generators for {B} rows; pass one torch.Generator per row.")
    device = prompt_ids.device
    C = int(model.config.canvas_length)
    V = int(model.config.text_config.vocab_size)
    s = settings
    num_canvases = math.ceil(s.max_new_tokens / C)
    prompt_mask = prompt_mask.bool()

    gc, _ = model._prepare_generation_config(None, max_new_tokens=s.max_new_tokens)
    cache = model._prepare_cache_for_generation(generation_config=gc, batch_size=B, max_length=P + num_canvases * C)
    sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=float(s.entropy_bound)), C, V,
                                  s.max_denoising_steps)  # fmt: skip
    schedule = LinearTemperatureScheduleLogitsProcessor(s.t_min, s.t_max, s.max_denoising_steps)
    stopping = None
    if s.stability_threshold is not None and s.confidence_threshold is not None:
        stopping = StableAndConfidentStoppingCriteria(s.stability_threshold, s.confidence_threshold)
    eos = torch.tensor(list(eos_token_ids), device=device)

    def draw_tokens(rows: Tensor) -> Tensor:
        # (B, C) uniform-random tokens; only the rows in `rows` draw (from their own generator)
        out = torch.zeros(B, C, dtype=torch.long, device=device)
        for b in rows.nonzero().flatten().tolist():
            out[b] = torch.randint(0, V, (1, C), device=device, generator=generators[b])[0]
        return out

    # Positions count from each row's first real token (a left-padded row is placed as the row alone).
    n_real = prompt_mask.sum(-1)  # (B,)
    enc_pos = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, P)
    attn = prompt_mask  # (B, P + committed) keys the encoder has seen
    new_ids = prompt_ids
    finished = torch.zeros(B, dtype=torch.bool, device=device)
    chunks = []
    offsets = torch.arange(C, device=device)
    for k in range(num_canvases):
        enc_masks = model.model.encoder.create_masks_for_generate(
            config=model.config,
            inputs_embeds=torch.empty((B, new_ids.shape[1], 0), dtype=model.dtype, device=device),
            attention_mask=attn,
            cache=cache,
            position_ids=enc_pos,
        )
        cache = model.model.encoder(
            input_ids=new_ids.contiguous(), attention_mask=enc_masks, cache=cache, position_ids=enc_pos
        ).cache
        dec_pos = n_real[:, None] + k * C + offsets  # (B, C)
        dec_attn = torch.nn.functional.pad(attn, (0, C), value=True)  # (B, keys + C)
        active = ~finished
        canvas = draw_tokens(active)  # (B, C)
        mask_mapping = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config, inputs_embeds=canvas.unsqueeze(-1), cache=cache, decoder_attention_mask=dec_attn
        )
        argmax_canvas = canvas
        sc_logits = None
        done = finished.clone()  # a finished row is not denoised again (generate: its tokens become pad)
        if stopping is not None:
            stopping.reset()
        for step in reversed(range(1, s.max_denoising_steps + 1)):
            cur = torch.tensor(step, device=device, dtype=torch.int32)
            logits = model(
                decoder_input_ids=canvas,
                self_conditioning_logits=sc_logits,
                decoder_attention_mask=mask_mapping,
                cache=cache,
                decoder_position_ids=dec_pos,
            ).logits  # (B, C, V)
            logits = schedule(None, logits, cur_step=cur)
            new_argmax = logits.argmax(-1)  # (B, C)
            drawing = ~done
            if s.greedy:
                proposal = new_argmax
            else:
                probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
                proposal = torch.zeros_like(canvas)
                for b in drawing.nonzero().flatten().tolist():
                    proposal[b] = torch.multinomial(probs[b], 1, generator=generators[b]).squeeze(-1)
            accepted = sampler.accept_canvas(canvas, proposal, logits, cur)
            new_canvas = torch.where(~sampler.accepted_token_mask, draw_tokens(drawing), accepted)
            if stopping is not None:
                if done.any():
                    new_argmax = torch.where(done[:, None], argmax_canvas, new_argmax)
                    new_canvas = torch.where(done[:, None], canvas, new_canvas)
                    if sc_logits is not None:  # (a row finished in an earlier canvas is done from step 1)
                        logits = torch.where(done[:, None, None], sc_logits, logits)
                done = done | stopping(new_argmax, logits)
            canvas, argmax_canvas = new_canvas, new_argmax
            sc_logits = logits.to(model.model.decoder.embed_tokens.weight.dtype)
            if bool(done.all()):
                break
        block = argmax_canvas.clone()
        block[finished] = pad_token_id  # rows finished in an earlier canvas
        is_eos = torch.isin(block, eos)
        csum = is_eos.cumsum(-1)
        block[(csum > 0) & ~((csum == 1) & is_eos)] = pad_token_id  # after the first EOS
        chunks.append(block)
        finished = finished | is_eos.any(-1)
        if bool(finished.all()):
            break
        new_ids = block
        attn = torch.cat([attn, torch.ones(B, C, dtype=torch.bool, device=device)], 1)
        enc_pos = n_real[:, None] + k * C + offsets
    completion = torch.cat(chunks, 1)
    if completion.shape[1] < num_canvases * C:  # every row stopped early: pad to the full length
        completion = torch.nn.functional.pad(
            completion, (0, num_canvases * C - completion.shape[1]), value=pad_token_id
        )
    return SamplerOutput(completion, completion_mask_from_ids(completion, eos_token_ids))
