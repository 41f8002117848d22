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
   of fields, and the TRL fields refused by loss type; through the generic helpers of `checks.py` (`check_config_values`,
   `check_float`). `SamplerSettings.from_fields` (scripts/evaluate.py's sampler flags) runs the
   same sampler checks (`sampler_settings.check_sampler_values`) without building a config.
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

Value checks shared by the layers and the scripts (`short_repr`, `check_config_values`, `check_float`,
`load_yaml_checked`, `check_num_threads`, `check_seed`) live in the ground-floor module `checks.py`, which imports
nothing from the package, and are importable from here as before.
"""

from __future__ import annotations

import os

from .checks import (  # noqa: F401  (the value checks every layer shares; importable from here as before)
    FLOAT_RANGES,
    INT_MINIMUMS,
    MAX_SEED,
    MAX_STRING_FIELD,
    MAX_YAML_NODES,
    REPR_LIMIT,
    _hint_kinds,
    check_config_values,
    check_float,
    check_num_threads,
    check_seed,
    load_yaml_checked,
    short_repr,
)

# The layers below import the package's modules inside their functions: the model code (torch, transformers) is not
# needed before a layer runs.

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
        if kwargs.get("processing_class") is None:  # TRL loads the tokenizer from the model's folder
            from .tokenizer_files import check_tokenizer_files

            check_tokenizer_files(model)
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
# special ids (the estimators' own option fields, e.g. sdmc_nodes, come from the estimators registry).
DIFFUSION_ESTIMATOR_FIELDS = (
    "mask_token_id", "likelihood_estimator", "mc_samples", "p_mask_prompt", "estimator_chunk_size", "eos_tail",
    "completion_end", "test_log_ratio_noise_std",
)  # fmt: skip


def diffusion_only_fields() -> tuple[str, ...]:
    """The StableDRLConfig fields only a diffusion LM reads: the `SamplerSettings` fields but the shared ones, the
    estimator's, and every registered estimator's option fields (`register_estimator(options=...)`)."""
    from .diffusion.estimators import ESTIMATOR_SPECS
    from .diffusion.sampler_settings import SamplerSettings

    sampler = [name for name in SamplerSettings.field_names() if name not in SHARED_SAMPLER_FIELDS]
    options = dict.fromkeys(f for spec in ESTIMATOR_SPECS.values() for f in spec.options.values())
    return (*sampler, *DIFFUSION_ESTIMATOR_FIELDS, *(f for f in options if f not in DIFFUSION_ESTIMATOR_FIELDS))


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
    from .objectives import OBJECTIVES

    if router_aux_loss_coef is not None and (is_diffusion or args.loss_type in OBJECTIVES):
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
    from .diffusion.adapter import NO_MASK_TOKEN
    from .diffusion.family import as_diffusion_lm, get_family
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
    if adapter.mask_token_id != NO_MASK_TOKEN:  # a family without a mask token has none to check
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
    from .objectives import needs_whole_groups

    if eval_dataset is not None and needs_whole_groups(args.loss_type):
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
    from .diffusion.adapter import NO_MASK_TOKEN

    if mask_token_id == NO_MASK_TOKEN:  # a family without a mask token: no prompt token to refuse
        mask_token_id = None
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
