"""LLaDA2 (inclusionAI LLaDA2.0 / 2.1 mini and flash) as a native transformers model: MoE masked block diffusion.

LLaDA2 (model_type "llada2_moe", class `LLaDA2MoeModelLM`) is a mixture-of-experts transformer trained as a block
diffusion LM: a block of masked positions is denoised while it attends to every earlier (clean) block. Its hub
checkpoints ship remote code for transformers 4.57; this module is an independent implementation that reads the same
config.json keys and weight names, built from transformers' DeepSeek-V3 blocks where they match:

    h = h + dense(attn(qk_norm(query_key_value(input_layernorm(h)))))             # GQA, partial RoPE
    h = h + mlp(post_attention_layernorm(h))                                        # dense SwiGLU (first layers)
    mlp(x) = sum_{e in top-k} w_e * expert_e(x) + shared_experts(x)                # MoE layers
    logits = lm_head(norm(h))                                                       # logits[:, i] predicts token i

- attention: fused `query_key_value` projection, rows [H query heads | KV key heads | KV value heads]; per-head RMSNorm
  of q and k (`query_layernorm`, `key_layernorm`, one weight shared by the heads) before RoPE; RoPE on the first
  `head_dim * partial_rotary_factor` dims of each head (rotate-half inside that slice), the rest pass through;
- router (`mlp.gate`, float32): s = sigmoid(x W^T); the selection score s + expert_bias picks `topk_group` of the
  `n_group` expert groups (a group's score = sum of its two best) and then the `num_experts_per_tok` best experts;
  the weights are the chosen experts' unbiased s, renormalised, times `routed_scaling_factor` (DeepSeek-V3's rule,
  `DeepseekV3TopkRouter`, with LLaDA2's names). No auxiliary balance loss;
- RMSNorm and the SwiGLU MLPs are `DeepseekV3RMSNorm` / `DeepseekV3MLP` (names gate_proj, up_proj, down_proj).

Attention is block-causal with blocks aligned at absolute position 0 (`stabledrl_trl.models.block_attention`):
query at position p_q sees a real key at p_k iff p_k // block_size <= p_q // block_size. Calling conventions of
`LLaDA2MoeModel.forward` (the same as `SDARModel.forward`, so the block sampler and the staircase estimator drive both):
- no mask: one unpadded sequence per row, positions 0..L-1 (what LLaDA2's `generate` computes);
- 2-D `attention_mask` (B, past + L), 1 = real: padding hidden, positions count real tokens only, so a left-padded
  row gives exactly the logits of the row alone;
- a `cache` (`DynamicCache`) of earlier complete blocks: queries are the new tokens; exact because block-causality
  never lets an earlier block see a later one;
- a 4-D `attention_mask` (B, 1, L, past + L): boolean (True = attend) or additive float (0 = attend, -inf or the
  dtype's minimum = blocked, the original's form), e.g. the [noisy | clean] "staircase" layout. Pass `position_ids`.

`LLaDA2MoeConfig` reads the hub config.json and writes it back with the same keys (plus `block_size` and
`mask_token_id`, which this package adds and the original code ignores); the hub's `auto_map` is kept for saving and
never used: importing stabledrl_trl registers model_type "llada2_moe" with the Auto classes.

PEFT target names: attention `query_key_value`, `dense`; experts and dense / shared MLPs `gate_proj`, `up_proj`,
`down_proj` (routed experts only: a regex such as `r".*experts\\.\\d+\\.(gate|up|down)_proj"`). The router `gate` is
an `nn.Module` with a float32 weight, not an `nn.Linear`, and is never a LoRA target.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import MoeCausalLMOutputWithPast, MoeModelOutputWithPast
from transformers.modeling_utils import slice_logits_to_keep
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP, DeepseekV3RMSNorm

from .block_attention import block_causal_inputs, check_attention_implementation
from .config_checks import check_native_config
from .original_format import config_json_string
from .registration import register_auto_classes

# Keys of the hub config that the original modeling code never reads: the behaviour they name is hard-coded there
# (and here). A value describing other behaviour is rejected instead of silently ignored.
FIXED_LLADA2_OPTIONS = {
    "score_function": ("sigmoid",),
    "router_dtype": ("fp32", None),
    "moe_router_enable_expert_bias": (True,),
    "norm_topk_prob": (True,),
    "norm_softmax": (False,),
    "norm_head": (False,),
    "use_rmsnorm": (True,),
    "use_sliding_window": (False,),
    "using_split_qkv_in_self_attention": (False,),
    "hidden_act": ("silu",),
}


class LLaDA2MoeConfig(PreTrainedConfig):
    """Configuration of a LLaDA2 model, in the hub config's keys (defaults: LLaDA2.0-mini).

    block_size: tokens per diffusion block (not in the hub config; LLaDA2's generate uses block_length 32).
    mask_token_id: the `<|mask|>` token (156895 in the real vocabulary; the hub config does not name it: the
        tokenizer's mask token is used when this is None).
    """

    model_type = "llada2_moe"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int | None = 128
    hidden_act: str = "silu"
    use_qkv_bias: bool = False
    use_bias: bool = False
    use_qk_norm: bool = True
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    embedding_dropout: float = 0.0
    attention_dropout: float = 0.0
    output_dropout: float = 0.0
    initializer_range: float = 0.02
    max_position_embeddings: int = 32768
    rope_theta: float = 600000.0
    partial_rotary_factor: float = 0.5
    rotary_dim: int | None = None
    num_experts: int = 256
    num_shared_experts: int = 1
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    moe_intermediate_size: int = 512
    first_k_dense_replace: int = 1
    routed_scaling_factor: float = 2.5
    output_router_logits: bool = False
    use_cache: bool = False
    pad_token_id: int | None = 156892
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    block_size: int = 32
    mask_token_id: int | None = None
    # The hub's auto_map (LLaDA2's remote code) is kept and saved back, never used here.
    auto_map: ClassVar[dict] = {}

    def __post_init__(self, **kwargs):
        for name, allowed in FIXED_LLADA2_OPTIONS.items():
            value = kwargs.get(name, getattr(self, name, allowed[0]))
            if value not in allowed:
                raise ValueError(
                    f"LLaDA2 option {name}={value!r} is not what LLaDA2's modeling code computes (supported: "
                    f"{', '.join(repr(v) for v in allowed)}); use a checkpoint with {name}={allowed[0]!r}."
                )
        rope_scaling = kwargs.pop("rope_scaling", None)
        if rope_scaling:
            raise ValueError(
                f"LLaDA2 config rope_scaling={rope_scaling!r}: RoPE scaling is not implemented here; use "
                "rope_scaling=None (the released LLaDA2 checkpoints)."
            )
        if kwargs.get("auto_map"):
            self.auto_map = dict(kwargs["auto_map"])
        kwargs.pop("auto_map", None)
        # kept and written back; the behaviour is fixed (FIXED_LLADA2_OPTIONS) or unused (dropouts at inference)
        self.original_options = {k: kwargs.pop(k) for k in list(kwargs) if k in FIXED_LLADA2_OPTIONS}
        check_native_config(self, "LLaDA2", sizes_only=True)  # before sizes are divided by
        super().__post_init__(**kwargs)
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        check_native_config(self, "LLaDA2")
        for name in ("block_size", "num_experts", "num_experts_per_tok", "n_group", "topk_group", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LLaDA2 config {name}={value!r} must be a positive int.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"LLaDA2 config num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}."
            )
        if self.num_experts % self.n_group:
            raise ValueError(
                f"LLaDA2 config num_experts={self.num_experts} must be a multiple of n_group={self.n_group}."
            )
        per_group = self.num_experts // self.n_group
        if self.topk_group > self.n_group or self.num_experts_per_tok > self.topk_group * per_group or per_group < 2:
            raise ValueError(
                f"LLaDA2 config: num_experts_per_tok={self.num_experts_per_tok} experts must fit in topk_group="
                f"{self.topk_group} of n_group={self.n_group} groups of {per_group} (at least 2) experts."
            )
        rot = self.rotary_dims
        if rot % 2 or not 0 < rot <= self.head_dim:
            raise ValueError(
                f"LLaDA2 config partial_rotary_factor={self.partial_rotary_factor} gives {rot} rotary dims of "
                f"head_dim={self.head_dim}; it must give an even number in (0, head_dim]."
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"LLaDA2 config mask_token_id={self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})."
            )

    @property
    def rotary_dims(self) -> int:
        """Dims of each q / k head that RoPE rotates: int(head_dim * partial_rotary_factor)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def to_dict(self) -> dict:
        """Serialise in the hub config's keys (the fixed options and `rope_scaling` included, `auto_map` kept)."""
        output = super().to_dict()
        output.update(output.pop("original_options", None) or {})
        output["rope_scaling"] = None
        if self.auto_map:
            output["auto_map"] = self.auto_map
        output.setdefault("architectures", ["LLaDA2MoeModelLM"])
        return output

    def to_json_string(self, use_diff: bool = True) -> str:
        """config.json's text: `to_dict`'s keys plus `torch_dtype` (see `original_format.config_json_string`)."""
        return config_json_string(self, use_diff)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class LLaDA2MoeRotaryEmbedding(nn.Module):
    """cos / sin of RoPE for the rotated slice: angle_i = position * theta ** (-2i / rotary_dims)."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.register_buffer("inv_freq", self.compute_inv_freq(config), persistent=False)

    @staticmethod
    def compute_inv_freq(config: LLaDA2MoeConfig) -> torch.Tensor:
        rot = config.rotary_dims
        return 1.0 / config.rope_theta ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)  # (rot / 2,)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # (B, L, rot / 2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (B, L, rot)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def apply_partial_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] dims of x (B, H, L, hd); the other dims pass through."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, rot)
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


class LLaDA2MoeAttention(nn.Module):
    """Grouped-query attention with a fused qkv projection, q/k RMSNorm and partial RoPE (no causal mask of its own)."""

    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.num_heads, self.num_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.query_key_value = nn.Linear(
            config.hidden_size, (self.num_heads + 2 * self.num_kv) * self.head_dim, bias=config.use_qkv_bias
        )
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.use_bias)
        if config.use_qk_norm:
            self.query_layernorm = DeepseekV3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.key_layernorm = DeepseekV3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden, cos, sin, mask, cache=None):
        """hidden (B, L, D); cos / sin (B, L, rot); mask (B, 1, L, past + L) bool, True = attend."""
        B, L, _ = hidden.shape
        qkv = self.query_key_value(hidden).view(B, L, self.num_heads + 2 * self.num_kv, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv, self.num_kv], dim=2)  # (B, L, h, hd)
        if self.config.use_qk_norm:
            q, k = self.query_layernorm(q), self.key_layernorm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, h, L, hd)
        q, k = apply_partial_rotary(q, cos, sin), apply_partial_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, kv, past + L, hd)
        groups = self.num_heads // self.num_kv
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)  # (B, H, K, hd)
        scale = 1.0 / math.sqrt(self.head_dim)
        dropout = self.config.attention_dropout if self.training else 0.0
        if (self.config._attn_implementation or "sdpa") == "eager":
            scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, L, K)
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
            probs = F.dropout(torch.softmax(scores.float(), dim=-1).to(q.dtype), dropout, self.training)
            out = probs @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale)
        return self.dense(out.transpose(1, 2).reshape(B, L, self.num_heads * self.head_dim))


class LLaDA2MoeGate(nn.Module):
    """LLaDA2's router: sigmoid scores, group-limited top-k chosen with `expert_bias`, weights from unbiased scores.

    The maths of transformers' `DeepseekV3TopkRouter` (sigmoid, n_group / topk_group, norm_topk_prob,
    routed_scaling_factor) with LLaDA2's parameter names, in float32, and the chosen experts in descending order of
    their selection score. `expert_load` counts the tokens routed to each expert since the last `reset_expert_load`.
    """

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        self.register_buffer("expert_bias", torch.zeros(config.num_experts), persistent=True)
        self.register_buffer("expert_load", torch.zeros(config.num_experts), persistent=False)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden (N, D) -> router logits (N, E) float32, chosen experts (N, k), their weights (N, k) float32."""
        logits = F.linear(hidden.float(), self.weight.float())  # (N, E)
        scores = logits.sigmoid()
        choice = scores + self.expert_bias.float()  # (N, E): the bias only steers the choice
        grouped = choice.view(-1, self.n_group, self.num_experts // self.n_group)  # (N, G, E / G)
        group_scores = grouped.topk(2, dim=-1).values.sum(-1)  # (N, G)
        keep_groups = group_scores.topk(self.topk_group, dim=-1).indices  # (N, topk_group)
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, keep_groups, True)  # (N, G)
        expert_mask = group_mask[:, :, None].expand_as(grouped).reshape(-1, self.num_experts)  # (N, E)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
        topk_idx = choice.topk(self.top_k, dim=-1, sorted=True).indices  # (N, k), best first
        weights = scores.gather(1, topk_idx)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * self.routed_scaling_factor
        with torch.no_grad():
            self.expert_load += torch.bincount(topk_idx.flatten(), minlength=self.num_experts).to(self.expert_load)
        return logits, topk_idx, weights

    def reset_expert_load(self) -> None:
        self.expert_load.zero_()


class LLaDA2MoeSparseMoeBlock(nn.Module):
    """Routed SwiGLU experts (`experts.E`) plus always-on shared experts; output = sum_k w_k expert_k(x) + shared(x)."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__()
        self.num_experts = config.num_experts
        self.experts = nn.ModuleList(
            DeepseekV3MLP(config, intermediate_size=config.moe_intermediate_size) for _ in range(config.num_experts)
        )
        self.gate = LLaDA2MoeGate(config)
        self.shared_experts = (
            DeepseekV3MLP(config, intermediate_size=config.moe_intermediate_size * config.num_shared_experts)
            if config.num_shared_experts
            else None
        )

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (B, L, D) -> output (B, L, D), router logits (B * L, E)."""
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])  # (N, D)
        logits, topk_idx, weights = self.gate(flat)
        out = torch.zeros_like(flat)
        for e in torch.unique(topk_idx).tolist():  # only the experts some token chose run (and get a gradient)
            token, slot = torch.where(topk_idx == e)
            y = self.experts[e](flat[token]) * weights[token, slot, None].to(flat.dtype)
            out = out.index_add(0, token, y.to(out.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(flat)
        return out.view(shape), logits


class LLaDA2MoeDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int):
        super().__init__()
        self.attention = LLaDA2MoeAttention(config, layer_idx)
        dense = layer_idx < config.first_k_dense_replace
        self.mlp = DeepseekV3MLP(config) if dense else LLaDA2MoeSparseMoeBlock(config)
        self.input_layernorm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, cos, sin, mask, cache=None):
        """hidden (B, L, D) -> (B, L, D) and the router logits (None in a dense layer)."""
        hidden = hidden + self.attention(self.input_layernorm(hidden), cos, sin, mask, cache)
        out = self.mlp(self.post_attention_layernorm(hidden))
        out, router_logits = out if isinstance(out, tuple) else (out, None)
        return hidden + out, router_logits


