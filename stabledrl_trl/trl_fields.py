"""Every field of TRL's `GRPOConfig` (and the `TrainingArguments` fields it inherits), classified.

A `StableDRLConfig` accepts every `GRPOConfig` field, so each one must do what TRL documents, or be refused where it
cannot apply, never be silently ignored. Each field is in exactly one of three tables:

- `HONOURED`: name -> who implements it: "trl" / "transformers" (their code runs unchanged for this trainer), or
  "here: <test>" (this package re-implements it for diffusion LMs or its own objectives; <test> shows it changes
  what it should).
- `REFUSED`: name -> `Refusal`: honoured except under a condition (a model family, a loss type) where it cannot
  apply; a value other than its neutral one is then an error naming the field, the value and the fix. Conditions on
  the loss type are checked at config construction (`check_config_fields`), conditions on the model when the
  trainer knows it (`check_model_fields`).
- `UNUSED`: name -> why ignoring it is harmless (TRL's GRPO never reads it either, and no value changes a result).

tests/test_trl_fields.py lists the dataclass fields of the installed TRL's `GRPOConfig` and fails for a field in
none or in more than one table, so a TRL upgrade that adds a field fails until the field is classified.
"""

from __future__ import annotations

from dataclasses import dataclass

from .objectives import OBJECTIVES

TRL_CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")  # TRL's two-sided clipped losses (epsilon, delta)


@dataclass(frozen=True)
class Refusal:
    """A field refused, under `when`, at any value outside `neutral`.

    when: "always", "diffusion" (a masked-diffusion model: checked by the trainer), or "loss" (loss_type in
    `losses`, or, with `own`, any registered objective that does not declare the field among its settings
    (`register_objective(settings=...)`): checked at config construction; see `refused_loss_types`). `needs` optionally names a bool field that must also be set (e.g.
    use_vllm) for the refusal to apply. `reason` says why the field cannot apply; `fix` what to do instead.
    """

    neutral: tuple
    when: str
    reason: str
    fix: str
    losses: tuple = ()
    needs: str | None = None
    own: bool = False

    def condition(self, config=None) -> str:
        """The condition in words; with `config`, the loss type it holds."""
        if self.when == "always":
            return "with StableDRLTrainer (GRPO)"
        if self.when == "diffusion":
            return "with a masked-diffusion model"
        text = (
            f"with loss_type={config.loss_type!r}"
            if config is not None
            else f"with loss_type in {list(self.losses)}"
            + (" or a package objective not reading it" if self.own else "")
        )
        return text if self.needs is None else f"{text} and {self.needs}=True"


_NO_ENTROPY_DLM = (
    "a diffusion LM's entropies come from the likelihood estimator without gradient, so an entropy bonus would "
    "change nothing"
)
_AR_GENERATION = "it is an option of TRL's autoregressive generation; the masked-diffusion samplers have no equivalent"
_DIFFUSION_SAMPLER_FIX = (
    "the diffusion samplers read temperature, top_k / top_p, block_length, diffusion_steps, remasking and cfg_scale"
)

