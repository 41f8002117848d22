"""Value checks of the ground floor: no import from the rest of the package, so the config, validation.py, safety.py
and the scripts all use them (one definition each) without importing each other.

- `short_repr(value)`: the repr every error message prints, bounded (about 200 characters, nesting cut), so that a
  huge value (a YAML alias bomb, a long list) cannot exhaust memory or flood the console while an error is built.
- `check_config_values(config, hints)`: every bool field holds a bool, every string field a string (not a list or
  mapping) of at most MAX_STRING_FIELD characters, every float field (inherited ones included) a finite number
  within its range (`FLOAT_RANGES`), `reward_weights` finite numbers, and the integer fields the step layout relies on
  are at least their minimum (`INT_MINIMUMS`); the message names the field, the value and the valid range.
- `check_field_types(config, hints)`: integer fields hold integers, float fields numbers, None only where allowed.
- `check_float(name, value, ...)`: one finite number in a range.
- `load_yaml_checked(path)`: a YAML mapping with duplicate keys refused (naming the key and both lines) and values
  that expand to more than `MAX_YAML_NODES` nodes through aliases refused before anything prints them.
- `check_num_threads`, `check_seed`: the scripts' shared arguments.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
import types
import typing

REPR_LIMIT = 200
MAX_YAML_NODES = 100_000
MAX_STRING_FIELD = 4096  # PATH_MAX: bounds what messages that print a string field's value can print

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = _repr.maxfrozenset = _repr.maxdeque = 8
_repr.maxstring = _repr.maxother = REPR_LIMIT


def short_repr(value, limit: int = REPR_LIMIT) -> str:
    """repr(value), cut to `limit` characters; nested containers are cut at depth 3 and 8 items before they are
    formatted, so the cost is bounded whatever the value (a self-referencing or alias-expanded structure included)."""
    text = _repr.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------- config values

# float field -> (low, low_open, high, high_open, advice). None: unbounded on that side. Every other float field must
# be finite; these must also be in range.
FLOAT_RANGES: dict[str, tuple] = {
    "test_log_ratio_noise_std": (0.0, False, None, False, "0.0 turns the test-only noise off"),
    # optimiser and schedule (TrainingArguments)
    "learning_rate": (0.0, False, None, False, "e.g. 1e-6 (the official StableDRL recipe uses 1e-6)"),
    "weight_decay": (0.0, False, None, False, "0.0 turns it off"),
    "adam_beta1": (0.0, False, 1.0, True, "TRL's default is 0.9"),
    "adam_beta2": (0.0, False, 1.0, True, "TRL's default is 0.999"),
    "adam_epsilon": (0.0, True, None, False, "TRL's default is 1e-8"),
    "max_grad_norm": (0.0, False, None, False, "0 turns clipping off; the default is 1.0"),
    "num_train_epochs": (0.0, False, None, False, "the default is 3"),
    "warmup_steps": (0.0, False, None, False, "a step count, or a fraction of the run below 1"),
    "label_smoothing_factor": (0.0, False, 1.0, True, "0 turns it off"),
    "logging_steps": (0.0, True, None, False, "a step count, or a fraction of the run below 1"),
    "save_steps": (0.0, True, None, False, "a step count, or a fraction of the run below 1"),
    "eval_steps": (0.0, True, None, False, "a step count, or a fraction of the run below 1"),
    # generation (GRPOConfig)
    "temperature": (0.0, False, None, False, "0 is greedy; the official StableDRL recipe uses 0.9"),
    "top_p": (0.0, True, 1.0, False, "1.0 turns it off"),
    "min_p": (0.0, False, 1.0, False, "None turns it off"),
    "repetition_penalty": (0.0, True, None, False, "1.0 turns it off"),
    "vllm_gpu_memory_utilization": (0.0, True, 1.0, False, "TRL's default is 0.3"),
    # objective (GRPOConfig)
    "beta": (0.0, False, None, False, "0.0 is no KL term"),
    "epsilon": (0.0, False, None, False, "TRL's default is 0.2"),
    "epsilon_high": (0.0, False, None, False, "None uses epsilon"),
    "delta": (0.0, True, None, False, "None turns two-sided clipping off"),
    "ref_model_mixup_alpha": (0.0, False, 1.0, False, "TRL's default is 0.6"),
    "top_entropy_quantile": (0.0, False, 1.0, False, "1.0 keeps every token"),
    "sapo_temperature_neg": (0.0, True, None, False, "TRL's default is 1.05"),
    "sapo_temperature_pos": (0.0, True, None, False, "TRL's default is 1.0"),
    "vllm_importance_sampling_clip_max": (0.0, True, None, False, "TRL's default is 3.0"),
    # this package
    "clip_c": (1.0, True, None, False, "the official StableDRL value is 5.0"),
    "sandwich_beta": (0.0, True, None, False, "SPG uses 1.5"),
    "sandwich_omega": (0.0, False, 1.0, False, "SPG uses 0.5"),
    "dgpo_n": (0.0, True, None, False, "the default is 1.0"),
    "dgpo_m": (0.0, True, None, False, "the default is 2.0"),
    "cfg_scale": (0.0, False, None, False, "0 turns guidance off"),
    "dream_alg_temp": (0.0, False, None, False, "0 reveals the most confident positions"),
    "dream_eps": (0.0, False, 1.0, True, "Dream uses 1e-3"),
    "p_mask_prompt": (0.0, False, 1.0, True, "None uses the estimator's default"),
    "parallel_threshold": (0.0, True, 1.0, True, "Fast-dLLM uses 0.9; None turns it off"),
    "block_confidence_threshold": (0.0, False, 1.0, False, "TraceRL uses 0.9"),
}

# integer field -> (smallest allowed value, advice); None stays allowed where the field allows it.
INT_MINIMUMS: dict[str, tuple[int, str]] = {
    "per_device_train_batch_size": (1, "the official recipe uses num_generations"),
    "per_device_eval_batch_size": (1, "a multiple of the eval group size"),
    "gradient_accumulation_steps": (1, "1 is no accumulation"),
    "steps_per_generation": (1, "None uses gradient_accumulation_steps"),
    "generation_batch_size": (1, "None derives it from the batch size and steps_per_generation"),
    "num_generations": (1, "the official recipe uses 8"),
    "num_generations_eval": (1, "None uses num_generations"),
    "max_nonfinite_reward_steps": (1, "the default is 3"),
}

# str fields that also take other values by design (TrainingArguments: `fsdp=True`; scripts: a bool resume flag).
_STR_FIELDS_TAKING_OTHER_TYPES = ("fsdp", "resume_from_checkpoint")


def _range_text(low, low_open, high, high_open) -> str:
    left = "(" if low_open or low is None else "["
    right = ")" if high_open or high is None else "]"
    return f"{left}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}{right}"


def _in_range(value, low, low_open, high, high_open) -> bool:
    if low is not None and (value < low or (low_open and value == low)):
        return False
    return not (high is not None and (value > high or (high_open and value == high)))


def check_float(name: str, value, low=None, low_open=False, high=None, high_open=False, advice: str = "") -> None:
    """Raise a ValueError naming `name` unless `value` is a finite number in the given range (None: unbounded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}={short_repr(value)} ({type(value).__name__}) must be a number.")
    finite = math.isfinite(float(value))
    if not finite or not _in_range(value, low, low_open, high, high_open):
        what = "is not finite" if not finite else "is out of range"
        hint = f"; {advice}" if advice else ""
        raise ValueError(
            f"{name}={short_repr(value)} {what}: it must be a finite number in "
            f"{_range_text(low, low_open, high, high_open)}{hint}."
        )