class LLaDA2MoePreTrainedModel(PreTrainedModel):
    config_class = LLaDA2MoeConfig
    config: LLaDA2MoeConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LLaDA2MoeDecoderLayer"]
    _supports_sdpa = True
    _supports_attention_backend = False

    def _init_weights(self, module):
        from transformers import initialization as init

        super()._init_weights(module)
        if isinstance(module, LLaDA2MoeGate):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            init.zeros_(module.expert_bias)
            init.zeros_(module.expert_load)
        elif isinstance(module, LLaDA2MoeRotaryEmbedding):  # non-persistent: never in a checkpoint
            init.copy_(module.inv_freq, module.compute_inv_freq(self.config))


class LLaDA2MoeModel(LLaDA2MoePreTrainedModel):
    """LLaDA2's transformer body with block-causal attention (see the module docstring for the calling conventions)."""

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDA2MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = DeepseekV3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LLaDA2MoeRotaryEmbedding(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_router_logits: bool | None = None,
        **kwargs,
    ) -> MoeModelOutputWithPast:
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        check_attention_implementation(self.config, "LLaDA2")
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)  # (B, L, D)
        B, L = inputs_embeds.shape[:2]
        device = inputs_embeds.device
        past = cache.get_seq_length() if cache is not None else 0
        if attention_mask is not None and attention_mask.dim() == 4:
            if attention_mask.shape[-2:] != (L, past + L):
                raise ValueError(
                    f"a 4-D attention_mask must be (batch, 1, {L}, {past + L}), got {tuple(attention_mask.shape)}."
                )
            if position_ids is None:
                position_ids = torch.arange(past, past + L, device=device)[None].expand(B, L)
            if attention_mask.dtype == torch.bool:
                mask = attention_mask
            else:  # additive: 0 = attend, -inf or the dtype's minimum = blocked
                mask = attention_mask > torch.finfo(attention_mask.dtype).min / 2
            mask = mask.to(device).expand(B, 1, L, past + L)
        else:
            position_ids, mask = block_causal_inputs(
                attention_mask, position_ids, B, L, past, device, self.config.block_size
            )
        position_ids = position_ids.to(device).expand(B, L)
        cos, sin = self.rotary_emb(inputs_embeds, position_ids)  # (B, L, rot)
        hidden = inputs_embeds
        router_logits = []
        for layer in self.layers:
            hidden, logits = layer(hidden, cos, sin, mask, cache if use_cache or cache is not None else None)
            if logits is not None:
                router_logits.append(logits)
        hidden = self.norm(hidden)
        want_router = self.config.output_router_logits if output_router_logits is None else output_router_logits
        return MoeModelOutputWithPast(
            last_hidden_state=hidden,
            cache=cache,
            router_logits=tuple(router_logits) if want_router else None,
        )


