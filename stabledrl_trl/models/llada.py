"""LLaDA as a native transformers model: the Llama implementation with bidirectional attention.

LLaDA (GSAI-ML/LLaDA-8B-Instruct and relatives) is the Llama architecture without a causal mask: pre-RMSNorm
attention with rotate-half RoPE, a SwiGLU MLP `ff_out(silu(ff_proj(x)) * up_proj(x))`, a final RMSNorm and an output
head. Its hub checkpoints ship their own modeling code (`trust_remote_code`) written for transformers 4. This module
instead reuses transformers' own `LlamaModel` / `LlamaForCausalLM` (SDPA, flash attention, gradient checkpointing,
PEFT target names q_proj ... down_proj) and changes only what makes LLaDA different:
- attention is bidirectional: `is_causal = False` on every attention module and the layer mask comes from
  `create_bidirectional_mask` (padding keys hidden, nothing else); positions count real tokens only, so a
  left-padded row gives the same logits as the row alone;
- `LLaDAConfig` reads LLaDA's own `config.json` keys (d_model, n_heads, ...) and rejects LLaDA options this
  implementation does not have, instead of ignoring them;
- LLaDA's weight names (model.transformer.blocks.{i}.ff_proj, ...) are renamed to Llama's while loading through
  transformers' checkpoint conversion mapping, and renamed back by `save_pretrained`.
Importing this module registers the classes with the Auto classes under model_type "llada", so
`AutoModel[ForCausalLM].from_pretrained(<LLaDA checkpoint>)` works without `trust_remote_code` and never runs the
checkpoint's own code, even though its config.json still carries an `auto_map` pointing at it.
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from transformers import LlamaConfig
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel
from transformers.utils.output_capturing import capture_outputs

from .bidirectional import check_no_cache, disable_causal_attention, padding_position_ids
from .config_checks import check_native_config
from .original_format import config_json_string, copy_remote_code, publishable_auto_map
from .registration import register_auto_classes

# LLaDA's config.json key -> the Llama config field holding the same number.
LLADA_TO_LLAMA_KEYS = {
    "d_model": "hidden_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "n_layers": "num_hidden_layers",
    "mlp_hidden_size": "intermediate_size",
    "max_sequence_length": "max_position_embeddings",
    "weight_tying": "tie_word_embeddings",
    "init_std": "initializer_range",
}
_LLAMA_TO_LLADA_KEYS = {v: k for k, v in LLADA_TO_LLAMA_KEYS.items()}

# LLaDA options that change the computation, with the values this implementation supports (LLaDA's released
# checkpoints all use these). Any other value raises instead of being silently ignored.
SUPPORTED_LLADA_OPTIONS = {
    "block_type": ("llama",),
    "layer_norm_type": ("rms",),
    "activation_type": ("silu",),
    "rope": (True,),
    "alibi": (False,),
    "include_bias": (False,),
    "include_qkv_bias": (False,),
    "bias_for_layer_norm": (False, None),  # None: follow include_bias (False)
    "layer_norm_with_affine": (True,),
    "attention_layer_norm": (False,),
    "input_emb_norm": (False,),
    "scale_logits": (False,),
    "clip_qkv": (None,),
    "block_group_size": (1,),  # other values store the blocks under different weight names
    "embedding_dropout": (0.0,),
    "residual_dropout": (0.0,),
}
# LLaDA keys accepted and kept (they are saved back) that do not change the computation here:
# alibi_bias_max and attention_layer_norm_with_affine only matter for options rejected above; flash_attention and
# precision are kernel / autocast choices (use attn_implementation= and dtype= instead); init_fn, init_device,
# init_cutoff_factor only affect fresh initialisation; rope_full_precision: LLaDA rotates q and k in float32, Llama
# in the activation dtype (identical in float32, a rounding-level difference in bfloat16); use_cache: there is no
# cache for bidirectional attention.

# LLaDA checkpoint names -> Llama module names (one rename per weight, so the reverse used by save_pretrained is
# exact, and Llama-named checkpoints pass through untouched).
LLADA_WEIGHT_RENAMES = [
    (r"^model\.transformer\.wte\.", "model.embed_tokens."),
    (r"^model\.transformer\.ln_f\.", "model.norm."),
    (r"^model\.transformer\.ff_out\.", "lm_head."),
    (r"^model\.transformer\.blocks\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^model\.transformer\.blocks\.(\d+)\.q_proj\.", r"model.layers.\1.self_attn.q_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.k_proj\.", r"model.layers.\1.self_attn.k_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.v_proj\.", r"model.layers.\1.self_attn.v_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.attn_out\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_norm\.", r"model.layers.\1.post_attention_layernorm."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_proj\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.up_proj\.", r"model.layers.\1.mlp.up_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_out\.", r"model.layers.\1.mlp.down_proj."),
]


_COMPILED_RENAMES = [(re.compile(source), target) for source, target in LLADA_WEIGHT_RENAMES]


def llada_to_module_name(name: str) -> str:
    """LLaDA's checkpoint name of a weight -> this implementation's module name (other names pass unchanged)."""
    for pattern, target in _COMPILED_RENAMES:
        if pattern.match(name):
            return pattern.sub(target, name, count=1)
    return name


class LLaDAConfig(LlamaConfig):
    """Configuration of a LLaDA model: a `LlamaConfig` that also reads (and writes) LLaDA's config.json keys.

    Build it from LLaDA's keys (`LLaDAConfig(d_model=4096, n_heads=32, ...)`, as `from_pretrained` does with a hub
    config.json) or from Llama's (`hidden_size=...`); `config.d_model` and friends read the Llama fields.
    `vocab_size` is the number of embedding rows and logit columns, i.e. LLaDA's `embedding_size` when it is set
    (it may exceed the tokenizer's vocabulary). `mask_token_id` is the diffusion mask token.
    `to_dict` (hence `save_pretrained`) writes LLaDA's keys, `torch_dtype` and the checkpoint's `auto_map` (see
    `models.original_format`), so LLaDA's own code loads the saved folder; this package never uses the `auto_map`.
    """

    model_type = "llada"
    attribute_map = dict(LLADA_TO_LLAMA_KEYS)  # config.d_model etc. read and write the Llama fields

    # LLaDA's defaults where they differ from Llama's (LLaDA configs set no bos token).
    rms_norm_eps: float = 1e-5
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    use_cache: bool = False
    mask_token_id: int | None = None
    # Empty unless the checkpoint had one (kept for saving): code that looks for remote code (e.g. TRL's
    # create_model_from_path) finds the Auto classes, which map "llada" to this package's model, before it.
    auto_map: ClassVar[dict] = {}

    def __post_init__(self, **kwargs):
        llada_format = any(key in kwargs for key in ("d_model", "n_heads", "n_layers", "embedding_size"))
        for name, allowed in SUPPORTED_LLADA_OPTIONS.items():
            if name in kwargs and kwargs[name] not in allowed:
                raise ValueError(
                    f"LLaDA option {name}={kwargs[name]!r} is not supported by stabledrl_trl's LLaDA implementation "
                    f"(supported: {', '.join(repr(v) for v in allowed)}). Use a checkpoint with {name}={allowed[0]!r}."
                )
        auto_map = kwargs.pop("auto_map", None)  # LLaDA's remote code: saved back, never run
        if auto_map:
            self.auto_map = dict(auto_map)
        if llada_format and kwargs.get("mlp_hidden_size") is None:
            # LLaDA sizes the MLP as mlp_ratio * d_model when mlp_hidden_size is absent or null.
            kwargs["mlp_hidden_size"] = int(kwargs.get("mlp_ratio", 4) * kwargs.get("d_model", self.hidden_size))
        # LLaDA keys are moved onto the Llama fields before LlamaConfig derives head_dim and the kv-head count.
        for llada_key, field in LLADA_TO_LLAMA_KEYS.items():
            if llada_key in kwargs:
                setattr(self, field, kwargs.pop(llada_key))
        if kwargs.pop("multi_query_attention", None):
            if self.num_key_value_heads not in (None, 1):
                raise ValueError(
                    f"LLaDA config sets multi_query_attention=True with n_kv_heads={self.num_key_value_heads}; "
                    "set one of them only."
                )
            self.num_key_value_heads = 1
        embedding_size = kwargs.pop("embedding_size", None)
        if embedding_size is not None:
            if embedding_size < self.vocab_size:
                raise ValueError(
                    f"LLaDA config has embedding_size={embedding_size} < vocab_size={self.vocab_size}; "
                    "embedding_size is the number of embedding rows and must be at least vocab_size."
                )
            self.vocab_size = embedding_size
        check_native_config(self, "LLaDA", sizes_only=True, aliases=_LLAMA_TO_LLADA_KEYS)  # before LlamaConfig divides by them
        super().__post_init__(**kwargs)
        self._check_llama_fields()
        check_native_config(self, "LLaDA", aliases=_LLAMA_TO_LLADA_KEYS)

    def _check_llama_fields(self) -> None:
        """Reject Llama options that LLaDA checkpoints do not have (their LLaDA keys could not express them)."""
        problems = []
        if self.hidden_act != "silu":
            problems.append(f"hidden_act={self.hidden_act!r} (LLaDA uses 'silu')")
        if self.attention_bias or self.mlp_bias:
            problems.append("attention_bias/mlp_bias=True (LLaDA has no biases)")
        if self.head_dim != self.hidden_size // self.num_attention_heads:
            problems.append(f"head_dim={self.head_dim} != hidden_size // num_attention_heads")
        rope_type = (self.rope_parameters or {}).get("rope_type", "default")
        if rope_type != "default":
            problems.append(f"rope_parameters.rope_type={rope_type!r} (LLaDA uses plain RoPE)")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            problems.append(
                f"num_attention_heads={self.num_attention_heads} not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            problems.append(f"mask_token_id={self.mask_token_id} outside the vocabulary [0, {self.vocab_size})")
        if problems:
            raise ValueError("Unsupported LLaDA configuration: " + "; ".join(problems) + ".")

    def to_dict(self) -> dict:
        """Serialise with LLaDA's key names (d_model, n_heads, embedding_size, rope_theta, ...)."""
        output = super().to_dict()
        for llada_key, field in LLADA_TO_LLAMA_KEYS.items():
            if field in output:
                output[llada_key] = output.pop(field)
        output["embedding_size"] = output["vocab_size"]
        rope_parameters = output.pop("rope_parameters", None) or {}
        output["rope_theta"] = rope_parameters.get("rope_theta", self.default_theta)
        for name in ("head_dim", "attention_bias", "mlp_bias", "hidden_act", "pretraining_tp"):
            output.pop(name, None)  # implied by the LLaDA options below, checked in _check_llama_fields
        output.setdefault("block_type", "llama")
        output.setdefault("layer_norm_type", "rms")
        output.setdefault("activation_type", "silu")
        output.setdefault("include_bias", False)
        output.setdefault("rope", True)
        output.setdefault("alibi", False)
        output.setdefault("multi_query_attention", None)  # n_kv_heads says it
        output.pop("auto_map", None)
        auto_map = publishable_auto_map(self.auto_map, getattr(self, "_name_or_path", None))
        if auto_map:
            output["auto_map"] = auto_map
        return output

    def to_json_string(self, use_diff: bool = True) -> str:
        """config.json's text: `to_dict`'s keys plus `torch_dtype` (see `original_format.config_json_string`)."""
        return config_json_string(self, use_diff)


class LLaDAModel(LlamaModel):
    """LLaDA's transformer body: `LlamaModel` with bidirectional attention and padding-aware positions."""

    config_class = LLaDAConfig
    config: LLaDAConfig

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        # LLaDA's embedding has no padding row: its pad token is EOS, a real token whose embedding must keep its
        # gradient (Llama's padding_idx would freeze it at zero).
        self.padding_idx = None
        self.embed_tokens = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        disable_causal_attention(self)
        self.post_init()  # initialises the new embedding only: the other modules are marked initialised

    @capture_outputs
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
        """Same inputs as `LlamaModel.forward`. A 2D `attention_mask` (1 = real token) hides padding keys only.

        `use_cache` is accepted for API compatibility and has no effect: with bidirectional attention every output
        depends on every position, so there is no exact key/value prefix, and a transformers cache raises. The one
        exception is the approximate `CanvasCache` of Fast-dLLM-style rollouts: while it records, this is a plain
        forward whose keys and values are stored; in its windowed phase `input_ids` (B, n) are the canvas positions
        [window_start, window_start + n), `attention_mask` covers the whole canvas (B, L), and default positions
        are the window's positions in the canvas.
        """
        cache = cache if cache is not None else kwargs.pop("past_key_values", None)
        check_no_cache(cache, type(self).__name__, allow_canvas_cache=True)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, n, D)
        window = cache is not None and cache.window_start is not None
        offset = cache.window_start if window else 0
        n = inputs_embeds.shape[1]
        if position_ids is None:
            if attention_mask is not None and attention_mask.dim() == 2:
                position_ids = padding_position_ids(attention_mask).to(inputs_embeds.device)[:, offset : offset + n]
            else:
                position_ids = torch.arange(offset, offset + n, device=inputs_embeds.device)[None]  # (1, n)
        if window and attention_mask is None:
            # No padding: every one of the canvas' keys is visible (a None mask attends to all keys).
            layer_mask = None
        else:
            # None when nothing is padded (sdpa / eager then attend to everything), else a mask over padded keys;
            # with a window, queries are the n window positions and keys the whole canvas (the mask's length).
            layer_mask = create_bidirectional_mask(
                config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
            )
        hidden_states = inputs_embeds
        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)  # (cos, sin), (B, n, Dh)
        for decoder_layer in self.layers[: self.config.num_hidden_layers]:
            hidden_states = decoder_layer(
                hidden_states,
                attention_mask=layer_mask,
                position_embeddings=position_embeddings,
                position_ids=position_ids,
                cache=cache,
                **kwargs,
            )
        hidden_states = self.norm(hidden_states)  # (B, n, D)
        return BaseModelOutputWithPast(last_hidden_state=hidden_states)