REFUSED: dict[str, Refusal] = {
    # ---- TRL's entropy controls: their objectives only
    "entropy_coef": Refusal(
        (0.0,),
        "loss",
        "the package's objectives add no entropy bonus",
        "use a TRL loss type (e.g. 'dapo') or leave entropy_coef=0.0",
        own=True,
    ),
    "use_adaptive_entropy": Refusal(
        (False,),
        "loss",
        "the package's objectives add no entropy bonus",
        "use a TRL loss type (e.g. 'dapo') or leave use_adaptive_entropy=False",
        own=True,
    ),
    "top_entropy_quantile": Refusal(
        (1.0,),
        "loss",
        "the package's objectives weight whole sequences (stable_drl, stable_drl_ratio) or every "
        "token (dgpo) and do not mask low-entropy tokens",
        "use a TRL loss type (e.g. 'dapo') or leave top_entropy_quantile=1.0",
        own=True,
    ),
    "off_policy_mask_threshold": Refusal(
        (None,),
        "loss",
        "the package's objectives bound off-policy samples themselves (clip_c's clipped, "
        "self-normalised weights; dgpo's soft clipping) and do not apply TRL's off-policy sequence mask",
        "use a TRL loss type (e.g. 'dapo') or leave off_policy_mask_threshold=None",
        own=True,
    ),
    # ---- loss-type-specific hyper-parameters: refused where the chosen loss does not read them
    "epsilon": Refusal(
        (0.2,),
        "loss",
        "this objective has no epsilon clip range (stable_drl clips the weight at clip_c; sapo and "
        "vespo use their own parameters)",
        "remove epsilon (stable_drl: set clip_c)",
        losses=("sapo", "vespo"),
        own=True,
    ),
    "epsilon_high": Refusal(
        (None,),
        "loss",
        "this objective has no upper clip range (stable_drl_ratio clips with epsilon on both sides; "
        "stable_drl clips the weight at clip_c)",
        "remove epsilon_high",
        losses=("sapo", "vespo"),
        own=True,
    ),
    "delta": Refusal(
        (None,),
        "loss",
        "delta bounds the ratio of TRL's two-sided clipped losses only",
        f"remove delta, or use one of {list(TRL_CLIPPED)}",
        losses=("cispo", "sapo", "vespo"),
        own=True,
    ),
    "sapo_temperature_neg": Refusal(
        (1.05,),
        "loss",
        "only loss_type='sapo' reads it",
        "remove it",
        losses=(*TRL_CLIPPED, "cispo", "vespo"),
        own=True,
    ),
    "sapo_temperature_pos": Refusal(
        (1.0,),
        "loss",
        "only loss_type='sapo' reads it",
        "remove it",
        losses=(*TRL_CLIPPED, "cispo", "vespo"),
        own=True,
    ),
    **{
        name: Refusal(
            (default,),
            "loss",
            "only loss_type='vespo' reads it",
            "remove it",
            losses=(*TRL_CLIPPED, "cispo", "sapo"),
            own=True,
        )
        for name, default in (
            ("vespo_k_pos", 2.0),
            ("vespo_lambda_pos", 3.0),
            ("vespo_k_neg", 3.0),
            ("vespo_lambda_neg", 2.0),
        )
    },
    "importance_sampling_level": Refusal(
        ("token",),
        "loss",
        "the package's objectives fix their own ratio level (stable_drl and stable_drl_ratio "
        "'mean': the sequence log-weight; dgpo: per token; stable_drl_ratio_form chooses for stable_drl_ratio)",
        "remove importance_sampling_level (stable_drl_ratio: set stable_drl_ratio_form)",
        own=True,
    ),
    "vllm_importance_sampling_correction": Refusal(
        (False,),
        "loss",
        "the package's objectives do not multiply by TRL's vLLM importance-sampling ratio",
        "set vllm_importance_sampling_correction=False, or use a TRL loss type with vLLM",
        own=True,
        needs="use_vllm",
    ),
    # ---- generation options of autoregressive models: refused for a masked-diffusion model
    "use_vllm": Refusal(
        (False,),
        "diffusion",
        "vLLM decodes autoregressively and does not run masked-diffusion sampling",
        "set use_vllm=False: rollouts then use the model family's masked-diffusion sampler (fast approximate "
        "decoding: rollout_cache / parallel_threshold, docs/rollouts.md)",
    ),
    "use_transformers_continuous_batching": Refusal(
        (False,),
        "diffusion",
        "transformers' continuous batching decodes autoregressively",
        "set use_transformers_continuous_batching=False (rollouts use the masked-diffusion sampler)",
    ),
    "cache_implementation": Refusal(
        (None,),
        "diffusion",
        _AR_GENERATION,
        "remove it; LLaDA's sampler has its own key/value reuse (rollout_cache)",
    ),
    "min_p": Refusal((None,), "diffusion", _AR_GENERATION, f"remove it (leave min_p=None); {_DIFFUSION_SAMPLER_FIX}"),
    "repetition_penalty": Refusal(
        (1.0,), "diffusion", _AR_GENERATION, f"remove it (leave repetition_penalty=1.0); {_DIFFUSION_SAMPLER_FIX}"
    ),
    "generation_kwargs": Refusal(
        (None, {}), "diffusion", _AR_GENERATION, f"remove it (leave generation_kwargs=None); {_DIFFUSION_SAMPLER_FIX}"
    ),
    # ---- Trainer options GRPO has no use for
    "label_smoothing_factor": Refusal(
        (0.0,), "always", "GRPO's losses have no labels to smooth", "remove label_smoothing_factor"
    ),
    "train_sampling_strategy": Refusal(
        ("random",),
        "always",
        "GRPO draws prompts with its own repeat sampler (num_generations copies per prompt); "
        "shuffle_dataset turns its shuffling off",
        "remove it (shuffle_dataset=False for dataset order)",
    ),
}

