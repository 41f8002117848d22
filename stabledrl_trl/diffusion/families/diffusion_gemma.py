"""DiffusionGemma (uniform-noise block diffusion, native in transformers): its own sampler, uniform-noise estimates.

transformers' `DiffusionGemmaForBlockDiffusion` (model_type "diffusion_gemma") is used as it is: a causal encoder
over the prompt and the committed canvases feeds its KV cache to a bidirectional canvas decoder with
self-conditioning; MoE layers; corruption by uniform-random tokens, no mask token. This module adds no model code:
- rollouts: `diffusion/gemma_sampler.py`, the model's own sampler (entropy-bound acceptance, renoising, linear
  temperature schedule, adaptive stopping, canvases over the encoder cache) with one generator per row;
- estimates: `diffusion/uniform_estimators.py`, the log-likelihood form of TRL's SFT loss for this model.

RL settings read: `max_completion_length` (a multiple of `canvas_length`: the sampler commits whole canvases),
`block_denoising_steps` (the sampler's `max_denoising_steps`; None = the model's generation config, else 48),
`temperature` (scales the model's temperature schedule: 1.0 is `model.generate`'s, 0 greedy proposals),
`likelihood_estimator` ("block_random" or "block_random_coupled"), `mc_samples`. Refused: everything the model's
sampler or the uniform-noise estimator has no counterpart for (see `check`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..adapter import unwrap_model
from ..family_base import CardSnippet, DiffusionFamily, register_family
from ..gemma_sampler import gemma_generate, gemma_sampler_settings, row_generators
from ..llada_sampler import SamplerOutput
from ..uniform_estimators import UNIFORM_ESTIMATORS, estimator_passes, uniform_noise_estimate

# LoRA targets: attention and dense-MLP linears of the encoder and decoder layers (TRL's SFT example), and, for
# `lora_target_parameters`, the routed experts' fused weights (nn.Parameter, not nn.Linear).
LORA_TARGET_MODULES = (
    r"model\.(encoder\.language_model|decoder)\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)"
)
LORA_EXPERT_PARAMETERS = ("experts.gate_up_proj", "experts.down_proj")

# The block-diffusion sampler fields (SDAR / LLaDA2) this sampler does not read, at their defaults.
_UNREAD_BLOCK_FIELDS = {"block_remasking": "low_confidence_dynamic", "block_confidence_threshold": 0.9}
_SELF_CONDITIONING = "off"  # the estimator's self-conditioning choice (docs/diffusion_gemma.md measures the others)
_PREDICTION = "denoiser"


class DiffusionGemmaFamily(DiffusionFamily):
    """DiffusionGemma: the model's own block sampler with per-row generators, uniform-noise estimates."""

    name = "diffusion_gemma"
    label = "DiffusionGemma"
    model_types = ("diffusion_gemma",)
    uses_every_parameter = False  # routed experts no token chose get no gradient
    block_causal = True  # an encoder KV cache over prompt + committed canvases
    mask_free = True  # corruption by uniform-random tokens: no mask token

    @staticmethod
    def canvas_length(model) -> int:
        return int(unwrap_model(model).config.canvas_length)

    def check(self, args, model) -> None:
        super().check(args, model)  # LLaDA's / Dream's sampler settings and layout are refused there
        C = self.canvas_length(model)
        errors = []
        length = getattr(args, "max_completion_length", None)
        if length is not None and length % C:
            errors.append(
                f"max_completion_length={length}: DiffusionGemma's sampler commits whole canvases of "
                f"canvas_length={C} tokens; use a multiple of {C} (e.g. {max(C, length // C * C)})."
            )
        for name, default in _UNREAD_BLOCK_FIELDS.items():
            value = getattr(args, name, default)
            if value != default:
                errors.append(
                    f"{name}={value!r} is a setting of the SDAR / LLaDA2 block sampler; DiffusionGemma's sampler "
                    f"accepts tokens by its entropy bound instead. Leave {name}={default!r}."
                )
        for name in ("top_k", "top_p"):
            value = getattr(args, name, None)
            if value not in (None, 0, 1.0) and not (name == "top_k" and value == 0):
                errors.append(
                    f"{name}={value}: DiffusionGemma's sampler draws from the full tempered distribution (its "
                    f"generate has no {name}); leave {name} unset."
                )
        if getattr(args, "reward_text", "completion") == "canvas":
            errors.append(
                "reward_text='canvas': DiffusionGemma's sampler writes pad after a row's first EOS (as "
                "model.generate does), so there is no canvas text after it to grade; use reward_text='completion'."
            )
        if getattr(args, "eos_tail", "visible") == "masked":
            errors.append("eos_tail='masked' needs a mask token; DiffusionGemma has none. Leave eos_tail='visible'.")
        if hasattr(args, "likelihood_estimator"):  # training (evaluation passes sampler settings only)
            if args.likelihood_estimator not in UNIFORM_ESTIMATORS:
                errors.append(
                    f"likelihood_estimator={args.likelihood_estimator!r} corrupts with a mask token; DiffusionGemma is "
                    f"trained with uniform-random-token corruption: use one of {list(UNIFORM_ESTIMATORS)} (its "
                    "uniform-noise forms, docs/diffusion_gemma.md)."
                )
            if getattr(args, "sandwich", False):
                errors.append(
                    "sandwich=True: SPG's EUBO is an upper bound derived for masked diffusion; no uniform-noise "
                    "counterpart is derived or tested here, so the sandwich is refused for DiffusionGemma. Set "
                    "sandwich=False (the objective then uses the uniform-noise estimate for every advantage)."
                )
            if args.p_mask_prompt not in (None, 0.0):
                errors.append(
                    f"p_mask_prompt={args.p_mask_prompt}: DiffusionGemma's encoder reads the clean prompt (its "
                    "training never corrupts it); leave p_mask_prompt unset."
                )
            if args.estimator_block_size != 32:
                errors.append(
                    f"estimator_block_size={args.estimator_block_size}: DiffusionGemma's estimator scores whole "
                    f"canvases of canvas_length={C}; leave estimator_block_size at its default 32."
                )
            if args.estimator_chunk_size is not None:
                errors.append(
                    f"estimator_chunk_size={args.estimator_chunk_size}: DiffusionGemma's estimator does not chunk its "
                    "rows yet (one encoder pass over the batch, then one decoder pass per sample); leave it unset and "
                    "bound memory with per_device_train_batch_size."
                )
            if getattr(args, "mask_token_id", None) is not None:
                errors.append(f"mask_token_id={args.mask_token_id}: DiffusionGemma has no mask token; remove it.")
        if errors:
            raise ValueError(" ".join(errors))

    def generate(self, adapter, prompt_ids, prompt_mask, args, *, eos_token_ids, generator) -> SamplerOutput:
        model = unwrap_model(adapter.model)
        track_expert_load(model)
        settings = gemma_sampler_settings(
            model,
            max_new_tokens=args.max_completion_length,
            max_denoising_steps=args.block_denoising_steps,
            temperature=args.temperature,
        )
        gens = row_generators(generator, prompt_ids.shape[0], prompt_ids.device)
        return gemma_generate(
            model, prompt_ids, prompt_mask, settings, eos_token_ids=tuple(eos_token_ids),
            pad_token_id=adapter.pad_token_id, generators=gens,
        )  # fmt: skip

    def estimate(self, adapter, prompt_ids, prompt_mask, completion_ids, completion_mask, args, *, seeds,
                 fill_token_id):  # fmt: skip
        track_expert_load(adapter.model)
        C = self.canvas_length(adapter.model)
        L = completion_ids.shape[1]
        extra = -L % C  # TRL pads completions to the longest; the estimator scores whole canvases
        ids = F.pad(completion_ids, (0, extra), value=fill_token_id)
        mask = F.pad(completion_mask, (0, extra), value=0)
        est = uniform_noise_estimate(
            adapter.model, prompt_ids, prompt_mask, ids, mask, seeds=seeds, fill_token_id=fill_token_id,
            num_samples=self.num_mc_samples(args), estimator=args.likelihood_estimator,
            self_conditioning=_SELF_CONDITIONING, prediction=_PREDICTION,
        )  # fmt: skip
        est.token_logps = est.token_logps[:, :L]
        est.token_entropy = est.token_entropy[:, :L]
        return est

    def estimator_passes(self, args) -> int:
        return estimator_passes(self.num_mc_samples(args), _SELF_CONDITIONING)

    def training_logits(self, model, noisy_ids, clean_ids, attention_mask):
        raise NotImplementedError(
            "masked-diffusion SFT does not apply to DiffusionGemma (no mask token); fine-tune it with TRL's "
            "examples/scripts/sft_diffusion_gemma.py."
        )

    def card_snippet(self, settings) -> CardSnippet:
        s = settings
        call = (
            "settings = gemma_sampler_settings(\n"
            f"    model, max_new_tokens={s.max_completion_length}, max_denoising_steps={s.block_denoising_steps!r},\n"
            f"    temperature={s.temperature!r},\n)\n"
            "out = gemma_generate(\n"
            '    model,\n    inputs["input_ids"],\n    inputs["attention_mask"],\n    settings,\n'
            "    eos_token_ids=lm.eos_token_ids,\n    pad_token_id=lm.pad_token_id,\n"
            "    generators=[torch.Generator().manual_seed(0)],\n)"
        )
        return CardSnippet(
            "import torch\n\nfrom stabledrl_trl.diffusion.gemma_sampler import gemma_generate, gemma_sampler_settings",
            call,
            f"DiffusionGemma's own sampler (transformers' generate with one generator per row), up to "
            f"{s.max_completion_length} tokens, temperature {s.temperature:g} times the model's schedule.",
        )


