"""`StableDRLConfig`: TRL's `GRPOConfig` plus masked-diffusion rollouts, likelihood estimation and the StableDRL
and DGPO objectives. Every new field is documented below; bad values fail here, at construction."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

from transformers.utils import logging
from trl import GRPOConfig

from .diffusion.dream_sampler import DREAM_ALGORITHMS
from .validation import check_config_values, short_repr

logger = logging.get_logger(__name__)

# (loss_type, importance_sampling_level, stable_drl_ratio_form, KL) pairs whose automatic mask_seed_mode was reported.
_REPORTED_AUTO_MASK_MODES: set = set()

# Loss types implemented in this package; TRL's own loss types keep working as baselines.
OWN_LOSS_TYPES = ("stable_drl", "stable_drl_ratio", "dgpo")
TRL_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
GROUP_NORMALISED_LOSS_TYPES = ("stable_drl", "stable_drl_ratio")
REWARD_TEXTS = ("completion", "canvas")
ESTIMATOR_NAMES = (
    "mean_field",
    "mc_elbo",
    "mc_elbo_inv_t",
    "block_random",
    "block_random_coupled",
    "coupled",
    "sdmc",
    "sdmc_coupled",
)
SANDWICH_ESTIMATORS = ("block_random", "block_random_coupled")  # SPG's EUBO is defined on block-random masks

# GRPOConfig defaults this config changes, with the reason. Listed in the README too.
CHANGED_GRPO_DEFAULTS = {
    "loss_type": ("dapo", "stable_drl", "the StableDRL objective is the point of this package"),
    "scale_rewards": ("group", "none", "advantages are mean-centred only, as the official StableDRL code"),
    "temperature": (1.0, 0.9, "the official StableDRL rollout temperature; an autoregressive model keeps 1.0"),
    "max_completion_length": (
        512,
        256,
        "the official StableDRL generation length (a diffusion LM's fixed canvas); an autoregressive model keeps 512",
    ),
}


class _UnsetLength(int):
    """The default `max_completion_length` (256), told apart from a user's 256 (see `autoregressive_defaults`)."""

    def __repr__(self) -> str:
        return repr(int(self))

    def __reduce__(self):
        return (_UnsetLength, (int(self),))


class _UnsetTemperature(float):
    """The default `temperature` (0.9), told apart from a user's 0.9 (see `autoregressive_defaults`)."""

    def __repr__(self) -> str:
        return repr(float(self))

    def __reduce__(self):
        return (_UnsetTemperature, (float(self),))


DIFFUSION_COMPLETION_LENGTH = _UnsetLength(256)
DIFFUSION_TEMPERATURE = _UnsetTemperature(0.9)
# The official StableDRL rollout settings only serve diffusion rollouts: left unset, an autoregressive model gets
# GRPOConfig's defaults instead. (loss_type and scale_rewards serve the objective, for every model.)
_ROLLOUT_DEFAULTS = {"max_completion_length": (_UnsetLength, 512), "temperature": (_UnsetTemperature, 1.0)}


def autoregressive_defaults(config) -> dict:
    """{field: GRPOConfig default} for each rollout field left at its diffusion default (not set by the user, not
    even to the same value): what an autoregressive model uses instead."""
    return {
        name: trl for name, (marker, trl) in _ROLLOUT_DEFAULTS.items() if isinstance(getattr(config, name), marker)
    }


