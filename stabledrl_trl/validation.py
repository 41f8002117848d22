"""The validation path of a run, layered by what is known when, and the value checks every layer shares.

Validation
----------
A setting or input is checked by the first layer that knows enough to judge it, so that a bad value fails before
the expensive steps (loading weights, building the trainer, the first rollout), with a `ValueError` naming the
field, the value and the fix. Each layer may assume the earlier ones passed. The checks are plain functions: they
raise, or return what they resolved (the trainer assigns it); none sets trainer state. `StableDRLTrainer.__init__`
runs layers 2 to 5 in order; scripts call the same functions (never a copy of a check).

Layers, in the order they run; the one function that runs each, and what it may assume is known:

1. config: `StableDRLConfig.__post_init__` (stabledrl_config.py). The fields alone: types, ranges and combinations
   of fields, and the TRL fields refused by loss type; through this module's generic helpers (`check_config_values`,
   `check_float`). `SamplerSettings.from_fields` (scripts/evaluate.py's sampler flags) builds a config to run it.
2. inputs before loading: `check_inputs_before_loading(model, args, kwargs)`. The config (checked), the model as
   given (a path, a hub id or a model object) and the datasets, before TRL loads anything: a local path that does
   not exist, a model folder transformers cannot read, pickle-only weights (`check_model_source`, which the scripts
   call on their model paths), an empty dataset, and the TRL fields refused before TRL's set-up (e.g. `use_vllm`)
   for the kind of model `is_diffusion_before_loading` tells from the config or the model's config. Returns that
   kind (True / False, None when unknown).
3. model: `check_model_setup(args, model, tokenizer, ...)`. The loaded model, its tokenizer, its diffusion family
   (None: autoregressive) and the device: a forced `diffusion=True` the model cannot honour, a tokenizer that
   indexes past the embedding matrix (`check_vocabulary`), what the family cannot run (`DiffusionFamily.check`),
   the TRL fields refused for the model's kind, a router auxiliary loss that would be ignored, LLaDA's block layout,
   an estimator whose logits cannot fit in memory (`check_estimator_memory`), and the mask / EOS / pad ids. Returns
   the model's `DiffusionAdapter` (its special ids resolved) for a diffusion LM, else None.
4. data: `check_data_setup(args, model, tokenizer, ...)`. The datasets, the resolved mask id and the number of
   processes: prompts (`safety.check_prompt_dataset`), enough prompts for one generation batch, an eval batch that
   holds whole groups, and what `reward_text` needs of the model and the rollouts.
5. launch: `check_launch_setup(args, num_processes, distributed_type)`. The processes accelerate runs: a launch of
   several processes that accelerate runs as one (each would train its own copy), and, across nodes, an output_dir
   that every node must see (`multinode.check_shared_directory`).
6. run: safety.py, when training starts, resumes and saves: the output folder, the checkpoint to resume from,
   weights and gradients holding inf / NaN, a full disk.

Value checks shared by the layers and the scripts:

- `short_repr(value)`: the repr every error message prints, bounded (about 200 characters, nesting cut), so that a
  huge value (a YAML alias bomb, a long list) cannot exhaust memory or flood the console while an error is built.
- `check_config_values(config)`: every bool field holds a bool, every string field a string (not a list or
  mapping) of at most MAX_STRING_FIELD characters, every float field (inherited ones included) a finite number
  within its range, `reward_weights` finite numbers, and the integer fields the step layout relies on are positive;
  the message names the field, the value and the valid range.
- `load_yaml_checked(path)`: a YAML mapping with duplicate keys refused (naming the key and both lines) and values
  that expand to more than `MAX_YAML_NODES` nodes through aliases refused before anything prints them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
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


# The layers below import the package's modules inside their functions: safety.py and stabledrl_config.py import
# this module, and the model code (torch, transformers) is not needed by the config-only checks above.

# ----------------------------------------------------------------------------------- layer 2: inputs before loading


def check_model_folder(path: str, field: str = "model") -> None:
    """A local model path (the value of `field`) that is a file, or a folder whose config.json has no model_type, or
    whose weight index does not cover its shards: clear errors before transformers' own."""
    import json

    from . import safety

    path = os.path.expanduser(path)
    if os.path.isfile(path):
        raise ValueError(
            f"{field}={path!r} is a file; give the folder that holds config.json and the weights (the folder written "
            "by save_pretrained), or a hub id."
        )
    config_file = os.path.join(path, "config.json")
    if not os.path.isdir(path) or not os.path.isfile(config_file):
        return
    try:
        with open(config_file) as f:
            config = json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f"{config_file} is not valid JSON ({short_repr(str(error))}); restore it.") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ValueError(
            f"{config_file} has no model_type, so transformers cannot tell which architecture to build. Add the "
            'model\'s "model_type" (e.g. "llada", "Dream", "sdar", "llama") or save the model again with '
            "save_pretrained."
        )
    safety.check_weight_index(path)


