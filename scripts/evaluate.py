"""Held-out accuracy of a masked diffusion LM checkpoint (full model or LoRA adapter) on a task.

    python scripts/evaluate.py --model_name_or_path outputs/tiny --task digit_sort --num_samples 256 \
        --training_config configs/tiny.yaml --output_file outputs/tiny/eval.json

`model_name_or_path` is a full model folder (or hub id) or a LoRA adapter folder saved by peft: an adapter is
loaded on its base model (`base_model_name_or_path`, default: the one recorded in adapter_config.json) with
`PeftModel.from_pretrained`, without merging. The sampler settings default to the training run's when
`--training_config` names its YAML (every `SamplerSettings` field: max_completion_length, block_length,
diffusion_steps, temperature, ..., rollout_cache), else to StableDRLConfig's defaults; explicit flags override both
(`--help` lists them last, as "[sampler: ...]"). The numbers, dtype, device, styles and data paths are checked, and the
rows loaded, before the model loads: a bad value fails in seconds, not after an 8B model's weights load.
The settings, the model paths and the model are checked by training's own validation layers (`validation.py`: the
config, `check_model_source`, the family's check in `evaluate_model`). The prompt style (tagged or official)
follows the same precedence (default "tagged"), and so does the grading (`reward_style`, default: the prompt style):
"tagged" scores with the task's correctness reward (1 / 0), "official" counts completions earning the task's full
official StableDRL score (GSM8K / MATH +1, Countdown 1, Sudoku 1.0). Completions are sampled in batches of
left-padded prompts with a progress bar; the accuracy, the grading used and every sample's prompt, completion, gold
answer and reward are written as JSON to `--output_file`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, make_dataclass

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Flags named differently from the StableDRLConfig field (SamplerSettings field) they set (LLaDA's generate.py names);
# every other sampler flag has the field's name.
RENAMED_FLAGS = {"gen_length": "max_completion_length", "steps": "diffusion_steps", "sampler": "diffusion_sampler"}


def _sampler_flags() -> list:
    """One optional flag per `SamplerSettings` field, its help taken from the `StableDRLConfig` field it sets: the
    list of sampler settings is written once, in `SamplerSettings`. Fresh `(name, type, Field)` specs on every call
    (a dataclass takes ownership of its Field objects)."""
    import typing

    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.stabledrl_config import StableDRLConfig

    config_fields = StableDRLConfig.__dataclass_fields__
    hints = typing.get_type_hints(SamplerSettings)
    flag_of = {name: flag for flag, name in RENAMED_FLAGS.items()}
    flags = []
    for name in SamplerSettings.field_names():
        kind = hints[name]
        kind = kind if type(None) in typing.get_args(kind) else kind | None  # None: not given on the command line
        where = name if name not in flag_of else f"{name}, here --{flag_of[name]}"
        help_text = f"[sampler: {where}] {config_fields[name].metadata.get('help', '')}"
        flags.append((flag_of.get(name, name), kind, field(default=None, metadata={"help": help_text})))
    return flags


SamplerFlags = make_dataclass("SamplerFlags", _sampler_flags())


@dataclass
class EvaluateOptions:
    """The options of scripts/evaluate.py other than the sampler flags."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Model folder or hub id, or a LoRA adapter folder (saved with peft)."}
    )
    base_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Base model of a LoRA adapter; None reads it from the adapter's adapter_config.json."},
    )
    task: str = field(default="digit_sort", metadata={"help": "Registered task name (its correctness reward)."})
    split: str = field(default="test", metadata={"help": "Dataset split to evaluate on."})
    dataset_path: str | None = field(
        default=None, metadata={"help": "Hub id, local folder or data file replacing the task's default dataset."}
    )
    data_files: str | None = field(default=None, metadata={"help": "Local data file(s) for the dataset builder."})
    num_samples: int | None = field(
        default=None, metadata={"help": "Evaluate this many rows (seeded shuffle by dataset_seed); None: all rows."}
    )
    dataset_seed: int = field(default=0, metadata={"help": "Seed of the row selection when num_samples is set."})
    system_prompt: str | None = field(
        default=None, metadata={"help": "Instructions before each question; None uses the task's default."}
    )
    prompt_style: str | None = field(
        default=None,
        metadata={
            "help": "'tagged' or 'official' prompts (stabledrl_trl.tasks); None: the training config's prompt_style, "
            "else 'tagged'."
        },
    )
    reward_style: str | None = field(
        default=None,
        metadata={
            "help": "Grading of the accuracy: 'tagged' (the task's correctness reward, 1 / 0) or 'official' (the "
            "fraction of completions earning the task's full official StableDRL score). None: the training "
            "config's reward_style, else the prompt style."
        },
    )
    training_config: str | None = field(
        default=None,
        metadata={
            "help": "The training run's YAML: its prompt_style, reward_style and sampler settings become the defaults "
            "of --prompt_style, --reward_style and the [sampler: ...] flags (listed last)."
        },
    )
    batch_size: int | None = field(
        default=None, metadata={"help": "Prompts sampled together; None: 32, or the protocol's batch size."}
    )
    seed: int | None = field(
        default=None, metadata={"help": "Seed of the sampler's torch.Generator; None: 0, or the protocol's seeds."}
    )
    dtype: str | None = field(
        default=None,
        metadata={"help": "Model dtype: float32, bfloat16, float16 or auto; None: float32, or the protocol's dtype."},
    )
    protocol: str | None = field(
        default=None,
        metadata={
            "help": "Evaluate as a paper's own code did: 'stabledrl' (official StableDRL), 'd1' or 'spg' "
            "(stabledrl_trl.protocols; docs/evaluation.md). The preset fixes data, prompt, sampler, grading, seeds "
            "and batch layout; every flag that changes one of them is recorded as a deviation on the protocol card."
        },
    )
    protocol_length: int | None = field(
        default=None,
        metadata={
            "help": "With --protocol d1 / spg: one of their reported lengths 128, 256, 512 (default 256; steps = "
            "length / 2 and the batch size follow, as in their scripts); the sampler flag gen_length is a "
            "deviation instead."
        },
    )
    draws: int | None = field(
        default=None,
        metadata={
            "help": "With --protocol and sampling (--temperature > 0): score this many seeds (--seed or the "
            "protocol's, then +1, +2, ...); None: 3 when sampling, 1 when greedy."
        },
    )
    limit: int | None = field(
        default=None, metadata={"help": "With --protocol: evaluate only the first N rows (a deviation on the card)."}
    )
    results_file: str | None = field(
        default=None,
        metadata={
            "help": "With --protocol: per-row results (JSON lines), appended batch by batch; rerunning with the same "
            "file resumes. None: the card file's name with .records.jsonl."
        },
    )
    card_file: str | None = field(
        default=None,
        metadata={
            "help": "With --protocol: the protocol card JSON. None: <model folder>/eval_cards/<protocol>-<task>-<len>"
            ".json (./eval_cards/ for a hub id)."
        },
    )
    update_model_card: bool = field(
        default=False,
        metadata={"help": "With --protocol: rewrite the results section of <model folder>/README.md from its cards."},
    )
    device: str | None = field(default=None, metadata={"help": "Device; None: cuda when available, else cpu."})
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op CPU threads; None keeps torch's default. 1 is fastest for tiny models on small or "
            "busy CPUs (idle threads spin and slow tiny ops down)."
        },
    )
    output_file: str | None = field(
        default=None, metadata={"help": "Write the results and per-sample outputs to this JSON file."}
    )
    progress: bool = field(default=True, metadata={"help": "Show a progress bar (--no_progress to hide it)."})
    allow_pickle_checkpoints: bool = field(
        default=False,
        metadata={"help": "Allow pickle weights (.bin / .pt), which can run code when loaded. Off: safetensors only."},
    )


