"""Likelihood estimates for uniform-noise block diffusion (DiffusionGemma), as DiffusionGemma is trained.

DiffusionGemma has no mask token: its forward process replaces each canvas token, independently with probability t,
by a token drawn uniformly from the vocabulary. TRL's SFT example (examples/scripts/sft_diffusion_gemma.py, TRL PR
#6003) trains it with, per example:
- one completion block ("canvas") of C = `config.canvas_length` tokens chosen uniformly, its target EOS-filled past
  the end of the response; the causal encoder reads the clean sequence and the decoder's key mask stops at the
  prompt plus the clean blocks before the chosen one;
- t ~ U(eps, 1) (eps = 1e-3), x_t = where(u < t, uniform token, x_0) with u ~ U(0, 1) per position;
- self-conditioning with probability 0.5: a first no-grad decoder pass gives the logits the second pass reads;
- the flat cross-entropy over the whole canvas, no 1/t weight:  L = -(1/C) sum_i log p_theta(x_0^i | x_t, context).

The estimate here is that loss's log-likelihood form, summed over the completion's blocks:

    F(y | x) = sum_b E_{t, x_t} [ sum_{i in block b} log p_theta(y_i | x_t^b, x, y_<b) ]

estimated with K samples, each scoring one block chosen uniformly among the n_b blocks the completion occupies
and multiplying by n_b (so each sample is unbiased for F):  F_hat = (1/K) sum_k n_b sum_i log p(y_i | x_t^{b_k}).
What it is: the negative of the model's own training loss (times C n_b), i.e. the "flat" surrogate TRL's example
trains on. It is not a proven lower bound of log pi(y | x): the continuous-time ELBO of uniform-noise diffusion
(Austin et al. 2021, arXiv 2107.03006; Schiff et al. 2024, arXiv 2412.10193; Sahoo et al. 2025, arXiv 2506.10892)
weights and combines the per-token terms differently, and the rollout sampler (entropy-bounded acceptance with
renoising) is not the reverse of this forward process. It is used, like the masked estimators, as a surrogate
log-likelihood inside ratio objectives; SPG's EUBO (a masked-diffusion upper bound) has no counterpart derived here.

Forms (`likelihood_estimator`):
- "block_random": K independent samples (block, t, corruption, replacement tokens).
- "block_random_coupled": samples in pairs sharing the block, the per-position uniforms u and the replacement
  tokens, with antithetic times t and t' (t = eps + (1 - eps) v, t' = eps + (1 - eps)(1 - v)); each member is
  distributed as one "block_random" sample, so the pair mean has the same expectation and (log p decreasing in t)
  less variance.
Self-conditioning (`self_conditioning`): "off" (one decoder pass, no self-conditioning signal), "on" (two passes,
the second conditioned on the first's logits, as at every sampler step but the first), "training" (the second pass
conditioned with probability 0.5 per sample, TRL's SFT rule). Prediction (`prediction`): "denoiser" (the logits as
they are) or "mean_loo" (arXiv 2605.22765: the leave-one-out posterior converted to the denoiser by adding
log(1 + V alpha_t / (1 - alpha_t)), alpha_t = 1 - t, to the logit of the token observed at each position).

Per-token contributions (`LikelihoodEstimate.token_logps`, masked mean = the sequence estimate): position i of the
scored block gets n_b log p(y_i | .); the EOS-fill positions past the first EOS (scored, as in training) are added to
the EOS token's contribution; positions of unscored blocks get 0 in that sample. Each is unbiased for its token's
term. Randomness comes from one torch.Generator per row seeded by `seeds[b]`, so a row's estimate does not depend
on the rows beside it (a left-padded row equals the row alone).

Context: the encoder reads [prompt; y] once (causal, so block b's keys are its prefix's); sliding-window layers keep
the last `sliding_window` keys of the whole sequence, as in TRL's example, so the context equals the sampler's
exactly when prompt + completion fits in the window (the 26B-A4B model: 1024 tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .adapter import unwrap_model
from .estimators import LikelihoodEstimate

EPS = 1e-3  # TRL's SFT example: minimum corruption level, t ~ U(eps, 1)
SELF_CONDITIONING = ("off", "on", "training")
PREDICTIONS = ("denoiser", "mean_loo")
UNIFORM_ESTIMATORS = ("block_random", "block_random_coupled")
TRAINING_SELF_CONDITIONING_P = 0.5


def fill_after_eos(completion_ids: Tensor, completion_mask: Tensor, fill_token_id: int) -> Tensor:
    """completion_ids, completion_mask (B, L) -> (B, L) targets: the completion, `fill_token_id` where the mask is 0
    (past the first EOS), as TRL's SFT example EOS-fills the canvas past the response."""
    return torch.where(completion_mask.bool(), completion_ids, torch.full_like(completion_ids, fill_token_id))