def check_model_source(path: str, field: str = "model", allow_pickle: bool = False) -> None:
    """A model path or hub id (the value of `field`) before anything loads it: a local path that does not exist,
    a folder transformers cannot read (`check_model_folder`), and, unless `allow_pickle`, pickle-only weights."""
    from . import safety

    safety.check_local_model_path(path, field=field)
    check_model_folder(path, field=field)
    if not allow_pickle:
        safety.check_safetensors_only(path, what=field)


def check_datasets_have_rows(datasets: dict) -> None:
    """`train_dataset` / `eval_dataset` of `datasets` (the trainer's keyword arguments; an eval dict per entry)
    that has no rows: nothing would be trained or evaluated."""
    for name in ("train_dataset", "eval_dataset"):
        data = datasets.get(name)
        for key, part in data.items() if isinstance(data, dict) else [(None, data)]:
            if part is not None and hasattr(part, "__len__") and len(part) == 0:
                label = name if key is None else f"{name}[{key!r}]"
                raise ValueError(f"{label} has no rows: nothing would be trained or evaluated. Check the data.")


def is_diffusion_before_loading(model, args) -> bool | None:
    """Whether the model is a masked-diffusion LM, known before TRL loads it: `diffusion` if set, the family of a
    model object, or the model_type / architecture of a local or hub config. None when it cannot be told."""
    from .diffusion.family import detect_family, detect_family_from_config

    if args.diffusion is not None:
        return bool(args.diffusion)
    if not isinstance(model, str):
        return detect_family(model) is not None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model, trust_remote_code=args.trust_remote_code)
    except Exception:  # TRL's own loading reports the problem
        return None
    return detect_family_from_config(config) is not None  # every registered family, LLaDA2 included


def check_inputs_before_loading(model, args, kwargs: dict) -> bool | None:
    """Layer 2 (see the module docstring): the model path, the datasets' sizes and the TRL fields refused before
    TRL's set-up for the model's kind. `model` and `kwargs` are the trainer's arguments, `args` its
    StableDRLConfig. Returns `is_diffusion_before_loading(model, args)`."""
    from .trl_fields import check_model_fields

    if isinstance(model, str):
        check_model_source(model, allow_pickle=args.allow_pickle_checkpoints)
    check_datasets_have_rows(kwargs)
    diffusion = is_diffusion_before_loading(model, args)
    check_model_fields(args, diffusion)  # e.g. use_vllm: refused before TRL sets vLLM up
    return diffusion


# ----------------------------------------------------------------------------------------------- layer 3: model