@dataclass
class StableDRLConfig(GRPOConfig):
    r"""Configuration for [`StableDRLTrainer`]: every [`trl.GRPOConfig`] field, plus the fields below.

    Changed GRPO defaults: `loss_type="stable_drl"` (was `"dapo"`), `scale_rewards="none"` (was `"group"`),
    `temperature=0.9` (was `1.0`), `max_completion_length=256` (was `512`); the last two for a diffusion LM only:
    left unset, an autoregressive model keeps TRL's values (`autoregressive_defaults`). Every GRPOConfig field is honoured or refused where it cannot apply
    (`trl_fields`).

    For a diffusion LM, `max_completion_length` is the generation length: every rollout has exactly that many
    positions, decoded in `diffusion_steps` denoising steps, by LLaDA's sampler in blocks of `block_length` or by
    Dream's sampler (Dream / DiffuCoder, `diffusion_sampler`) over the whole completion with `dream_alg` ranking.
    Left unset, `block_length` and `diffusion_steps` follow `max_completion_length` (`resolve_diffusion_layout`:
    block 32 or the largest divisor <= 32, 2 tokens per step), so a GRPOConfig call needs no new field.

    Run safety: a step with a non-finite gradient norm is skipped (`max_nonfinite_grad_steps` in a row stop the run),
    a fresh run refuses an output_dir holding checkpoints (`overwrite_output_dir`), and weights load from
    safetensors only (`allow_pickle_checkpoints`).

    Group-exact self-normalisation: `stable_drl` and `stable_drl_ratio` normalise over the G completions of one
    prompt, so each micro-batch must hold whole groups: `per_device_train_batch_size` must be a multiple of
    `num_generations`. Micro-batches are then formed by shuffling whole groups, and the loss is the mean over groups,
    which is exact under gradient accumulation and data parallelism.
    """

    # Objective
    loss_type: str = field(
        default="stable_drl",
        metadata={
            "help": "Objective: 'stable_drl' (official StableDRL: clipped, group-softmax sequence weights), "
            "'stable_drl_ratio' (ratio-level form), 'dgpo' (soft clipping), or one of TRL's "
            f"{list(TRL_LOSS_TYPES)}."
        },
    )
    scale_rewards: str = field(
        default="none",
        metadata={"help": "Advantage scaling, as in GRPOConfig: 'none' (mean-centred, default), 'group', 'batch'."},
    )
    max_completion_length: int | None = field(
        default=DIFFUSION_COMPLETION_LENGTH,
        metadata={
            "help": "Maximum completion length; for a diffusion LM, the fixed generation length. Left unset: 256 "
            "(the official StableDRL generation length) for a diffusion LM, TRL's 512 for an autoregressive model."
        },
    )
    temperature: float = field(
        default=DIFFUSION_TEMPERATURE,
        metadata={
            "help": "Sampling temperature for rollouts (0 = greedy). Left unset: 0.9 (the official StableDRL rollout "
            "temperature) for a diffusion LM, TRL's 1.0 for an autoregressive model."
        },
    )
    clip_c: float = field(
        default=5.0,
        metadata={"help": "stable_drl: upper clip C on the sequence importance weight, log w <- min(log w, log C)."},
    )
    sandwich: bool = field(
        default=False,
        metadata={
            "help": "stable_drl: use SPG's sandwich objective (ELBO for A > 0, omega*EUBO + (1-omega)*ELBO "
            "otherwise). Needs likelihood_estimator='block_random' or 'block_random_coupled'."
        },
    )
    sandwich_beta: float = field(default=1.5, metadata={"help": "SPG's EUBO exponent beta (> 0)."})
    sandwich_omega: float = field(default=0.5, metadata={"help": "SPG's mixing weight omega in [0, 1]."})
    dgpo_n: float = field(default=1.0, metadata={"help": "dgpo: decay exponent n on the low side (> 0)."})
    dgpo_m: float = field(default=2.0, metadata={"help": "dgpo: decay root m on the high side (> 0)."})

    # Diffusion model
    diffusion: bool | None = field(
        default=None,
        metadata={
            "help": "Treat the policy as a masked diffusion LM. None detects it from the model (LLaDA, Dream, "
            "masked LMs); False keeps TRL's autoregressive generation and exact log-probs."
        },
    )
    mask_token_id: int | None = field(
        default=None, metadata={"help": "Mask token id; None reads it from the model config or tokenizer."}
    )

    # Sampler
    block_length: int | None = field(
        default=None,
        metadata={
            "help": "Semi-autoregressive block length; must divide max_completion_length. None: 32 (the official "
            "recipe) when it divides max_completion_length, else the largest divisor of max_completion_length <= 32."
        },
    )
    diffusion_steps: int | None = field(
        default=None,
        metadata={
            "help": "Denoising steps per rollout; a multiple of max_completion_length / block_length and at most "
            "max_completion_length. None: the official ratio of 2 tokens per step (256 positions: 128 steps), rounded "
            "to a multiple of the number of blocks."
        },
    )
    remasking: str = field(
        default="low_confidence", metadata={"help": "Which masked positions to reveal: 'low_confidence' or 'random'."}
    )
    cfg_scale: float = field(default=0.0, metadata={"help": "Classifier-free guidance scale (0 = off)."})

    # ---- Fast rollouts: approximate, opt-in decoding modes of LLaDA's sampler (defaults are exact; README) ----
    rollout_cache: str = field(
        default="none",
        metadata={
            "help": "Key/value reuse during rollouts (LLaDA only): 'none' (exact), 'prefix' (Fast-dLLM prefix cache: "
            "prompt and earlier blocks refreshed once per block) or 'dual' (also the masked suffix). Approximate."
        },
    )
    parallel_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Confidence-threshold parallel decoding: each step also reveals every masked position of the "
            "block whose confidence exceeds this (Fast-dLLM uses 0.9). None keeps LLaDA's fixed schedule. Approximate."
        },
    )
    max_tokens_per_step: int | None = field(
        default=None,
        metadata={
            "help": "Cap on the positions parallel_threshold reveals in one step (the schedule's own count is "
            "always allowed); None = no cap. Needs parallel_threshold."
        },
    )

    # ---- Sampler choice and Dream's sampler (Dream-v0 / DiffuCoder `diffusion_generate`) ----
    diffusion_sampler: str = field(
        default="auto",
        metadata={
            "help": "Rollout sampler of a diffusion LM: 'auto' (the family's own: Dream's for Dream / DiffuCoder, "
            "LLaDA's otherwise; block-diffusion models always use their own), 'llada' (semi-autoregressive blocks; "
            "block_length, remasking, cfg_scale) or 'dream' (one global schedule, no blocks; dream_alg, "
            "dream_alg_temp, dream_eps). temperature, top_k and top_p are read by every sampler."
        },
    )
    dream_alg: str = field(
        default="entropy",
        metadata={
            "help": "Dream sampler: which masked positions to reveal, one of "
            f"{list(DREAM_ALGORITHMS)}. 'entropy' (lowest entropy first) is what Dream's README and DiffuCoder use; "
            "'maskgit_plus' = highest top probability, 'topk_margin' = largest top1 - top2 gap, 'origin' = random."
        },
    )
    dream_alg_temp: float = field(
        default=0.0,
        metadata={
            "help": "Dream sampler: 0 reveals the most confident positions; > 0 draws them from "
            "softmax(confidence / dream_alg_temp)."
        },
    )
    dream_eps: float = field(
        default=1e-3,
        metadata={"help": "Dream sampler: final time of the schedule t = linspace(1, eps, steps + 1), in [0, 1)."},
    )

    # Likelihood estimation
    likelihood_estimator: str = field(
        default="block_random",
        metadata={
            "help": f"Sequence likelihood estimator, one of {list(ESTIMATOR_NAMES)}. 'block_random' is the "
            "official StableDRL (SPG) estimator and 'block_random_coupled' its low-variance form (complementary "
            "masks inside the chosen block, same expectation); 'mean_field' is d1's one-step estimator; 'sdmc' / "
            "'sdmc_coupled' are Gauss-Legendre quadratures over the masking level (sdmc_nodes)."
        },
    )
    mc_samples: int | None = field(
        default=None,
        metadata={
            "help": "Monte-Carlo mask samples per estimate (forward passes per completion). None: the estimator's "
            "default (1 for mean_field, sdmc_nodes for sdmc, 2 * sdmc_nodes for sdmc_coupled, 2 otherwise). "
            "mean_field takes exactly one pass; the paired estimators (coupled, block_random_coupled) need an even "
            "count, sdmc a multiple of sdmc_nodes (sdmc_coupled: of 2 * sdmc_nodes)."
        },
    )
    sdmc_nodes: int | None = field(
        default=None,
        metadata={
            "help": "sdmc / sdmc_coupled: Gauss-Legendre nodes over the masking level t, 1 to 5 (None: 3, GDPO's "
            "gauss-3). Only for those estimators."
        },
    )
    p_mask_prompt: float | None = field(
        default=None,
        metadata={
            "help": "Probability of masking each prompt token in the estimator; None uses the estimator's default "
            "(0.15 for mean_field and block_random, 0 otherwise)."
        },
    )
    estimator_block_size: int = field(
        default=32, metadata={"help": "Block size of the block_random estimator's masks."}
    )
    estimator_chunk_size: int | None = field(
        default=None,
        metadata={
            "help": "Rows per estimator forward pass (batch x MC samples are chunked); bounds peak memory. "
            "None runs all rows at once."
        },
    )
    mask_seed_mode: str | None = field(
        default=None,
        metadata={
            "help": "'fresh': new random masks at every inner step, old policy scored once after generation "
            "(official StableDRL). 'shared': one mask seed per inner iteration, used for the current, old and "
            "reference policies alike (d1). None (default) picks per objective: 'fresh' for loss_type='stable_drl' "
            "without KL, 'shared' otherwise; the choice is logged and written back into this field."
        },
    )

    # ------------------------------------------------------------------ Ratio pairing, guards, official inputs
    allow_noisy_token_ratios: bool = field(
        default=False,
        metadata={
            "help": "Allow an objective that consumes per-token log-ratios (TRL's token-level losses, dgpo, "
            "stable_drl_ratio with form 'sum', a KL term) with mask_seed_mode='fresh' and a random-mask estimator. "
            "Such ratios are mask noise (a token masked in one pass and not in the other gives a log-ratio of about "
            "+-25), so this is refused unless set, e.g. for a stability study."
        },
    )
    test_log_ratio_noise_std: float = field(
        default=0.0,
        metadata={
            "help": "TEST-ONLY, for noise-dose studies (scripts/bench_noise_dose.py); never for a model you keep. "
            "Adds noise of this standard deviation, N(0, std^2) drawn per completion and inner step (seeded from "
            "`seed`), to every completion's log-ratio L_theta - L_old (for per-token objectives: to each of its "
            "tokens' log-ratios, the same draw), on top of the estimator's own noise. 0.0 (default): off."
        },
    )
    stable_drl_ratio_form: str = field(
        default="mean",
        metadata={
            "help": "stable_drl_ratio: 'mean' (default) uses rho = exp(L_theta - L_old), the length-normalised "
            "sequence ratio built from the estimator's sequence estimate, meaningful with any masks; 'sum' uses "
            "rho = exp(sum of per-token log-ratios), which needs shared masks (or the deterministic mean_field "
            "estimator without prompt masking)."
        },
    )
    all_clipped_patience: int = field(
        default=3,
        metadata={
            "help": "Warn when every sample (or token) of this many consecutive optimiser steps is clipped: the "
            "clipped objectives then get no gradient from the ratio (no learning). Logged every step as "
            "'stabledrl/all_clipped' (0/1) and 'stabledrl/all_clipped_streak'. 0 disables the warning."
        },
    )
    eos_tail: str = field(
        default="visible",
        metadata={
            "help": "What the likelihood estimator shows after a completion's first EOS (a diffusion rollout is a "
            "fixed canvas): 'visible' shows the tail as unmasked EOS tokens, as the sampler saw them; 'masked' "
            "(the official StableDRL code) masks every tail position and attends to it. Never scored. In both modes "
            "the prompt's left padding is neither attended nor masked (the official code never pads)."
        },
    )
    completion_end: str = field(
        default="any_eos",
        metadata={
            "help": "Where a diffusion rollout's scored completion ends: 'any_eos' at the first EOS or end-of-turn "
            "id (model config and tokenizer); 'tokenizer_eos' at the first tokenizer.eos_token_id only (the "
            "official StableDRL code: LLaDA's <|eot_id|> before it is scored as a token)."
        },
    )

    # ---- Block diffusion (SDAR, TraDo): rollouts of block-causal models (their block size is the model's
    # config.block_size; temperature, top_k and top_p are GRPOConfig's fields)
    block_denoising_steps: int | None = field(
        default=None,
        metadata={
            "help": "Denoising steps per block for block-diffusion models (SDAR, TraDo); None = the model's block "
            "size (one token per step at least, SDAR's and TraceRL's setting)."
        },
    )
    block_remasking: str = field(
        default="low_confidence_dynamic",
        metadata={
            "help": "Block-diffusion reveal rule: 'low_confidence_dynamic' (every token above "
            "block_confidence_threshold, at least the step's scheduled count; TraceRL's rollouts) or "
            "'low_confidence_static' (the scheduled count, most confident first)."
        },
    )
    block_confidence_threshold: float = field(
        default=0.9,
        metadata={"help": "Confidence threshold of 'low_confidence_dynamic' (TraceRL uses 0.9)."},
    )
    # ---- Run safety: non-finite steps, the output folder, checkpoint formats ----
    max_nonfinite_grad_steps: int = field(
        default=3,
        metadata={
            "help": "An optimiser step whose gradient norm is inf/NaN is skipped (parameters and optimiser state "
            "untouched), counted (`stabledrl/nonfinite_grad_steps`) and warned about; this many in a row stop the run "
            "with an error."
        },
    )
    max_nonfinite_reward_steps: int = field(
        default=3,
        metadata={
            "help": "A generation batch in which every sample's reward is inf / NaN / None trains nothing: it is "
            "warned about (naming the reward functions), and this many in a row stop the run with an error."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Start a fresh run in an output_dir that already holds checkpoint-* folders, deleting them. "
            "Without it such a run is refused (resume it with resume_from_checkpoint, or pick another output_dir)."
        },
    )
    allow_pickle_checkpoints: bool = field(
        default=False,
        metadata={
            "help": "Allow loading pickle weights (.bin / .pt model files, which can run code when unpickled). "
            "Off: only safetensors weights are loaded."
        },
    )

    # ---- Reward text: what the reward functions grade ----
    reward_text: str = field(
        default="completion",
        metadata={
            "help": "Text the reward functions receive as `completions`: 'completion' (TRL's: the completion up to "
            "and including the first EOS, decoded without special tokens) or 'canvas' (the official StableDRL "
            "code's: the whole decoded generation canvas without special tokens, so text after the first EOS is "
            "graded too; diffusion LMs only). The trained tokens (`completion_ids`) are the same either way."
        },
    )

    def __post_init__(self):
        check_field_types(self)
        check_config_values(self, _type_hints(type(self)))  # bools, finite floats in range, positive step counts
        self._check_trainable_run()
        # Layout checks first: TRL's own check on the same numbers gives a less specific message.
        if self.loss_type in GROUP_NORMALISED_LOSS_TYPES:
            if self.num_generations < 2:
                raise ValueError(
                    f"num_generations={self.num_generations}: loss_type={self.loss_type!r} normalises over the "
                    "completions of one prompt, so it needs num_generations >= 2."
                )
            if self.per_device_train_batch_size % self.num_generations != 0:
                raise ValueError(
                    f"per_device_train_batch_size={self.per_device_train_batch_size} is not a multiple of "
                    f"num_generations={self.num_generations}: loss_type={self.loss_type!r} normalises each group of "
                    "num_generations completions exactly, so every micro-batch must hold whole groups. Set "
                    f"per_device_train_batch_size to a multiple of {self.num_generations} (the official recipe uses "
                    "one prompt per device micro-batch: per_device_train_batch_size = num_generations) and use "
                    "gradient_accumulation_steps for a larger batch."
                )
        super().__post_init__()
        known = OWN_LOSS_TYPES + TRL_LOSS_TYPES
        if self.loss_type not in known:
            raise ValueError(f"loss_type={self.loss_type!r} is not known; choose one of {list(known)}.")
        if self.likelihood_estimator not in ESTIMATOR_NAMES:
            raise ValueError(
                f"likelihood_estimator={self.likelihood_estimator!r} is not known; choose one of "
                f"{list(ESTIMATOR_NAMES)}."
            )
        if self.mask_seed_mode not in (None, "fresh", "shared"):
            raise ValueError(f"mask_seed_mode={self.mask_seed_mode!r}; choose 'fresh', 'shared' or None (auto).")
        if self.remasking not in ("low_confidence", "random"):
            raise ValueError(f"remasking={self.remasking!r}; choose 'low_confidence' or 'random'.")
        if self.clip_c <= 1.0:
            raise ValueError(f"clip_c={self.clip_c} must be > 1 (the upper bound on the importance weight); use 5.0.")
        eps_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        for name, value in (("epsilon", self.epsilon), ("epsilon_high", eps_high)):
            if not 0.0 < value < 1.0 and self.loss_type in ("stable_drl_ratio", "dgpo"):
                raise ValueError(f"{name}={value} must be in (0, 1) for loss_type={self.loss_type!r}; use 0.2.")
        self._check_estimator_samples()
        if self.p_mask_prompt is not None and not 0.0 <= self.p_mask_prompt < 1.0:
            raise ValueError(f"p_mask_prompt={self.p_mask_prompt} must be in [0, 1) (or None for the default).")
        if self.estimator_chunk_size is not None and self.estimator_chunk_size < 1:
            raise ValueError(f"estimator_chunk_size={self.estimator_chunk_size} must be >= 1 or None.")
        if self.estimator_block_size < 1:
            raise ValueError(f"estimator_block_size={self.estimator_block_size} must be >= 1.")
        if self.sandwich:
            if self.loss_type != "stable_drl":
                raise ValueError(f"sandwich=True needs loss_type='stable_drl' (got {self.loss_type!r}).")
            if self.likelihood_estimator not in SANDWICH_ESTIMATORS:
                raise ValueError(
                    f"sandwich=True needs likelihood_estimator='block_random' or 'block_random_coupled' (got "
                    f"{self.likelihood_estimator!r}): SPG's EUBO is defined on block-random masks."
                )
        if self.sandwich_beta <= 0:
            raise ValueError(f"sandwich_beta={self.sandwich_beta} must be > 0; SPG uses 1.5.")
        if not 0.0 <= self.sandwich_omega <= 1.0:
            raise ValueError(f"sandwich_omega={self.sandwich_omega} must be in [0, 1]; SPG uses 0.5.")
        if self.dgpo_n <= 0 or self.dgpo_m <= 0:
            raise ValueError(f"dgpo_n={self.dgpo_n} and dgpo_m={self.dgpo_m} must be > 0; defaults are 1 and 2.")
        if self.rollout_cache not in ("none", "prefix", "dual"):
            raise ValueError(
                f"rollout_cache={self.rollout_cache!r}; choose 'none' (exact), 'prefix' or 'dual' (approximate)."
            )
        if self.parallel_threshold is not None and not 0.0 < self.parallel_threshold < 1.0:
            raise ValueError(
                f"parallel_threshold={self.parallel_threshold} must be a probability in (0, 1) (Fast-dLLM uses 0.9), "
                "or None for LLaDA's fixed schedule."
            )
        if self.max_tokens_per_step is not None:
            if self.max_tokens_per_step < 1:
                raise ValueError(f"max_tokens_per_step={self.max_tokens_per_step} must be >= 1 or None (no cap).")
            if self.parallel_threshold is None:
                raise ValueError(
                    f"max_tokens_per_step={self.max_tokens_per_step} caps confidence-threshold decoding only; set "
                    "parallel_threshold (e.g. 0.9) or leave max_tokens_per_step=None."
                )
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} must be >= 0.")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0.")
        # Sampler layout: unset block_length / diffusion_steps get defaults that fit max_completion_length; a layout
        # set explicitly is checked where LLaDA's sampler may run (not for diffusion=False: an autoregressive model
        # never uses these fields; not for Dream's block-free sampler). The trainer checks again once it knows the
        # model's sampler.
        self.block_length, self.diffusion_steps = resolve_diffusion_layout(
            self.max_completion_length,
            self.block_length,
            self.diffusion_steps,
            check=self.diffusion is not False and self.diffusion_sampler != "dream",
        )
        # before the samplers' own checks, so the message is the field's and not one sampler's
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off).")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off).")
        self._check_sampler_choice()
        if self.reward_text not in REWARD_TEXTS:
            raise ValueError(
                f"reward_text={self.reward_text!r}; choose 'completion' (the text up to the first EOS) or 'canvas' "
                "(the whole decoded generation canvas, as the official StableDRL code grades it)."
            )
        # Block diffusion (SDAR, TraDo)
        from .diffusion.block_sampler import REMASKING_STRATEGIES

        if self.block_remasking not in REMASKING_STRATEGIES:
            raise ValueError(f"block_remasking={self.block_remasking!r}; choose one of {list(REMASKING_STRATEGIES)}.")
        if not 0.0 <= self.block_confidence_threshold <= 1.0:
            raise ValueError(
                f"block_confidence_threshold={self.block_confidence_threshold} must be in [0, 1]; TraceRL uses 0.9."
            )
        if self.block_denoising_steps is not None and self.block_denoising_steps < 1:
            raise ValueError(
                f"block_denoising_steps={self.block_denoising_steps} must be >= 1, or None for the model's block size."
            )
        self._check_ratio_pairing()
        from .trl_fields import check_config_fields

        check_config_fields(self)  # GRPOConfig fields that cannot apply to this loss type (trl_fields.REFUSED)

    @property
    def num_mc_samples(self) -> int:
        """Forward passes per completion of one estimate: `mc_samples`, or the estimator's default when unset."""
        from .diffusion.estimators import default_num_samples

        if self.mc_samples is not None:
            return self.mc_samples
        return default_num_samples(self.likelihood_estimator, self.sdmc_nodes or 3)

    def _check_estimator_samples(self) -> None:
        """mc_samples and sdmc_nodes against the estimator: a value the estimator would ignore or cannot use fails."""
        name, k, nodes = self.likelihood_estimator, self.mc_samples, self.sdmc_nodes
        sdmc = name in ("sdmc", "sdmc_coupled")
        if nodes is not None:
            if not sdmc:
                raise ValueError(
                    f"sdmc_nodes={nodes} is an option of likelihood_estimator='sdmc' or 'sdmc_coupled', not of "
                    f"{name!r}; remove it or choose one of those estimators."
                )
            if not 1 <= nodes <= 5:
                raise ValueError(f"sdmc_nodes={nodes} must be in [1, 5] (Gauss-Legendre nodes over t); GDPO uses 3.")
        if k is None:
            return
        if k < 1:
            raise ValueError(f"mc_samples={k} must be >= 1 (or None for the estimator's default).")
        if name == "mean_field" and k > 1:
            raise ValueError(
                f"mc_samples={k} with likelihood_estimator='mean_field': the one-step estimator masks every completion "
                "token and takes exactly one forward pass, so further samples would be ignored. Set mc_samples=1 or "
                "leave it unset (null), or choose a Monte-Carlo estimator (e.g. 'block_random') for more samples."
            )
        if name in ("coupled", "block_random_coupled") and k % 2:
            raise ValueError(
                f"mc_samples={k} must be even for likelihood_estimator={name!r} (each mask and its complement); "
                f"use mc_samples={k + 1}."
            )
        if sdmc:
            unit = (nodes or 3) * (2 if name == "sdmc_coupled" else 1)
            if k % unit:
                raise ValueError(
                    f"mc_samples={k} must be a multiple of {unit} for likelihood_estimator={name!r} with sdmc_nodes="
                    f"{nodes or 3} (one pass per node{' and half pair' if name == 'sdmc_coupled' else ''}); use "
                    f"mc_samples={unit * max(1, round(k / unit))} or leave it unset."
                )

    def _check_ratio_pairing(self):
        """Pick `mask_seed_mode` when unset, and refuse objective / mask pairings whose ratios are mask noise."""
        from .objectives import TOKEN_INPUT, ratio_input

        for name, value, allowed in (
            ("stable_drl_ratio_form", self.stable_drl_ratio_form, ("mean", "sum")),
            ("eos_tail", self.eos_tail, ("visible", "masked")),
            ("completion_end", self.completion_end, ("any_eos", "tokenizer_eos")),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not known; choose one of {list(allowed)}.")
        if self.all_clipped_patience < 0:
            raise ValueError(
                f"all_clipped_patience={self.all_clipped_patience} must be >= 0 (0 disables the warning)."
            )
        consumes = ratio_input(self.loss_type, self.importance_sampling_level, self.stable_drl_ratio_form)
        per_token = consumes == TOKEN_INPUT or self.beta != 0.0  # TRL's KL term is per token too
        if self.mask_seed_mode is None:
            self.mask_seed_mode = "fresh" if (self.loss_type == "stable_drl" and self.beta == 0.0) else "shared"
            key = (self.loss_type, self.importance_sampling_level, self.stable_drl_ratio_form, self.beta != 0.0)
            if key not in _REPORTED_AUTO_MASK_MODES:
                _REPORTED_AUTO_MASK_MODES.add(key)
                reason = (
                    "the official StableDRL setting: the old policy is scored once with its own masks"
                    if self.mask_seed_mode == "fresh"
                    else "the current, old and reference policies are scored on the same masks, so the ratio "
                    "measures the policy change rather than mask noise"
                )
                logger.warning(
                    f"mask_seed_mode=None: using mask_seed_mode={self.mask_seed_mode!r} for "
                    f"loss_type={self.loss_type!r} ({reason}). Set mask_seed_mode explicitly to silence this."
                )
        deterministic = self.likelihood_estimator == "mean_field" and self.p_mask_prompt == 0.0
        exact = self.diffusion is False  # autoregressive: exact per-token log-probs, masks play no part
        if (
            per_token
            and self.mask_seed_mode == "fresh"
            and not (deterministic or exact or self.allow_noisy_token_ratios)
        ):
            what = "a KL term (beta != 0)" if consumes != TOKEN_INPUT else "per-token log-ratios"
            fixes = [
                "mask_seed_mode='shared' (or None: auto)",
            ]
            if self.loss_type not in ("dgpo", "stable_drl_ratio") and self.loss_type != "vespo" and self.beta == 0.0:
                fixes.append("importance_sampling_level='sequence' (the paper's GRPO baseline: exp(L_theta - L_old))")
            if self.loss_type == "stable_drl_ratio":
                fixes.append("stable_drl_ratio_form='mean' (exp(L_theta - L_old))")
            fixes.append("allow_noisy_token_ratios=True to run it anyway, e.g. in a stability study")
            raise ValueError(
                f"loss_type={self.loss_type!r} (importance_sampling_level={self.importance_sampling_level!r}) "
                f"consumes {what}, but mask_seed_mode='fresh' with likelihood_estimator="
                f"{self.likelihood_estimator!r} scores the old and the current policy on independent random masks: "
                "a Monte-Carlo estimator's per-token values are not per-token log-probs, and a token masked in one "
                "pass and not in the other gives a log-ratio of about +-25. Fix: set " + ", or ".join(fixes) + "."
            )

    # ---------------------------------------------------------------- drop-in defaults and run-level checks

    def _check_trainable_run(self):
        """Settings that would train nothing: refused (or warned about when they can be intended)."""
        if self.num_iterations < 1:
            raise ValueError(
                f"num_iterations={self.num_iterations}: each generation batch must be optimised at least once; use "
                "num_iterations=1 (TRL's default) or 2 (the official StableDRL recipe)."
            )
        if self.max_nonfinite_grad_steps < 1:
            raise ValueError(
                f"max_nonfinite_grad_steps={self.max_nonfinite_grad_steps} must be >= 1 (consecutive skipped steps "
                "before the run stops); the default is 3."
            )
        if self.temperature == 0 and self.num_generations is not None and self.num_generations > 1:
            warnings.warn(
                f"temperature=0 with num_generations={self.num_generations}: greedy decoding gives every completion "
                "of a prompt the same text, so every advantage is 0 and nothing is learnt. Use temperature > 0 "
                "(the official StableDRL recipe uses 0.9) unless this is an evaluation-only run.",
                stacklevel=3,
            )

    # ---- Sampler choice and Dream's sampler ----
    def _check_sampler_choice(self) -> None:
        """`diffusion_sampler` and the settings that only one sampler reads: a setting the chosen sampler would
        ignore is an error. With 'auto' the model decides, so the check against the family runs in the trainer."""
        from .diffusion.dream_sampler import validate_dream_sampler_args
        from .diffusion.family import SAMPLERS, check_sampler_settings

        if self.diffusion_sampler != "auto" and self.diffusion_sampler not in SAMPLERS:
            raise ValueError(
                f"diffusion_sampler={self.diffusion_sampler!r}; choose 'auto' (the model family's own sampler) or one "
                f"of {' / '.join(repr(name) for name in SAMPLERS)}."
            )
        if self.diffusion is False or self.max_completion_length is None:
            return  # an autoregressive model reads none of the diffusion samplers' settings
        validate_dream_sampler_args(
            gen_length=self.max_completion_length,
            steps=self.diffusion_steps,
            alg=self.dream_alg,
            alg_temp=self.dream_alg_temp,
            eps=self.dream_eps,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k if self.top_k else None,
        )
        if self.diffusion_sampler in SAMPLERS:
            check_sampler_settings(self, self.diffusion_sampler)


# --------------------------------------------------------------------------- drop-in helpers (used above)

OFFICIAL_BLOCK_LENGTH = 32
OFFICIAL_TOKENS_PER_STEP = 2  # 256 positions in 128 steps


def resolve_diffusion_layout(
    max_completion_length: int, block_length: int | None, diffusion_steps: int | None, check: bool = True
) -> tuple[int, int]:
    """Fill unset `block_length` / `diffusion_steps` from `max_completion_length` and check the layout.

    block_length None: 32 (official) when it divides L = max_completion_length, else the largest divisor of L <= 32.
    diffusion_steps None: L / 2 (the official 2 tokens per step), rounded down to a multiple of the number of blocks
    L / block_length, and at least one step per block; never more steps than positions.
    `check=False` fills the defaults but leaves a layout the user set explicitly unchecked (for a model that may be
    autoregressive); `check_diffusion_layout` checks it later. Messages use the config's field names.
    """
    length = max_completion_length
    if length is None:  # TRL's "no limit" for autoregressive models; the trainer refuses it for a dLLM
        return block_length, diffusion_steps
    if not _is_int(length) or length < 1:
        raise ValueError(f"max_completion_length must be a positive integer, got {length!r}.")
    if block_length is None:
        block_length = max(d for d in range(1, min(OFFICIAL_BLOCK_LENGTH, length) + 1) if length % d == 0)
    if diffusion_steps is None and _is_int(block_length) and block_length >= 1 and length % block_length == 0:
        num_blocks = length // block_length
        diffusion_steps = num_blocks * max(1, length // OFFICIAL_TOKENS_PER_STEP // num_blocks)
    if check:
        check_diffusion_layout(length, block_length, diffusion_steps)
    return block_length, diffusion_steps


def check_diffusion_layout(max_completion_length: int, block_length, diffusion_steps) -> None:
    """Raise a ValueError naming the config field, its value and the fix for a layout the sampler cannot run."""
    length = max_completion_length
    if length is None:
        raise ValueError(
            "max_completion_length=None: a diffusion LM decodes a fixed canvas of max_completion_length positions; "
            "set it (the official StableDRL recipe uses 256)."
        )
    if not _is_int(block_length) or block_length < 1:
        raise ValueError(f"block_length must be a positive integer (or None for the default), got {block_length!r}.")
    if length % block_length != 0:
        divisors = [d for d in range(1, length + 1) if length % d == 0 and d <= OFFICIAL_BLOCK_LENGTH]
        raise ValueError(
            f"block_length={block_length} must divide max_completion_length={length} (every block has the same "
            f"length). Set block_length to a divisor of {length} (e.g. {divisors[-1]}), leave it unset for that "
            f"default, or change max_completion_length to a multiple of {block_length}."
        )
    num_blocks = length // block_length
    if diffusion_steps is None:
        raise ValueError("diffusion_steps is None; leave both block_length and diffusion_steps unset, or set both.")
    if not _is_int(diffusion_steps) or diffusion_steps < 1:
        raise ValueError(
            f"diffusion_steps must be a positive integer (or None for the default), got {diffusion_steps!r}."
        )
    if diffusion_steps % num_blocks != 0:
        raise ValueError(
            f"diffusion_steps={diffusion_steps} must be a multiple of the number of blocks max_completion_length / "
            f"block_length = {length} / {block_length} = {num_blocks} (steps are split evenly across blocks); use "
            f"e.g. diffusion_steps={num_blocks * max(1, diffusion_steps // num_blocks)}, or leave it unset."
        )
    if diffusion_steps > length:
        raise ValueError(
            f"diffusion_steps={diffusion_steps} is more than max_completion_length={length}: a step reveals at "
            f"least one position, so at most {length} steps can do anything. Use diffusion_steps <= {length} "
            f"(the official ratio is {length // OFFICIAL_TOKENS_PER_STEP or 1}), or leave it unset."
        )


# Fields whose None has a documented TRL meaning although their default is not None.
NONE_ALLOWED = ("max_completion_length",)  # no limit: transformers' generation config decides (autoregressive only)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_field_types(config) -> None:
    """Integer fields must hold integers (YAML gives `8.0`, `[8]` or `null` unchanged); floats accept integers.

    None is accepted only where the field's default is None (there it has a documented meaning).
    """
    import dataclasses
    import typing

    hints = _type_hints(type(config))
    for f in dataclasses.fields(config):
        hint = hints.get(f.name)
        if hint is None or not f.init:
            continue
        args = set(typing.get_args(hint)) or {hint}
        value = getattr(config, f.name)
        kinds = args - {type(None)}
        if kinds not in ({int}, {float}):
            continue
        if value is None:
            if type(None) in args and (f.default is None or f.name in NONE_ALLOWED):
                continue
            raise TypeError(
                f"{f.name}=None: this field needs {'an integer' if kinds == {int} else 'a number'}; remove the line "
                f"to keep the default {f.default!r}."
            )
        if kinds == {int} and not _is_int(value):
            fix = f" (write {int(value)})" if isinstance(value, float) and value.is_integer() else ""
            raise TypeError(f"{f.name}={short_repr(value)} ({type(value).__name__}) must be an integer{fix}.")
        if kinds == {float} and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise TypeError(f"{f.name}={short_repr(value)} ({type(value).__name__}) must be a number.")


@functools.lru_cache(maxsize=None)
def _type_hints(cls) -> dict:
    import typing

    return typing.get_type_hints(cls)