def context_inputs(prompt_ids: Tensor, prompt_mask: Tensor, targets: Tensor) -> dict:
    """The encoder's inputs for [prompt; targets] (B, P + L): ids, the key mask and positions counted from each row's
    first real token (a left-padded row is placed as the row alone)."""
    ids = torch.cat([prompt_ids, targets], 1)  # (B, P + L)
    key_mask = torch.cat([prompt_mask.bool(), torch.ones_like(targets, dtype=torch.bool)], 1)
    positions = (key_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, P + L)
    return {"input_ids": ids, "attention_mask": key_mask, "position_ids": positions}


def decoder_inputs(key_mask: Tensor, n_prompt: Tensor, prompt_len: int, block: Tensor, canvas_ids: Tensor) -> dict:
    """The decoder's inputs for canvases `canvas_ids` (B, C) of completion block `block` (B,): the key mask stops at
    the prompt plus the completion's blocks before `block` (TRL's SFT example), positions n_prompt + block C + i."""
    C = canvas_ids.shape[1]
    L = key_mask.shape[1] - prompt_len
    cut = torch.arange(L, device=canvas_ids.device)[None, :] < (block * C)[:, None]  # (B, L)
    dec_mask = torch.cat([key_mask[:, :prompt_len], cut, torch.ones_like(canvas_ids, dtype=torch.bool)], 1)
    offsets = torch.arange(C, device=canvas_ids.device)
    return {
        "decoder_input_ids": canvas_ids,
        "decoder_attention_mask": dec_mask,
        "decoder_position_ids": n_prompt[:, None] + (block * C)[:, None] + offsets,
    }


def canvas_logits(model, cache, encoder: dict | None, decoder: dict, self_conditioning: Tensor | None):
    """Decoder logits (B, C, V) float32 and the encoder cache. `encoder` given: the call also encodes the context
    into a fresh cache (differentiable). self_conditioning (B,) bool or None: None is one pass without the signal;
    a mask conditions a second pass on the first pass's logits (detached: TRL's no-grad first pass) for the rows
    set, the others getting the zero signal, as TRL's SFT example does."""
    from transformers import DynamicCache

    if encoder is not None:
        inner = unwrap_model(model)
        cache = DynamicCache(config=inner.config.get_text_config(decoder=True))
        out = model(**encoder, cache=cache, **decoder)
        first, cache = out.logits, out.cache
    elif self_conditioning is not None:
        with torch.no_grad():
            first = model(cache=cache, **decoder).logits
    else:
        first = model(cache=cache, **decoder).logits
    if self_conditioning is None:
        return first.float(), cache
    out = model(
        cache=cache, **decoder, self_conditioning_logits=first.detach(), self_conditioning_mask=self_conditioning
    )
    return out.logits.float(), cache