def check_vocabulary(model, tokenizer) -> None:
    """Token ids the tokenizer can produce must index the embedding matrix: a vocabulary smaller than the tokenizer's
    or a pad id outside it fails later as an index error deep in a forward pass (or silently on some devices)."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if rows is None or tokenizer is None or not hasattr(tokenizer, "__len__"):
        return
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None and not 0 <= pad < rows:
        raise ValueError(
            f"pad_token_id={pad} (tokenizer) is outside the model's vocabulary (embedding rows 0..{rows - 1}). Set "
            "tokenizer.pad_token to a token of the vocabulary (e.g. tokenizer.pad_token = tokenizer.eos_token), or "
            "resize the model (model.resize_token_embeddings(len(tokenizer)))."
        )
    if len(tokenizer) > rows:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's embedding matrix only {rows} rows "
            f"(config.vocab_size={getattr(model.config, 'vocab_size', None)}): ids >= {rows} would index past it. "
            "Use the tokenizer saved with this model, or resize the model (model.resize_token_embeddings(len(tokenizer)))."
        )


def check_estimator_memory(args, family, vocab_size: int | None, device) -> None:
    """Refuse a likelihood-estimator setting whose logits alone cannot fit in the device's memory (e.g. a huge
    mc_samples): per forward pass, rows x max_completion_length x vocabulary float32 logits and log-probs, a lower
    bound that ignores the prompt and the model's activations."""
    if vocab_size is None or args.max_completion_length is None:
        return
    passes = family.estimator_passes(args)  # forward passes per completion (mc_samples for Monte-Carlo estimators)
    rows = args.per_device_train_batch_size * passes
    per_pass = rows if args.estimator_chunk_size is None else min(rows, args.estimator_chunk_size)
    length = args.max_completion_length
    need = per_pass * length * vocab_size * 4 * 2 + rows * length * 4 * 3  # logits + log-probs; (rows, C) outputs
    if device.type == "cuda":
        import torch

        total = torch.cuda.get_device_properties(device).total_memory
    else:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return
    if need <= total:
        return
    fix = "lower mc_samples"
    fit = total // (length * vocab_size * 8 * 2)
    if args.estimator_chunk_size is None and fit >= 1 and rows * length * 12 < total // 2:
        fix += f", or set estimator_chunk_size (rows per forward pass) to at most {fit}"
    raise ValueError(
        f"mc_samples={args.mc_samples} (likelihood_estimator={args.likelihood_estimator!r}): the estimator scores "
        f"per_device_train_batch_size x {passes} passes = {rows} rows, {per_pass} per forward pass, which needs at "
        f"least {need / 2**30:.1f} GiB for its logits alone (x {length} positions x {vocab_size} vocabulary), more "
        f"than the {total / 2**30:.1f} GiB of the {device.type} device. Fix: {fix}."
    )


def _check_forced_diffusion(args, model, family: str | None) -> None:
    """diffusion=True for a model no diffusion family recognises."""
    from .diffusion.family import family_labels

    if args.diffusion is True and family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        raise ValueError(
            f"diffusion=True, but {type(model).__name__} (model_type={model_type!r}) is not a masked diffusion "
            f"LM this package can sample from ({family_labels()}). Remove "
            "diffusion (None detects it) or set diffusion=False to train it autoregressively."
        )


# Sampler settings an autoregressive model reads too (TRL's generation: length, temperature, top-k / top-p), or that
# are checked elsewhere (LLaDA's layout: against its derived values; reward_text: the data layer).
SHARED_SAMPLER_FIELDS = (
    "max_completion_length", "temperature", "top_k", "top_p", "block_length", "diffusion_steps", "reward_text",
)  # fmt: skip
# StableDRLConfig fields only a diffusion LM reads besides its sampler settings: its likelihood estimator and its
# special ids.
DIFFUSION_ESTIMATOR_FIELDS = (
    "mask_token_id", "likelihood_estimator", "mc_samples", "sdmc_nodes", "p_mask_prompt", "estimator_block_size",
    "estimator_chunk_size", "eos_tail", "completion_end", "test_log_ratio_noise_std",
)  # fmt: skip


def diffusion_only_fields() -> tuple[str, ...]:
    """The StableDRLConfig fields only a diffusion LM reads: the `SamplerSettings` fields but the shared ones, and the
    estimator's."""
    from .diffusion.sampler_settings import SamplerSettings

    sampler = [name for name in SamplerSettings.field_names() if name not in SHARED_SAMPLER_FIELDS]
    return (*sampler, *DIFFUSION_ESTIMATOR_FIELDS)


def unused_diffusion_fields(args) -> dict:
    """The diffusion-only fields `args` sets away from their defaults (LLaDA's layout: away from the values
    max_completion_length derives): what an autoregressive model would not read."""
    from .diffusion.family import explicit_layout

    defaults = type(args).__dataclass_fields__
    changed = {
        name: getattr(args, name) for name in diffusion_only_fields() if getattr(args, name) != defaults[name].default
    }
    changed.update(explicit_layout(args))
    return changed


def _warn_unused_diffusion_fields(args) -> None:
    """An autoregressive model decodes with TRL's generation and scores exact log-probabilities: diffusion settings
    would be ignored. Warned, not refused, so one YAML can drive a diffusion run and its autoregressive baseline."""
    import warnings

    changed = unused_diffusion_fields(args)
    if changed:
        warnings.warn(
            f"{short_repr(changed)}: settings of masked-diffusion rollouts and likelihood estimates, which this "
            "autoregressive model does not use (TRL's generation and exact log-probabilities); they are ignored. "
            "Remove them, or load a diffusion LM.",
            UserWarning,
            stacklevel=3,
        )


