"""Run guards of `StableDRLTrainer`: the errors that stop a run with a message naming the cause, the callback that
stops it when weights turn inf / NaN, reward functions wrapped so that a failure names the function and the sample,
and a `generation_config` for masked LMs that lack one. The trainer's hooks that use them stay in
`stabledrl_trainer.py` (TRL's and transformers' overrides are listed in its class docstring)."""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from transformers import TrainerCallback
from trl.trainer.utils import is_async_callable

from .checks import short_repr


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


def _ensure_generation_config(model) -> None:
    """A masked LM (e.g. `BertForMaskedLM`) has no `generation_config` in transformers 5; TRL writes the pad id
    into it. Give it one built from the model config (the masked-diffusion samplers never read it)."""
    if getattr(model, "generation_config", None) is None and hasattr(model, "config"):
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_model_config(model.config)


def check_loaded_weights(model_id, loading_info: dict) -> None:
    """A model TRL loads by path must have every weight in its checkpoint: transformers initialises missing ones at
    random and only prints a table, so the run would train (and report on) a partly random model. An error naming
    them instead; shape mismatches likewise."""
    missing = sorted(loading_info.get("missing_keys") or [])
    mismatched = [str(m[0]) if isinstance(m, (list, tuple)) else str(m) for m in loading_info.get("mismatched_keys") or []]
    if missing or mismatched:
        what = []
        if missing:
            what.append(f"{len(missing)} weight(s) missing from the checkpoint (e.g. {missing[:3]})")
        if mismatched:
            what.append(f"{len(mismatched)} weight(s) of the wrong shape (e.g. {mismatched[:3]})")
        raise CheckpointError(
            f"model={short_repr(model_id)}: {' and '.join(what)}; transformers would initialise them at random and "
            "training would start from a partly random model. Use a complete checkpoint (all weight files and "
            "model.safetensors.index.json), or a config that matches its weights."
        )


@contextlib.contextmanager
def _generation_config_on_load():
    """While TRL builds the trainer, models it loads from a path get a `generation_config` if they lack one."""
    import trl.trainer.grpo_trainer as grpo_module

    original = grpo_module.create_model_from_path

    def create(*a, **k):
        model_id = a[0] if a else k.get("model_id")
        adapter = isinstance(model_id, str) and os.path.isfile(os.path.join(model_id, "adapter_config.json"))
        if k.get("output_loading_info") or adapter:  # an adapter folder reports through PEFT instead
            return original(*a, **k)
        model, info = original(*a, output_loading_info=True, **k)
        check_loaded_weights(model_id, info)
        _ensure_generation_config(model)
        return model

    grpo_module.create_model_from_path = create
    try:
        yield
    finally:
        grpo_module.create_model_from_path = original
