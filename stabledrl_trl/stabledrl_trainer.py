"""`StableDRLTrainer`: TRL's `GRPOTrainer` for masked diffusion LMs, with the StableDRL and DGPO objectives.

Swap `GRPOConfig`/`GRPOTrainer` for `StableDRLConfig`/`StableDRLTrainer` in working TRL code and nothing else
changes. For a diffusion LM (LLaDA, Dream, a masked LM) rollouts come from the masked-diffusion sampler and
log-probabilities from a likelihood estimator; an autoregressive model keeps TRL's generation and exact
log-probabilities and only gains the new objectives.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import functools
import logging
import math
import os
import time
from typing import Any

import torch
from accelerate.utils import gather
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import (
    is_async_callable,
    pad,
    split_pixel_values_by_grid,
    split_tensor_dict,
    unsplit_pixel_values_by_grid,
)

from . import multinode, safety
from .diffusion.adapter import as_diffusion_lm, unwrap_model
from .diffusion.estimators import estimator_standard_error
from .diffusion.family import detect_family, get_family
from .diffusion.seeding import mix_seed, rollout_row_keys
from .noise_dose import add_log_ratio_noise, log_ratio_noise
from .objectives import (
    SEQUENCE_INPUT,
    PolicyLossInputs,
    add_kl_penalty,
    aggregate_loss,
    equal_reward_groups,
    get_objective,
    ratio_input,
    trl_applied_weights,
    weight_by_advantage_sign,
)
from .scoring_context import ScoringContext
from .stabledrl_config import GROUP_NORMALISED_LOSS_TYPES, OWN_LOSS_TYPES, StableDRLConfig, autoregressive_defaults
from .validation import (
    check_data_setup,
    check_inputs_before_loading,
    check_launch_setup,
    check_model_setup,
    short_repr,
)

logger = logging.getLogger(__name__)

# TRL's losses: the per-micro-batch metric(s) TRL logs whose sum is the fraction of samples (tokens) whose ratio is
# clipped (TRL computes it inside its loss and returns nothing else). The package's objectives report theirs in
# their statistics (keys ending in "clip_frac").
_TRL_CLIP_METRICS = {
    "cispo": ("cispo_clip_ratio",),
    **{t: ("clip_ratio/region_mean",) for t in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")},
}

# Stream ids mixed into the per-row mask seeds, so that each use of the estimator draws its own masks.
_STREAM_OLD, _STREAM_ITER, _STREAM_STEP, _STREAM_SAMPLER, _STREAM_ROWS = 1, 2, 3, 4, 5


class NonFiniteGradientError(RuntimeError):
    """Training stopped: repeated non-finite gradient norms, or weights holding inf / NaN at save time."""


class RewardFunctionError(RuntimeError):
    """A reward function raised; the message names the function and the sample."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the checkpoint and, when known, the file."""


class NonFiniteRewardError(RuntimeError):
    """Training stopped: every reward of `max_nonfinite_reward_steps` generation batches in a row was inf / NaN."""