# Fields also refused for a masked-diffusion model whatever the loss (a second condition on a REFUSED field).
REFUSED_DIFFUSION: dict[str, Refusal] = {
    "entropy_coef": Refusal((0.0,), "diffusion", _NO_ENTROPY_DLM, "leave entropy_coef=0.0"),
    "use_adaptive_entropy": Refusal((False,), "diffusion", _NO_ENTROPY_DLM, "leave use_adaptive_entropy=False"),
}

_T, _TF = "trl", "transformers"

HONOURED: dict[str, str] = {
    # ---- GRPOConfig: model and data
    "model_init_kwargs": _T,
    "trust_remote_code": _T,
    "router_aux_loss_coef": "here: test_trl_fields.py::test_router_aux_loss_is_refused_where_the_loss_drops_it",
    "disable_dropout": _T,
    "cast_lm_head_to_fp32": _T,
    "shuffle_dataset": _T,
    "pad_to_multiple_of": _T,
    "chat_template_kwargs": _T,
    "max_tool_calling_iterations": _T,
    # ---- generation
    "num_generations": "here: test_group_exact.py::test_gradient_accumulation_equals_whole_batch",
    "num_generations_eval": _T,
    "max_completion_length": "here: test_trl_fields.py::test_autoregressive_model_keeps_trls_completion_length",
    "ds3_gather_for_generation": _T,  # TRL's unwrap_model_for_generation, which the diffusion rollouts use too
    "generation_batch_size": _T,
    "steps_per_generation": "here: test_group_exact.py::test_gradient_accumulation_equals_whole_batch",
    "temperature": "here: test_stabledrl_trainer.py::test_llada_rollouts_draw_from_the_configured_top_k",
    "top_p": "here: diffusion/test_llada_sampler.py::test_filtered_draws_follow_the_renormalised_softmax",
    "top_k": "here: test_stabledrl_trainer.py::test_llada_rollouts_draw_from_the_configured_top_k",
    "vllm_mode": _T,
    "vllm_model_impl": _T,
    "vllm_enable_sleep_mode": _T,
    "vllm_structured_outputs_regex": _T,
    "vllm_server_base_url": _T,
    "vllm_server_host": _T,
    "vllm_server_port": _T,
    "vllm_server_timeout": _T,
    "vllm_group_port": _T,
    "vllm_gpu_memory_utilization": _T,
    "vllm_max_model_length": _T,
    "vllm_tensor_parallel_size": _T,
    "vllm_importance_sampling_mode": _T,
    "vllm_importance_sampling_clip_max": _T,
    "vllm_importance_sampling_clip_min": _T,
    "vllm_importance_sampling_cap": _T,
    "transformers_continuous_batching_config": _T,
    # TRL's deprecated alias: it turns use_transformers_continuous_batching on (refused with it for a diffusion LM)
    "use_transformers_paged": _T,
    # ---- objective
    "beta": "here: test_trl_fields.py::test_beta_adds_a_kl_term_to_the_packages_objectives",
    "use_bias_correction_kl": "here: test_trl_fields.py::test_beta_adds_a_kl_term_to_the_packages_objectives",
    "num_iterations": "here: test_stabledrl_trainer.py::test_d1_recipe_grpo_mean_field_shared_masks_with_reference",
    "reward_weights": _T,
    "multi_objective_aggregation": _T,
    "scale_rewards": _T,
    "loss_type": "here: test_stabledrl_trainer.py::test_every_loss_type_trains_under_its_defaults_with_bounded_gradients",
    "mask_truncated_completions": _T,
    "sync_ref_model": _T,
    "ref_model_mixup_alpha": _T,
    "ref_model_sync_steps": _T,
    "entropy_coef_min": _T,  # read only with use_adaptive_entropy, refused where it cannot apply
    "entropy_coef_max": _T,
    "entropy_coef_delta": _T,
    "entropy_target": _T,
    # ---- logging
    "log_completions": _T,
    "log_multimodal": _T,
    "num_completions_to_print": _T,
    "log_unique_prompts": _T,
    "log_completions_hub_repo": _T,
    # ---- TrainingArguments, honoured by transformers' Trainer
    **{
        name: _TF
        for name in (
            "output_dir",
            "eval_strategy",
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "eval_delay",
            "torch_empty_cache_steps",
            "learning_rate",
            "weight_decay",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "max_grad_norm",
            "num_train_epochs",
            "max_steps",
            "lr_scheduler_type",
            "lr_scheduler_kwargs",
            "warmup_steps",
            "log_level",
            "log_level_replica",
            "log_on_each_node",
            "logging_strategy",
            "logging_first_step",
            "logging_steps",
            "logging_nan_inf_filter",
            "save_strategy",
            "save_steps",
            "save_total_limit",
            "save_on_each_node",
            "save_only_model",
            "enable_jit_checkpoint",
            "use_cpu",
            "seed",
            "data_seed",
            "bf16",
            "fp16",
            "bf16_full_eval",
            "fp16_full_eval",
            "tf32",
            "local_rank",
            "ddp_backend",
            "debug",
            "dataloader_drop_last",
            "eval_steps",
            "dataloader_num_workers",
            "dataloader_prefetch_factor",
            "run_name",
            "disable_tqdm",
            "remove_unused_columns",
            "load_best_model_at_end",
            "metric_for_best_model",
            "greater_is_better",
            "ignore_data_skip",
            "fsdp",
            "fsdp_config",
            "accelerator_config",
            "parallelism_config",
            "deepspeed",
            "optim",
            "optim_args",
            "report_to",
            "project",
            "trackio_space_id",
            "trackio_bucket_id",
            "trackio_static_space_id",
            "ddp_find_unused_parameters",
            "ddp_bucket_cap_mb",
            "ddp_broadcast_buffers",
            "ddp_static_graph",
            "ddp_timeout",
            "dataloader_pin_memory",
            "dataloader_persistent_workers",
            "dataloader_multiprocessing_context",
            "dataloader_in_order",
            "skip_memory_metrics",
            "push_to_hub",
            "hub_model_id",
            "hub_strategy",
            "hub_token",
            "hub_private_repo",
            "hub_always_push",
            "hub_revision",
            "gradient_checkpointing",
            "gradient_checkpointing_kwargs",
            "activation_checkpointing",
            "activation_checkpointing_kwargs",
            "auto_find_batch_size",
            "full_determinism",
            "torch_compile",
            "torch_compile_backend",
            "torch_compile_mode",
            "neftune_noise_alpha",
            "optim_target_modules",
            "use_liger_kernel",
            "liger_kernel_config",
            "eval_on_start",
            "use_cache",
            "restore_callback_states_from_checkpoint",
        )
    },
    # transformers' Trainer leaves it to scripts; StableDRLTrainer.train() reads it when called without an argument
    "resume_from_checkpoint": "here: test_trl_fields.py::test_resume_from_checkpoint_field_is_read_by_train",
}