def target_logps(logits: Tensor, targets: Tensor, canvas_ids: Tensor, t: Tensor, prediction: str = "denoiser"):
    """logits (B, C, V), targets / canvas_ids (B, C), t (B,) -> (log p(target) (B, C), entropy (B, C)).

    "mean_loo" adds log(1 + V alpha / (1 - alpha)), alpha = 1 - t, to the logit of each position's observed token."""
    if prediction == "mean_loo":
        V = logits.shape[-1]
        alpha = (1 - t).to(logits.dtype)
        bonus = torch.log1p(V * alpha / (1 - alpha))  # (B,)
        logits = logits.scatter_add(-1, canvas_ids[..., None], bonus[:, None, None].expand(-1, canvas_ids.shape[1], 1))
    elif prediction != "denoiser":
        raise ValueError(f"prediction={prediction!r}; choose one of {list(PREDICTIONS)}.")
    logp = F.log_softmax(logits, -1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1), entropy.detach()


def draw_samples(seeds: Tensor, n_blocks: Tensor, C: int, V: int, num_samples: int, coupled: bool,
                 self_conditioning: str, eps: float = EPS) -> dict:  # fmt: skip
    """The random inputs of `num_samples` samples per row, each row from its own generator seeded by seeds[b].

    Returns block (K, B), t (K, B), u (K, B, C), tokens (K, B, C), sc (K, B) bool or None. coupled: pairs share
    block, u and tokens, with antithetic t."""
    B = seeds.shape[0]
    K = num_samples
    out = {k: [] for k in ("block", "t", "u", "tokens", "sc")}
    for b in range(B):
        g = torch.Generator().manual_seed(int(seeds[b]))
        units = K // 2 if coupled else K
        block = torch.randint(0, 2**62, (units,), generator=g) % int(n_blocks[b])
        v = torch.rand(units, generator=g)
        u = torch.rand(units, C, generator=g)
        tokens = torch.randint(0, V, (units, C), generator=g)
        sc = torch.rand(K, generator=g) < TRAINING_SELF_CONDITIONING_P
        if coupled:  # (pair, 2) -> K: member 0 at t(v), member 1 at t(1 - v)
            block = block.repeat_interleave(2)
            v = torch.stack([v, 1 - v], 1).flatten()
            u = u.repeat_interleave(2, 0)
            tokens = tokens.repeat_interleave(2, 0)
        out["block"].append(block)
        out["t"].append(eps + (1 - eps) * v)
        out["u"].append(u)
        out["tokens"].append(tokens)
        out["sc"].append(sc)
    res = {k: torch.stack(v, 1) for k, v in out.items()}  # (K, B, ...)
    if self_conditioning == "off":
        res["sc"] = None
    elif self_conditioning == "on":
        res["sc"] = torch.ones_like(res["sc"])
    elif self_conditioning != "training":
        raise ValueError(f"self_conditioning={self_conditioning!r}; choose one of {list(SELF_CONDITIONING)}.")
    return res