def _check_router_aux_loss(args, model, is_diffusion: bool, router_aux_loss_coef: float | None) -> None:
    """A mixture-of-experts model whose router auxiliary loss TRL would add (`router_aux_loss_coef` not None) but
    which a diffusion LM's estimator or the package's own objectives leave out: it would be silently ignored."""
    from .stabledrl_config import OWN_LOSS_TYPES

    if router_aux_loss_coef is not None and (is_diffusion or args.loss_type in OWN_LOSS_TYPES):
        where = "a diffusion LM's estimator" if is_diffusion else f"loss_type={args.loss_type!r}"
        raise ValueError(
            f"router_aux_loss_coef={router_aux_loss_coef}: {type(model).__name__} is a mixture-of-experts "
            f"model, but {where} does not add the router auxiliary loss, so it would be silently ignored. Fix: "
            "set router_aux_loss_coef=0.0 (no auxiliary loss), or train with a TRL loss type on an "
            "autoregressive model."
        )


def _check_block_layout(args, family) -> None:
    """A diffusion LM decodes a canvas of max_completion_length positions; where LLaDA's sampler runs, its blocks
    and steps must divide it (`stabledrl_config.check_diffusion_layout`). TRL sampling options no diffusion sampler
    implements are refused by `trl_fields.check_model_fields`, what a family's sampler would ignore by
    `family.check`."""
    from .stabledrl_config import check_diffusion_layout

    sampler = family.sampler_name(args) if getattr(family, "default_sampler", None) is not None else None
    if args.max_completion_length is None:
        check_diffusion_layout(None, args.block_length, args.diffusion_steps)  # raises: a dLLM needs a length
    if sampler == "llada":
        check_diffusion_layout(args.max_completion_length, args.block_length, args.diffusion_steps)


def check_model_setup(
    args, model, tokenizer, *, family: str | None, is_diffusion: bool, router_aux_loss_coef: float | None, device
):
    """Layer 3 (see the module docstring), once TRL has loaded the model.

    args: the trainer's StableDRLConfig. model: the loaded model, unwrapped (no DDP / PEFT wrapper). tokenizer: the
    trainer's tokenizer. family: the model's diffusion family (`diffusion.family.detect_family`, None for an
    autoregressive LM); is_diffusion: whether it trains as a diffusion LM (`args.diffusion`, else family is not
    None). router_aux_loss_coef: the coefficient of the router auxiliary loss TRL adds, None when it adds none.
    device: the device the estimator runs on.
    Returns the model's `DiffusionAdapter` (mask, EOS and pad ids resolved and checked) for a diffusion LM, else None.
    """
    from . import safety
    from .diffusion.adapter import as_diffusion_lm
    from .diffusion.family import get_family
    from .trl_fields import check_model_fields

    _check_forced_diffusion(args, model, family)
    check_vocabulary(model, tokenizer)
    impl = get_family(family) if is_diffusion else None  # sampler + estimator of the family
    if impl is not None:
        impl.check(args, model)  # e.g. dream_alg with LLaDA's sampler, remasking with Dream's
    check_model_fields(args, is_diffusion)
    _check_router_aux_loss(args, model, is_diffusion, router_aux_loss_coef)
    if not is_diffusion:
        _warn_unused_diffusion_fields(args)
        return None
    _check_block_layout(args, impl)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    vocab_size = getattr(embeddings, "num_embeddings", None)
    check_estimator_memory(args, impl, vocab_size, device)
    # Resolve and validate the mask / EOS / pad ids once (clear errors here, not at step 37).
    adapter = as_diffusion_lm(model, tokenizer=tokenizer, family=family, mask_token_id=args.mask_token_id)
    safety.check_mask_token_id(
        args.mask_token_id,
        adapter.mask_token_id,
        getattr(getattr(model, "config", None), "mask_token_id", None),
        getattr(tokenizer, "mask_token_id", None),
        vocab_size,
    )
    return adapter


# ------------------------------------------------------------------------------------------------ layer 4: data


