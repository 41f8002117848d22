"""`StableDRLTrainer`: TRL's `GRPOTrainer` for masked diffusion LMs, with the StableDRL and DGPO objectives.

Swap `GRPOConfig`/`GRPOTrainer` for `StableDRLConfig`/`StableDRLTrainer` in working TRL code and nothing else
changes. For a diffusion LM (LLaDA, Dream, a masked LM) rollouts come from the masked-diffusion sampler and
log-probabilities from a likelihood estimator; an autoregressive model keeps TRL's generation and exact
log-probabilities and only gains the new objectives.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from types import MappingProxyType
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import (
    pad,
    split_pixel_values_by_grid,
    split_tensor_dict,
    unsplit_pixel_values_by_grid,
)

from . import eval_cards, multinode, safety
from .changed_defaults import announce_changed_defaults
from .diagnostics import _TRL_CLIP_METRICS, TrainerDiagnostics  # noqa: F401
from .diffusion.family import as_diffusion_lm, detect_family, get_family
from .diffusion.seeding import mix_seed
from .moe_metrics import expert_load_entropy
from .noise_dose import add_log_ratio_noise, log_ratio_noise
from .objectives import (
    OBJECTIVES,
    PolicyLossInputs,
    add_kl_penalty,
    aggregate_loss,
    equal_reward_groups,
    get_objective_spec,
    needs_whole_groups,
)
from .rollout_rows import _STREAM_ITER, _STREAM_OLD, _STREAM_SAMPLER, _STREAM_STEP, RolloutRows
from .run_guards import (  # noqa: F401  (importable from here as before)
    CheckpointError,
    NonFiniteGradientError,
    NonFiniteRewardError,
    RewardFunctionError,
    _check_reward_output,
    _ensure_generation_config,
    _generation_config_on_load,
    _NonFiniteParameterGuard,
    _wrap_reward_func,
)
from .safety_hooks import RunSafety
from .scoring_context import ScoringContext
from .stabledrl_config import StableDRLConfig, autoregressive_defaults
from .validation import (
    check_data_setup,
    check_inputs_before_loading,
    check_launch_setup,
    check_model_setup,
)

logger = logging.getLogger(__name__)


class StableDRLTrainer(RunSafety, RolloutRows, TrainerDiagnostics, GRPOTrainer):
    """GRPOTrainer with masked-diffusion rollouts, likelihood estimation and the StableDRL / DGPO objectives.

    Same constructor as `trl.GRPOTrainer`; `args` is a `StableDRLConfig` (a plain `GRPOConfig` is refused with a
    message saying to swap the class name).

    TRL hooks overridden, and why (tests/test_stabledrl_trainer.py checks each still exists in TRL with the expected
    signature and runs during a training step):
    - `_generate_single_turn`: diffusion LMs decode with their family's sampler (LLaDA's, Dream's, ...) instead of
      `model.generate`.
    - `_get_per_token_logps_and_entropies`: diffusion LMs have no exact log-probs; the chosen estimator supplies
      per-token contributions (their masked mean is the sequence estimate) with masks seeded per row.
    - `_generate_and_score_completions`: after TRL's scoring, adds the old-policy (and reference) estimates each
      inner iteration needs and drops samples whose reward is not finite from their group's normalisation.
    - `_prepare_inputs`: shuffles whole groups instead of rows, so every micro-batch holds whole groups (the
      self-normalised objectives are then exact under accumulation and data parallelism).
    - `_calculate_rewards`: a non-finite reward (inf, or NaN from every function) drops its sample from the group's
      normalisation instead of entering the advantages; with `reward_text="canvas"` the reward functions grade each
      row's whole decoded rollout canvas (the official StableDRL grading) instead of the completion up to its EOS.
    - `_compute_loss`: the package's objectives, looked up by loss_type in the registry
      (`objectives.get_objective_spec`) and called with one `PolicyLossInputs` (its declared settings as one
      mapping); TRL's own loss types go to TRL's implementation. For every objective
      it logs the mean applied weight of negative- and positive-advantage samples (`stabledrl/weight_mean_neg_adv`,
      `weight_mean_pos_adv`) and, with fresh masks, the estimator's own noise in L_theta - L_old
      (`stabledrl/estimator_noise_std`); `_calculate_rewards` logs `stabledrl/equal_reward_group_frac`.
    - `training_step`: at the end of each optimiser step, logs `stabledrl/all_clipped` (every sample or token of the
      step had its ratio clipped) and `stabledrl/all_clipped_streak`, and warns after `all_clipped_patience`
      consecutive such steps (no learning).

    What is not a hook lives in single-purpose modules, as mixins overriding nothing of TRL's or transformers' (a
    test checks this): the per-step diagnostics in `diagnostics.TrainerDiagnostics`, the run-safety checks the
    transformers hooks below hand their parent's implementation to in `safety_hooks.RunSafety`, the per-row seeds,
    row keys, group shuffle and reward canvases in `rollout_rows.RolloutRows`; the run guards the hooks raise and
    install are in `run_guards.py`, the MoE metric in `moe_metrics.py`.

    The hooks hand each other per-step state (which masks to draw, the last estimate, the rollout canvases, the rows
    with non-finite rewards, the step's clipping) through one `ScoringContext` (`scoring_context.py`, which documents
    each field's writer and reader), created in `__init__`.

    Evaluation during training (`eval_strategy` steps / epoch with an `eval_dataset`): `__init__` installs
    `eval_cards.EvalCardsCallback` and `_calculate_rewards` hands it each eval batch's rewards; it writes one
    protocol card per evaluation (`output_dir/eval_cards/during_training/`).

    transformers `Trainer` hooks overridden for run safety: `__init__` (the validation layers of `validation.py`:
    `check_inputs_before_loading` before TRL builds the trainer, then `check_model_setup` and `check_data_setup`),
    `_build_accelerator_args` (DDP's find_unused_parameters per family), `_get_grad_norm` (skips a step
    with a non-finite gradient norm), `train` (checks the output folder and the checkpoint to resume),
    `_load_from_checkpoint`, `_issue_warnings_after_load`, `_load_optimizer_and_scheduler` (name the damaged
    checkpoint file, refuse missing or non-finite weights), `save_model`, `_save_checkpoint` (refuse non-finite
    weights, report a full disk), `create_model_card` (the package's card).

    Mask seeds (`mask_seed_mode`), forward passes per completion with an estimator of cost K (K = mc_samples for
    the Monte-Carlo estimators, 1 for mean_field) and I = num_iterations inner iterations per generation:
    - "fresh" (official StableDRL): the old policy is scored once after generation with its own masks (K passes,
      no gradient), and every inner step scores the current policy with fresh masks (K passes with gradient): K(1+I)
      in all. At the first inner step the weight log w is pure estimator noise, as in the official code.
    - "shared" (d1): one seed per inner iteration, shared by the current, old and reference policies, so their ratio
      is not dominated by mask noise. Old-policy scores are needed per iteration: K*I passes without gradient,
      skipped entirely when generation and optimisation are aligned (the ratio is then exactly 1), plus K*I with
      gradient. A reference model (beta > 0) costs another K*I.
    Seeds are mixed from the row's position in the run's global stream of rollouts (carried with the row as
    `mask_row_key`), the config seed and the stream: every row draws its own masks (identical completions of a group
    too, as in the official code), the masks do not depend on the batch layout, and a resumed run draws the same
    masks and the same rollouts as an uninterrupted one.
    """

    _tag_names = ["trl", "grpo", "stabledrl", "diffusion"]

    def __init__(self, model, reward_funcs=None, args: StableDRLConfig | None = None, *pos, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = StableDRLConfig(output_dir=f"{str(name).split('/')[-1]}-StableDRL")
        elif not isinstance(args, StableDRLConfig):
            if isinstance(args, GRPOConfig):
                raise TypeError(
                    "StableDRLTrainer needs a StableDRLConfig: replace GRPOConfig(...) with StableDRLConfig(...) "
                    "(same arguments; it adds the diffusion and objective fields)."
                )
            raise TypeError(f"args must be a StableDRLConfig, got {type(args).__name__}.")
        diffusion_before = check_inputs_before_loading(model, args, kwargs)
        if isinstance(model, str) and not args.allow_pickle_checkpoints:
            args.model_init_kwargs = {"use_safetensors": True, **(args.model_init_kwargs or {})}
        trl_defaults = autoregressive_defaults(args) if diffusion_before is False else {}
        if trl_defaults:  # an autoregressive model keeps TRL's rollout defaults (256 tokens, 0.9 serve dLLMs)
            args = copy.copy(args)  # the caller's config is left as it was
            for name, value in trl_defaults.items():
                setattr(args, name, value)
        if reward_funcs is not None:
            funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
            reward_funcs = [
                f if isinstance(f, str) or isinstance(f, torch.nn.Module) else _wrap_reward_func(f) for f in funcs
            ]
        if kwargs.get("peft_config") is not None:  # a LoRA config without target modules: the family's default
            from .lora_defaults import with_default_lora_targets

            kwargs["peft_config"] = with_default_lora_targets(kwargs["peft_config"], model)
        if not isinstance(model, str):
            _ensure_generation_config(model)
        with _generation_config_on_load():
            super().__init__(model, reward_funcs, args, *pos, **kwargs)

        unwrapped = self.accelerator.unwrap_model(self.model)
        family = detect_family(unwrapped)
        self.is_diffusion = (family is not None) if args.diffusion is None else bool(args.diffusion)
        self._model_adapter = check_model_setup(
            args,
            unwrapped,
            self._tokenizer,
            family=family,
            is_diffusion=self.is_diffusion,
            router_aux_loss_coef=self.router_aux_loss_coef if self.aux_loss_enabled else None,
            device=self.accelerator.device,
        )  # the model's DiffusionAdapter, None for an autoregressive model
        self._family_name = family
        self._diffusion_family = get_family(family) if self.is_diffusion else None  # sampler + estimator of the family
        if self.accelerator.is_main_process:
            announce_changed_defaults(args, self.is_diffusion)
        if self.is_diffusion:
            self._mask_token_id = self._model_adapter.mask_token_id
            if args.completion_end == "tokenizer_eos":  # official: <|eot_id|> before the EOS is a scored token
                self.eos_token_ids = [self._tokenizer.eos_token_id]
            else:
                self.eos_token_ids = list(dict.fromkeys([*self.eos_token_ids, *self._model_adapter.eos_token_ids]))
        check_data_setup(
            self.args,
            unwrapped,
            self._tokenizer,
            train_dataset=self.train_dataset,
            eval_dataset=self.eval_dataset,
            mask_token_id=self._mask_token_id if self.is_diffusion else None,
            is_diffusion=self.is_diffusion,
            num_processes=self.accelerator.num_processes,
            rollout_func=self.rollout_func,
            tools=self.tools,
        )
        check_launch_setup(args, self.accelerator.num_processes, self.accelerator.distributed_type)
        if self.accelerator.num_processes > 1:
            multinode.leave_process_group_at_exit()  # gloo aborts a rank whose peer left first at interpreter exit
        self._nonfinite_grad_streak = 0
        self._scoring = ScoringContext(mask_stream=(_STREAM_OLD, 0))  # what the hooks pass each other per step
        self._all_clipped_streak = 0
        self._nonfinite_reward_streak = 0
        self.add_callback(_NonFiniteParameterGuard(self))
        self._eval_cards = eval_cards.install(self)  # a protocol card per evaluation during training (or None)

    # ------------------------------------------------------------------ run safety

    def _build_accelerator_args(self, **kwargs):
        """transformers hook: DDP's `find_unused_parameters`. transformers turns it on for any model without
        activation checkpointing, which costs a graph traversal per step; it stays off for a family whose model uses
        every parameter in every forward pass (`DiffusionFamily.uses_every_parameter`: LLaDA, Dream) unless
        `ddp_find_unused_parameters` is set explicitly."""
        from .ddp_settings import without_needless_unused_parameter_search

        accelerator_args = super()._build_accelerator_args(**kwargs)
        return without_needless_unused_parameter_search(
            accelerator_args, self.model, self.args.ddp_find_unused_parameters, self.args.diffusion
        )

    def _get_grad_norm(self, model, grad_norm=None):
        """transformers hook, run right before `optimizer.step()`: a step with a non-finite gradient norm is skipped
        (`RunSafety._skip_nonfinite_grad_norm`: its gradients dropped, stopped after `max_nonfinite_grad_steps`)."""
        return self._skip_nonfinite_grad_norm(model, super()._get_grad_norm(model, grad_norm=grad_norm))

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        """`Trainer.train`, with the output folder and the checkpoint to resume checked first (see `safety`)."""
        return self._train_guarded(super().train, resume_from_checkpoint, trial, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """`Trainer._load_from_checkpoint`, naming the file when a weight file cannot be read, refusing missing keys
        (`_issue_warnings_after_load`) and weights holding inf / NaN."""
        self._load_checkpoint_checked(super()._load_from_checkpoint, resume_from_checkpoint, model=model)

    def _issue_warnings_after_load(self, load_result):
        """Missing keys on resume are an error naming them (`RunSafety._refuse_missing_keys`), then TRL's warnings."""
        self._refuse_missing_keys(load_result)
        super()._issue_warnings_after_load(load_result)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """`Trainer._load_optimizer_and_scheduler`, naming the file when the optimiser or scheduler state cannot be
        read."""
        return self._load_optimizer_checked(super()._load_optimizer_and_scheduler, checkpoint)

    def save_model(self, output_dir=None, _internal_call=False):
        """`Trainer.save_model`, refusing to write weights that hold inf / NaN (checked on every process)."""
        return self._save_model_checked(super().save_model, output_dir, _internal_call)

    def _save_checkpoint(self, model, trial):
        """`Trainer._save_checkpoint`, recording the run's settings in the checkpoint (`run_identity`) and reporting a
        full disk."""
        return self._save_checkpoint_checked(super()._save_checkpoint, model, trial)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """The model card (README.md in output_dir): names StableDRL and the objective actually used, cites the
        paper, and shows how to load the model (`import stabledrl_trl` first) and decode it with this package's
        sampler (a diffusion LM has no `pipeline("text-generation")`)."""
        if not self.is_world_process_zero():
            return
        from .model_card import build_model_card

        card = build_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    # ------------------------------------------------------------------ TRL hooks

    def _adapter(self, model):
        return as_diffusion_lm(
            model, tokenizer=self._tokenizer, family=self._family_name, mask_token_id=self._mask_token_id
        )

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if not self.is_diffusion:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
            )
        device = self.accelerator.device
        tensors = [torch.tensor(ids) for ids in prompt_ids]
        padded = pad(tensors, padding_value=self._tokenizer.pad_token_id, padding_side="left").to(device)  # (B, P)
        mask = pad([torch.ones_like(t) for t in tensors], padding_value=0, padding_side="left").to(device)  # (B, P)
        mode = 0 if self.model.training else 1
        # (optimiser step, micro-step within it): restored exactly on resume, unlike TRL's micro-step counter
        micro = self._step % self.args.gradient_accumulation_steps
        generator = self._generator(_STREAM_SAMPLER, mode, self.state.global_step, micro)
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as unwrapped_model,
            torch.no_grad(),
            self._dist.summon_full_params(self.model_wrapped, recurse=False),
        ):
            started = time.perf_counter()
            with self.accelerator.autocast():
                out = self._diffusion_family.generate(
                    self._adapter(unwrapped_model),
                    padded,
                    mask,
                    self.args,
                    eos_token_ids=tuple(self.eos_token_ids),
                    generator=generator,
                )
        completion_cpu, mask_cpu = out.completion_ids.cpu(), out.completion_mask.cpu()  # waits for the device
        seconds = time.perf_counter() - started
        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics["stabledrl/rollout_seconds"].append(seconds)
        if out.forward_passes is not None:
            metrics["stabledrl/rollout_forward_passes"].append(float(out.forward_passes.float().mean()))
        metrics["stabledrl/rollout_tokens_per_s"].append(float(mask_cpu.sum()) / max(seconds, 1e-9))
        completion_ids = [c[m.bool()].tolist() for c, m in zip(completion_cpu, mask_cpu, strict=True)]
        if self.args.reward_text == "canvas":
            self._scoring.canvas_ids = completion_cpu.tolist()  # (B, C): the whole canvas, after the EOS too
        return completion_ids, None

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        if not self.is_diffusion:
            return super()._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                logits_to_keep,
                batch_size=batch_size,
                compute_entropy=compute_entropy,
                **kwargs,
            )
        prompt_ids, completion_ids = input_ids[:, :-logits_to_keep], input_ids[:, -logits_to_keep:]  # (B, P), (B, C)
        prompt_mask, completion_mask = attention_mask[:, :-logits_to_keep], attention_mask[:, -logits_to_keep:]
        seeds = mix_seed(
            self._row_keys(input_ids.shape[0], input_ids.device), self.args.seed, *self._scoring.mask_stream
        )
        with self.accelerator.autocast():
            est = self._diffusion_family.estimate(
                self._adapter(model),
                prompt_ids,
                prompt_mask,
                completion_ids,
                completion_mask,
                self.args,
                seeds=seeds,
                fill_token_id=self._tokenizer.eos_token_id,
            )
        self._scoring.last_estimate = est
        self._metrics["train" if self.model.training else "eval"]["stabledrl/estimator_passes"].append(
            float(self._diffusion_family.estimator_passes(self.args))
        )
        entropies = est.token_entropy if compute_entropy else None
        return est.token_logps, entropies, None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self.args.reward_text == "canvas":
            # TRL scores this process's rows here and gathers only the rewards, so the rows are the rollout's rows.
            completions = self._canvas_completions(completions)
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # (N_global, F)
        # A non-finite reward drops its sample from the group (marked here, applied to the advantages below);
        # None (NaN) from every function is TRL's "unscorable" and is treated the same way.
        # A finite reward whose square overflows float32 is treated as inf (it would overflow the gradient).
        overflow = rewards.abs() > safety.OVERFLOW_LIMIT  # (N_global, F); False for NaN
        bad = overflow.any(dim=1) | torch.isnan(rewards).all(dim=1)
        self._scoring.nonfinite_reward_rows = bad
        if self.model.training:
            self._note_nonfinite_rewards(rewards, bad)
        # share of groups whose total rewards are all equal (zero advantages: nothing learnt from them)
        mode = "train" if self.model.training else "eval"
        g = self.num_generations if mode == "train" else self.num_generations_eval
        total = (rewards * self.reward_weights.to(rewards.device)[None, :]).nansum(dim=1)  # (N_global,)
        total = torch.where(torch.isnan(rewards).all(dim=1), torch.nan, total)
        if total.shape[0] % g == 0:
            equal, groups = equal_reward_groups(total, g).tolist()
            self._metrics[mode]["stabledrl/equal_reward_group_frac"].append(equal / groups)
        if mode == "eval" and self._eval_cards is not None:
            self._eval_cards.add(total, g)  # every completion's reward of this evaluation, for its protocol card
        return torch.where(overflow, torch.nan, rewards)

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        shared = self.args.mask_seed_mode == "shared"
        step = self.state.global_step
        scoring = self._scoring
        # set before super(): TRL's own code scores the old and reference policies through the estimator hook
        scoring.mask_stream = (_STREAM_ITER, step, 0) if shared else (_STREAM_OLD, step)
        scoring.mask_rows = self._rollout_row_keys(len(inputs)) if self.is_diffusion else None
        output = super()._generate_and_score_completions(inputs)
        if self.is_diffusion:
            output["mask_row_key"] = scoring.mask_rows  # (B,): travels with its row through shuffles and splits

        # Samples with a non-finite reward leave their group's normalisation (advantage NaN: objectives drop it).
        if scoring.nonfinite_reward_rows is not None:
            n_local = output["advantages"].shape[0]
            start = self.accelerator.process_index * n_local
            bad = scoring.nonfinite_reward_rows[start : start + n_local].to(output["advantages"].device)
            bad = bad | ~torch.isfinite(output["advantages"]) | (output["advantages"].abs() > safety.OVERFLOW_LIMIT)
            if self.loss_type in OBJECTIVES:
                output["advantages"] = torch.where(bad, torch.nan, output["advantages"])
            self._metrics[mode]["stabledrl/nonfinite_rewards"].append(float(scoring.nonfinite_reward_rows.sum()))
            scoring.nonfinite_reward_rows = None

        if not self.is_diffusion or mode != "train":
            return output
        gen_step = self.state.global_step
        output["mask_gen_step"] = torch.full_like(output["advantages"], gen_step, dtype=torch.long)
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attn = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        c = output["completion_ids"].size(1)
        bs = self.args.per_device_train_batch_size

        def score(model, stream):
            scoring.mask_stream = stream
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, attn, c, batch_size=bs)
            return logps

        if shared:
            # d1: iteration j uses seed stream (gen_step, j) for the old, current and reference policies alike.
            if not self._aligned:
                # TRL already scored iteration 0's masks when it needed old log-probs; score the other iterations.
                first = output.get("old_per_token_logps")
                olds = [first if first is not None else score(self.model, (_STREAM_ITER, gen_step, 0))]
                olds += [score(self.model, (_STREAM_ITER, gen_step, j)) for j in range(1, self.num_iterations)]
                output["old_per_token_logps_iters"] = torch.stack(olds, dim=1)  # (B, I, C)
            if self.beta != 0.0 and self.num_iterations > 1:
                refs = [output["ref_per_token_logps"]]
                refs += [
                    self._ref_logps(ids, attn, c, (_STREAM_ITER, gen_step, j)) for j in range(1, self.num_iterations)
                ]
                output["ref_per_token_logps_iters"] = torch.stack(refs, dim=1)  # (B, I, C)
        elif self.loss_type in OBJECTIVES and "old_per_token_logps" not in output:
            # Official StableDRL: the old policy is scored once, right after generation, with its own masks.
            output["old_per_token_logps"] = score(self.model, (_STREAM_OLD, gen_step))
        return output

    def _ref_logps(self, ids, attn, c, stream):
        """Reference-policy log-probs on `stream`'s masks: the reference model, or the policy with adapters off."""
        self._scoring.mask_stream = stream
        with torch.no_grad():
            if self.ref_model is not None:
                logps, _, _ = self._get_per_token_logps_and_entropies(self.ref_model, ids, attn, c)
            else:
                from trl.trainer.grpo_trainer import use_adapter

                model = self.accelerator.unwrap_model(self.model)
                with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
                    logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attn, c)
        return logps

    def _prepare_inputs(self, generation_batch: dict[str, torch.Tensor | Any]) -> dict[str, torch.Tensor | Any]:
        if not self.model.training or not needs_whole_groups(self.loss_type):
            # TRL's row shuffle (and its draws from the global random stream): only the group-normalised losses
            # need whole groups per micro-batch; the others keep TRL's behaviour, a group split over processes too
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = split_pixel_values_by_grid(batch)
            batch = self._shuffle_groups(batch)
            self._buffered_inputs = [
                unsplit_pixel_values_by_grid(b) for b in split_tensor_dict(batch, self.args.steps_per_generation)
            ]
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    def _compute_loss(self, model, inputs):
        if self.is_diffusion:
            self._scoring.mask_rows = inputs.get("mask_row_key")
            j = self._inner_iteration
            if self.args.mask_seed_mode == "shared":
                gen_step = int(inputs["mask_gen_step"][0]) if "mask_gen_step" in inputs else self.state.global_step
                self._scoring.mask_stream = (_STREAM_ITER, gen_step, j)
                inputs = dict(inputs)
                if "old_per_token_logps_iters" in inputs:
                    inputs["old_per_token_logps"] = inputs["old_per_token_logps_iters"][:, j]
                if "ref_per_token_logps_iters" in inputs:
                    inputs["ref_per_token_logps"] = inputs["ref_per_token_logps_iters"][:, j]
            else:
                # Fresh masks per inner step, the same for every micro-batch and process of that step, so a row's
                # masks do not depend on where the layout puts it.
                self._scoring.mask_stream = (_STREAM_STEP, self.state.global_step, j)
            if self.args.test_log_ratio_noise_std > 0 and self.model.training:  # test-only (noise_dose.py)
                gen_step = int(inputs["mask_gen_step"][0]) if "mask_gen_step" in inputs else self.state.global_step
                noise = log_ratio_noise(inputs["mask_row_key"], self.args.seed, gen_step, j,
                                        self.args.test_log_ratio_noise_std)  # fmt: skip
                inputs = add_log_ratio_noise(inputs, noise)
        if self.loss_type not in OBJECTIVES:
            loss = super()._compute_loss(model, inputs)
        else:
            loss = self._compute_own_loss(model, inputs)
        if self.is_diffusion and not needs_whole_groups(self.loss_type):
            self._log_ratio_max(inputs)
        if self.is_diffusion and self.loss_type not in OBJECTIVES:
            self._log_trl_weights(inputs)
        if self.is_diffusion:
            self._log_estimator_noise(inputs)
        if self.model.training and self.loss_type not in OBJECTIVES:
            self._note_trl_clipping()
        return loss

    # ------------------------------------------------------------------ the optimiser step (diagnostics: diagnostics.py)

    def training_step(self, model, inputs, num_items_in_batch=None):
        output = super().training_step(model, inputs, num_items_in_batch)
        if self._step % self.current_gradient_accumulation_steps == 0:  # the optimiser step ends here (as TRL)
            self._end_clipping_step()
            reduce = None
            if self.accelerator.num_processes > 1:  # the whole step's routing, not this process's share

                def reduce(counts):
                    return self.accelerator.reduce(counts.to(self.accelerator.device), reduction="sum").cpu()

            for name, value in expert_load_entropy(model, reduce).items():  # routing of this step's forwards
                self._metrics["train"][name].append(value)
        return output

    def _compute_own_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + C)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # (B, P + C)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]  # (B, C)
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True
        )
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old  # (B, C)
        advantages = inputs["advantages"]  # (B,)
        g = self.num_generations if mode == "train" else self.num_generations_eval
        estimate = self._scoring.last_estimate
        args = self.args
        objective = get_objective_spec(self.loss_type)
        x = PolicyLossInputs(
            per_token_logps=per_token_logps,
            old_per_token_logps=old,
            advantages=advantages,
            mask=mask,
            group_size=g,
            eubo=None if estimate is None else estimate.eubo,
            settings=MappingProxyType(objective.settings_of(args)),  # the config fields it declares, read-only
        )
        out = objective.fn(x)
        if out.level != objective.level:
            raise ValueError(
                f"objective {self.loss_type!r} is registered with level={objective.level!r} but returned "
                f"level={out.level!r}; register it with the level its unit_loss has."
            )
        missing = [k for k in objective.statistics if k != "clip_frac" and k not in out.stats]
        if missing:
            raise KeyError(
                f"objective {self.loss_type!r} declares the statistics {missing} but its stats hold "
                f"{sorted(out.stats)}; return them or leave them out of register_objective(statistics=...)."
            )
        out = self._add_kl(out, inputs, per_token_logps, old, mask, g, mode)
        if out.level == "group":  # mean over the groups of the optimiser step
            accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1
            loss = aggregate_loss(out, normalizer=(advantages.shape[0] // g) * accumulation)
        else:  # token level: token-mean over the accumulation window, as TRL's `dapo`
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / args.steps_per_generation
            loss = aggregate_loss(out, mask, normalizer)
        logged = self._log_objective_stats(mode, out.stats, entropies, mask)
        clip_keys = [k for k in logged if k.endswith("clip_frac")]  # e.g. clip_frac; dgpo: low_ and high_clip_frac
        if mode == "train" and clip_keys:
            self._scoring.note_clipping(sum(logged[k] for k in clip_keys))
        if "applied_weight" in objective.statistics:
            applied = out.stats["applied_weight"]
            self._log_applied_weights(mode, applied, advantages, mask if applied.dim() == 2 else None)
        return loss

    def _add_kl(self, out, inputs, per_token_logps, old, mask, group_size, mode):
        """beta != 0: TRL's KL penalty to the reference policy on the objective's units (`add_kl_penalty`); the
        reference log-probs are TRL's (`ref_per_token_logps`, scored on the same masks in mask_seed_mode='shared')."""
        if self.beta == 0.0:
            return out
        out, kl = add_kl_penalty(
            out,
            per_token_logps,
            inputs["ref_per_token_logps"],
            mask,
            self.beta,
            group_size,
            old_per_token_logps=old if self.args.use_bias_correction_kl else None,
        )
        local = torch.stack([(kl * mask).sum(), mask.sum().to(kl.dtype)])
        totals = self.accelerator.reduce(local, reduction="sum")
        self._metrics[mode]["kl"].append(float(totals[0] / totals[1].clamp(min=1.0)))
        return out
