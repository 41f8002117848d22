"""Dream (Dream-v0, DiffuCoder) as a native transformers model: the Qwen2 implementation with bidirectional attention.

Dream models are Qwen2 checkpoints trained further as masked diffusion LMs: same weights and names as
`Qwen2ForCausalLM` (model.layers.{i}.self_attn.q_proj, ..., lm_head), attention without a causal mask, mask token
151666 on the hub checkpoints (`mask_token_id` in their config.json). Because they started from an autoregressive
model, their logits keep the autoregressive alignment: output position i-1 holds the prediction for token i.
`DreamModel` returns those raw (shifted) logits like Dream's own code; `stabledrl_trl.diffusion.adapter` realigns
them.

The hub config's model_type is "Dream" (capital D). transformers' Auto registry looks model types up by exact
string, so registering "Dream" is enough for `AutoModel.from_pretrained(<Dream checkpoint>)`; the config's
`auto_map` (remote code) is then never used.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from transformers import Qwen2Config
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.qwen2.modeling_qwen2 import Qwen2ForCausalLM, Qwen2Model, Qwen2PreTrainedModel

from .bidirectional import check_no_cache, disable_causal_attention, padding_position_ids
from .config_checks import check_native_config
from .original_format import config_json_string, copy_remote_code, publishable_auto_map
from .registration import register_auto_classes


class DreamConfig(Qwen2Config):
    """A `Qwen2Config` with model_type "Dream" and the diffusion `mask_token_id` (151666 on the hub checkpoints).

    `to_dict` (hence `save_pretrained`) writes Dream's own config.json: `rope_theta` and `rope_scaling` (Dream's code
    was written for transformers 4 and reads no `rope_parameters`: without `rope_theta` it would fall back to 1e4),
    `torch_dtype`, and the checkpoint's `auto_map` (see `models.original_format`; never used by this package).
    """

    model_type = "Dream"
    mask_token_id: int | None = None
    # Empty unless the checkpoint had one (kept for saving only: the registered native class always takes precedence
    # over this remote code); the Auto classes and TRL test `name in config.auto_map`, so it is never None.
    auto_map: ClassVar[dict] = {}

    def __post_init__(self, **kwargs):
        auto_map = kwargs.pop("auto_map", None)
        if auto_map:
            self.auto_map = dict(auto_map)
        check_native_config(self, "Dream", sizes_only=True)  # before Qwen2Config divides by them
        super().__post_init__(**kwargs)
        check_native_config(self, "Dream")
        if "sliding_attention" in self.layer_types:
            raise ValueError(
                "Dream config enables sliding-window attention (use_sliding_window=True), which this bidirectional "
                "implementation does not support; set use_sliding_window=False."
            )
        if self.mask_token_id is not None and not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"Dream config mask_token_id={self.mask_token_id} is outside the vocabulary [0, {self.vocab_size})."
            )

    def to_dict(self) -> dict:
        """Serialise with Dream's (transformers 4 Qwen2) keys: rope_theta / rope_scaling and auto_map."""
        output = super().to_dict()
        rope = dict(output.pop("rope_parameters", None) or {})
        output["rope_theta"] = rope.pop("rope_theta", self.default_theta)
        rope_type = rope.get("rope_type", "default")
        # transformers 4 reads "type" (older checkpoints) or "rope_type"
        output["rope_scaling"] = (
            None if rope_type == "default" else {**rope, "type": rope_type, "rope_type": rope_type}
        )
        output.pop("layer_types", None)  # implied by use_sliding_window / max_window_layers in Dream's config
        output.pop("auto_map", None)
        auto_map = publishable_auto_map(self.auto_map, getattr(self, "_name_or_path", None))
        if auto_map:
            output["auto_map"] = auto_map
        return output

    def to_json_string(self, use_diff: bool = True) -> str:
        """config.json's text: `to_dict`'s keys plus `torch_dtype` (see `original_format.config_json_string`)."""
        return config_json_string(self, use_diff)


class DreamBaseModel(Qwen2Model):
    """Dream's transformer body: `Qwen2Model` with bidirectional attention and padding-aware positions."""

    config_class = DreamConfig
    config: DreamConfig

    def __init__(self, config: DreamConfig):
        super().__init__(config)
        disable_causal_attention(self)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache=None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ):
        """Same inputs as `Qwen2Model.forward`. A 2D `attention_mask` (1 = real token) hides padding keys only.

        `use_cache` has no effect (no key/value prefix can be reused with bidirectional attention); a `cache` raises.
        """
        check_no_cache(cache or kwargs.pop("past_key_values", None), type(self).__name__)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, L, D)
        if position_ids is None and attention_mask is not None and attention_mask.dim() == 2:
            position_ids = padding_position_ids(attention_mask).to(inputs_embeds.device)  # (B, L)
        # Qwen2Model uses a precomputed {layer type: mask} dict as is: give it the bidirectional one (None when
        # nothing is padded, else a mask over padded keys), so its causal mask is never built.
        layer_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        return super().forward(
            inputs_embeds=inputs_embeds,
            attention_mask={"full_attention": layer_mask},
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        )


class DreamModel(Qwen2ForCausalLM):
    """Dream with its output head; `logits[:, i - 1]` predicts token i, as in Dream's own code.

    The class name is the one Dream's hub checkpoints list under `architectures`; it is registered for AutoModel
    (what Dream's own instructions load) and AutoModelForCausalLM. `save_pretrained` writes Qwen2 weight names, which
    are Dream's own, and Dream's config.json (see `DreamConfig`): the folder loads with Dream's code too.
    """

    config_class = DreamConfig
    config: DreamConfig

    def __init__(self, config: DreamConfig):
        # Qwen2ForCausalLM.__init__ would first build a causal Qwen2Model; build the bidirectional body directly.
        Qwen2PreTrainedModel.__init__(self, config)
        self.model = DreamBaseModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def save_pretrained(self, save_directory, *args, **kwargs):
        """`PreTrainedModel.save_pretrained`, plus what Dream's own code (`trust_remote_code=True`) needs to load the
        folder: `mask_token_id` in generation_config.json and the source folder's remote code files that `auto_map`
        names."""
        generation_config = getattr(self, "generation_config", None)
        if generation_config is not None and getattr(generation_config, "mask_token_id", None) is None:
            # Dream's own generation config reads its mask token from generation_config.json (default None).
            generation_config.mask_token_id = self.config.mask_token_id
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            copy_remote_code(self.config.auto_map, getattr(self.config, "_name_or_path", None), str(save_directory))
        return result

    def generate(self, *args, **kwargs):
        raise NotImplementedError(
            "Dream is a masked diffusion model: left-to-right `generate` does not apply. Use the masked-diffusion "
            "sampler in stabledrl_trl.diffusion.dream_sampler with stabledrl_trl.diffusion.adapter.as_diffusion_lm(model)."
        )


def register_dream() -> None:
    """Register Dream (model_type "Dream") with AutoConfig, AutoModel and AutoModelForCausalLM."""
    register_auto_classes("Dream", DreamConfig, DreamModel)