def _check_generation_batch(args, train_dataset, num_processes: int) -> None:
    """A train dataset with fewer prompts than one generation batch needs: no step would run."""
    if train_dataset is None or not hasattr(train_dataset, "__len__"):
        return
    needed = args.generation_batch_size // args.num_generations  # distinct prompts per generation batch
    if len(train_dataset) < needed:
        raise ValueError(
            f"train_dataset has {len(train_dataset)} prompt(s), fewer than the {needed} one generation batch needs "
            f"(generation_batch_size={args.generation_batch_size} = per_device_train_batch_size="
            f"{args.per_device_train_batch_size} x steps_per_generation={args.steps_per_generation} x "
            f"{num_processes} process(es), / num_generations={args.num_generations}): "
            "incomplete batches are dropped, so no step would run and train() would return at once. Add "
            "prompts, or lower per_device_train_batch_size / steps_per_generation (or raise num_generations)."
        )


def _check_eval_layout(args, eval_dataset) -> None:
    """An eval batch that splits groups, for a loss type that normalises whole groups."""
    from .stabledrl_config import GROUP_NORMALISED_LOSS_TYPES

    if eval_dataset is not None and args.loss_type in GROUP_NORMALISED_LOSS_TYPES:
        g = args.num_generations_eval or args.num_generations  # as TRL's num_generations_eval
        if args.per_device_eval_batch_size % g != 0:
            raise ValueError(
                f"per_device_eval_batch_size={args.per_device_eval_batch_size} is not a multiple of the eval group "
                f"size {g} (num_generations_eval, else num_generations): loss_type={args.loss_type!r} normalises "
                f"whole groups. Set per_device_eval_batch_size to a multiple of {g}."
            )


def _check_reward_text(args, is_diffusion: bool, rollout_func, tools) -> None:
    """reward_text="canvas" needs a diffusion rollout canvas of exactly the rows TRL scores."""
    if args.reward_text != "canvas":
        return
    if not is_diffusion:
        raise ValueError(
            "reward_text='canvas' grades the whole generation canvas of a diffusion LM, but this model generates "
            "autoregressively (no canvas, nothing after its EOS); set reward_text='completion'."
        )
    if rollout_func is not None or tools:
        raise ValueError(
            "reward_text='canvas' is not available with rollout_func or tools (their completions are not one "
            "sampler canvas per row); set reward_text='completion'."
        )


def check_data_setup(
    args,
    model,
    tokenizer,
    *,
    train_dataset,
    eval_dataset,
    mask_token_id: int | None,
    is_diffusion: bool,
    num_processes: int,
    rollout_func=None,
    tools=None,
) -> None:
    """Layer 4 (see the module docstring), once the model and its special ids are known.

    args: the trainer's StableDRLConfig. model: the loaded model, unwrapped (its max_position_embeddings bounds the
    prompts). tokenizer: the trainer's tokenizer. train_dataset / eval_dataset: as TRL holds them (an eval dict of
    datasets included). mask_token_id: the resolved mask id of a diffusion LM (no prompt may hold it), None for an
    autoregressive LM. num_processes: the processes sharing a generation batch. rollout_func / tools: TRL's.
    """
    from . import safety

    max_positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    datasets = [("train_dataset", train_dataset)]
    for key, part in eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]:
        datasets.append(("eval_dataset" if key is None else f"eval_dataset[{key!r}]", part))
    for name, data in datasets:
        safety.check_prompt_dataset(data, name, tokenizer, mask_token_id, max_positions, args.max_completion_length)
    _check_generation_batch(args, train_dataset, num_processes)
    _check_eval_layout(args, eval_dataset)
    _check_reward_text(args, is_diffusion, rollout_func, tools)


def check_launch_setup(args, num_processes: int, distributed_type) -> None:
    """Layer 5 (see the module docstring): what the launch gives the run. `num_processes` and `distributed_type` are
    the accelerator's; WORLD_SIZE is what the launcher started."""
    from . import multinode

    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > 1 and num_processes == 1:
        raise RuntimeError(
            f"{launched} processes were launched (WORLD_SIZE={launched}) but accelerate runs this one alone "
            f"(distributed_type={distributed_type}): each process would train its own copy. On a "
            "machine without GPUs set use_cpu=True (gloo on the CPU; accelerate has no FSDP on the CPU)."
        )
    if multinode.num_nodes() > 1 and not args.save_on_each_node:
        # checkpoints are written once (global rank 0) and read by every rank on resume: one shared output_dir
        multinode.check_shared_directory(args.output_dir, "output_dir")


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
