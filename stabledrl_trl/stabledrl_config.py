"""`StableDRLConfig`: TRL's `GRPOConfig` plus masked-diffusion rollouts, likelihood estimation and the StableDRL
and DGPO objectives. Every new field is documented below; bad values fail here, at construction."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

from transformers.utils import logging
from trl import GRPOConfig

from .checks import NONE_ALLOWED, check_config_values, check_field_types, short_repr  # noqa: F401
from .diffusion.dream_sampler import DREAM_ALGORITHMS
from .diffusion.estimators import ESTIMATOR_SPECS
from .diffusion.sampler_settings import (  # noqa: F401  (the layout rule, importable from here as before)
    OFFICIAL_BLOCK_LENGTH,
    OFFICIAL_TOKENS_PER_STEP,
    REWARD_TEXTS,
    _is_int,
    check_diffusion_layout,
    check_sampler_values,
    resolve_diffusion_layout,
    sampler_default,
)
from .objectives import (
    MASK_SEED_MODES,
    OBJECTIVES,
    STABLE_DRL_RATIO_FORMS,
    TOKEN_INPUT,
    TRL_ALWAYS_TOKEN,
    TRL_LOSS_TYPES,
    config_ratio_input,
    known_loss_types,
    needs_whole_groups,
)

logger = logging.get_logger(__name__)

# (loss_type, importance_sampling_level, stable_drl_ratio_form, KL) pairs whose automatic mask_seed_mode was reported.
_REPORTED_AUTO_MASK_MODES: set = set()

# The package's loss types are the objectives registry (`objectives.OBJECTIVES`); TRL's own loss types keep working
# as baselines. `OWN_LOSS_TYPES` / `GROUP_NORMALISED_LOSS_TYPES` stay importable (see `__getattr__` below).
# The estimators are the registry `diffusion.estimators.ESTIMATOR_SPECS`; `ESTIMATOR_NAMES` / `SANDWICH_ESTIMATORS`
# stay importable (see `__getattr__` below).

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


DIFFUSION_COMPLETION_LENGTH = _UnsetLength(sampler_default("max_completion_length"))
DIFFUSION_TEMPERATURE = _UnsetTemperature(sampler_default("temperature"))
# The official StableDRL rollout settings only serve diffusion rollouts: left unset, an autoregressive model gets
# GRPOConfig's defaults instead. (loss_type and scale_rewards serve the objective, for every model.)
_ROLLOUT_DEFAULTS = {"max_completion_length": (_UnsetLength, 512), "temperature": (_UnsetTemperature, 1.0)}


def autoregressive_defaults(config) -> dict:
    """{field: GRPOConfig default} for each rollout field left at its diffusion default (not set by the user, not
    even to the same value): what an autoregressive model uses instead. A block_length / diffusion_steps derived
    from the diffusion length is derived again from the new one, so that the unused layout does not read as set."""
    changes = {
        name: trl for name, (marker, trl) in _ROLLOUT_DEFAULTS.items() if isinstance(getattr(config, name), marker)
    }
    if "max_completion_length" in changes:
        from .diffusion.family import explicit_layout

        explicit = explicit_layout(config)  # set away from what the diffusion length derives
        derived = resolve_diffusion_layout(changes["max_completion_length"], None, None, check=False)
        for name, value in zip(("block_length", "diffusion_steps"), derived):
            if name not in explicit:
                changes[name] = value
    return changes


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
        default=sampler_default("remasking"), metadata={"help": "Which masked positions to reveal: 'low_confidence' or 'random'."}
    )
    cfg_scale: float = field(default=sampler_default("cfg_scale"), metadata={"help": "Classifier-free guidance scale (0 = off)."})

    # ---- Fast rollouts: approximate, opt-in decoding modes of LLaDA's sampler (defaults are exact; docs/rollouts.md) ----
    rollout_cache: str = field(
        default=sampler_default("rollout_cache"),
        metadata={
            "help": "Key/value reuse during rollouts (LLaDA only): 'none' (exact), 'prefix' (Fast-dLLM prefix cache: "
            "prompt and earlier blocks refreshed once per block) or 'dual' (also the masked suffix). Approximate."
        },
    )
    parallel_threshold: float | None = field(
        default=sampler_default("parallel_threshold"),
        metadata={
            "help": "Confidence-threshold parallel decoding: each step also reveals every masked position of the "
            "block whose confidence exceeds this (Fast-dLLM uses 0.9). None keeps LLaDA's fixed schedule. Approximate."
        },
    )
    max_tokens_per_step: int | None = field(
        default=sampler_default("max_tokens_per_step"),
        metadata={
            "help": "Cap on the positions parallel_threshold reveals in one step (the schedule's own count is "
            "always allowed); None = no cap. Needs parallel_threshold."
        },
    )

    # ---- Sampler choice and Dream's sampler (Dream-v0 / DiffuCoder `diffusion_generate`) ----
    diffusion_sampler: str = field(
        default=sampler_default("diffusion_sampler"),
        metadata={
            "help": "Rollout sampler of a diffusion LM: 'auto' (the family's own: Dream's for Dream / DiffuCoder, "
            "LLaDA's otherwise; block-diffusion models always use their own), 'llada' (semi-autoregressive blocks; "
            "block_length, remasking, cfg_scale) or 'dream' (one global schedule, no blocks; dream_alg, "
            "dream_alg_temp, dream_eps). temperature, top_k and top_p are read by every sampler."
        },
    )
    dream_alg: str = field(
        default=sampler_default("dream_alg"),
        metadata={
            "help": "Dream sampler: which masked positions to reveal, one of "
            f"{list(DREAM_ALGORITHMS)}. 'entropy' (lowest entropy first) is what Dream's README and DiffuCoder use; "
            "'maskgit_plus' = highest top probability, 'topk_margin' = largest top1 - top2 gap, 'origin' = random."
        },
    )
    dream_alg_temp: float = field(
        default=sampler_default("dream_alg_temp"),
        metadata={
            "help": "Dream sampler: 0 reveals the most confident positions; > 0 draws them from "
            "softmax(confidence / dream_alg_temp)."
        },
    )
    dream_eps: float = field(
        default=sampler_default("dream_eps"),
        metadata={"help": "Dream sampler: final time of the schedule t = linspace(1, eps, steps + 1), in [0, 1)."},
    )

    # Likelihood estimation
    likelihood_estimator: str = field(
        default="block_random",
        metadata={
            "help": "Sequence likelihood estimator: 'block_random' is the official StableDRL (SPG) estimator and "
            "'block_random_coupled' its paired form (complementary masks inside the chosen block, same expectation); "
            "'mean_field' is d1's one-step estimator; 'mc_elbo' / 'mc_elbo_inv_t' / 'coupled' are Monte-Carlo "
            "ELBOs (per-token mean, 1/t-weighted, complementary pairs); 'sdmc' / 'sdmc_coupled' are Gauss-Legendre "
            "quadratures over the masking level (sdmc_nodes); or the name of an estimator added with "
            "`register_estimator`."
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
        default=sampler_default("block_denoising_steps"),
        metadata={
            "help": "Denoising steps per block for block-diffusion models (SDAR, TraDo); None = the model's block "
            "size (one token per step at least, SDAR's and TraceRL's setting)."
        },
    )
    block_remasking: str = field(
        default=sampler_default("block_remasking"),
        metadata={
            "help": "Block-diffusion reveal rule: 'low_confidence_dynamic' (every token above "
            "block_confidence_threshold, at least the step's scheduled count; TraceRL's rollouts) or "
            "'low_confidence_static' (the scheduled count, most confident first)."
        },
    )
    block_confidence_threshold: float = field(
        default=sampler_default("block_confidence_threshold"),
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

    resume_allow_changes: list[str] | None = field(
        default=None,
        metadata={
            "help": "Settings that define the run (loss_type, num_generations, likelihood_estimator, ...: "
            "run_identity.RUN_DEFINING_FIELDS) allowed to differ from the checkpoint's on resume, e.g. "
            "['learning_rate'], or ['all']. Unset: a resume whose run-defining settings differ is refused."
        },
    )

    # ---- Reward text: what the reward functions grade ----
    reward_text: str = field(
        default=sampler_default("reward_text"),
        metadata={
            "help": "Text the reward functions receive as `completions`: 'completion' (TRL's: the completion up to "
            "and including the first EOS, decoded without special tokens) or 'canvas' (the official StableDRL "
            "code's: the whole decoded generation canvas without special tokens, so text after the first EOS is "
            "graded too; diffusion LMs only). The trained tokens (`completion_ids`) are the same either way."
        },
    )

    def __post_init__(self):
        from .launch_env import check_launch_environment, expand_path

        check_launch_environment()  # before accelerate reads WORLD_SIZE / RANK (a hang or a bare error otherwise)
        self.output_dir = expand_path("output_dir", self.output_dir)  # ~ and $VAR, as a shell would
        check_field_types(self, _type_hints(type(self)))
        # bools, finite floats in range (checks.FLOAT_RANGES: every float field's range is checked there, once),
        # positive step counts
        check_config_values(self, _type_hints(type(self)))
        self._check_trainable_run()
        # Layout checks first: TRL's own check on the same numbers gives a less specific message.
        if needs_whole_groups(self.loss_type):
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
        known = known_loss_types()
        if self.loss_type not in known:
            raise ValueError(f"loss_type={self.loss_type!r} is not known; choose one of {list(known)}.")
        if self.likelihood_estimator not in ESTIMATOR_SPECS:
            raise ValueError(
                f"likelihood_estimator={self.likelihood_estimator!r} is not known; choose one of "
                f"{list(ESTIMATOR_SPECS)}."
            )
        if self.mask_seed_mode not in (None, *MASK_SEED_MODES):
            raise ValueError(f"mask_seed_mode={self.mask_seed_mode!r}; choose 'fresh', 'shared' or None (auto).")
        objective = OBJECTIVES.get(self.loss_type)  # None for TRL's loss types
        missing = [name for name in (objective.settings if objective else ()) if not hasattr(self, name)]
        if missing:
            raise ValueError(
                f"loss_type={self.loss_type!r} declares settings {missing} that are not StableDRLConfig fields; "
                "register_objective(settings=...) lists config field names (add a field to a config subclass)."
            )
        if objective is not None and objective.check is not None:
            objective.check(self)  # the objective's own settings (e.g. epsilon in (0, 1) for ratio clipping)
        self._check_estimator_samples()
        if self.estimator_chunk_size is not None and self.estimator_chunk_size < 1:
            raise ValueError(f"estimator_chunk_size={self.estimator_chunk_size} must be >= 1 or None.")
        if self.estimator_block_size < 1:
            raise ValueError(f"estimator_block_size={self.estimator_block_size} must be >= 1.")
        if self.sandwich:
            if objective is None or not objective.supports_sandwich:
                supporting = " or ".join(repr(name) for name, spec in OBJECTIVES.items() if spec.supports_sandwich)
                raise ValueError(f"sandwich=True needs loss_type={supporting} (got {self.loss_type!r}).")
            if not ESTIMATOR_SPECS[self.likelihood_estimator].sandwich:
                accepted = " or ".join(repr(n) for n, spec in ESTIMATOR_SPECS.items() if spec.sandwich)
                raise ValueError(
                    f"sandwich=True needs likelihood_estimator={accepted} (got "
                    f"{self.likelihood_estimator!r}): SPG's EUBO is defined on block-random masks."
                )
        # the sampler settings (the same checks `SamplerSettings.from_fields` runs); fills the length-derived layout
        self.block_length, self.diffusion_steps = check_sampler_values(self, diffusion=self.diffusion)
        self._check_ratio_pairing()
        from .run_identity import check_allowed_changes

        check_allowed_changes(self.resume_allow_changes)
        from .trl_fields import check_config_fields

        check_config_fields(self)  # GRPOConfig fields that cannot apply to this loss type (trl_fields.REFUSED)

    @property
    def num_mc_samples(self) -> int:
        """Forward passes per completion of one estimate: `mc_samples`, or the estimator's default when unset."""
        if self.mc_samples is not None:
            return self.mc_samples
        spec = ESTIMATOR_SPECS[self.likelihood_estimator]
        return spec.default_num_samples(spec.option_values(self))

    def _check_estimator_samples(self) -> None:
        """mc_samples and sdmc_nodes against the estimator: a value the estimator would ignore or cannot use fails."""
        name, k, nodes = self.likelihood_estimator, self.mc_samples, self.sdmc_nodes
        spec = ESTIMATOR_SPECS[name]
        for option_field in _unset_estimator_option_fields():  # e.g. sdmc_nodes: an option of some estimators only
            value = getattr(self, option_field)
            if value is not None and option_field not in spec.options.values():
                owners = " or ".join(repr(n) for n, s in ESTIMATOR_SPECS.items() if option_field in s.options.values())
                raise ValueError(
                    f"{option_field}={value} is an option of likelihood_estimator={owners}, not of {name!r}; remove it "
                    "or choose one of those estimators."
                )
        if nodes is not None and not 1 <= nodes <= 5:
            raise ValueError(f"sdmc_nodes={nodes} must be in [1, 5] (Gauss-Legendre nodes over t); GDPO uses 3.")
        if k is None:
            return
        if k < 1:
            raise ValueError(f"mc_samples={k} must be >= 1 (or None for the estimator's default).")
        if spec.max_samples is not None and k > spec.max_samples:
            raise ValueError(
                f"mc_samples={k} with likelihood_estimator={name!r}: {spec.max_samples_reason}. Set "
                f"mc_samples={spec.max_samples} or leave it unset (null), or choose a Monte-Carlo estimator (e.g. "
                "'block_random') for more samples."
            )
        if spec.even_samples and k % 2:
            raise ValueError(
                f"mc_samples={k} must be even for likelihood_estimator={name!r} (each mask and its complement); "
                f"use mc_samples={k + 1}."
            )
        options = spec.option_values(self)
        unit = spec.passes_per_unit(options)
        if k % unit:
            setting = ", ".join(f"{f}={options[o]}" for o, f in spec.options.items())
            half = " and half pair" if "nodes" in options and unit == 2 * options["nodes"] else ""
            per = f"one pass per node{half}" if "nodes" in options else f"{unit} passes per unit"
            raise ValueError(
                f"mc_samples={k} must be a multiple of {unit} for likelihood_estimator={name!r}"
                + (f" with {setting}" if setting else "")
                + f" ({per}); use mc_samples={unit * max(1, round(k / unit))} or leave it unset."
            )

    def _check_ratio_pairing(self):
        """Pick `mask_seed_mode` when unset, and refuse objective / mask pairings whose ratios are mask noise."""
        for name, value, allowed in (
            ("stable_drl_ratio_form", self.stable_drl_ratio_form, STABLE_DRL_RATIO_FORMS),
            ("eos_tail", self.eos_tail, ("visible", "masked")),
            ("completion_end", self.completion_end, ("any_eos", "tokenizer_eos")),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not known; choose one of {list(allowed)}.")
        if self.all_clipped_patience < 0:
            raise ValueError(
                f"all_clipped_patience={self.all_clipped_patience} must be >= 0 (0 disables the warning)."
            )
        objective = OBJECTIVES.get(self.loss_type)  # None for TRL's loss types
        consumes = config_ratio_input(self)
        per_token = consumes == TOKEN_INPUT or self.beta != 0.0  # TRL's KL term is per token too
        if self.mask_seed_mode is None:
            fresh = objective is not None and objective.auto_mask_seed_mode == "fresh" and self.beta == 0.0
            self.mask_seed_mode = "fresh" if fresh else "shared"
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
            if self.loss_type in TRL_LOSS_TYPES and self.loss_type not in TRL_ALWAYS_TOKEN and self.beta == 0.0:
                fixes.append("importance_sampling_level='sequence' (the paper's GRPO baseline: exp(L_theta - L_old))")
            if objective is not None and objective.sequence_fix:
                fixes.append(objective.sequence_fix)
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


@functools.lru_cache(maxsize=None)
def _type_hints(cls) -> dict:
    import typing

    return typing.get_type_hints(cls)


def _unset_estimator_option_fields() -> list[str]:
    """Config fields that are options of some estimators and default to None (unset), e.g. sdmc_nodes."""
    fields = StableDRLConfig.__dataclass_fields__
    declared = dict.fromkeys(f for spec in ESTIMATOR_SPECS.values() for f in spec.options.values())
    return [f for f in declared if f in fields and fields[f].default is None]


def __getattr__(name: str):
    """`OWN_LOSS_TYPES` (every registered objective), `GROUP_NORMALISED_LOSS_TYPES` (those normalising over whole
    groups), `ESTIMATOR_NAMES` (every registered estimator) and `SANDWICH_ESTIMATORS` (those SPG's sandwich accepts),
    read from the registries when asked, so they include objectives and estimators registered later."""
    if name == "ESTIMATOR_NAMES":
        return tuple(ESTIMATOR_SPECS)
    if name == "SANDWICH_ESTIMATORS":
        return tuple(n for n, spec in ESTIMATOR_SPECS.items() if spec.sandwich)
    if name == "OWN_LOSS_TYPES":
        return tuple(OBJECTIVES)
    if name == "GROUP_NORMALISED_LOSS_TYPES":
        return tuple(n for n, spec in OBJECTIVES.items() if spec.whole_groups)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