UNUSED: dict[str, str] = {
    "do_train": "transformers' Trainer never reads it (a flag for scripts); train() trains whatever it says",
    "do_eval": "transformers' Trainer never reads it (a flag for scripts); eval_strategy decides evaluation",
    "do_predict": "transformers' Trainer never reads it (a flag for scripts); GRPO has no predict step",
    "label_names": "GRPO batches carry no labels; evaluation returns the loss and the logged metrics only",
    "length_column_name": "read only by train_sampling_strategy='group_by_length', which is refused",
    "prediction_loss_only": "GRPO evaluation returns the loss only, whatever this says",
    "eval_accumulation_steps": "GRPO evaluation gathers no predictions to accumulate",
    "eval_do_concat_batches": "GRPO evaluation gathers no predictions to concatenate",
    "eval_use_gather_object": "GRPO evaluation gathers no predictions",
    "include_for_metrics": "GRPO takes no compute_metrics; evaluation logs the loss and the rollout metrics",
    "batch_eval_metrics": "GRPO takes no compute_metrics",
    "include_num_input_tokens_seen": "GRPO batches are prompt rows without input_ids: transformers counts nothing "
    "(and says so); TRL logs the tokens seen itself (num_tokens)",
    "average_tokens_across_devices": "GRPO batches carry no labels, so transformers counts no tokens to average; "
    "GRPO's losses normalise themselves across devices",
}