def uniform_noise_estimate(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    *,
    seeds: Tensor,
    fill_token_id: int,
    num_samples: int = 2,
    estimator: str = "block_random",
    self_conditioning: str = "off",
    prediction: str = "denoiser",
    draws: dict | None = None,
) -> LikelihoodEstimate:
    """Uniform-noise block-diffusion estimate of log pi(completion | prompt) (see the module docstring).

    model: DiffusionGemmaForBlockDiffusion, possibly inside DDP / FSDP / PEFT (always called as model(...)).
    prompt_ids, prompt_mask (B, P) left-padded; completion_ids, completion_mask (B, L) right-padded, L a multiple of
    C = canvas_length (1 up to and including the first EOS). seeds (B,) one per row. draws: the random inputs
    (`draw_samples`' dict) to use instead of drawing them (tests fix t, the corruption and self-conditioning).
    Returns a LikelihoodEstimate: token_logps (B, L), seq_logps (B,) per-token mean scale, sample_seq_logps (B, K).
    """
    if estimator not in UNIFORM_ESTIMATORS:
        raise ValueError(f"estimator={estimator!r}; DiffusionGemma's estimators are {list(UNIFORM_ESTIMATORS)}.")
    if estimator == "block_random_coupled" and num_samples % 2:
        raise ValueError(f"num_samples={num_samples} must be even for 'block_random_coupled' (antithetic pairs).")
    inner = unwrap_model(model)
    C = int(inner.config.canvas_length)
    V = int(inner.config.text_config.vocab_size)
    B, L = completion_ids.shape
    if L % C:
        raise ValueError(f"completion length {L} is not a multiple of canvas_length {C}.")
    mask = completion_mask.bool()
    n_tokens = mask.sum(-1)  # (B,)
    n_blocks = (n_tokens - 1).clamp(min=0) // C + 1  # (B,) blocks the completion occupies
    targets = fill_after_eos(completion_ids, completion_mask, fill_token_id)  # (B, L)
    if draws is None:
        draws = draw_samples(seeds.cpu(), n_blocks.cpu(), C, V, num_samples, estimator == "block_random_coupled",
                             self_conditioning)  # fmt: skip
    device = completion_ids.device
    draws = {k: (v.to(device) if v is not None else None) for k, v in draws.items()}
    K = draws["t"].shape[0]

    enc = context_inputs(prompt_ids, prompt_mask, targets)
    n_prompt = prompt_mask.long().sum(-1)  # (B,)
    P = prompt_ids.shape[1]
    cache = None
    # last scored token (the EOS, or the last token): the EOS-fill terms are added to it
    last = (n_tokens - 1).clamp(min=0)  # (B,)
    token_sum = torch.zeros(B, L, device=device)
    entropy_sum = torch.zeros(B, L, device=device)
    sample_totals = []
    rows = torch.arange(B, device=device)
    for k in range(K):
        block = draws["block"][k]  # (B,)
        idx = block[:, None] * C + torch.arange(C, device=device)  # (B, C) completion positions of the block
        clean = targets.gather(1, idx)  # (B, C)
        canvas = torch.where(draws["u"][k] < draws["t"][k][:, None], draws["tokens"][k], clean)  # (B, C)
        sc = draws["sc"][k] if draws["sc"] is not None else None
        dec = decoder_inputs(enc["attention_mask"], n_prompt, P, block, canvas)
        logits, cache = canvas_logits(model, cache, enc if k == 0 else None, dec, sc)  # (B, C, V)
        logp, ent = target_logps(logits, clean, canvas, draws["t"][k], prediction)  # (B, C)
        scale = n_blocks.to(logp.dtype)[:, None]
        inside = mask.gather(1, idx)  # (B, C) real completion tokens (the rest is EOS fill)
        contrib = torch.zeros(B, L, device=device, dtype=logp.dtype).scatter(1, idx, logp * inside) * scale
        fill = (logp * ~inside).sum(-1) * n_blocks  # (B,) EOS-fill terms, moved onto the last real token
        contrib = contrib + torch.zeros_like(contrib).index_put((rows, last), fill)
        token_sum = token_sum + contrib
        ent_c = torch.zeros(B, L, device=device).scatter(1, idx, ent * inside)
        entropy_sum = entropy_sum + ent_c * n_blocks[:, None]
        sample_totals.append(contrib.sum(-1).detach() / n_tokens.clamp(min=1))
    token_logps = token_sum / K * mask  # (B, L)
    seq = token_logps.sum(-1) / n_tokens.clamp(min=1)
    return LikelihoodEstimate(
        token_logps=token_logps,
        seq_logps=seq,
        token_entropy=(entropy_sum / K * mask).detach(),
        eubo=None,
        sample_seq_logps=torch.stack(sample_totals, 1),
    )


def estimator_passes(num_samples: int, self_conditioning: str) -> int:
    """Decoder forward passes per completion (the first sample's also encodes the context): K without
    self-conditioning, 2 K with it ("on", and "training", whose first pass always runs, as in TRL's example)."""
    return num_samples * (1 if self_conditioning == "off" else 2)
