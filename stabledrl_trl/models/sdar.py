"""SDAR (and TraDo) as a native transformers model: the Qwen3 implementation with block-causal attention.

SDAR (JetLM/SDAR-*-Chat, arXiv 2510.06303) and TraDo (Gen-Verse/TraDo-*-Instruct, SDAR after TraceRL) are block
diffusion LMs: the Qwen3 architecture (q/k RMSNorm, GQA, RoPE) with Qwen3's weight names, trained so that a block of
`block_size` masked positions is denoised while attending to every earlier (clean) block. Their hub checkpoints ship
remote code for transformers 4.52 (it imports flash_attn); this module instead reuses transformers' `Qwen3Model` /
`Qwen3ForCausalLM` and changes only the attention mask:

    block(p) = p // block_size           (blocks aligned at absolute position 0)
    query at position p_q sees key at p_k  iff  key is real and block(p_k) <= block(p_q)

i.e. causal across blocks, bidirectional inside a block (`stabledrl_trl.models.block_attention`, shared with LLaDA2).
Positions count real tokens only (`cumsum(mask) - 1`), so blocks are aligned on a row's real tokens and a left-padded
row gives exactly the logits of the row alone. Logits are not shifted: `logits[:, i]` predicts token i.

Calling conventions of `SDARModel.forward` (all build the block-causal mask above unless a 4-D mask is given):
- no mask: one unpadded sequence per row, positions 0..L-1 (what SDAR computes at inference);
- 2-D `attention_mask` (B, past + L), 1 = real: padding hidden, positions from its cumsum;
- with a `cache` (`DynamicCache`) of earlier blocks: queries are the new tokens, keys the cached ones plus the new
  ones; key positions come from the 2-D mask over (past + L) columns (or 0..past+L-1 without one). A denoising step
  that must not be stored is followed by `cache.crop(past)` (see stabledrl_trl.diffusion.block_sampler);
- a 4-D boolean `attention_mask` (B, 1, L, past + L), True = attend, is used as is (e.g. the two-copy "staircase"
  layout of stabledrl_trl.diffusion.block_estimators). Pass `position_ids` with it.
The 4-D mask is given to every layer directly (never through `create_causal_mask`, which would read repeated position
ids as packed sequences); for eager attention it is turned into the additive float mask eager adds.

`SDARConfig` reads SDAR's config.json (`block_size`, `mask_token_id`, `rope_theta`, `tie_word_embeddings`, ...) and
writes it back in SDAR's keys (`rope_theta` / `rope_scaling` instead of transformers 5's `rope_parameters`, the hub's
`auto_map` and `architectures` kept), so a saved model loads with SDAR's own code too. The `auto_map` is never used
here: importing stabledrl_trl registers model_type "sdar" with the Auto classes.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from transformers import Qwen3Config
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.qwen3.modeling_qwen3 import Qwen3ForCausalLM, Qwen3Model, Qwen3PreTrainedModel

from .bidirectional import disable_causal_attention
from .block_attention import block_causal_inputs, check_attention_implementation
from .block_attention import block_causal_mask as block_causal_mask  # SDAR's masks, importable from here as before
from .block_attention import two_copy_block_mask as two_copy_block_mask
from .config_checks import check_native_config
from .original_format import config_json_string
from .registration import register_auto_classes


class SDARConfig(Qwen3Config):
    """A `Qwen3Config` with model_type "sdar", the diffusion `block_size` and `mask_token_id`.

    block_size: tokens per diffusion block (4 on the released SDAR / TraDo checkpoints).
    mask_token_id: the `<|MASK|>` token (151669 on the hub checkpoints).
    The hub config's `attn_implementation` ("flex_attention", the kernel SDAR's remote code uses) does not choose the
    kernel here (this implementation runs on SDPA, the default, or eager attention); it is kept as
    `original_attn_implementation` and written back by `to_dict`.
    """

    model_type = "sdar"

    block_size: int = 4
    mask_token_id: int | None = None
    fuse_cross_entropy: bool = True  # SDAR's training-kernel flag; no effect here, kept so it is saved back
    # The hub's auto_map (SDAR's remote code) is kept and saved back, never used here; a config without one reads {}
    # (code that looks for remote code, e.g. TRL's create_model_from_path, then falls back to the Auto classes).
    auto_map: ClassVar[dict] = {}

    def __post_init__(self, **kwargs):
        # SDAR's remote code was written for flex / flash attention; the kernel is chosen at load time here.
        self.original_attn_implementation = kwargs.pop("attn_implementation", None)
        if kwargs.get("auto_map"):
            self.auto_map = kwargs.pop("auto_map")
        kwargs.pop("auto_map", None)
        check_native_config(self, "SDAR", sizes_only=True)  # before Qwen3Config divides by them
        super().__post_init__(**kwargs)
        check_native_config(self, "SDAR")
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"SDAR config block_size={self.block_size!r} must be a positive int (SDAR uses 4).")
        if "sliding_attention" in self.layer_types:
            raise ValueError(
                "SDAR config enables sliding-window attention (use_sliding_window=True), which this block-causal "
                "implementation does not support; set use_sliding_window=False."
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"SDAR config mask_token_id={self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})."
            )

    def to_dict(self) -> dict:
        """Serialise in SDAR's keys: `rope_theta` and `rope_scaling` (what SDAR's transformers-4 code reads)."""
        output = super().to_dict()
        rope = dict(output.pop("rope_parameters", None) or {})
        output["rope_theta"] = rope.pop("rope_theta", self.default_theta)
        output["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
        original_attn = output.pop("original_attn_implementation", None)
        if original_attn is not None:
            output["attn_implementation"] = original_attn
        if self.auto_map:
            output["auto_map"] = self.auto_map
        output.pop("layer_types", None)  # derived from use_sliding_window / max_window_layers, which are saved
        output.setdefault("architectures", ["SDARForCausalLM"])
        return output

    def to_json_string(self, use_diff: bool = True) -> str:
        """config.json's text: `to_dict`'s keys plus `torch_dtype` (see `original_format.config_json_string`)."""
        return config_json_string(self, use_diff)


class SDARModel(Qwen3Model):
    """SDAR's transformer body: `Qwen3Model` with block-causal attention and padding-aware positions."""

    config_class = SDARConfig
    config: SDARConfig

    def __init__(self, config: SDARConfig):
        super().__init__(config)
        disable_causal_attention(self)  # SDPA must never add its own causal mask

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        """Inputs as `Qwen3Model.forward`; the attention is block-causal (see the module docstring)."""
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        implementation = check_attention_implementation(self.config, "SDAR")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, L, D)
        B, L = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        past = cache.get_seq_length() if cache is not None else 0

        if attention_mask is not None and attention_mask.dim() == 4:
            if position_ids is None:
                position_ids = torch.arange(past, past + L, device=device)[None].expand(B, L)
            mask = attention_mask.bool()
        else:
            position_ids, mask = block_causal_inputs(
                attention_mask, position_ids, B, L, past, device, self.config.block_size
            )
        if implementation == "eager":  # eager adds its mask to the scores
            mask = torch.zeros(mask.shape, dtype=inputs_embeds.dtype, device=device).masked_fill(
                ~mask, torch.finfo(inputs_embeds.dtype).min
            )
        return super().forward(
            inputs_embeds=inputs_embeds,
            attention_mask={"full_attention": mask},
            position_ids=position_ids,
            cache=cache,
            use_cache=use_cache if cache is not None else False,
            **kwargs,
        )


