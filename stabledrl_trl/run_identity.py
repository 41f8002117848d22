"""The settings that define a run, recorded in every checkpoint and compared on resume.

Resuming a checkpoint with another `loss_type`, `num_generations` or likelihood estimator would continue a different
experiment from the first one's weights, optimiser moments and step count, and nothing in the weights shows it (a
changed LoRA rank or expert count fails on the shapes; these do not). So each checkpoint holds `RUN_FILE`, a JSON of
the values of `RUN_DEFINING_FIELDS` the run used, and a resume compares them with the resuming run's values: any
difference is an error naming the fields, both values and the two fixes (resume with the checkpoint's values, or
name the fields in `resume_allow_changes` to change them on purpose).

What stays free to change on resume: everything else, e.g. `max_steps` / `num_train_epochs` (train longer),
logging, saving and evaluation settings, `output_dir`, `report_to`, thread and memory settings.
"""

from __future__ import annotations

import json
import logging
import math
import os

logger = logging.getLogger(__name__)

RUN_FILE = "stabledrl_run.json"
ALLOW_ALL = "all"

# Settings that change what is optimised, from which samples, or how: grouped for the messages.
RUN_DEFINING_FIELDS = (
    # objective and advantages
    "loss_type",
    "scale_rewards",
    "beta",
    "epsilon",
    "epsilon_high",
    "delta",
    "clip_c",
    "stable_drl_ratio_form",
    "sandwich",
    "sandwich_beta",
    "sandwich_omega",
    "dgpo_n",
    "dgpo_m",
    "importance_sampling_level",
    "num_iterations",
    "reward_weights",
    "reward_text",
    "completion_end",
    "eos_tail",
    # likelihood estimator and its masks
    "diffusion",
    "likelihood_estimator",
    "mc_samples",
    "sdmc_nodes",
    "p_mask_prompt",
    "estimator_block_size",
    "mask_seed_mode",
    # rollouts
    "num_generations",
    "max_completion_length",
    "temperature",
    "top_k",
    "top_p",
    "block_length",
    "diffusion_steps",
    "remasking",
    "cfg_scale",
    "diffusion_sampler",
    "dream_alg",
    "dream_alg_temp",
    "dream_eps",
    "block_denoising_steps",
    "block_remasking",
    "block_confidence_threshold",
    # batch layout
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    # optimisation
    "learning_rate",
    "lr_scheduler_type",
    "optim",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "max_grad_norm",
    "seed",
)


class ChangedRunError(ValueError):
    """A resume whose run-defining settings differ from the checkpoint's (see the module docstring)."""


def _plain(value):
    """A JSON value for a setting: numbers, strings, bools and None as they are, lists recursively, enums by value,
    anything else by its string (compared as text)."""
    import enum

    if isinstance(value, enum.Enum):  # e.g. transformers' SchedulerType / OptimizerNames (str enums)
        value = value.value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def run_settings(args) -> dict:
    """{field: JSON value} of the `RUN_DEFINING_FIELDS` that `args` has (a StableDRLConfig as the trainer uses it)."""
    missing = object()
    settings = {}
    for name in RUN_DEFINING_FIELDS:
        value = getattr(args, name, missing)
        if value is not missing:
            settings[name] = _plain(value)
    return settings


def write_run_settings(folder: str, args) -> str:
    """Write `RUN_FILE` into `folder` (a checkpoint); returns its path. Written to a temporary name and renamed, so a
    kill while writing leaves no half file."""
    path = os.path.join(folder, RUN_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"settings": run_settings(args)}, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return path


def read_run_settings(folder: str) -> dict | None:
    """The settings recorded in `folder`'s `RUN_FILE`, or None when the checkpoint has none (written before this
    file existed, or by another trainer)."""
    path = os.path.join(folder, RUN_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            data = json.load(f)
        settings = data["settings"]
        if not isinstance(settings, dict):
            raise TypeError("settings is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ChangedRunError(
            f"Cannot resume from {folder}: {RUN_FILE} (the settings that run used) is unreadable ({error}). "
            "Resume from another checkpoint, or delete that file to resume without comparing the settings."
        ) from error
    return settings


def check_allowed_changes(allowed) -> None:
    """`resume_allow_changes` names run-defining fields (or 'all'); any other name is refused at construction."""
    if allowed is None:
        return
    if isinstance(allowed, str) or not isinstance(allowed, (list, tuple)):
        raise TypeError(
            f"resume_allow_changes={allowed!r} must be a list of field names, e.g. ['learning_rate'] (or ['all'])."
        )
    for name in allowed:
        if name != ALLOW_ALL and name not in RUN_DEFINING_FIELDS:
            raise ValueError(
                f"resume_allow_changes holds {name!r}, which is not a setting that defines the run (those compared on "
                f"resume: {', '.join(RUN_DEFINING_FIELDS)}; or 'all'). Other settings may change on resume freely."
            )


def changed_settings(recorded: dict, current: dict) -> dict:
    """{field: (checkpoint's value, current value)} for every recorded run-defining field whose value differs."""
    return {
        name: (recorded[name], current.get(name))
        for name in sorted(recorded)
        if name in current and recorded[name] != current[name]
    }


def check_resume_settings(checkpoint: str, args, allowed=None) -> dict:
    """Compare the run-defining settings of `args` with those recorded in `checkpoint`.

    Raises ChangedRunError naming every changed field not in `allowed` (`resume_allow_changes`), with both values.
    Changes the user allowed are logged. A checkpoint without `RUN_FILE` cannot be compared: a warning says so.
    Returns the changes found {field: (old, new)}.
    """
    recorded = read_run_settings(checkpoint)
    if recorded is None:
        logger.warning(
            f"Resuming from {checkpoint}, which does not record the settings of its run ({RUN_FILE}): the loss, "
            "estimator and batch settings cannot be compared with this run's. Make sure they are the same."
        )
        return {}
    changes = changed_settings(recorded, run_settings(args))
    allowed = set(allowed or ())
    refused = {k: v for k, v in changes.items() if ALLOW_ALL not in allowed and k not in allowed}
    if refused:
        lines = "; ".join(f"{k}: checkpoint {old!r}, now {new!r}" for k, (old, new) in refused.items())
        raise ChangedRunError(
            f"Cannot resume from {checkpoint}: this run's settings differ from those the checkpoint was trained "
            f"with ({lines}). Resuming would continue a different run from its weights and optimiser state. Fix: "
            "resume with the checkpoint's values, start a fresh run in another output_dir, or, to change them on "
            f"purpose, set resume_allow_changes={sorted(refused)!r}."
        )
    if changes:
        logger.warning(
            f"Resuming from {checkpoint} with changed settings (allowed by resume_allow_changes): "
            + "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changes.items())
        )
    return changes
