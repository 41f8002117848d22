"""DiffusionGemma's layout for the memory planner (`stabledrl_trl.memory_plan`): encoder + canvas decoder, MoE.

transformers' `DiffusionGemmaForBlockDiffusion` has one set of text layers used twice: the causal encoder
(`model.encoder.language_model`) and the canvas decoder (`model.decoder`) tie every weight they have in common, and
the LM head is tied to the embeddings. Parameters (d hidden, V vocabulary, I dense MLP width, E experts of width m):

    P = V d + sum_l [attention_l + 3 d I + (d + E + E d) + 3 E d m + 7 d] + d + (d + 3 d I) + P_vision

- attention_l: sliding layers q, k, v, o with `head_dim` and `num_key_value_heads` (+ q/k norm scales); full-attention
  layers use `global_head_dim` and `num_global_key_value_heads` and have no v projection (k = v);
- every layer has both the dense MLP (3 d I) and the routed experts (gate_up E x 2m x d, down E x d x m), a router
  (proj E d, scale d, per-expert scale E) and 7 RMSNorm scales;
- the decoder alone adds the self-conditioning MLP (d + 3 d I); P_vision is the vision tower plus its projection,
  counted by instantiating them on the meta device from the config (no weights are allocated).
LoRA (peft): adapters are NOT tied, the encoder and the decoder each get their own: r (d_in + d_out) per targeted
linear of each stack, and r E (d + 2m) + r E (m + d) for `target_parameters` experts.gate_up_proj / experts.down_proj.

Transients (B micro-batch rows, K estimator samples, L = prompt + completion, C = canvas_length, b bytes per weight):
- training: the encoder reads [prompt; completion] once (B L tokens) and is never checkpointed (transformers keeps
  its cache writes out of checkpointing), so its activations are n_layers B L a b; the decoder runs K canvas passes
  (B K C tokens, all kept for backward), checkpointed or not like the masked layouts; a = 10 d + 4 (I + k m)
  (+ heads L with materialised attention), k the experts per token. Logits: B K C V (b + float32 copy + 12).
- rollouts (R rows, no gradient): one layer's activations R L (4 d + 2 (I + k m)) b; the canvas logits R C V (b +
  float32 copy + 4) plus the previous step's logits kept for self-conditioning (R C V b); the encoder's KV cache
  sum_l 2 kv_l hd_l R min(L, window_l) b (sliding layers keep the last `sliding_window` positions).
`estimator_chunk_size` is refused for this family, so the training rows are never chunked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import ClassVar

from .memory_plan import ModelShape

# the linears LoRA can target in each stack's layer, with (d_in, d_out) given by DiffusionGemmaShape.linear_dims
_LAYER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj")  # fmt: skip
_STACKS = ("model.encoder.language_model", "model.decoder")


@dataclass(frozen=True)
class DiffusionGemmaShape(ModelShape):
    """A DiffusionGemma text model (module docstring); ModelShape's fields with DiffusionGemma's meaning: n_kv_heads
    and head_dim of the sliding layers, n_experts / active_experts / moe_intermediate the routed experts."""

    layer_types: tuple = ()
    layer_kv_heads: tuple = ()  # per layer (full-attention layers: num_global_key_value_heads when set)
    layer_head_dims: tuple = ()  # per layer (full-attention layers: global_head_dim)
    sliding_window: int = 0
    canvas_length: int = 256
    vision_parameters: int = 0
    chunkable_estimator: ClassVar[bool] = False  # estimator_chunk_size is refused for this family

    def _layer(self, i: int) -> tuple[int, int, bool]:
        """(kv heads, head dim, sliding) of layer i."""
        return self.layer_kv_heads[i], self.layer_head_dims[i], self.layer_types[i] == "sliding_attention"

    def linear_dims(self, i: int) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each linear of layer i (v_proj only in sliding layers)."""
        kv, hd, sliding = self._layer(i)
        d, q = self.hidden, self.n_heads * hd
        dims = {"self_attn.q_proj": (d, q), "self_attn.k_proj": (d, kv * hd), "self_attn.o_proj": (q, d),
                "mlp.gate_proj": (d, self.intermediate), "mlp.up_proj": (d, self.intermediate),
                "mlp.down_proj": (self.intermediate, d)}  # fmt: skip
        if sliding:
            dims["self_attn.v_proj"] = (d, kv * hd)
        return dims

    def layer_params(self, i: int) -> int:
        _, hd, _ = self._layer(i)
        d, E, m = self.hidden, self.n_experts, self.moe_intermediate
        linears = sum(a * b for a, b in self.linear_dims(i).values())
        return linears + 2 * hd + (d + E + E * d) + 3 * E * d * m + 7 * d

    def num_parameters(self) -> int:
        d, inter = self.hidden, self.intermediate
        layers = sum(self.layer_params(i) for i in range(self.n_layers))
        return self.vocab * d + layers + d + (d + 3 * d * inter) + self.vision_parameters

    def layer_parameters(self) -> int:
        return max(self.layer_params(i) for i in range(self.n_layers))

    def active_intermediate(self) -> int:
        return self.intermediate + self.active_experts * self.moe_intermediate

    def lora_parameters(self, r: int, targets, target_parameters=None) -> int:
        """peft's adapter parameters: `targets` a regex (peft matches it against the full module name) over the
        layers of both stacks; `target_parameters` the experts' fused weights. A list of names or "all-linear" would
        also reach the vision tower and the self-conditioning MLP, which this count does not model: refused."""
        if not isinstance(targets, str) or targets == "all-linear":
            raise ValueError(
                f"lora_target_modules={targets!r}: the DiffusionGemma memory plan counts LoRA for a regex over the "
                "text layers (e.g. the family's LORA_TARGET_MODULES, as configs/diffusion_gemma_gsm8k_lora.yaml "
                "sets); a list or 'all-linear' also matches the vision tower and self-conditioning linears."
            )
        total = 0
        for stack in _STACKS:
            for i in range(self.n_layers):
                for name, (a, b) in self.linear_dims(i).items():
                    hit = re.fullmatch(targets, f"{stack}.layers.{i}.{name}") is not None
                    total += r * (a + b) if hit else 0
                E, d, m = self.n_experts, self.hidden, self.moe_intermediate
                for p in target_parameters or ():
                    if p.endswith("gate_up_proj"):
                        total += r * E * (d + 2 * m)
                    elif p.endswith("down_proj"):
                        total += r * E * (m + d)
        return total

    def kv_cache_bytes(self, rows: int, length: int, b: int) -> int:
        total = 0
        for i in range(self.n_layers):
            kv, hd, sliding = self._layer(i)
            keep = min(length, self.sliding_window) if sliding and self.sliding_window else length
            total += 2 * kv * hd * rows * keep * b
        return total

    def refine(self, c: dict, s) -> dict:
        """memory_plan.estimate's components with this layout's LoRA count and transients (module docstring)."""
        b = 2 if s.bf16 else 4
        copy = 4 if b < 4 else 0
        d, C, V = self.hidden, self.canvas_length, self.vocab
        inter = self.active_intermediate()
        if s.use_peft:
            c["lora"] = self.lora_parameters(s.lora_r, s.lora_target_modules, s.lora_target_parameters) * (4 + 4 + 8)
        B, K = s.per_device_train_batch_size, max(1, s.mc_samples)
        L = s.max_prompt_length + s.max_completion_length
        a = 10 * d + 4 * inter + (self.n_heads * L if s.attention_matrix else 0)
        enc = self.n_layers * B * L * a * b
        Td = B * K * C
        dec = self.n_layers * Td * d * b + Td * a * b if s.gradient_checkpointing else self.n_layers * Td * a * b
        c["activations"] = enc + dec
        c["estimator_logits"] = Td * V * (b + copy + 12)
        R = B * max(1, s.steps_per_generation)
        c["rollout_activations"] = R * L * (4 * d + 2 * inter) * b
        c["rollout_logits"] = R * C * V * (b + copy + 4) + R * C * V * b
        c["rollout_kv_cache"] = self.kv_cache_bytes(R, L, b)
        persistent = c["weights"] + c["gradients"] + c["optimizer"] + c["lora"] + c["runtime_overhead"]
        train = c["activations"] + c["estimator_logits"] + c["gathered_layers"]
        rollout = (c["rollout_activations"] + c["rollout_logits"] + c["rollout_kv_cache"]
                   + c["rollout_gathered_weights"])  # fmt: skip
        c["phase"] = "training" if train >= rollout else "rollout"
        c["peak"] = persistent + max(train, rollout)
        return c