class SDARForCausalLM(Qwen3ForCausalLM):
    """SDAR with its output head; `logits[:, i]` predicts token i (no shift). Weight names are Qwen3's (SDAR's own).

    The class name is the one SDAR's hub checkpoints list under `architectures`; it is registered for AutoModel and
    AutoModelForCausalLM. The output head is tied to the embedding when `tie_word_embeddings` (1.7B) and separate
    otherwise (4B, 8B).
    """

    config_class = SDARConfig
    config: SDARConfig

    def __init__(self, config: SDARConfig):
        # Qwen3ForCausalLM.__init__ would first build a causal Qwen3Model; build the block-causal body directly.
        Qwen3PreTrainedModel.__init__(self, config)
        self.model = SDARModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        self.loss_type = "ForMaskedLM"  # labels[i] is predicted at position i: no causal shift

    def generate(self, *args, **kwargs):
        raise NotImplementedError(
            "SDAR is a block diffusion model: left-to-right `generate` does not apply. Use "
            "stabledrl_trl.diffusion.block_sampler.block_generate."
        )


def register_sdar() -> None:
    """Register SDAR (model_type "sdar") with AutoConfig, AutoModel and AutoModelForCausalLM."""
    register_auto_classes("sdar", SDARConfig, SDARForCausalLM)