EvaluateArguments = make_dataclass(
    "EvaluateArguments",
    _sampler_flags(),
    bases=(EvaluateOptions,),
    namespace={
        "__module__": __name__,
        "__doc__": "Options of scripts/evaluate.py: `EvaluateOptions`, then one flag per `SamplerSettings` field (the "
        "fields of `SamplerFlags`, listed last in --help), each defaulting to the training YAML's value "
        "(`--training_config`), else to StableDRLConfig's default.",
    },
)


def make_parser(subparsers=None):

    if subparsers is not None:
        return subparsers.add_parser("evaluate", help="held-out accuracy", dataclass_types=(EvaluateArguments,))
    from stabledrl_trl.safety import make_trl_parser

    description = __doc__.strip().split("\n\n", 1)[0]
    description += "\n\n--config CONFIG.yaml: a YAML file of these fields (flags override it)."
    return make_trl_parser((EvaluateArguments,), description=description, prog="python scripts/evaluate.py")


def sampler_settings(args: EvaluateArguments):
    """The evaluation's `SamplerSettings`: explicit flag > the training YAML's value > StableDRLConfig's default, for
    every sampler setting (each has a flag: `SamplerFlags`), checked as
    training checks them; the error names the training field, and this script's flag where it is renamed."""
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings

    training = load_training_config(args.training_config)
    flag_of = {field: flag for flag, field in RENAMED_FLAGS.items()}
    fields = {}
    for name in SamplerSettings.field_names():
        value = getattr(args, flag_of.get(name, name), None)
        if value is None:
            value = training.get(name)
        if value is not None:  # None: StableDRLConfig's default (block_length / diffusion_steps: length-derived)
            fields[name] = value
    try:
        return SamplerSettings.from_fields(**fields)
    except (ValueError, TypeError) as error:
        renamed = ", ".join(f"--{flag} is {field}" for flag, field in RENAMED_FLAGS.items())
        raise type(error)(
            f"sampler settings (a flag, else --training_config, else the default): {error} "
            f"(training field names; here {renamed})"
        ) from None


