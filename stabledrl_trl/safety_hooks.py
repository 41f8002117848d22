"""Run safety of `StableDRLTrainer`: what its overrides of transformers' `Trainer` hooks check around the parent's
implementation, kept apart from the trainer's TRL hooks.

`RunSafety` is a mixin of the trainer and overrides nothing of TRL's or transformers' (a test checks this): each
hook stays a method of `StableDRLTrainer`, listed in its docstring, whose body hands the parent's implementation to
one method here. It reads the trainer's `args`, `state`, `model`, `accelerator`, `_metrics` and the streak counters
`_nonfinite_grad_streak` / `_nonfinite_reward_streak`:

- `_get_grad_norm` -> `_skip_nonfinite_grad_norm` (drop the step's gradients, stop after a streak);
- `train` -> `_train_guarded` (output-folder lock, fresh folder or a checkpoint whose settings match);
- `_load_from_checkpoint` -> `_load_checkpoint_checked`, `_issue_warnings_after_load` -> `_refuse_missing_keys`,
  `_load_optimizer_and_scheduler` -> `_load_optimizer_checked` (name the damaged file, refuse missing or non-finite
  weights);
- `save_model` -> `_save_model_checked`, `_save_checkpoint` -> `_save_checkpoint_checked` (refuse non-finite
  weights, report a full disk);
- after each optimiser step `_check_parameters_finite` (`run_guards._NonFiniteParameterGuard`), after each reward
  computation `_note_nonfinite_rewards`.
"""

from __future__ import annotations

import errno
import logging
import math
import os

import torch

from . import multinode, run_identity, safety
from .checks import short_repr
from .run_guards import CheckpointError, NonFiniteGradientError, NonFiniteRewardError

logger = logging.getLogger("stabledrl_trl.stabledrl_trainer")  # the trainer's logger: its warnings keep their source


