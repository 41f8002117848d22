"""One calling convention for every masked diffusion LM: `adapter(input_ids, attention_mask) -> aligned logits`.

The sampler, the likelihood estimators and the trainer only ever call a `DiffusionAdapter`. It hides what differs
between model families, reading each fact from the model's family object, which it is handed (`as_diffusion_lm` in `diffusion/family.py`
detects it):
- logit alignment: logits[:, i] predicts token i, except for families with `shifted_logits` (Dream / DiffuCoder,
  trained from an autoregressive model: output i-1 holds the prediction for token i), which the adapter shifts back
  (see `DiffusionAdapter.__call__`);
- LLaDA's approximate canvas cache, for families with `supports_canvas_cache`;
- block diffusion (SDAR, TraDo, LLaDA2): their sampler and estimator call the model directly (KV cache, 4-D masks);
  the adapter's plain call gives the block-causal logits.
Padding is never attended: a 2D attention mask goes to the model (which hides padded keys only), together with
position ids that count real tokens only, so a left-padded row gets exactly the logits of the row alone, even for
absolute position embeddings. The special ids (mask, EOS / end-of-turn, pad) come from the model config or the
tokenizer, never from constants.
"""

from __future__ import annotations

import functools
import inspect

import torch
import torch.nn.functional as F
from torch import nn

from stabledrl_trl.models.bidirectional import padding_position_ids