class LLaDA2MoeModelLM(LLaDA2MoePreTrainedModel, GenerationMixin):
    """LLaDA2 with its output head; `logits[:, i]` predicts token i (no shift); logits are float32.

    The class name is the one LLaDA2's hub checkpoints list under `architectures`; it is registered for AutoModel and
    AutoModelForCausalLM under model_type "llada2_moe". (`GenerationMixin` gives it the `generation_config` that TRL
    and transformers read; left-to-right `generate` itself is refused.)
    """

    _tied_weights_keys = {"lm_head.weight": "model.word_embeddings.weight"}

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def set_input_embeddings(self, value):
        self.model.word_embeddings = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        output_router_logits: bool | None = None,
        **kwargs,
    ) -> MoeCausalLMOutputWithPast:
        """labels (B, L): cross-entropy of logits[:, i] against labels[:, i] (no shift), -100 ignored."""
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_router_logits=output_router_logits,
            **kwargs,
        )
        hidden = slice_logits_to_keep(
            out.last_hidden_state, logits_to_keep
        )  # int: the last n; tensor: those positions
        logits = self.lm_head(hidden).float()  # (B, L, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten().to(logits.device), ignore_index=-100)
        return MoeCausalLMOutputWithPast(loss=loss, logits=logits, cache=out.cache, router_logits=out.router_logits)

    def generate(self, *args, **kwargs):
        raise NotImplementedError(
            "LLaDA2 is a block diffusion model: left-to-right `generate` does not apply. Use "
            "stabledrl_trl.diffusion.block_sampler.block_generate (LLaDA2's algorithm: the llada2 family)."
        )


def register_llada2() -> None:
    """Register LLaDA2 (model_type "llada2_moe") with AutoConfig, AutoModel and AutoModelForCausalLM."""
    register_auto_classes("llada2_moe", LLaDA2MoeConfig, LLaDA2MoeModelLM)