register_family(DiffusionGemmaFamily())


def _count_routing(router, inputs, outputs) -> None:
    # outputs: (router probabilities, top-k weights, top-k expert indices (tokens, k))
    router.expert_load += torch.bincount(outputs[2].flatten(), minlength=router.expert_load.numel()).to(
        router.expert_load.dtype
    )


def track_expert_load(model) -> None:
    """Give every DiffusionGemma router (encoder and decoder) an `expert_load` (E,) count of the tokens routed to each
    expert, updated by a forward hook: the trainer's `moe/expert_load_entropy` reads and resets it
    (`stabledrl_trainer.expert_load_entropy`). Idempotent; the counts are not saved with the model."""
    from transformers.models.diffusion_gemma.modeling_diffusion_gemma import DiffusionGemmaTextRouter

    for module in unwrap_model(model).modules():
        if isinstance(module, DiffusionGemmaTextRouter) and not hasattr(module, "expert_load"):
            module.expert_load = torch.zeros(module.proj.out_features, device=module.proj.weight.device)
            module.register_forward_hook(_count_routing)


def expert_parameters(model) -> list[str]:
    """Names of the routed experts' fused weights (for peft's `target_parameters`)."""
    inner = unwrap_model(model)
    return [n for n, _ in inner.named_parameters() if n.endswith(LORA_EXPERT_PARAMETERS)]