class RunSafety:
    """The run-safety checks of `StableDRLTrainer`'s transformers hooks, as a mixin (see the module docstring)."""

    def _skip_nonfinite_grad_norm(self, model, grad_norm):
        """`_get_grad_norm`'s guard, on the norm the parent computed: a non-finite gradient norm skips the step.

        The gradients are dropped (`grad = None`), so the optimiser changes neither the parameters nor its moments
        (the learning-rate schedule still advances); the step is counted (`stabledrl/nonfinite_grad_steps`) and
        warned about, and `max_nonfinite_grad_steps` in a row stop the run with an error. The norm is the global one
        (after DDP's all-reduce / over FSDP shards), so every process skips the same steps. DeepSpeed steps inside
        its engine before this hook: there the guard only counts and stops.
        """
        value = float(grad_norm) if grad_norm is not None else 0.0
        mode = "train"
        if math.isfinite(value):
            self._nonfinite_grad_streak = 0
            self._metrics[mode]["stabledrl/nonfinite_grad_steps"].append(0.0)
            return grad_norm
        for p in model.parameters():
            p.grad = None
        self._nonfinite_grad_streak += 1
        self._metrics[mode]["stabledrl/nonfinite_grad_steps"].append(1.0)
        step = self.state.global_step + 1
        limit = self.args.max_nonfinite_grad_steps
        logger.warning(
            f"Step {step}: gradient norm is {value}; the optimiser step is skipped (parameters unchanged). "
            f"{self._nonfinite_grad_streak} in a row (limit max_nonfinite_grad_steps={limit})."
        )
        if self._nonfinite_grad_streak >= limit:
            raise NonFiniteGradientError(
                f"{self._nonfinite_grad_streak} optimiser steps in a row (up to step {step}) had a non-finite "
                f"gradient norm ({value}); stopping (max_nonfinite_grad_steps={limit}). The parameters are those "
                "of the last good step. Look for huge or non-finite rewards, a too-large learning_rate, or fp16 "
                "overflow (use bf16)."
            )
        return grad_norm

    def _good_checkpoint_note(self) -> str:
        """What the user can resume from after a failure: the newest complete checkpoint (saved weights are checked
        finite when written), or that there is none. Never claims a checkpoint that does not exist."""
        needs_optimizer = not self.args.save_only_model
        for path in reversed(safety.list_checkpoints(self.args.output_dir)):
            if not safety.checkpoint_missing(path, needs_optimizer):
                return f"The newest complete checkpoint, {path}, holds finite weights: resume from it."
        return "No complete checkpoint was saved (save_strategy / save_steps), so there is nothing to resume from."

    def _check_parameters_finite(self):
        """Raise NonFiniteGradientError when a parameter holds inf / NaN after an optimiser step (every process).
        One device synchronisation per step: the per-parameter flags are reduced on the device first."""
        device = self.accelerator.device
        local = [p.detach() for p in self.model.parameters() if p.numel()]
        local = [t.to_local() if hasattr(t, "to_local") else t for t in local]
        flags = [torch.isfinite(t).all().to(device) for t in local if t.numel()]
        finite = bool(torch.stack(flags).all()) if flags else True
        bad = [] if finite else safety.nonfinite_parameters(self.model)
        found = float(len(bad))
        if self.accelerator.num_processes > 1:
            found = float(self.accelerator.reduce(torch.tensor([found], device=self.accelerator.device), "sum"))
        if found > 0:
            a = self.args
            raise NonFiniteGradientError(
                f"Step {self.state.global_step + 1}: after the optimiser step, parameters hold inf/NaN "
                f"({', '.join(bad[:3]) or 'on another process'}) although the gradient norm was finite. Look at the "
                f"optimiser settings (learning_rate={a.learning_rate}, weight_decay={a.weight_decay}, "
                f"adam_epsilon={a.adam_epsilon}, optim={a.optim!r}) and at fp16 overflow (use bf16). "
                + self._good_checkpoint_note()
            )

    def _train_guarded(self, parent_train, resume_from_checkpoint, trial, **kwargs):
        """`train`'s body: `parent_train` (transformers' `Trainer.train`) with output_dir locked for the whole run
        and the output folder and the checkpoint to resume checked first (see `safety`)."""
        if resume_from_checkpoint is None:  # GRPOConfig's field (transformers' Trainer leaves it to scripts)
            resume_from_checkpoint = self.args.resume_from_checkpoint
        lock = self._lock_output_dir()
        try:
            return self._train_locked(parent_train, resume_from_checkpoint, trial, **kwargs)
        finally:
            if lock is not None:
                lock.release()

    def _lock_output_dir(self):
        """Global rank 0 takes output_dir's lock (`output_lock`); every process raises if another run holds it."""
        from .output_lock import OutputDirInUseError, OutputDirLock

        lock, refusal = None, None
        if self.accelerator.is_main_process:
            try:
                lock = OutputDirLock(self.args.output_dir).acquire()
            except OutputDirInUseError as error:
                refusal = str(error)
        if self.accelerator.num_processes > 1:
            refusal = multinode.broadcast_object(refusal)
        if refusal is not None:
            if lock is not None:
                lock.release()
            raise OutputDirInUseError(refusal)
        return lock

    def _train_locked(self, parent_train, resume_from_checkpoint, trial, **kwargs):
        resume = safety.resolve_resume(
            resume_from_checkpoint, self.args.output_dir, needs_optimizer=not self.args.save_only_model
        )
        if resume is not None:  # the loss, estimator, batch layout ... must be the checkpoint's (run_identity)
            run_identity.check_resume_settings(resume, self.args, self.args.resume_allow_changes)
        if resume is None:
            safety.check_fresh_output_dir(
                self.args.output_dir, self.args.overwrite_output_dir, self.accelerator.is_main_process
            )
            self.accelerator.wait_for_everyone()
        elif not self.args.allow_pickle_checkpoints:
            safety.check_safetensors_only(resume, what="checkpoint")
        self._nonfinite_grad_streak = 0
        self._nonfinite_reward_streak = 0
        return parent_train(resume_from_checkpoint=resume, trial=trial, **kwargs)

    def _load_checkpoint_checked(self, parent_load, resume_from_checkpoint, model=None):
        """`_load_from_checkpoint`'s body: `parent_load` (`Trainer._load_from_checkpoint`), naming the file when a
        weight file cannot be read, refusing missing keys (`_issue_warnings_after_load`) and weights holding inf /
        NaN."""
        self._loading_checkpoint = resume_from_checkpoint
        try:
            parent_load(resume_from_checkpoint, model=model)
        except (OSError, RuntimeError, ValueError) as error:
            if isinstance(error, CheckpointError):
                raise
            damage = safety.checkpoint_damage(resume_from_checkpoint, needs_optimizer=False)
            where = (
                f"{damage[0]} is {damage[1]}" if damage else f"loading its weights failed ({short_repr(str(error))})"
            )
            raise CheckpointError(
                f"Cannot resume from {resume_from_checkpoint}: {where}. Resume from an older checkpoint "
                "(resume_from_checkpoint=True skips damaged ones)."
            ) from error
        finally:
            self._loading_checkpoint = None
        bad = safety.nonfinite_parameters(self.model if model is None else model)
        if bad:
            raise CheckpointError(
                f"Cannot resume from {resume_from_checkpoint}: its weights hold inf/NaN ({', '.join(bad[:3])}). "
                "Resume from an older checkpoint (resume_from_checkpoint=<its folder>)."
            )

    def _refuse_missing_keys(self, load_result):
        """`_issue_warnings_after_load`'s check, before the parent's warnings: missing keys on resume (a shard left
        out of the index, a cut state dict) would leave those weights as the fresh model's: an error naming them.
        Keys tied to a loaded weight (a tied lm_head) are not missing."""
        model = self.accelerator.unwrap_model(self.model)
        state = model.state_dict()
        missing = set(load_result.missing_keys) - set(getattr(model, "_keys_to_ignore_on_save", None) or [])
        loaded_ptrs = {t.data_ptr() for k, t in state.items() if k not in missing and t.numel()}
        missing = sorted(k for k in missing if k in state and state[k].data_ptr() not in loaded_ptrs)
        if missing:
            where = getattr(self, "_loading_checkpoint", None) or "the checkpoint"
            raise CheckpointError(
                f"Cannot resume from {where}: {len(missing)} weight(s) of the model are not in it (e.g. "
                f"{missing[:3]}); they would keep the fresh model's values. A shard or the index "
                "(model.safetensors.index.json) is incomplete: resume from an older checkpoint."
            )

    def _load_optimizer_checked(self, parent_load, checkpoint):
        """`_load_optimizer_and_scheduler`'s body: `parent_load` (`Trainer._load_optimizer_and_scheduler`), naming
        the file when the optimiser or scheduler state cannot be read."""
        try:
            return parent_load(checkpoint)
        except (OSError, RuntimeError, ValueError, EOFError) as error:
            damage = safety.checkpoint_damage(checkpoint) if checkpoint else None
            where = (
                f"{damage[0]} is {damage[1]}"
                if damage
                else f"its optimiser / scheduler state ({short_repr(str(error))})"
            )
            raise CheckpointError(
                f"Cannot resume from {checkpoint}: {where}. Resume from an older checkpoint "
                "(resume_from_checkpoint=True skips damaged ones)."
            ) from error

    def _save_model_checked(self, parent_save, output_dir, _internal_call):
        """`save_model`'s body: `parent_save` (`Trainer.save_model`), refusing to write weights that hold inf / NaN
        (checked on every process)."""
        bad = safety.nonfinite_parameters(self.model)
        found = float(len(bad))
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            # sharded parameters: every process saves collectively, so every process must take the same decision
            found = float(self.accelerator.reduce(torch.tensor([found], device=self.accelerator.device), "sum"))
        if found > 0:
            raise NonFiniteGradientError(
                f"Refusing to save to {output_dir or self.args.output_dir}: parameters hold inf/NaN "
                f"({', '.join(bad[:3]) or 'on another process'}). " + self._good_checkpoint_note()
            )
        if _internal_call:  # inside _save_checkpoint, which reports a full disk with the checkpoint's name
            return parent_save(output_dir, _internal_call=_internal_call)
        try:
            return parent_save(output_dir, _internal_call=_internal_call)
        except (OSError, RuntimeError) as error:
            if not safety.is_disk_full(error):
                raise
            raise OSError(
                errno.ENOSPC,
                f"Disk full while saving the model to {output_dir or self.args.output_dir} ({short_repr(str(error))}). "
                "The files there are incomplete; free space and save again. " + self._good_checkpoint_note(),
            ) from error

    def _save_checkpoint_checked(self, parent_save, model, trial):
        """`_save_checkpoint`'s body: `parent_save` (`Trainer._save_checkpoint`), then the run settings a resume must
        match written into the checkpoint; a full disk is reported naming the incomplete checkpoint."""
        try:
            out = parent_save(model, trial)
            if self.args.should_save:  # the settings a resume must match (run_identity)
                folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
                if os.path.isdir(folder):
                    run_identity.write_run_settings(folder, self.args)
            return out
        except Exception as error:  # torch.save and safetensors report a full disk as RuntimeError / SafetensorError
            if not safety.is_disk_full(error):
                raise
            raise OSError(
                errno.ENOSPC,
                f"Disk full while saving checkpoint-{self.state.global_step} to {self.args.output_dir} ({short_repr(str(error))}). "
                "That folder is incomplete (resume skips it); free space or set save_total_limit, then resume.",
            ) from error

    def _note_nonfinite_rewards(self, rewards, bad):
        """A generation batch whose every sample has a non-finite reward trains nothing: warn naming the functions
        that returned no finite reward, and stop after `max_nonfinite_reward_steps` such batches in a row."""
        if bad.numel() == 0 or not bool(bad.all()):
            self._nonfinite_reward_streak = 0
            return
        self._nonfinite_reward_streak += 1
        finite = torch.isfinite(rewards) & (rewards.abs() <= safety.OVERFLOW_LIMIT)  # (N_global, F)
        names = [n for n, ok in zip(self.reward_func_names, finite.any(dim=0).tolist(), strict=True) if not ok]
        limit = self.args.max_nonfinite_reward_steps
        what = (
            f"reward function(s) {names} returned no finite reward (inf, NaN or None)"
            if names
            else "no sample had a finite reward from every reward function"
        )
        message = (
            f"Step {self.state.global_step + 1}: every one of the {bad.numel()} samples has a non-finite reward: {what}, "
            f"so nothing is learnt from this batch ({self._nonfinite_reward_streak} in a row, limit "
            f"max_nonfinite_reward_steps={limit})."
        )
        logger.warning(message)
        if self._nonfinite_reward_streak >= limit:
            raise NonFiniteRewardError(
                message + " Stopping: fix the reward function(s) (return a float for each completion, None only for "
                "a completion that cannot be scored)."
            )