def _is_neutral(value, neutral: tuple) -> bool:
    return any(
        value is n
        or (type(value) is type(n) and value == n)
        or (isinstance(n, float) and isinstance(value, (int, float)) and not isinstance(value, bool) and value == n)
        for n in neutral
    )


def _refuse(name: str, value, refusal: Refusal, config=None) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise ValueError(
        f"{name}={shown} cannot apply {refusal.condition(config)}: {refusal.reason}, so it would be silently ignored. "
        f"Fix: {refusal.fix}."
    )


def refused_loss_types(name: str) -> tuple[str, ...]:
    """The loss types under which the "loss" refusal of field `name` applies: every registered objective that does
    not declare `name` among its settings (for a refusal with `own`), then the TRL loss types it lists."""
    refusal = REFUSED[name]
    own = tuple(o for o, spec in OBJECTIVES.items() if name not in spec.settings) if refusal.own else ()
    return own + tuple(refusal.losses)


def check_config_fields(config) -> None:
    """Refuse, at config construction, a field whose condition is known then (always, or the loss type)."""
    for name, refusal in REFUSED.items():
        if refusal.when == "diffusion" or refusal.needs is not None:  # the latter: after the model checks
            continue
        if refusal.when == "loss" and config.loss_type not in refused_loss_types(name):
            continue
        if refusal.needs is not None and getattr(config, refusal.needs) is not True:
            continue
        value = getattr(config, name)
        if not _is_neutral(value, refusal.neutral):
            _refuse(name, value, refusal, config if refusal.when == "loss" else None)


def check_model_fields(args, is_diffusion: bool | None) -> None:
    """Refuse, when the trainer is built, a field that cannot apply to a masked-diffusion model (`is_diffusion`
    True), then a loss-type refusal that depends on another option (`Refusal.needs`, e.g. use_vllm): the model's
    refusal says more, so it comes first."""
    refusals = []
    if is_diffusion:
        refusals += [(n, r) for n, r in REFUSED.items() if r.when == "diffusion"] + list(REFUSED_DIFFUSION.items())
    refusals += [(n, r) for n, r in REFUSED.items() if r.when == "loss" and r.needs is not None]
    for name, refusal in refusals:
        if refusal.when == "loss" and (
            args.loss_type not in refused_loss_types(name) or getattr(args, refusal.needs) is not True
        ):
            continue
        value = getattr(args, name)
        if not _is_neutral(value, refusal.neutral):
            _refuse(name, value, refusal, args if refusal.when == "loss" else None)