# google/diffusiongemma-26B-A4B-it, for planning without its config.json: the text model's geometry as published for
# the checkpoint (the Gemma 4 26B-A4B text layout: 30 layers, 5 sliding : 1 full attention, 128 experts, 8 per token,
# canvas 256); the same numbers appear in several independent public loaders of the checkpoint. It gives a text model
# of 25.25e9 parameters (the model card: 25.2B). The vision tower's config is not among them: its parameters are the
# checkpoint's total (51,647,701,024 bytes of bfloat16 weights = 25,823,850,512 parameters) minus the text model, so
# the plan counts every weight that loads. Pass the checkpoint's own config.json (`--model <folder>`) to plan from it.
DIFFUSION_GEMMA_26B_A4B = {
    "model_type": "diffusion_gemma",
    "canvas_length": 256,
    "tie_word_embeddings": True,
    "text_config": {
        "hidden_size": 2816, "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
        "num_global_key_value_heads": 2, "head_dim": 256, "global_head_dim": 512, "intermediate_size": 2112,
        "moe_intermediate_size": 704, "num_experts": 128, "top_k_experts": 8, "vocab_size": 262144,
        "sliding_window": 1024, "final_logit_softcapping": 30.0,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
    },
}  # fmt: skip
DIFFUSION_GEMMA_26B_A4B_TOTAL_PARAMETERS = 25_823_850_512
KNOWN_GEMMA_MODELS = {"google/diffusiongemma-26B-A4B-it": DIFFUSION_GEMMA_26B_A4B}