def load_training_config(path: str | None) -> dict:
    """The training YAML given with --training_config, checked as scripts/train.py checks it: duplicate keys and
    alias bombs refused, and every key must be a field of training's dataclasses (a misspelt key would silently
    leave its setting at the default)."""
    if path is None:
        return {}
    import dataclasses

    from stabledrl_trl.safety import suggest_fields
    from stabledrl_trl.validation import load_yaml_checked

    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"training_config={path!r} is not a file ({os.path.abspath(path)}); give the YAML the model was trained "
            "with (e.g. configs/tiny.yaml), or leave --training_config out to use the sampler defaults."
        )
    training = load_yaml_checked(path) or {}
    if not isinstance(training, dict):
        raise ValueError(f"training_config: {path!r} does not hold a YAML mapping.")
    known = [f.name for t in _training_dataclasses() for f in dataclasses.fields(t)] + ["env"]
    unknown = [str(k) for k in training if k not in known]
    if unknown:
        raise ValueError(
            suggest_fields(
                f"training_config {path!r}: unknown key(s): {', '.join('--' + k for k in unknown)} (not a field of "
                "scripts/train.py's TrainScriptArguments, StableDRLConfig or ModelConfig)",
                known,
            )
        )
    return training


def _train_script():
    """scripts/train.py as a module (its dataclasses, whose fields a training YAML may hold); importing it is cheap
    (its heavy imports are inside its functions)."""
    import importlib.util

    name = "_stabledrl_train_script"
    train = sys.modules.get(name)
    if train is None:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")
        )
        train = importlib.util.module_from_spec(spec)
        sys.modules[name] = train  # dataclasses look their module up while the class is built
        spec.loader.exec_module(train)
    return train