def _hint_kinds(hint) -> set:
    """The non-None types a field annotation allows (`list[float]` stays one kind, it is not `float`)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set(typing.get_args(hint)) - {type(None)}
    return {hint}


def check_config_values(config, hints: dict) -> None:
    """Types and ranges of every field of a (StableDRL / GRPO / Training) config dataclass; see the module docstring.
    `hints` maps field names to their resolved annotations."""
    for f in dataclasses.fields(config):
        if not f.init or f.name not in hints:
            continue
        value = getattr(config, f.name)
        kinds = _hint_kinds(hints[f.name])
        if value is None:
            continue
        if kinds == {bool}:
            if not isinstance(value, bool) and type(value).__name__ != "bool_":  # numpy.bool_ is a bool too
                fix = ""
                if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
                    fix = f" (write {value.strip().lower() in ('true', 'yes', '1')}, without quotes)"
                raise TypeError(
                    f"{f.name}={short_repr(value)} ({type(value).__name__}) must be True or False{fix}: a non-empty "
                    "string such as 'false' is true in Python."
                )
        elif kinds == {str} and f.name not in _STR_FIELDS_TAKING_OTHER_TYPES:
            if isinstance(value, (list, tuple, dict, set)):
                raise TypeError(f"{f.name}={short_repr(value)} ({type(value).__name__}) must be a string.")
            if isinstance(value, str) and len(value) > MAX_STRING_FIELD:  # later messages print it whole
                raise ValueError(
                    f"{f.name}={short_repr(value)} is {len(value)} characters long; at most {MAX_STRING_FIELD} "
                    "(no setting or path is longer)."
                )
        elif kinds == {float} and isinstance(value, numbers.Real) and not isinstance(value, bool):
            low, low_open, high, high_open, advice = FLOAT_RANGES.get(f.name, (None, False, None, False, ""))
            check_float(f.name, value, low, low_open, high, high_open, advice)
        elif kinds == {int} and f.name in INT_MINIMUMS and isinstance(value, int) and not isinstance(value, bool):
            minimum, advice = INT_MINIMUMS[f.name]
            if value < minimum:
                raise ValueError(f"{f.name}={value} must be an integer >= {minimum}; {advice}.")
    init_kwargs = getattr(config, "model_init_kwargs", None)
    if isinstance(init_kwargs, dict):
        for key in ("dtype", "torch_dtype"):
            dtype = init_kwargs.get(key)
            if isinstance(dtype, str) and dtype != "auto" and not _is_torch_dtype(dtype):
                raise ValueError(
                    f"model_init_kwargs[{key!r}]={short_repr(dtype)} is not a torch dtype; use 'auto', 'bfloat16', "
                    "'float16' or 'float32'."
                )
    weights = getattr(config, "reward_weights", None)
    if weights is not None:
        if not isinstance(weights, (list, tuple)):
            raise TypeError(
                f"reward_weights={short_repr(weights)} must be a list of numbers (one per reward function)."
            )
        for i, w in enumerate(weights):
            check_float(f"reward_weights[{i}]", w, advice="one finite weight per reward function")


# Fields whose None has a documented TRL meaning although their default is not None.
NONE_ALLOWED = ("max_completion_length",)  # no limit: transformers' generation config decides (autoregressive only)


def check_field_types(config, hints: dict | None = None, none_allowed: tuple[str, ...] = ()) -> None:
    """Integer fields must hold integers (YAML gives `8.0`, `[8]` or `null` unchanged); floats accept integers.

    None is accepted only where the field's default is None (there it has a documented meaning) or the field is in
    NONE_ALLOWED or `none_allowed` (the caller's fields whose None is documented in their help). `hints` maps field
    names to their resolved annotations (None: read from the config's class).
    """
    if hints is None:
        hints = typing.get_type_hints(type(config))
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
            if type(None) in args and (f.default is None or f.name in NONE_ALLOWED or f.name in none_allowed):
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


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """An int or a float, not a bool (the samplers' argument checks)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_torch_dtype(name: str) -> bool:
    import torch

    return isinstance(getattr(torch, name, None), torch.dtype)


# ----------------------------------------------------------------------------------------------- YAML


def load_yaml_checked(path: str):
    """`yaml.safe_load` of the file at `path`, refusing duplicate mapping keys (naming the key and both lines) and a
    value that expands to more than MAX_YAML_NODES nodes through aliases (naming its key)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    def construct_mapping(loader, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: let yaml raise its own error
                break
            if first is not None:
                raise ValueError(
                    f"{path}: duplicate key {short_repr(key)} on line {key_node.start_mark.line + 1} (first on line "
                    f"{first}); YAML would silently keep the last value. Keep one of them."
                )
            seen[key] = key_node.start_mark.line + 1
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    with open(path) as f:
        root = yaml.compose(f, Loader=Loader)
    if root is None:
        return None
    _check_expanded_size(root, path)
    with open(path) as f:
        return yaml.load(f, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)


def _check_expanded_size(root, path: str) -> None:
    """Count the nodes each top-level value expands to (aliases followed), memoised per node: linear time."""
    import yaml

    sizes: dict[int, int] = {}

    def size(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = 1  # a recursive alias counts once
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(n) for n in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        sizes[id(node)] = total
        return total

    items = root.value if isinstance(root, yaml.MappingNode) else [(None, root)]
    for key_node, value_node in items:
        n = size(value_node)
        if n > MAX_YAML_NODES:
            key = "the document" if key_node is None else repr(key_node.value)[:80]
            raise ValueError(
                f"{path}: the value of {key} (line {value_node.start_mark.line + 1}) expands to {n} YAML nodes through "
                f"aliases (limit {MAX_YAML_NODES}); write the value out without nested aliases."
            )


# ------------------------------------------------------------------------------------ script arguments

# transformers' set_seed seeds numpy's legacy generator, which takes 0 <= seed < 2**32.
MAX_SEED = 2**32 - 1


def check_num_threads(value, name: str = "num_threads") -> None:
    """`num_threads` (torch's intra-op CPU threads) is None or a positive integer; `name` is the field or flag the
    user set (scripts/train.py, evaluate.py and sft.py run this check)."""
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"{name}={value!r} must be a positive integer (torch's intra-op CPU threads; 1 is fastest for tiny "
            f"models on a small or busy CPU), or leave {name} out to keep torch's default."
        )


def check_seed(value, name: str = "seed", high: int | None = MAX_SEED) -> None:
    """A seed is an integer in [0, high]: numpy (transformers' set_seed) and datasets' shuffle refuse negative seeds,
    deep inside their own code and without the field's name."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (high is not None and value > high):
        bound = f"from 0 to {high}" if high is not None else ">= 0"
        raise ValueError(
            f"{name}={value!r} is not a valid seed: give an integer {bound} (numpy and datasets refuse negative "
            "seeds), e.g. 42."
        )
