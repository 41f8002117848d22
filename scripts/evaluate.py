"""Held-out accuracy of a masked diffusion LM checkpoint (full model or LoRA adapter) on a task.

    python scripts/evaluate.py --model_name_or_path outputs/tiny --task digit_sort --num_samples 256 \
        --training_config configs/tiny.yaml --output_file outputs/tiny/eval.json

`model_name_or_path` is a full model folder (or hub id) or a LoRA adapter folder saved by peft: an adapter is
loaded on its base model (`base_model_name_or_path`, default: the one recorded in adapter_config.json) with
`PeftModel.from_pretrained`, without merging. The sampler settings default to the training run's when
`--training_config` names its YAML (max_completion_length, block_length, diffusion_steps, temperature, remasking,
cfg_scale), else to StableDRLConfig's defaults; explicit flags override both. The prompt style (tagged or official)
follows the same precedence (default "tagged"); scoring is the task's tagged correctness reward (1 / 0). Completions are sampled in batches of
left-padded prompts with a progress bar; the accuracy and every sample's prompt, completion, gold answer and reward
are written as JSON to `--output_file`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# Sampler setting -> the StableDRLConfig field (training YAML key) it is read from.
SAMPLER_FROM_TRAINING = {
    "gen_length": "max_completion_length",
    "block_length": "block_length",
    "steps": "diffusion_steps",
    "temperature": "temperature",
    "remasking": "remasking",
    "cfg_scale": "cfg_scale",
}


@dataclass
class EvaluateArguments:
    """Options of scripts/evaluate.py."""

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
            "else 'tagged'. Scoring is the task's tagged correctness reward either way."
        },
    )
    training_config: str | None = field(
        default=None,
        metadata={"help": "The training run's YAML; its sampler settings become the defaults of the flags below."},
    )
    gen_length: int | None = field(
        default=None, metadata={"help": "Completion length (training: max_completion_length)."}
    )
    block_length: int | None = field(default=None, metadata={"help": "Semi-autoregressive block length."})
    steps: int | None = field(default=None, metadata={"help": "Denoising steps (training: diffusion_steps)."})
    temperature: float | None = field(default=None, metadata={"help": "Sampling temperature (0 = greedy)."})
    remasking: str | None = field(default=None, metadata={"help": "'low_confidence' or 'random'."})
    cfg_scale: float | None = field(default=None, metadata={"help": "Classifier-free guidance scale (0 = off)."})
    batch_size: int = field(default=32, metadata={"help": "Prompts sampled together."})
    seed: int = field(default=0, metadata={"help": "Seed of the sampler's torch.Generator."})
    dtype: str = field(default="float32", metadata={"help": "Model dtype: float32, bfloat16, float16 or auto."})
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


def make_parser(subparsers=None):
    from trl import TrlParser

    if subparsers is not None:
        return subparsers.add_parser("evaluate", help="held-out accuracy", dataclass_types=(EvaluateArguments,))
    return TrlParser((EvaluateArguments,))


def sampler_settings(args: EvaluateArguments) -> dict:
    """Explicit flag > the training YAML's value > StableDRLConfig's default, for every sampler setting."""
    from stabledrl_trl.stabledrl_config import StableDRLConfig

    training = {}
    if args.training_config is not None:
        import yaml

        with open(args.training_config) as f:
            training = yaml.safe_load(f) or {}
        if not isinstance(training, dict):
            raise ValueError(f"training_config: {args.training_config!r} does not hold a YAML mapping.")
    defaults = StableDRLConfig.__dataclass_fields__
    settings = {}
    for name, training_key in SAMPLER_FROM_TRAINING.items():
        value = getattr(args, name)
        if value is None:
            value = training.get(training_key, defaults[training_key].default)
        settings[name] = value
    return settings


def prompt_style(args: EvaluateArguments) -> str:
    """Explicit flag > the training YAML's prompt_style > "tagged"."""
    if args.prompt_style is not None:
        return args.prompt_style
    if args.training_config is not None:
        import yaml

        with open(args.training_config) as f:
            training = yaml.safe_load(f) or {}
        if isinstance(training, dict) and training.get("prompt_style") is not None:
            return training["prompt_style"]
    return "tagged"


def load_model(args: EvaluateArguments):
    """(model, tokenizer, is_adapter): a full model, or a LoRA adapter on its base model (not merged)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import stabledrl_trl  # noqa: F401  (registers LLaDA and Dream with the Auto classes)

    if args.model_name_or_path is None:
        raise ValueError("model_name_or_path is not set: pass a model folder, hub id or LoRA adapter folder.")
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype, None)
    if dtype is None or (dtype != "auto" and not isinstance(dtype, torch.dtype)):
        raise ValueError(f"dtype={args.dtype!r} is not a torch dtype; use float32, bfloat16, float16 or auto.")
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
        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=dtype)
        model = PeftModel.from_pretrained(base, args.model_name_or_path)  # adapter kept separate: no merge
        has_tokenizer = os.path.isfile(os.path.join(args.model_name_or_path, "tokenizer_config.json"))
        tokenizer_path = args.model_name_or_path if has_tokenizer else base_path
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path, dtype=dtype)
        tokenizer_path = args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer, is_adapter


def main(args: EvaluateArguments | None = None, argv=None) -> dict:
    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.tasks import get_task, load_task_dataset

    if args is None:
        (args,) = make_parser().parse_args_and_config(argv)
    task = get_task(args.task)
    if args.num_threads is not None:
        import torch

        if args.num_threads < 1:
            raise ValueError(f"num_threads must be a positive integer or None, got {args.num_threads}.")
        torch.set_num_threads(args.num_threads)
    settings = sampler_settings(args)
    model, tokenizer, is_adapter = load_model(args)
    dataset = load_task_dataset(
        args.task,
        args.split,
        path=args.dataset_path,
        data_files=args.data_files,
        num_samples=args.num_samples,
        system_prompt=args.system_prompt,
        seed=args.dataset_seed,
        prompt_style=prompt_style(args),
    )
    result = evaluate_model(
        model,
        tokenizer,
        dataset,
        task,
        **settings,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=args.progress,
    )
    output = {
        "model": args.model_name_or_path,
        "adapter": is_adapter,
        "task": task.name,
        "split": args.split,
        "accuracy": result["accuracy"],
        "n": result["n"],
        "num_rows": result["num_rows"],
        "sampler": settings,
        "seed": args.seed,
        "records": result["records"],
    }
    print(f"{task.name} {args.split}: accuracy {result['accuracy']:.4f} on {result['n']} samples", flush=True)
    if args.output_file is not None:
        os.makedirs(os.path.dirname(os.path.abspath(args.output_file)), exist_ok=True)
        with open(args.output_file, "w") as f:
            json.dump(output, f, indent=2)
    return output


if __name__ == "__main__":
    main()