def _training_dataclasses() -> tuple:
    """scripts/train.py's three dataclasses (its script arguments, StableDRLConfig, TRL's ModelConfig)."""
    from trl import ModelConfig

    from stabledrl_trl.stabledrl_config import StableDRLConfig

    return (_train_script().TrainScriptArguments, StableDRLConfig, ModelConfig)


def _training_value(args: EvaluateArguments, key: str):
    """`key` of the training YAML (None without one, or when it does not set it)."""
    if args.training_config is None:
        return None
    return load_training_config(args.training_config).get(key)


def prompt_style(args: EvaluateArguments) -> str:
    """Explicit flag > the training YAML's prompt_style > "tagged"."""
    if args.prompt_style is not None:
        return args.prompt_style
    return _training_value(args, "prompt_style") or "tagged"


def reward_style(args: EvaluateArguments) -> str:
    """The grading: explicit flag > the training YAML's reward_style > the prompt style (as in training)."""
    if args.reward_style is not None:
        return args.reward_style
    return _training_value(args, "reward_style") or prompt_style(args)


def _style_given(args: EvaluateArguments, flag: str, value: str) -> str:
    """`--flag='value'` and, unless the flag was given, where the value came from (for error messages)."""
    given = f"--{flag}={value!r}"
    if getattr(args, flag) is not None:
        return given
    if _training_value(args, flag) is not None:
        return f"{given} (the {flag} of --training_config {args.training_config})"
    return f"{given} (following the prompt style)"


def check_styles(args: EvaluateArguments, task) -> tuple[str, str]:
    """(prompt style, grading), refused with this script's flag names when unknown or when `task` has no official
    form (e.g. a GSM8K training config evaluated on digit_sort): before the model loads."""
    from stabledrl_trl.tasks import PROMPT_STYLES, TASKS

    styles = {"prompt_style": prompt_style(args), "reward_style": reward_style(args)}
    for flag, value in styles.items():
        if value not in PROMPT_STYLES:
            raise ValueError(
                f"{_style_given(args, flag, value)} is not a style; choose one of {', '.join(PROMPT_STYLES)}."
            )
    refused = [flag for flag, value in styles.items() if value not in task.prompt_styles]
    if refused:
        given = " and ".join(_style_given(args, flag, styles[flag]) for flag in refused)
        official = ", ".join(name for name, spec in TASKS.items() if spec.official_reward is not None)
        raise ValueError(
            f"task {task.name!r} has no official StableDRL form, but {given}; pass "
            f"{' '.join(f'--{flag} tagged' for flag in refused)} (official forms exist for {official})."
        )
    return styles["prompt_style"], styles["reward_style"]


def model_dtype(args: EvaluateArguments):
    """The torch dtype of --dtype ("auto" kept as is; None: float32)."""
    import torch

    name = "float32" if args.dtype is None else args.dtype
    dtype = name if name == "auto" else getattr(torch, str(name), None)
    if dtype is None or (dtype != "auto" and not isinstance(dtype, torch.dtype)):
        raise ValueError(f"--dtype={args.dtype!r} is not a torch dtype; use float32, bfloat16, float16 or auto.")
    return dtype


def resolve_device(args: EvaluateArguments) -> str:
    """--device, checked against this machine (None: cuda when available, else cpu): a device torch cannot reach
    is refused naming the flag, before the model loads."""
    import torch

    if args.device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(
            f"--device={args.device!r} is not a torch device; use cpu, cuda, cuda:<index> or mps, or leave --device "
            "out (cuda when available, else cpu)."
        ) from None
    backend = getattr(torch, device.type, None) if device.type != "cpu" else None
    if device.type == "mps":
        backend = torch.backends.mps
    if backend is not None and hasattr(backend, "is_available") and not backend.is_available():
        build = f"torch {torch.__version__}" + (" (a CPU-only build)" if torch.version.cuda is None else "")
        raise ValueError(
            f"--device={args.device!r}: no {device.type} device is available to {build}; use --device cpu, or leave "
            "--device out (cuda when available, else cpu)."
        )
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"--device={args.device!r}: this machine has {torch.cuda.device_count()} CUDA device(s) (indices 0 to "
            f"{torch.cuda.device_count() - 1}); choose one of them."
        )
    return args.device


