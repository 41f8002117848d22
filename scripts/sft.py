"""Masked-diffusion SFT (LLaDA's objective) of a diffusion LM on a task's answers, then an optional held-out check.

    python scripts/sft.py --task digit_sort --output_dir outputs/sft-tiny --max_steps 200 \
        --per_device_train_batch_size 32 --learning_rate 1e-3 --completion_length 8 --eval_num_samples 256 \
        --per_device_eval_batch_size 64
    python scripts/sft.py --config my_sft.yaml

Without `model_name_or_path` the script builds the tiny local LLaDA (sizes below) and the char-level tokenizer, as
the embedded CPU default does; with it, it fine-tunes that checkpoint. Two dataclasses are parsed by TRL's
`TrlParser`: `SFTScriptArguments` (task, data, model, evaluation) and `MaskedDiffusionSFTConfig` (transformers'
`TrainingArguments` plus completion_length and mask_eps). A YAML key that neither knows is an error; command-line
flags override YAML values. The model and tokenizer are saved to `output_dir`; with `eval_num_samples > 0` the
accuracy on the task's test split (sampler: gen_length = completion_length) is printed and written to
`output_dir/sft_eval.json` with the per-sample outputs.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


@dataclass
class SFTScriptArguments:
    """Task, data, model and evaluation options of scripts/sft.py."""

    task: str = field(default="digit_sort", metadata={"help": "Registered task whose 'answer' column is the target."})
    dataset_path: str | None = field(
        default=None, metadata={"help": "Hub id, local folder or data file replacing the task's default dataset."}
    )
    data_files: str | None = field(default=None, metadata={"help": "Local data file(s) for the dataset builder."})
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    dataset_test_split: str = field(default="test", metadata={"help": "Held-out split of the evaluation."})
    num_train_samples: int | None = field(
        default=None, metadata={"help": "Keep this many training rows (seeded shuffle); None: all rows."}
    )
    dataset_seed: int = field(
        default=0, metadata={"help": "Seed of the row selection (num_train_samples, eval_num_samples)."}
    )
    system_prompt: str | None = field(
        default=None, metadata={"help": "Instructions before each question; None uses the task's default."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Checkpoint to fine-tune; None builds the tiny local LLaDA and tokenizer."}
    )
    tiny_d_model: int = field(default=128, metadata={"help": "Tiny model: hidden size."})
    tiny_n_layers: int = field(default=4, metadata={"help": "Tiny model: number of layers."})
    tiny_n_heads: int = field(default=4, metadata={"help": "Tiny model: attention heads."})
    tiny_mlp_hidden_size: int = field(default=256, metadata={"help": "Tiny model: MLP hidden size."})
    num_threads: int | None = field(
        default=None,
        metadata={
            "help": "torch intra-op CPU threads; None keeps torch's default. 1 is fastest for tiny models on small or "
            "busy CPUs (idle threads spin and slow tiny ops down)."
        },
    )
    eval_num_samples: int = field(
        default=0, metadata={"help": "Test rows to evaluate after training (0: no evaluation)."}
    )
    eval_temperature: float = field(default=0.9, metadata={"help": "Sampling temperature of the evaluation."})
    eval_block_length: int | None = field(
        default=None, metadata={"help": "Sampler block length of the evaluation; None: completion_length."}
    )
    eval_diffusion_steps: int | None = field(
        default=None, metadata={"help": "Sampler steps of the evaluation; None: completion_length (one per token)."}
    )
    allow_pickle_checkpoints: bool = field(
        default=False,
        metadata={"help": "Allow pickle weights (.bin / .pt), which can run code when loaded. Off: safetensors only."},
    )

    def __post_init__(self):
        import typing

        from stabledrl_trl.stabledrl_config import check_field_types
        from stabledrl_trl.validation import check_config_values

        check_field_types(self)
        check_config_values(self, typing.get_type_hints(type(self)))


def make_parser(subparsers=None):
    from stabledrl_trl.sft import MaskedDiffusionSFTConfig

    dataclass_types = (SFTScriptArguments, MaskedDiffusionSFTConfig)
    if subparsers is not None:
        return subparsers.add_parser("sft", help="masked-diffusion SFT", dataclass_types=dataclass_types)
    from stabledrl_trl.safety import make_trl_parser

    description = __doc__.strip().split("\n\n", 1)[0]
    description += "\n\n--config CONFIG.yaml: a YAML file of these fields (flags override it)."
    return make_trl_parser(dataclass_types, description=description, prog="python scripts/sft.py")


def main(script_args=None, training_args=None, argv=None) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import stabledrl_trl  # noqa: F401  (registers LLaDA and Dream with the Auto classes)
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.sft import build_tiny_model, run_sft
    from stabledrl_trl.tasks import get_task, load_task_dataset
    from stabledrl_trl.tiny import build_tiny_tokenizer
    from stabledrl_trl.validation import check_num_threads

    if script_args is None:
        script_args, training_args = make_parser().parse_args_and_config(argv)
    task = get_task(script_args.task)
    check_num_threads(script_args.num_threads)
    if script_args.num_threads is not None:
        import torch

        torch.set_num_threads(script_args.num_threads)

    if script_args.model_name_or_path is None:
        tokenizer = build_tiny_tokenizer()
        model = build_tiny_model(
            tokenizer,
            seed=training_args.seed,
            d_model=script_args.tiny_d_model,
            n_layers=script_args.tiny_n_layers,
            n_heads=script_args.tiny_n_heads,
            n_kv_heads=script_args.tiny_n_heads,
            mlp_hidden_size=script_args.tiny_mlp_hidden_size,
        )
    else:
        from stabledrl_trl.validation import check_model_source

        path = script_args.model_name_or_path
        # as training: never unpickle weights unless asked to
        check_model_source(path, field="model_name_or_path", allow_pickle=script_args.allow_pickle_checkpoints)
        load_kwargs = {} if script_args.allow_pickle_checkpoints else {"use_safetensors": True}
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
        model = AutoModelForCausalLM.from_pretrained(path, **load_kwargs)

    def load(split, num_samples):
        return load_task_dataset(
            task.name,
            split,
            path=script_args.dataset_path,
            data_files=script_args.data_files,
            num_samples=num_samples,
            system_prompt=script_args.system_prompt,
            seed=script_args.dataset_seed,
        )

    metrics = run_sft(
        model, tokenizer, load(script_args.dataset_train_split, script_args.num_train_samples), training_args
    )
    results = {"train": metrics}
    if script_args.eval_num_samples > 0:
        length = training_args.completion_length
        evaluation = evaluate_model(
            model,
            tokenizer,
            load(script_args.dataset_test_split, script_args.eval_num_samples),
            task,
            settings=SamplerSettings.from_fields(
                max_completion_length=length,
                block_length=script_args.eval_block_length or length,
                diffusion_steps=script_args.eval_diffusion_steps or length,
                temperature=script_args.eval_temperature,
            ),
            batch_size=training_args.per_device_eval_batch_size,
            seed=training_args.seed,
            progress=not training_args.disable_tqdm,
            desc="eval after SFT",
        )
        results["eval"] = evaluation
        print(f"held-out accuracy after SFT: {evaluation['accuracy']:.4f} on {evaluation['n']} prompts", flush=True)
        if training_args.process_index == 0:
            with open(os.path.join(training_args.output_dir, "sft_eval.json"), "w") as f:
                json.dump(evaluation, f, indent=2)
    return results


if __name__ == "__main__":
    main()