def known_gemma_shape(model: str) -> DiffusionGemmaShape:
    """The shape of a DiffusionGemma checkpoint in `KNOWN_GEMMA_MODELS` (see DIFFUSION_GEMMA_26B_A4B's comment)."""
    shape = shape_from_gemma_config(
        KNOWN_GEMMA_MODELS[model],
        source=f"{model}: published text geometry (memory_plan_gemma.DIFFUSION_GEMMA_26B_A4B); vision tower = the "
        "checkpoint's 25,823,850,512 weights minus the text model",
    )
    text = shape.num_parameters() - shape.vision_parameters
    return replace(shape, vision_parameters=DIFFUSION_GEMMA_26B_A4B_TOTAL_PARAMETERS - text)


def vision_parameters(config) -> int:
    """Parameters of the vision tower and its projection into the text model, counted on the meta device."""
    import torch
    from transformers import AutoModel
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaMultimodalEmbedder

    with torch.device("meta"):
        tower = AutoModel.from_config(config.vision_config)
        embedder = DiffusionGemmaMultimodalEmbedder(config.vision_config, config.text_config)
    return sum(p.numel() for p in tower.parameters()) + sum(p.numel() for p in embedder.parameters())


def shape_from_gemma_config(config: dict, source: str = "") -> DiffusionGemmaShape:
    """A DiffusionGemmaShape from a DiffusionGemma config.json (a dict), read through transformers'
    `DiffusionGemmaConfig` so that its defaults and derived values (layer_types, per-layer head dims) apply."""
    from transformers import DiffusionGemmaConfig

    cfg = DiffusionGemmaConfig(**{k: v for k, v in config.items() if k != "model_type"})
    t = cfg.text_config
    if not t.num_experts:
        raise ValueError(
            f"{source or 'config'}: text_config.num_experts is not set; DiffusionGemma's layers are MoE layers "
            "(transformers requires num_experts, top_k_experts and moe_intermediate_size)."
        )
    layers = [t.per_layer_config[i] for i in range(t.num_hidden_layers)]  # head dim and KV heads vary per layer
    shape = DiffusionGemmaShape(
        hidden=t.hidden_size, n_layers=t.num_hidden_layers, n_heads=t.num_attention_heads,
        n_kv_heads=layers[0].num_key_value_heads, intermediate=t.intermediate_size, vocab=t.vocab_size,
        head_dim=layers[0].head_dim,
        tied_embeddings=True, qk_norm=True, block_diffusion=True, n_experts=t.num_experts,
        active_experts=t.top_k_experts, moe_intermediate=t.moe_intermediate_size, layer_types=tuple(t.layer_types),
        layer_kv_heads=tuple(c.num_key_value_heads for c in layers), layer_head_dims=tuple(c.head_dim for c in layers),
        sliding_window=t.sliding_window,
        canvas_length=cfg.canvas_length, source=source,
    )  # fmt: skip
    return replace(shape, vision_parameters=vision_parameters(cfg))