class LLaDAModelLM(LlamaForCausalLM):
    """LLaDA with its output head: `model(input_ids).logits[:, i]` predicts token i (no shift), as LLaDA's own code.

    The class name is the one LLaDA's hub checkpoints list under `architectures`. It is registered for AutoModel
    (what LLaDA's own instructions load), AutoModelForCausalLM and AutoModelForMaskedLM. `labels` gives the
    masked-LM loss (cross-entropy at positions whose label is not -100, no shift).

    `save_pretrained` writes what LLaDA's own code loads: safetensors weights under LLaDA's names
    (model.transformer.blocks.{i}.ff_proj, ...), a config.json with model_type "llada", LLaDA's keys and the
    checkpoint's `auto_map`, and the source folder's remote code files (see `models.original_format`); the folder
    loads back with `from_pretrained` too. `load_state_dict` accepts LLaDA's names as well as the module's own, so
    transformers' Trainer, which resumes a checkpoint by `model.load_state_dict(file, strict=False)`, resumes exactly.
    `save_pretrained(..., save_original_format=False)` writes the module's own (Llama) names instead.
    """

    config_class = LLaDAConfig
    config: LLaDAConfig

    def __init__(self, config: LLaDAConfig):
        # LlamaForCausalLM.__init__ would first build a causal LlamaModel; build the bidirectional body directly.
        LlamaPreTrainedModel.__init__(self, config)
        self.model = LLaDAModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()
        self.loss_type = "ForMaskedLM"  # labels[i] is predicted at position i: no causal shift

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained` (LLaDA's weight names by default), plus the source folder's remote code
        files that `auto_map` names."""
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            copy_remote_code(self.config.auto_map, getattr(self.config, "_name_or_path", None), str(save_directory))
        return result

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """`nn.Module.load_state_dict` that also accepts LLaDA's weight names (renamed to the module's).

        Without it, `load_state_dict(strict=False)` on a LLaDA-named checkpoint (what transformers' Trainer does
        when it resumes) would skip every weight silently.
        """
        renamed = {llada_to_module_name(name): value for name, value in state_dict.items()}
        if len(renamed) != len(state_dict):
            raise ValueError(
                "state_dict holds some weights under both their LLaDA name and their module name; pass one of them."
            )
        return super().load_state_dict(renamed, strict=strict, assign=assign)

    def generate(self, *args, **kwargs):
        raise NotImplementedError(
            "LLaDA is a masked diffusion model, not an autoregressive one: `generate` (left-to-right decoding) does not "
            "apply. Use the masked-diffusion sampler in stabledrl_trl.diffusion.llada_sampler."
        )


def register_llada() -> None:
    """Register LLaDA with the Auto classes and LLaDA's weight names with the checkpoint conversion mapping."""
    register_auto_classes("llada", LLaDAConfig, LLaDAModelLM, masked_lm=True)
    renames = [WeightRenaming(source, target) for source, target in LLADA_WEIGHT_RENAMES]
    register_checkpoint_conversion_mapping("llada", renames, overwrite=True)