def check_data_paths(args: EvaluateArguments) -> None:
    """A --dataset_path meant as a local path, or a --data_files file, that does not exist: refused naming the flag
    (the dataset builder's own error does not, and a missing path would otherwise be tried on the hub)."""
    import glob

    for flag in ("dataset_path", "data_files"):
        value = getattr(args, flag)
        if not isinstance(value, str) or "://" in value or os.path.exists(os.path.expanduser(value)):
            continue
        if glob.has_magic(value) and glob.glob(os.path.expanduser(value)):
            continue
        first = value.split("/", 1)[0]
        local = (
            flag == "data_files"
            or value.startswith(("/", "./", "../", "~"))
            or value.count("/") != 1
            or os.path.isdir(first)
            or os.path.splitext(value)[1] in (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".txt")
        )
        if local:
            raise FileNotFoundError(
                f"--{flag}={value!r} does not exist ({os.path.abspath(os.path.expanduser(value))}); give an existing "
                "data file or folder"
                + (", a hub dataset id (owner/name)" if flag == "dataset_path" else "")
                + f", or leave --{flag} out for the task's default dataset."
            )


def check_arguments(args: EvaluateArguments) -> None:
    """The cheap checks of the numbers and names, before the dataset and the model load (an 8B model takes minutes
    to load: a bad value must not wait for it)."""
    from stabledrl_trl.validation import check_num_threads, check_seed

    check_num_threads(args.num_threads, "--num_threads")
    for flag in ("batch_size", "num_samples"):
        value = getattr(args, flag)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            fix = "e.g. 32" if flag == "batch_size" else "or leave --num_samples out to evaluate every row"
            raise ValueError(f"--{flag}={value!r} must be a positive integer ({fix}).")
    if args.num_samples is not None:
        # the row selection shuffles with datasets, which refuses negative seeds
        check_seed(args.dataset_seed, "--dataset_seed", high=None)
    model_dtype(args)
    resolve_device(args)
    check_data_paths(args)


