"""`StableDRLConfig`: TRL's `GRPOConfig` plus masked-diffusion rollouts, likelihood estimation and the StableDRL
and DGPO objectives. Every new field is documented below; bad values fail here, at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.utils import logging
from trl import GRPOConfig

from .diffusion.dream_sampler import DREAM_ALGORITHMS

logger = logging.get_logger(__name__)

# (loss_type, importance_sampling_level, stable_drl_ratio_form, KL) pairs whose automatic mask_seed_mode was reported.
_REPORTED_AUTO_MASK_MODES: set = set()

# Loss types implemented in this package; TRL's own loss types keep working as baselines.
OWN_LOSS_TYPES = ("stable_drl", "stable_drl_ratio", "dgpo")
TRL_LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
GROUP_NORMALISED_LOSS_TYPES = ("stable_drl", "stable_drl_ratio")
ESTIMATOR_NAMES = ("mean_field", "mc_elbo", "mc_elbo_inv_t", "block_random", "coupled")

# GRPOConfig defaults this config changes, with the reason. Listed in the README too.
CHANGED_GRPO_DEFAULTS = {
    "loss_type": ("dapo", "stable_drl", "the StableDRL objective is the point of this package"),
    "scale_rewards": ("group", "none", "advantages are mean-centred only, as the official StableDRL code"),
    "temperature": (1.0, 0.9, "the official StableDRL rollout temperature"),
    "max_completion_length": (512, 256, "the official StableDRL generation length (for a dLLM, every rollout's)"),
}


@dataclass
class StableDRLConfig(GRPOConfig):
    r"""Configuration for [`StableDRLTrainer`]: every [`trl.GRPOConfig`] field, plus the fields below.

    Changed GRPO defaults: `loss_type="stable_drl"` (was `"dapo"`), `scale_rewards="none"` (was `"group"`),
    `temperature=0.9` (was `1.0`), `max_completion_length=256` (was `512`).

    For a diffusion LM, `max_completion_length` is the generation length: every rollout has exactly that many
    positions, split into blocks of `block_length` and decoded in `diffusion_steps` denoising steps.

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
        default=256,
        metadata={"help": "Maximum completion length; for a diffusion LM, the fixed generation length."},
    )
    temperature: float = field(default=0.9, metadata={"help": "Sampling temperature for rollouts (0 = greedy)."})
    clip_c: float = field(
        default=5.0,
        metadata={"help": "stable_drl: upper clip C on the sequence importance weight, log w <- min(log w, log C)."},
    )
    sandwich: bool = field(
        default=False,
        metadata={
            "help": "stable_drl: use SPG's sandwich objective (ELBO for A > 0, omega*EUBO + (1-omega)*ELBO "
            "otherwise). Needs likelihood_estimator='block_random'."
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
    block_length: int = field(
        default=32, metadata={"help": "Semi-autoregressive block length; must divide max_completion_length."}
    )
    diffusion_steps: int = field(
        default=128,
        metadata={"help": "Denoising steps per rollout; must be divisible by max_completion_length / block_length."},
    )
    remasking: str = field(
        default="low_confidence", metadata={"help": "Which masked positions to reveal: 'low_confidence' or 'random'."}
    )
    cfg_scale: float = field(default=0.0, metadata={"help": "Classifier-free guidance scale (0 = off)."})

    # ---- Sampler choice and Dream's sampler (Dream-v0 / DiffuCoder `diffusion_generate`) ----
    diffusion_sampler: str = field(
        default="auto",
        metadata={
            "help": "Rollout sampler of a diffusion LM: 'auto' (the family's own: Dream's for Dream / DiffuCoder, "
            "LLaDA's otherwise), 'llada' (semi-autoregressive blocks; block_length, remasking, cfg_scale) or "
            "'dream' (one global schedule, no blocks; dream_alg, dream_alg_temp, dream_eps, top_p, top_k)."
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
            "official StableDRL (SPG) estimator, 'mean_field' is d1's one-step estimator."
        },
    )
    mc_samples: int = field(
        default=2, metadata={"help": "Monte-Carlo mask samples per estimate (forward passes per completion)."}
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
            "(the official StableDRL code) masks every tail position and attends to it, and treats the prompt's "
            "left-padding positions as prompt tokens (attended, masked with p_mask_prompt). Never scored."
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

    def __post_init__(self):
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
        if self.mc_samples < 1:
            raise ValueError(f"mc_samples={self.mc_samples} must be >= 1.")
        if self.likelihood_estimator == "coupled" and self.mc_samples % 2:
            raise ValueError(
                f"mc_samples={self.mc_samples} must be even for likelihood_estimator='coupled' (mask + complement)."
            )
        if self.p_mask_prompt is not None and not 0.0 <= self.p_mask_prompt < 1.0:
            raise ValueError(f"p_mask_prompt={self.p_mask_prompt} must be in [0, 1) (or None for the default).")
        if self.estimator_chunk_size is not None and self.estimator_chunk_size < 1:
            raise ValueError(f"estimator_chunk_size={self.estimator_chunk_size} must be >= 1 or None.")
        if self.estimator_block_size < 1:
            raise ValueError(f"estimator_block_size={self.estimator_block_size} must be >= 1.")
        if self.sandwich:
            if self.loss_type != "stable_drl":
                raise ValueError(f"sandwich=True needs loss_type='stable_drl' (got {self.loss_type!r}).")
            if self.likelihood_estimator != "block_random":
                raise ValueError(
                    f"sandwich=True needs likelihood_estimator='block_random' (got {self.likelihood_estimator!r}): "
                    "SPG's EUBO is defined on block-random masks."
                )
        if self.sandwich_beta <= 0:
            raise ValueError(f"sandwich_beta={self.sandwich_beta} must be > 0; SPG uses 1.5.")
        if not 0.0 <= self.sandwich_omega <= 1.0:
            raise ValueError(f"sandwich_omega={self.sandwich_omega} must be in [0, 1]; SPG uses 0.5.")
        if self.dgpo_n <= 0 or self.dgpo_m <= 0:
            raise ValueError(f"dgpo_n={self.dgpo_n} and dgpo_m={self.dgpo_m} must be > 0; defaults are 1 and 2.")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale={self.cfg_scale} must be >= 0.")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0.")
        self._check_sampler_choice()
        # LLaDA's sampler layout (only used for diffusion models, but a bad value is a bad value); Dream's sampler
        # has no blocks, so its settings are checked instead when it is chosen explicitly.
        from .diffusion.sampler import validate_sampler_args

        if self.diffusion_sampler != "dream":
            validate_sampler_args(
                gen_length=self.max_completion_length,
                block_length=self.block_length,
                steps=self.diffusion_steps,
                temperature=self.temperature,
                remasking=self.remasking,
                cfg_scale=self.cfg_scale,
                mask_token_id=0,  # placeholder: the real id is resolved from the model and checked by the trainer
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
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 = off).")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 = off).")
        if self.loss_type in OWN_LOSS_TYPES and self.beta != 0.0:
            raise ValueError(
                f"beta={self.beta}: loss_type={self.loss_type!r} has no KL term (the official StableDRL recipe uses "
                "none). Set beta=0.0, or use one of TRL's loss types (e.g. 'grpo') for a KL-regularised baseline."
            )
        self._check_ratio_pairing()

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

    # ---- Sampler choice and Dream's sampler ----
    def _check_sampler_choice(self) -> None:
        """`diffusion_sampler` and the settings that only one sampler reads: a setting the chosen sampler would
        ignore is an error. With 'auto' the model decides, so the check against the family runs in the trainer."""
        from .diffusion.dream_sampler import validate_dream_sampler_args

        if self.diffusion_sampler not in ("auto", "llada", "dream"):
            raise ValueError(
                f"diffusion_sampler={self.diffusion_sampler!r}; choose 'auto' (the model family's own sampler), "
                "'llada' or 'dream'."
            )
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
        if self.diffusion_sampler in ("llada", "dream"):
            check_sampler_settings(self, self.diffusion_sampler)


DREAM_SAMPLER_DEFAULTS = {"dream_alg": "entropy", "dream_alg_temp": 0.0, "dream_eps": 1e-3}


def check_sampler_settings(args, sampler: str) -> None:
    """Raise if `args` sets something the rollout sampler `sampler` ('llada' or 'dream') does not read."""
    if sampler == "dream":
        if args.remasking != "low_confidence":
            raise ValueError(
                f"remasking={args.remasking!r} is a setting of LLaDA's sampler; Dream's sampler ranks positions by "
                "dream_alg (dream_alg='origin' reveals them at random). Leave remasking='low_confidence'."
            )
        if args.cfg_scale != 0:
            raise ValueError(
                f"cfg_scale={args.cfg_scale}: Dream's sampler has no classifier-free guidance; set cfg_scale=0 or "
                "diffusion_sampler='llada'."
            )
    else:
        changed = {k: getattr(args, k) for k, v in DREAM_SAMPLER_DEFAULTS.items() if getattr(args, k) != v}
        if changed:
            raise ValueError(
                f"{changed} only apply to Dream's sampler, but rollouts use LLaDA's sampler; set "
                "diffusion_sampler='dream' (or 'auto' with a Dream model) or leave them at their defaults "
                f"{DREAM_SAMPLER_DEFAULTS}."
            )
        if args.top_p != 1.0 or args.top_k:
            raise ValueError(
                f"top_p={args.top_p}, top_k={args.top_k}: LLaDA's sampler has no nucleus / top-k filtering; set "
                "top_p=1.0 and top_k=0, or diffusion_sampler='dream'."
            )