class _NonFiniteParameterGuard(TrainerCallback):
    """After each optimiser step: parameters holding inf / NaN (a NaN learning rate, weight decay or optimiser state
    makes them so although the gradient norm was finite) stop the run at once, naming the step and parameters."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._check_parameters_finite()


def _check_reward_output(name: str, output, n: int):
    """A reward function must return one number (or None) per completion: a list, tuple or 1-D array / tensor of
    Python, NumPy or 0-d tensor numbers (bools read as 0 / 1, as TRL does). A string, a scalar or nested lists is an error naming the function."""
    import numbers

    one_dim = getattr(output, "ndim", 1) == 1 and hasattr(output, "__len__")
    if isinstance(output, (str, bytes, dict)) or not one_dim or not hasattr(output, "__iter__"):
        raise RewardFunctionError(
            f"Reward function {name!r} returned {type(output).__name__} {short_repr(output)}; it must return a list of "
            f"{n} floats (one per completion, None for a completion it cannot score)."
        )
    for i, r in enumerate(output):
        number = isinstance(r, numbers.Real)  # bool included: TRL reads True as 1.0
        if r is not None and not number and not (isinstance(r, torch.Tensor) and r.numel() == 1):
            raise RewardFunctionError(
                f"Reward function {name!r} returned {type(r).__name__} {short_repr(r)} for completion {i}; each reward "
                "must be a float (or None for a completion it cannot score)."
            )
    return output


def _exit_error(name: str, error: SystemExit) -> RewardFunctionError:
    """A reward function calling sys.exit / exit() would end the run with that exit code and no traceback."""
    return RewardFunctionError(
        f"Reward function {name!r} called sys.exit({short_repr(error.code)}) (raised SystemExit) while scoring "
        "completions; a reward function must return one reward per completion (None for one it cannot score). "
        "Raise an exception instead of exiting to stop the run."
    )


def _wrap_reward_func(func):
    """Re-raise a reward function's exception with the function's name and the first failing sample, and check
    what it returns. An async function stays async (TRL awaits it on its event loop)."""
    name = getattr(func, "__name__", type(func).__name__)

    def locate(batch_error, prompts, completions, completion_ids, kwargs, call_one):
        own = (f"{name}() got an unexpected keyword argument", "__call__() got an unexpected keyword argument")
        if isinstance(batch_error, TypeError) and any(words in str(batch_error) for words in own):
            return RewardFunctionError(  # its signature, not a sample: TRL passes more keywords than it takes
                f"Reward function {name!r} raised TypeError: {batch_error}. TRL calls every reward function with the "
                f"keywords {', '.join(['prompts', 'completions', 'completion_ids', *kwargs])} (here: TRL's and the "
                "dataset's columns); add **kwargs to its parameters: def f(completions, **kwargs)."
            )
        for i in range(len(completions)):  # find the sample: call it one sample at a time
            one = {
                k: (v[i : i + 1] if isinstance(v, list) and len(v) == len(completions) else v)
                for k, v in kwargs.items()
            }
            try:
                call_one(
                    prompts=prompts[i : i + 1],
                    completions=completions[i : i + 1],
                    completion_ids=None if completion_ids is None else completion_ids[i : i + 1],
                    **one,
                )
            except Exception:
                return RewardFunctionError(
                    f"Reward function {name!r} raised {type(batch_error).__name__}: {batch_error} on sample "
                    f"{i}: prompt={short_repr(prompts[i])}, completion={short_repr(completions[i])}. Fix the reward function "
                    "(return None for a completion it cannot score)."
                )
        return RewardFunctionError(
            f"Reward function {name!r} raised {type(batch_error).__name__}: {batch_error} on the batch."
        )

    if is_async_callable(func):

        @functools.wraps(func)
        async def wrapped_async(prompts, completions, completion_ids=None, **kwargs):
            try:
                out = await func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            except SystemExit as error:
                raise _exit_error(name, error) from error
            except Exception as batch_error:

                def call_one(**kw):  # the event loop is busy running us: run the per-sample calls on a fresh one
                    import asyncio
                    import concurrent.futures

                    with concurrent.futures.ThreadPoolExecutor(1) as pool:
                        return pool.submit(asyncio.run, func(**kw)).result()

                raise locate(batch_error, prompts, completions, completion_ids, kwargs, call_one) from batch_error
            return _check_reward_output(name, out, len(completions))

        return wrapped_async

    @functools.wraps(func)
    def wrapped(prompts, completions, completion_ids=None, **kwargs):
        try:
            out = func(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
        except SystemExit as error:
            raise _exit_error(name, error) from error
        except Exception as batch_error:
            raise locate(batch_error, prompts, completions, completion_ids, kwargs, func) from batch_error
        return _check_reward_output(name, out, len(completions))

    return wrapped


def expert_load_entropy(model, reduce=None) -> dict[str, float]:
    """Routing health of a mixture-of-experts model, then a reset of the counts it read.

    Every router module exposing `expert_load` (E,) (tokens routed to each expert since its last reset, e.g.
    LLaDA2's `mlp.gate`) gives the normalised entropy H(p) / log E of p = load / sum(load): 1 = a uniform load,
    0 = every token on one expert (a routing collapse). Returns {"moe/expert_load_entropy": mean over routers,
    "moe/expert_load_entropy_min": the lowest router}, or {} for a model without routers.
    reduce: sums a tensor over processes (the trainer passes accelerate's `reduce(..., "sum")` under data
    parallelism), so the entropy is that of the step's whole load, not of one process's share; called once, on the
    concatenated counts of every router, by every process.
    """
    loads = []
    for module in unwrap_model(model).modules():
        load = getattr(module, "expert_load", None)
        if isinstance(load, torch.Tensor) and load.dim() == 1 and load.numel() >= 2:
            loads.append(load)
    if not loads:
        return {}
    counts = torch.cat([load.detach().double() for load in loads])  # (sum of E,) every router's counts
    if reduce is not None:
        counts = reduce(counts)
    values = []
    for part in counts.split([load.numel() for load in loads]):  # (E,) per router
        total = float(part.sum())
        if total > 0:
            p = part / total  # (E,)
            values.append(float(-(p * p.clamp_min(1e-300).log()).sum()) / math.log(part.numel()))
    for load in loads:
        load.zero_()
    if not values:
        return {}
    return {"moe/expert_load_entropy": sum(values) / len(values), "moe/expert_load_entropy_min": min(values)}


def _ensure_generation_config(model) -> None:
    """A masked LM (e.g. `BertForMaskedLM`) has no `generation_config` in transformers 5; TRL writes the pad id
    into it. Give it one built from the model config (the masked-diffusion samplers never read it)."""
    if getattr(model, "generation_config", None) is None and hasattr(model, "config"):
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_model_config(model.config)


@contextlib.contextmanager
def _generation_config_on_load():
    """While TRL builds the trainer, models it loads from a path get a `generation_config` if they lack one."""
    import trl.trainer.grpo_trainer as grpo_module

    original = grpo_module.create_model_from_path

    def create(*a, **k):
        model = original(*a, **k)
        _ensure_generation_config(model)
        return model

    grpo_module.create_model_from_path = create
    try:
        yield
    finally:
        grpo_module.create_model_from_path = original


class StableDRLTrainer(GRPOTrainer):
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
      (`objectives.get_objective`) and called with one `PolicyLossInputs`; TRL's own loss types go to TRL's
      implementation. For every objective
      it logs the mean applied weight of negative- and positive-advantage samples (`stabledrl/weight_mean_neg_adv`,
      `weight_mean_pos_adv`) and, with fresh masks, the estimator's own noise in L_theta - L_old
      (`stabledrl/estimator_noise_std`); `_calculate_rewards` logs `stabledrl/equal_reward_group_frac`.
    - `training_step`: at the end of each optimiser step, logs `stabledrl/all_clipped` (every sample or token of the
      step had its ratio clipped) and `stabledrl/all_clipped_streak`, and warns after `all_clipped_patience`
      consecutive such steps (no learning).

    The hooks hand each other per-step state (which masks to draw, the last estimate, the rollout canvases, the rows
    with non-finite rewards, the step's clipping) through one `ScoringContext` (`scoring_context.py`, which documents
    each field's writer and reader), created in `__init__`.

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
        if not isinstance(model, str):
            _ensure_generation_config(model)
        with _generation_config_on_load():
            super().__init__(model, reward_funcs, args, *pos, **kwargs)

        unwrapped = self.accelerator.unwrap_model(self.model)
        family = detect_family(unwrapped)
        self.is_diffusion = (family is not None) if args.diffusion is None else bool(args.diffusion)
        self._dlm = check_model_setup(
            args,
            unwrapped,
            self._tokenizer,
            family=family,
            is_diffusion=self.is_diffusion,
            router_aux_loss_coef=self.router_aux_loss_coef if self.aux_loss_enabled else None,
            device=self.accelerator.device,
        )  # the model's DiffusionAdapter, None for an autoregressive model
        self._family = family
        self._family_impl = get_family(family) if self.is_diffusion else None  # sampler + estimator of the family
        if self.is_diffusion:
            self._mask_token_id = self._dlm.mask_token_id
            if args.completion_end == "tokenizer_eos":  # official: <|eot_id|> before the EOS is a scored token
                self.eos_token_ids = [self._tokenizer.eos_token_id]
            else:
                self.eos_token_ids = list(dict.fromkeys([*self.eos_token_ids, *self._dlm.eos_token_ids]))
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

    # ------------------------------------------------------------------ run safety

    def _build_accelerator_args(self, **kwargs):
        """transformers hook: DDP's `find_unused_parameters`. transformers turns it on for any model without
        activation checkpointing, which costs a graph traversal per step; it stays off for a family whose model uses
        every parameter in every forward pass (`DiffusionFamily.uses_every_parameter`: LLaDA, Dream) unless
        `ddp_find_unused_parameters` is set explicitly."""
        from accelerate.utils import DistributedDataParallelKwargs

        accelerator_args = super()._build_accelerator_args(**kwargs)
        family = detect_family(self.model) if self.args.diffusion is not False else None
        uses_all = family is not None and get_family(family).uses_every_parameter
        if self.args.ddp_find_unused_parameters is None and uses_all:
            for handler in accelerator_args.get("kwargs_handlers", []):
                if isinstance(handler, DistributedDataParallelKwargs):
                    handler.find_unused_parameters = False
        return accelerator_args

    def _get_grad_norm(self, model, grad_norm=None):
        """transformers hook, run right before `optimizer.step()`: a step with a non-finite gradient norm is skipped.

        The gradients are dropped (`grad = None`), so the optimiser changes neither the parameters nor its moments
        (the learning-rate schedule still advances); the step is counted (`stabledrl/nonfinite_grad_steps`) and
        warned about, and `max_nonfinite_grad_steps` in a row stop the run with an error. The norm is the global one
        (after DDP's all-reduce / over FSDP shards), so every process skips the same steps. DeepSpeed steps inside
        its engine before this hook: there the guard only counts and stops.
        """
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
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

    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        """`Trainer.train`, with the output folder and the checkpoint to resume checked first (see `safety`)."""
        if resume_from_checkpoint is None:  # GRPOConfig's field (transformers' Trainer leaves it to scripts)
            resume_from_checkpoint = self.args.resume_from_checkpoint
        resume = safety.resolve_resume(
            resume_from_checkpoint, self.args.output_dir, needs_optimizer=not self.args.save_only_model
        )
        if resume is None:
            safety.check_fresh_output_dir(
                self.args.output_dir, self.args.overwrite_output_dir, self.accelerator.is_main_process
            )
            self.accelerator.wait_for_everyone()
        elif not self.args.allow_pickle_checkpoints:
            safety.check_safetensors_only(resume, what="checkpoint")
        self._nonfinite_grad_streak = 0
        self._nonfinite_reward_streak = 0
        return super().train(resume_from_checkpoint=resume, trial=trial, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        """`Trainer._load_from_checkpoint`, naming the file when a weight file cannot be read, refusing missing keys
        (`_issue_warnings_after_load`) and weights holding inf / NaN."""
        self._loading_checkpoint = resume_from_checkpoint
        try:
            super()._load_from_checkpoint(resume_from_checkpoint, model=model)
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

    def _issue_warnings_after_load(self, load_result):
        """Missing keys on resume (a shard left out of the index, a cut state dict) would leave those weights as the
        fresh model's: an error naming them. Keys tied to a loaded weight (a tied lm_head) are not missing."""
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
        super()._issue_warnings_after_load(load_result)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """`Trainer._load_optimizer_and_scheduler`, naming the file when the optimiser or scheduler state cannot be
        read."""
        try:
            return super()._load_optimizer_and_scheduler(checkpoint)
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

    def save_model(self, output_dir=None, _internal_call=False):
        """`Trainer.save_model`, refusing to write weights that hold inf / NaN (checked on every process)."""
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
            return super().save_model(output_dir, _internal_call=_internal_call)
        try:
            return super().save_model(output_dir, _internal_call=_internal_call)
        except (OSError, RuntimeError) as error:
            if not safety.is_disk_full(error):
                raise
            raise OSError(
                errno.ENOSPC,
                f"Disk full while saving the model to {output_dir or self.args.output_dir} ({short_repr(str(error))}). "
                "The files there are incomplete; free space and save again. " + self._good_checkpoint_note(),
            ) from error

    def _save_checkpoint(self, model, trial):
        try:
            return super()._save_checkpoint(model, trial)
        except Exception as error:  # torch.save and safetensors report a full disk as RuntimeError / SafetensorError
            if not safety.is_disk_full(error):
                raise
            raise OSError(
                errno.ENOSPC,
                f"Disk full while saving checkpoint-{self.state.global_step} to {self.args.output_dir} ({short_repr(str(error))}). "
                "That folder is incomplete (resume skips it); free space or set save_total_limit, then resume.",
            ) from error

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """The model card (README.md in output_dir): names StableDRL and the objective actually used, cites the
        paper, and shows how to load the model (`import stabledrl_trl` first) and decode it with this package's
        sampler (a diffusion LM has no `pipeline("text-generation")`)."""
        if not self.is_world_process_zero():
            return
        from .model_card import build_model_card

        card = build_model_card(self, model_name=model_name, dataset_name=dataset_name, tags=tags)
        card.save(os.path.join(self.args.output_dir, "README.md"))

    # ------------------------------------------------------------------ helpers

    def _canvas_completions(self, completions: list) -> list:
        """`completions` with each text replaced by its row's decoded canvas (special tokens skipped), in the
        structure TRL builds: a string, or one assistant message for conversational prompts."""
        canvases, self._scoring.canvas_ids = self._scoring.canvas_ids, None
        if canvases is None or len(canvases) != len(completions):
            raise RuntimeError(
                f"reward_text='canvas': expected the rollout canvases of the {len(completions)} completions being "
                f"scored, found {'none' if canvases is None else len(canvases)}."
            )
        texts = self.processing_class.batch_decode(canvases, skip_special_tokens=True)
        return [
            text if isinstance(c, str) else [{"role": "assistant", "content": text}]
            for c, text in zip(completions, texts, strict=True)
        ]

    def _adapter(self, model):
        return as_diffusion_lm(
            model, tokenizer=self._tokenizer, family=self._family, mask_token_id=self._mask_token_id
        )

    def _generator(self, *stream: int) -> torch.Generator:
        """A generator seeded from the config seed, the process and a stream: rollouts replay exactly on resume."""
        value = int(
            mix_seed(torch.zeros(1, dtype=torch.long), self.args.seed, self.accelerator.process_index, *stream)
        )
        return torch.Generator(device=self.accelerator.device).manual_seed(value)

    @property
    def _inner_iteration(self) -> int:
        return (self._step // self.args.steps_per_generation) % self.num_iterations

    @property
    def _aligned(self) -> bool:
        return self.args.gradient_accumulation_steps % (self.args.steps_per_generation * self.num_iterations) == 0

    # ------------------------------------------------------------------ TRL hooks

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
                out = self._family_impl.generate(
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
            est = self._family_impl.estimate(
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
            float(self._family_impl.estimator_passes(self.args))
        )
        entropies = est.token_entropy if compute_entropy else None
        return est.token_logps, entropies, None

    def _rollout_row_keys(self, num_rows: int) -> torch.Tensor:
        """Keys (num_rows,) of this process's rows of the generation batch being made: their positions in the run's
        global stream of rollouts (TRL's sampler order; process p holds the p-th slice of each generation batch),
        so each row draws its own masks and keeps them under any layout of processes and micro-batches."""
        ga = self.args.gradient_accumulation_steps
        generate_every = self.args.steps_per_generation * self.num_iterations
        # micro-steps since the start of the run (restored exactly on resume, unlike TRL's micro-step counter)
        micro_steps = self.state.global_step * ga + self._step % ga
        generation = micro_steps // generate_every
        first = (generation * self.accelerator.num_processes + self.accelerator.process_index) * num_rows
        mode = 0 if self.model.training else 1  # evaluation rollouts form their own stream
        return rollout_row_keys(first, num_rows, _STREAM_ROWS, mode, device=self.accelerator.device)

    def _row_keys(self, num_rows: int, device) -> torch.Tensor:
        """Keys of the rows being scored: `ScoringContext.mask_rows` (set from the batch), else the rows' indices in
        the call."""
        keys = self._scoring.mask_rows
        if keys is None:
            return torch.arange(num_rows, device=device)
        if keys.shape != (num_rows,):
            raise RuntimeError(
                f"mask row keys of shape {tuple(keys.shape)} for {num_rows} rows being scored: the batch's "
                "'mask_row_key' must hold one key per row."
            )
        return keys.to(device)

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
        return torch.where(overflow, torch.nan, rewards)

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
            if self.loss_type in OWN_LOSS_TYPES:
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
        elif self.loss_type in OWN_LOSS_TYPES and "old_per_token_logps" not in output:
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
        if not self.model.training:
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

    def _shuffle_groups(self, batch: dict) -> dict:
        """Permute whole groups of num_generations consecutive rows (TRL permutes rows, which splits groups)."""
        n = len(next(v for v in batch.values() if isinstance(v, torch.Tensor) and v.ndim > 0))
        g = self.num_generations
        if n % g != 0:
            raise ValueError(f"local generation batch of {n} rows is not a multiple of num_generations={g}.")
        perm_groups = torch.randperm(n // g, generator=self._generator(_STREAM_STEP, -1, self.state.global_step))
        perm = (perm_groups[:, None] * g + torch.arange(g)[None, :]).reshape(-1)  # (n,)

        def permute(v):
            if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == n:
                return v[perm.to(v.device)]
            if isinstance(v, list) and len(v) == n:
                return [v[i] for i in perm.tolist()]
            return v

        return {k: permute(v) for k, v in batch.items()}

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
        if self.loss_type not in OWN_LOSS_TYPES:
            loss = super()._compute_loss(model, inputs)
        else:
            loss = self._compute_own_loss(model, inputs)
        if self.is_diffusion and self.loss_type not in GROUP_NORMALISED_LOSS_TYPES:
            self._log_ratio_max(inputs)
        if self.is_diffusion and self.loss_type not in OWN_LOSS_TYPES:
            self._log_trl_weights(inputs)
        if self.is_diffusion:
            self._log_estimator_noise(inputs)
        if self.model.training and self.loss_type not in OWN_LOSS_TYPES:
            self._note_trl_clipping()
        return loss

    # ------------------------------------------------------------------ mechanism and noise diagnostics

    def _log_applied_weights(self, mode, weights, advantages, mask=None):
        """`stabledrl/weight_mean_neg_adv` / `weight_mean_pos_adv`: mean multiplier the objective puts on the
        gradient term of negative- / positive-advantage samples (tokens, for token-level losses), over processes."""
        sums = gather(weight_by_advantage_sign(weights, advantages, mask).reshape(1, 4)).sum(0)  # (4,)
        for key, total, count in (("neg", sums[0], sums[1]), ("pos", sums[2], sums[3])):
            if count > 0:
                self._metrics[mode][f"stabledrl/weight_mean_{key}_adv"].append(float(total / count))

    def _log_trl_weights(self, inputs):
        """The applied weights of TRL's losses (`objectives.trl_applied_weights`), from the estimate just computed."""
        if self._scoring.last_estimate is None:
            return
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"].bool()  # (B, C)
        current = self._scoring.last_estimate.token_logps.detach()
        old = inputs.get("old_per_token_logps")
        log_r = current - (current if old is None else old)  # (B, C); exactly 0 on-policy
        advantages = inputs["advantages"]
        if self.loss_type == "vespo":
            adv = advantages[:, None] if advantages.dim() == 1 else advantages
            weights = self.get_gamma_weights(
                advantages=adv,
                log_ratio_per_token=log_r,
                mask=mask,
                importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
                k_pos=self.args.vespo_k_pos,
                lambda_pos=self.args.vespo_lambda_pos,
                k_neg=self.args.vespo_k_neg,
                lambda_neg=self.args.vespo_lambda_neg,
            )  # (B, 1)
            unit_mask = mask.any(-1, keepdim=True)
        else:
            if self.args.importance_sampling_level == "sequence":
                log_r = ((log_r * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None]  # (B, 1)
                unit_mask = mask.any(-1, keepdim=True)
            else:
                unit_mask = mask
            weights = trl_applied_weights(
                self.loss_type,
                log_r,
                advantages,
                epsilon_low=self.epsilon_low,
                epsilon_high=self.epsilon_high,
                delta=self.args.delta,
                sapo_temperature_pos=getattr(self.args, "sapo_temperature_pos", 1.0),
                sapo_temperature_neg=getattr(self.args, "sapo_temperature_neg", 1.05),
            )
        if weights is not None:
            self._log_applied_weights(mode, weights, advantages.reshape(advantages.shape[0], -1)[:, 0], unit_mask)

    def _log_estimator_noise(self, inputs):
        """`stabledrl/estimator_noise_std`: with fresh masks, the noise that the likelihood estimator alone puts in
        L_theta - L_old, sqrt(2) x the standard error of the current estimate (std over its independent units /
        sqrt(U)), averaged over completions; the old estimate is independent with the same variance. No extra
        forward pass; not logged with fewer than two units per estimate, nor for shared masks or on-policy steps."""
        est = self._scoring.last_estimate
        if (
            est is None
            or est.sample_seq_logps is None
            or self.args.mask_seed_mode != "fresh"
            or inputs.get("old_per_token_logps") is None
        ):
            return
        se = estimator_standard_error(est.sample_seq_logps.float())  # (B,)
        rows = inputs["completion_mask"].bool().any(-1) & torch.isfinite(se)
        local = torch.stack([torch.where(rows, se, 0.0).sum() * math.sqrt(2.0), rows.sum().float()])
        total = gather(local.reshape(1, 2)).sum(0)
        if total[1] > 0:
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["stabledrl/estimator_noise_std"].append(float(total[0] / total[1]))

    def _log_ratio_max(self, inputs):
        """`stabledrl/weight_max` for objectives that do not log it: the largest unclipped ratio they consume,
        per token or per sequence (`objectives.ratio_input`), from the estimate just computed."""
        old = inputs.get("old_per_token_logps")
        if old is None or self._scoring.last_estimate is None:
            return  # on-policy: every ratio is exactly 1
        mask = inputs["completion_mask"].bool()  # (B, C)
        log_r = self._scoring.last_estimate.token_logps.detach() - old  # (B, C)
        level = ratio_input(self.loss_type, self.args.importance_sampling_level, self.args.stable_drl_ratio_form)
        if level == SEQUENCE_INPUT:
            log_r = ((log_r * mask).sum(-1) / mask.sum(-1).clamp(min=1))[:, None]  # (B, 1)
            mask = mask.any(-1, keepdim=True)
        local = torch.where(mask & torch.isfinite(log_r), log_r, -torch.inf).max().reshape(1)
        value = gather(local.float()).max()
        self._metrics["train" if self.model.training else "eval"]["stabledrl/weight_max"].append(
            float(torch.exp(value.clamp(max=80.0)))
        )

    # ------------------------------------------------------------------ all-clipped guard

    def _note_trl_clipping(self):
        """TRL's losses: record whether every sample (token) of this micro-batch, over all processes, had its ratio
        clipped, from the clip fraction TRL logged for it (`_TRL_CLIP_METRICS`)."""
        keys = _TRL_CLIP_METRICS.get(self.loss_type)
        metrics = self._metrics["train"]
        if keys is None or not all(metrics.get(k) for k in keys):
            return
        self._scoring.note_clipping(sum(float(metrics[k][-1]) for k in keys))  # the values logged for this micro-batch

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

    def _end_clipping_step(self):
        full = self._scoring.end_clipping_step()
        if full is None:
            return
        self._all_clipped_streak = self._all_clipped_streak + 1 if full else 0
        self._metrics["train"]["stabledrl/all_clipped"].append(float(full))
        self._metrics["train"]["stabledrl/all_clipped_streak"].append(float(self._all_clipped_streak))
        patience = self.args.all_clipped_patience
        if patience and self._all_clipped_streak == patience:
            if self.loss_type == "stable_drl":
                effect = (
                    f"every importance weight exceeded clip_c={self.args.clip_c}, so the group weights are uniform "
                    "and the update ignores the ratios"
                )
            else:
                effect = "the clipped objective gets no gradient from the ratios: the policy is not learning"
            logger.warning(
                f"Every sample was clipped for {patience} consecutive optimiser steps (up to step "
                f"{self.state.global_step + 1}, loss_type={self.loss_type!r}): {effect}. The ratios are likely "
                f"dominated by likelihood-estimator noise (likelihood_estimator={self.args.likelihood_estimator!r}, "
                f"mask_seed_mode={self.args.mask_seed_mode!r}). Fix: use mask_seed_mode='shared', more mc_samples "
                "or a lower learning rate; loss_type='stable_drl' keeps learning under such noise."
            )

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
        x = PolicyLossInputs(
            per_token_logps=per_token_logps,
            old_per_token_logps=old,
            advantages=advantages,
            mask=mask,
            group_size=g,
            eubo=None if estimate is None else estimate.eubo,
            clip_c=args.clip_c,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            stable_drl_ratio_form=args.stable_drl_ratio_form,
            sandwich=args.sandwich,
            sandwich_omega=args.sandwich_omega,
            dgpo_n=args.dgpo_n,
            dgpo_m=args.dgpo_m,
        )
        out = get_objective(self.loss_type)(x)
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

    def _log_objective_stats(self, mode, stats, entropies, mask) -> dict[str, float]:
        """Log the objective's scalar statistics as `stabledrl/<key>` (reduced over processes); returns them."""
        m = self._metrics[mode]
        logged = {}
        for key, value in stats.items():
            if key in ("weights", "applied_weight") or not isinstance(value, torch.Tensor) or value.ndim != 0:
                continue
            reduce = "max" if key.endswith("max") else ("sum" if key == "skipped" else "mean")
            v = gather(value.detach().float().reshape(1))
            logged[key] = float(v.max() if reduce == "max" else v.sum() if reduce == "sum" else v.mean())
            m[f"stabledrl/{key}"].append(logged[key])
        if entropies is not None:
            ent = gather(((entropies * mask).sum() / mask.sum().clamp(min=1)).detach().reshape(1))
            m["entropy"].append(float(ent.mean()))
        return logged