def load_model(args: EvaluateArguments):
    """(model, tokenizer, is_adapter): a full model, or a LoRA adapter on its base model (not merged)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import stabledrl_trl  # noqa: F401  (registers LLaDA and Dream with the Auto classes)

    if args.model_name_or_path is None:
        raise ValueError("model_name_or_path is not set: pass a model folder, hub id or LoRA adapter folder.")
    dtype = model_dtype(args)
    device = resolve_device(args)
    from stabledrl_trl.validation import check_model_source

    # training's checks of a model path (validation's inputs-before-loading layer)
    check_model_source(args.model_name_or_path, field="model_name_or_path", allow_pickle=args.allow_pickle_checkpoints)
    load_kwargs = {} if args.allow_pickle_checkpoints else {"use_safetensors": True}
    adapter_config = os.path.join(args.model_name_or_path, "adapter_config.json")
    is_adapter = os.path.isfile(adapter_config)
    if is_adapter:
        from peft import PeftModel

        base_path = args.base_model_name_or_path
        if base_path is None:
            with open(adapter_config) as f:
                base_path = json.load(f).get("base_model_name_or_path")
        if not base_path:
            raise ValueError(
                f"{adapter_config} names no base model; pass --base_model_name_or_path <the model it was trained on>."
            )
        check_model_source(base_path, field="base_model_name_or_path", allow_pickle=args.allow_pickle_checkpoints)
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype, **load_kwargs)
        model = PeftModel.from_pretrained(base, args.model_name_or_path)  # adapter kept separate: no merge
        has_tokenizer = os.path.isfile(os.path.join(args.model_name_or_path, "tokenizer_config.json"))
        tokenizer_path = args.model_name_or_path if has_tokenizer else base_path
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=dtype, **load_kwargs)
        tokenizer_path = args.model_name_or_path
    from stabledrl_trl.tokenizer_files import check_tokenizer_files

    check_tokenizer_files(tokenizer_path, field="model_name_or_path" if tokenizer_path == args.model_name_or_path else "base_model_name_or_path")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left")
    return model.to(device).eval(), tokenizer, is_adapter


def main(args: EvaluateArguments | None = None, argv=None) -> dict:
    from stabledrl_trl.evaluation import evaluate_model, resolve_grading
    from stabledrl_trl.tasks import get_task, load_task_dataset

    if args is None:
        (args,) = make_parser().parse_args_and_config(argv)
    if args.protocol is not None:
        from stabledrl_trl.protocol_cli import run_protocol_cli

        return run_protocol_cli(args, argv, load_model=load_model, check_arguments=check_arguments)
    from stabledrl_trl.protocol_cli import refuse_protocol_only_flags

    refuse_protocol_only_flags(args)
    args.batch_size = 32 if args.batch_size is None else args.batch_size
    args.seed = 0 if args.seed is None else args.seed
    args.dtype = "float32" if args.dtype is None else args.dtype
    task = get_task(args.task)
    check_arguments(args)  # numbers, dtype, device, data paths: before anything loads
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    settings = sampler_settings(args)
    style, grading = check_styles(args, task)
    resolve_grading(task, grading)  # a bad grading fails before the model loads
    if args.output_file is not None:
        check_writable(args.output_file)  # before the evaluation, not after it
    # the rows before the model: a bad split or data file fails in seconds, not after the weights load
    dataset = load_task_dataset(
        args.task,
        args.split,
        path=args.dataset_path,
        data_files=args.data_files,
        num_samples=args.num_samples,
        system_prompt=args.system_prompt,
        seed=args.dataset_seed,
        prompt_style=style,
    )
    from stabledrl_trl.tasks.code import configure_code_sandbox

    if task.runs_code:  # the code sandbox (default settings) must start before the model loads
        print(f"code rewards: {configure_code_sandbox().description}", flush=True)
    model, tokenizer, is_adapter = load_model(args)
    result = evaluate_model(
        model,
        tokenizer,
        dataset,
        task,
        settings=settings,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=args.progress,
        grading=grading,
    )
    output = {
        "model": args.model_name_or_path,
        "adapter": is_adapter,
        "task": task.name,
        "split": args.split,
        "accuracy": result["accuracy"],
        "n": result["n"],
        "num_rows": result["num_rows"],
        "grading": result["grading"],
        "grading_rule": result["grading_rule"],
        "full_score": result["full_score"],
        "sampler": settings.to_dict(),
        "seed": args.seed,
        "records": result["records"],
    }
    print(
        f"{task.name} {args.split}: accuracy {result['accuracy']:.4f} on {result['n']} samples "
        f"({result['grading']} grading)",
        flush=True,
    )
    if args.output_file is not None:
        write_output(output, args.output_file)
    return output


def check_writable(path: str) -> None:
    """Fail at once when the results file cannot be written (its folder cannot be created or is read-only)."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as error:
        raise OSError(error.errno, f"output_file={path!r}: cannot create its folder {folder!r} ({error}).") from error
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise PermissionError(f"output_file={path!r} is not writable; choose another --output_file.")


def write_output(output: dict, path: str) -> str:
    """Write the results JSON; if that fails (disk full, permissions changed), keep the per-sample records in a
    temporary file, say where, and raise: the evaluation's work is never lost."""
    text = json.dumps(output, indent=2)
    try:
        with open(path, "w") as f:
            f.write(text)
        return path
    except OSError as error:
        import tempfile

        fd, fallback = tempfile.mkstemp(prefix="stabledrl_eval_", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        raise OSError(
            error.errno, f"could not write output_file={path!r} ({error}); the results are saved in {fallback}."
        ) from error


if __name__ == "__main__":
    main()