# Tokens that end a completion besides EOS: chat end-of-turn tokens of common templates, and DiffuCoder's
# `<|dlm_pad|>` (DiffuCoder cuts its output at the first one). A completion ends at them as at EOS.
END_OF_TURN_TOKENS = ("<|eot_id|>", "<|im_end|>", "<|dlm_pad|>")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The transformers model inside DDP / FSDP (`.module`), PEFT (`get_base_model()`) and torch.compile wrappers."""
    for _ in range(8):  # wrappers nest a few levels at most (e.g. DDP around PEFT around the model)
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, nn.Module) and not hasattr(model, "config"):
            model = model.module
        else:
            return model
    return model


def as_id_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def _position_offset(inner: nn.Module) -> int:
    """First position index of a sequence: padding_idx + 1 for RoBERTa-style embeddings (they number positions from
    there, computed from the padding), 0 for everything else (BERT's absolute positions, RoPE)."""
    for module in inner.modules():
        if hasattr(module, "create_position_ids_from_input_ids") and getattr(module, "padding_idx", None) is not None:
            return int(module.padding_idx) + 1
    return 0


def realign_shifted_logits(logits: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Dream-style logits (output i-1 predicts token i) -> logits[:, i] predicting token i.

    A row's first real token has no real output before it; it gets its own output instead, as Dream's sampler does
    for position 0. It is always a prompt token, never a masked position that is predicted, and with this rule a
    left-padded row gets exactly the logits of the row alone.
    logits: (B, L, V); attention_mask: (B, L) with 1 for real tokens, or None (no padding).
    """
    shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)  # (B, L, V): output i-1 at position i
    if attention_mask is None:
        return shifted
    real = attention_mask.bool()  # (B, L)
    previous_real = F.pad(real[:, :-1], (1, 0), value=False)  # (B, L): is token i-1 real
    first_real = real & ~previous_real  # (B, L)
    return torch.where(first_real[..., None], logits, shifted)


class DiffusionAdapter:
    """Calls a masked diffusion LM and returns logits aligned with the input positions, in float32.

    Attributes: `model` (what is called, possibly a DDP / FSDP / PEFT wrapper), `family_object` (its
    `DiffusionFamily`), `family` (that family's name), `mask_token_id`, `eos_token_ids` (EOS and end-of-turn ids),
    `pad_token_id`. Build it with `as_diffusion_lm` (`diffusion/family.py`), which detects the family; this module
    is handed the family object and never imports the registry (the families build on the adapter).
    """

    def __init__(self, model: nn.Module, family, mask_token_id: int, eos_token_ids, pad_token_id: int):
        if isinstance(family, str) or not all(
            hasattr(family, fact) for fact in ("name", "shifted_logits", "supports_canvas_cache")
        ):
            raise TypeError(
                f"DiffusionAdapter needs the model's DiffusionFamily object, got {family!r}; pass "
                "stabledrl_trl.diffusion.family.get_family(name), or build the adapter with as_diffusion_lm."
            )
        eos_token_ids = tuple(dict.fromkeys(int(t) for t in eos_token_ids))
        if not eos_token_ids:
            raise ValueError(
                "No EOS token id found in the model config or the tokenizer; pass eos_token_ids=[...] to "
                "as_diffusion_lm (e.g. the tokenizer's end-of-sequence / [SEP] id)."
            )
        if pad_token_id == mask_token_id:
            raise ValueError(
                f"pad_token_id == mask_token_id == {mask_token_id}: padding would read as masked positions. Use a "
                "different pad token, e.g. `tokenizer.pad_token = tokenizer.eos_token`, or pass pad_token_id=..."
            )
        if mask_token_id in eos_token_ids:
            raise ValueError(f"mask_token_id={mask_token_id} is also an EOS id {eos_token_ids}; fix the special ids.")
        self.model = model
        self.family_object = family
        self.family = family.name
        self.mask_token_id = int(mask_token_id)
        self.eos_token_ids = eos_token_ids
        self.pad_token_id = int(pad_token_id)
        self.position_offset = _position_offset(unwrap_model(model))

    @property
    def config(self):
        """The config of the unwrapped transformers model."""
        return unwrap_model(self.model).config

    # The sampler and the estimators ask for logits at some positions only (see `__call__`).
    accepts_logits_to_keep = True

    @property
    def supports_canvas_cache(self) -> bool:
        """Whether the model's forward accepts the approximate `CanvasCache` (LLaDA: Fast-dLLM-style prefix / dual
        cache); the family says."""
        return self.family_object.supports_canvas_cache

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        logits_to_keep: int | torch.Tensor | None = None,
        cache=None,
    ) -> torch.Tensor:
        """input_ids (B, n), attention_mask (B, L) of 1 (real) / 0 (padding) or None -> logits (B, K, V) float32.

        logits[:, k] is the model's distribution for the token at position index[k] of the input, where index is
        `logits_to_keep` (a 1-D long tensor of positions, or an int n for the last n positions; None = all, K = n).
        Only those positions go through the output head when the model supports transformers' `logits_to_keep`
        (LLaDA, Dream); a masked LM without it computes all logits and the adapter keeps the requested ones.
        For Dream, output i-1 predicts token i and is returned at position i (see `realign_shifted_logits`).
        cache: a `CanvasCache` (LLaDA only). While it records, a plain forward (n = L) whose keys are stored; in its
        windowed phase input_ids are the canvas positions [window_start, window_start + n) and attention_mask
        still covers the whole canvas (L >= n).
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}.")
        window_start = None if cache is None else cache.window_start
        if cache is not None and not self.supports_canvas_cache:
            raise ValueError(f"family={self.family!r} has no canvas cache path; only LLaDA does (use cache='none').")
        n = input_ids.shape[1]
        kwargs = {}
        if attention_mask is not None:
            expected = (input_ids.shape[0], n if window_start is None else attention_mask.shape[1])
            if tuple(attention_mask.shape) != expected or (
                window_start is not None and window_start + n > expected[1]
            ):
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape "
                    f"{tuple(input_ids.shape)} (or cover the whole canvas with a windowed cache)."
                )
            # Positions count real tokens only, so left padding does not shift them (exact for absolute positions).
            position_ids = padding_position_ids(attention_mask) + self.position_offset  # (B, L)
            if window_start is not None:
                position_ids = position_ids[:, window_start : window_start + n]  # (B, n)
            kwargs = {"attention_mask": attention_mask, "position_ids": position_ids}
        if cache is not None:
            kwargs["cache"] = cache
        index = None
        if logits_to_keep is not None:
            if isinstance(logits_to_keep, int):
                if not 0 < logits_to_keep <= n:
                    raise ValueError(f"logits_to_keep={logits_to_keep} must be in [1, {n}] for {n} input positions.")
                index = torch.arange(n - logits_to_keep, n, device=input_ids.device)
            else:
                index = logits_to_keep.to(device=input_ids.device, dtype=torch.long).reshape(-1)  # (K,)
        if self.family_object.shifted_logits:
            logits = self._shifted_logits(input_ids, attention_mask, index, kwargs)
        elif index is not None and self._model_keeps_logits:
            out = self.model(input_ids=input_ids, logits_to_keep=index, **kwargs)
            logits = out.logits if hasattr(out, "logits") else out[0]  # (B, K, V)
        else:
            out = self.model(input_ids=input_ids, **kwargs)
            logits = out.logits if hasattr(out, "logits") else out[0]  # (B, n, V)
            if index is not None:
                logits = logits.index_select(1, index)  # (B, K, V)
        return logits.float()

    @functools.cached_property
    def _model_keeps_logits(self) -> bool:
        """Whether the model's forward takes transformers' `logits_to_keep` (LLaDA, Dream; not BERT-style LMs)."""
        return "logits_to_keep" in inspect.signature(unwrap_model(self.model).forward).parameters

    def _shifted_logits(self, input_ids, attention_mask, index, kwargs):
        """Output i-1 predicts token i (Dream; a row's first real token keeps its own output)."""
        if index is None or not self._model_keeps_logits:
            out = self.model(input_ids=input_ids, **kwargs)
            logits = realign_shifted_logits(out.logits if hasattr(out, "logits") else out[0], attention_mask)
            return logits if index is None else logits.index_select(1, index)
        previous = (index - 1).clamp(min=0)  # (K,)
        union, inverse = torch.unique(torch.cat([previous, index]), return_inverse=True)  # (U,), (2K,)
        out = self.model(input_ids=input_ids, logits_to_keep=union, **kwargs)
        kept = out.logits if hasattr(out, "logits") else out[0]  # (B, U, V)
        k = index.shape[0]
        shifted = kept.index_select(1, inverse[:k])  # (B, K, V) output at i-1
        own = kept.index_select(1, inverse[k:])  # (B, K, V) output at i
        if attention_mask is None:
            first_real = (index == 0)[None, :].expand(input_ids.shape[0], -1)  # (B, K)
        else:
            real = attention_mask.bool()  # (B, L)
            previous_real = F.pad(real[:, :-1], (1, 0), value=False)  # (B, L)
            first_real = (real & ~previous_real).index_select(1, index)  # (B, K)
        return torch.where(first_real[..., None], own, shifted)

    def __repr__(self) -> str:
        return (
            f"DiffusionAdapter(family={self.family!r}, model={type(self.model).__name__}, "
            f"mask_token_id={self.mask_token_id}, eos_token_ids={self.eos_token_ids}, pad_token_id={self.pad_token_id})"
        )


# The mask id of a family without a mask token (`DiffusionFamily.mask_free`): no token id equals it.
NO_MASK_TOKEN = -1


def __getattr__(name: str):
    """`as_diffusion_lm` is defined in `diffusion/family.py` (it detects the model's family, so it sits above the
    families, which build on this module); it stays importable from here."""
    if name == "as_diffusion_lm":
        from .family import as_diffusion_lm

        return as_diffusion_lm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
