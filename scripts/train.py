"""Train a (diffusion) language model with StableDRL from a YAML config.

    accelerate launch scripts/train.py --config configs/llada_gsm8k_lora.yaml
    python scripts/train.py --config configs/tiny.yaml                       # one process, CPU, no hub needed

Three dataclasses are parsed by TRL's `TrlParser`: `TrainScriptArguments` (task and data), `StableDRLConfig`
(training, sampler, estimator, objective) and TRL's `ModelConfig` (model, dtype, LoRA). A YAML key that none of them
knows is an error; command-line flags override YAML values.

`prompt_style` / `reward_style` choose between the tasks' tagged prompts and rewards and the official StableDRL ones
(stabledrl_trl.tasks); the official configs (configs/llada_*.yaml) use the official ones with the anti-short-boxed
term. The before/after evaluation grades with the same `reward_style`: the task's tagged correctness reward (1 / 0),
or the fraction of completions earning the task's full official score (GSM8K / MATH +1, Countdown 1, Sudoku 1.0);
accuracy_before_after.json says which.

With `tiny_model: true` the script builds the embedded default: a tiny LLaDA-architecture model and a character
tokenizer made locally, warmed up by masked-diffusion SFT on the task (cached under `sft_cache_dir`), then trained
with StableDRL; with `evaluate_before_after: true` it prints held-out accuracy before and after RL.
"""

from __future__ import annotations

import json
import os
import sys
import time
import typing
import warnings
from dataclasses import dataclass, field

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USAGE = [
    "python scripts/train.py --config CONFIG.yaml [--FIELD VALUE ...]",
    "accelerate launch [--config_file ACCELERATE.yaml] scripts/train.py --config CONFIG.yaml [--FIELD VALUE ...]",
]


def __getattr__(name):
    # the checks shared with evaluate.py and sft.py, imported on first use: `--help` must not import torch
    if name in ("check_num_threads", "check_seed"):
        from stabledrl_trl import validation

        return getattr(validation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class TrainScriptArguments:
    """Task and data options of scripts/train.py."""

    task: str = field(default="gsm8k", metadata={"help": "Task name (gsm8k, math, countdown, sudoku, or built-in)."})
    dataset_path: str | None = field(
        default=None, metadata={"help": "Hub id, local folder or data file replacing the task's default dataset."}
    )
    data_files: str | None = field(default=None, metadata={"help": "Local data file(s) for the dataset builder."})
    test_data_files: str | None = field(
        default=None,
        metadata={
            "help": "Local data file(s) of the held-out split. Needed when the training data is one file "
            "(dataset_path or data_files) and a held-out evaluation is asked for: one file is one split."
        },
    )
    dataset_train_split: str = field(default="train", metadata={"help": "Training split."})
    dataset_test_split: str = field(default="test", metadata={"help": "Held-out split for evaluation."})
    num_train_samples: int | None = field(default=None, metadata={"help": "Keep this many training rows."})
    num_eval_samples: int | None = field(default=None, metadata={"help": "Keep this many held-out rows."})
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "Instructions before each question (tagged prompts only); None uses the task's default."},
    )
    tiny_model: bool = field(
        default=False,
        metadata={"help": "Build the tiny local LLaDA model and tokenizer and warm them up by SFT (cached)."},
    )
    tiny_architecture: str = field(
        default="llada",
        metadata={
            "help": "Architecture of the tiny model (tiny_model only): 'llada' (full attention), 'sdar' (block "
            "diffusion, block size 4), 'llada2' (MoE block diffusion, block size 4) or 'diffusion_gemma' (uniform-noise "
            "block diffusion, canvas 8; its warm-up is uniform-noise SFT, it has no mask token)."
        },
    )
    sft_cache_dir: str = field(default=".cache/stabledrl_tiny", metadata={"help": "Cache of the SFT warm-up."})
    sft_max_steps: int = field(
        default=200,
        metadata={
            "help": "SFT warm-up steps (tiny_model only); 0 skips the warm-up (RL starts from the random model)."
        },
    )
    sft_learning_rate: float = field(default=1e-3, metadata={"help": "SFT warm-up learning rate (tiny_model only)."})
    sft_num_samples: int | None = field(
        default=5000,
        metadata={"help": "SFT warm-up examples (tiny_model only); null: every row of the task's train split."},
    )
    evaluate_before_after: bool = field(
        default=False, metadata={"help": "Print held-out accuracy before and after RL (same sampler settings)."}
    )
    eval_batch_size: int = field(default=64, metadata={"help": "Batch size of the before/after evaluation."})
    num_threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads (1 is fastest for the tiny default on a small CPU); None keeps torch's."},
    )
    eval_temperature: float | None = field(
        default=None, metadata={"help": "Sampling temperature of the evaluation; None uses the training one."}
    )
    console: str = field(
        default="short",
        metadata={
            "help": "Console output: 'short' (one line per logged step, warnings, a final summary with the paths; "
            "the full record goes to log_file) or 'full' (every log dict and progress bar, as transformers prints)."
        },
    )
    log_file: str | None = field(
        default=None,
        metadata={"help": "Full log of the run (appended); None: train.log in output_dir."},
    )
    eval_draws: int = field(
        default=1,
        metadata={
            "help": "Sampled evaluations before and after RL, draw d seeded with seed + d; the accuracy reported is "
            "their mean, with the std over draws (one draw is noisy: use at least 4 to compare runs)."
        },
    )
    eval_greedy: bool = field(
        default=False, metadata={"help": "Also evaluate greedily (temperature 0) before and after RL."}
    )

    # --- task style: today's tagged prompts and rewards, or the official StableDRL ones -------------------------
    prompt_style: str = field(
        default="tagged",
        metadata={
            "help": "'tagged': reasoning/answer tags and the task's instructions; 'official': the official StableDRL "
            "wording (gsm8k, math, countdown, sudoku; no system_prompt)."
        },
    )
    reward_style: str | None = field(
        default=None,
        metadata={
            "help": "'tagged': the task's rewards; 'official': the official StableDRL grading. None: as prompt_style."
        },
    )
    anti_short_boxed: bool | None = field(
        default=None,
        metadata={
            "help": "Add the official anti-short-boxed reward term (0 for a short, mostly-boxed completion, else 1). "
            "None: on with reward_style 'official', off with 'tagged'."
        },
    )

    # --- MATH problem filter, training split only (the official runs: dataset_path qwedsacf/competition_math,
    # math_max_level 4, max_problem_chars 1500, max_problem_words 300)
    math_max_level: int | None = field(
        default=None,
        metadata={
            "help": "MATH: keep training problems of level at most this (1-5; an unreadable level such as 'Level ?' "
            "counts as 5). None: every level."
        },
    )
    max_problem_chars: int | None = field(
        default=None,
        metadata={"help": "MATH: keep training problems of 1 to max_problem_chars - 1 characters. None: no bound."},
    )
    max_problem_words: int | None = field(
        default=None,
        metadata={
            "help": "MATH: keep training problems of at most this many whitespace-separated words. None: no bound."
        },
    )

    # --- code tasks (kodcode, humaneval, mbpp): the sandbox that runs the model's programs (docs/code.md)
    code_sandbox: str = field(
        default="bwrap",
        metadata={
            "help": "Code tasks: 'bwrap' (isolated: no network, read-only system files only, no host files) or "
            "'unsafe_local' (resource limits only, NO isolation; warned at start and in the model card)."
        },
    )
    code_sandbox_mode: str | None = field(
        default=None,
        metadata={
            "help": "Code tasks, bwrap: 'zygote' (a long-lived sandbox per worker forks a child per program; fast) "
            "or 'per_program' (a new sandbox per program; slower, the strongest separation). None: 'zygote'."
        },
    )
    code_workers: int | None = field(
        default=None, metadata={"help": "Code tasks: programs graded at once. None: the CPU count."}
    )
    code_timeout: float = field(default=3.0, metadata={"help": "Code tasks: seconds per program (official: 3)."})
    code_memory_mb: int = field(default=1024, metadata={"help": "Code tasks: address-space limit per program, MiB."})
    code_verdict_cache_mb: int = field(
        default=64,
        metadata={
            "help": "Code tasks: MiB of verdicts kept across reward calls for programs whose verdict did not depend "
            "on time (never timeouts or crashes): a program graded before on the same tests is not run again. "
            "0: run every program every time (docs/code.md)."
        },
    )
    code_reward: str = field(
        default="official",
        metadata={
            "help": "Code tasks: 'official' (kodcode +1 / -1, humaneval / mbpp 1 / 0 per program) or 'fraction' "
            "(the fraction of tests passed; kodcode and mbpp)."
        },
    )

    def sandbox_settings(self):
        """The code sandbox's settings from the code_* fields (checked: an error names the field)."""
        from stabledrl_trl.sandbox import SandboxSettings

        return SandboxSettings(backend=self.code_sandbox, num_workers=self.code_workers, timeout=self.code_timeout,
                               memory_mb=self.code_memory_mb, mode=self.code_sandbox_mode,
                               verdict_cache_mb=self.code_verdict_cache_mb)  # fmt: skip

    def _check_code_fields(self, task) -> None:
        from stabledrl_trl.tasks import code_task_names
        from stabledrl_trl.tasks.code import FRACTION_REWARDS

        defaults = {"code_sandbox": "bwrap", "code_sandbox_mode": None, "code_workers": None, "code_timeout": 3.0,
                    "code_memory_mb": 1024, "code_reward": "official", "code_verdict_cache_mb": 64}  # fmt: skip
        if not task.runs_code:
            for name, default in defaults.items():
                if getattr(self, name) != default:
                    raise ValueError(
                        f"{name}: set to {getattr(self, name)!r}, but it applies to the code tasks "
                        f"({', '.join(code_task_names())}) only and task is {task.name!r}; remove {name}"
                    )
            return
        try:
            self.sandbox_settings()
        except ValueError as error:  # SandboxSettings names its own fields: give the script's names
            message = str(error)
            for key, name in (("timeout", "code_timeout"), ("memory_mb", "code_memory_mb"), ("num_workers", "code_workers"),
                              ("mode", "code_sandbox_mode"), ("verdict_cache_mb", "code_verdict_cache_mb")):  # fmt: skip
                if message.startswith(key + ":"):
                    raise ValueError(name + message[len(key) :]) from None
            raise
        if self.code_reward not in ("official", "fraction"):
            raise ValueError(f"code_reward: expected 'official' or 'fraction', got {self.code_reward!r}")
        if self.code_reward == "fraction" and task.name not in FRACTION_REWARDS:
            raise ValueError(
                f"code_reward: 'fraction' exists for {', '.join(FRACTION_REWARDS)}, not {task.name!r} (one check per "
                "problem); use code_reward: official"
            )

    def __post_init__(self):
        from stabledrl_trl.tasks import PROMPT_STYLES, get_task
        from stabledrl_trl.tasks.math import check_problem_filter

        if self.reward_style is None:
            self.reward_style = self.prompt_style
        for name in ("prompt_style", "reward_style"):
            if getattr(self, name) not in PROMPT_STYLES:
                raise ValueError(
                    f"{name}: expected one of {', '.join(PROMPT_STYLES)}, got {getattr(self, name)!r}; "
                    "'official' poses and grades the task as the official StableDRL code does"
                )
        task = get_task(self.task)
        for name in ("prompt_style", "reward_style"):
            if getattr(self, name) not in task.prompt_styles:
                if task.styles is not None:  # a task with its own set of styles (the code tasks: official only)
                    raise ValueError(
                        f"{name}: task {task.name!r} has the styles {', '.join(task.styles)} only; set {name}: "
                        f"{task.styles[0]}"
                    )
                raise ValueError(
                    f"{name}: task {task.name!r} has no official StableDRL form; set {name}: tagged (official forms "
                    "exist for gsm8k, math, countdown and sudoku)"
                )
        if self.prompt_style == "official" and self.system_prompt:
            raise ValueError(
                f"system_prompt: got {self.system_prompt!r:.60} with prompt_style 'official', whose prompts carry "
                "their own wording; remove system_prompt or set prompt_style: tagged"
            )
        if self.anti_short_boxed is None:
            self.anti_short_boxed = self.reward_style == "official" and task.official_anti_short_boxed
        if not isinstance(self.eval_draws, int) or isinstance(self.eval_draws, bool) or self.eval_draws < 1:
            raise ValueError(
                f"eval_draws: expected a positive integer, got {self.eval_draws!r}; 4 draws or more "
                "separate runs whose held-out accuracies differ by a few points"
            )
        for name, value in self.problem_filter().items():
            if value is not None and task.name != "math":
                field_name = "math_max_level" if name == "max_level" else name
                raise ValueError(
                    f"{field_name}: filters MATH problems, but task is {task.name!r}; remove {field_name} or set "
                    "task: math"
                )
        check_problem_filter(**self.problem_filter(), level_name="math_max_level")
        self._check_code_fields(task)
        if self.console not in ("short", "full"):
            raise ValueError(f"console: expected 'short' or 'full', got {self.console!r}")

    def problem_filter(self) -> dict:
        """The MATH loader's filter options (`stabledrl_trl.tasks.math.filter_problems`) for the training split."""
        return {
            "max_level": self.math_max_level,
            "max_problem_chars": self.max_problem_chars,
            "max_problem_words": self.max_problem_words,
        }

    def reward_funcs(self) -> list:
        """The reward functions of the chosen task and reward style (with the anti-short-boxed term if on)."""
        from stabledrl_trl.tasks import get_task
        from stabledrl_trl.tasks.code import FRACTION_REWARDS

        if self.code_reward == "fraction":
            return [FRACTION_REWARDS[get_task(self.task).name]]
        return get_task(self.task).reward_funcs_for(self.reward_style, anti_short_boxed=self.anti_short_boxed)


def make_parser(subparsers=None):
    from trl import ModelConfig

    from stabledrl_trl import StableDRLConfig

    dataclass_types = (TrainScriptArguments, StableDRLConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("train", help="StableDRL training", dataclass_types=dataclass_types)
    from stabledrl_trl.safety import make_trl_parser

    return make_trl_parser(dataclass_types)


MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32")
def check_script_args(script_args) -> None:
    """TrainScriptArguments' types and numbers, named (bools, finite floats; sft_max_steps 0 skips the warm-up)."""
    from stabledrl_trl.stabledrl_config import check_field_types
    from stabledrl_trl.validation import check_config_values, check_float, check_num_threads

    check_field_types(script_args, none_allowed=("sft_num_samples",))  # None: the whole train split
    check_config_values(script_args, typing.get_type_hints(type(script_args)))
    check_num_threads(script_args.num_threads)
    if script_args.sft_max_steps < 0:
        raise ValueError(
            f"sft_max_steps={script_args.sft_max_steps} must be >= 0 (0 skips the SFT warm-up; the default is 200)."
        )
    check_float("sft_learning_rate", script_args.sft_learning_rate, 0.0, True, advice="the default is 1e-3")


def check_model_args(model_args) -> None:
    """TRL's ModelConfig fields this script reads, checked with their names (a YAML value skips argparse's
    choices, and peft's own errors do not name the field)."""
    from stabledrl_trl.validation import check_config_values, check_float, short_repr

    check_config_values(model_args, typing.get_type_hints(type(model_args)))
    if model_args.dtype is not None and model_args.dtype not in MODEL_DTYPES:
        raise ValueError(f"dtype={short_repr(model_args.dtype)} is not known; choose one of {list(MODEL_DTYPES)}.")
    if model_args.use_peft:
        if model_args.lora_r < 1:
            raise ValueError(f"lora_r={model_args.lora_r} must be an integer >= 1 (the LoRA rank; e.g. 16).")
        check_float("lora_alpha", model_args.lora_alpha, 0.0, True, advice="TRL's default is 32")
        check_float("lora_dropout", model_args.lora_dropout, 0.0, False, 1.0, True, advice="TRL's default is 0.05")


def build_model_init_kwargs(training_args, model_args) -> dict:
    """from_pretrained kwargs: dtype, revision, attention; safetensors only and no remote code unless asked for."""
    import torch

    check_model_args(model_args)
    dtype = model_args.dtype
    if dtype not in (None, "auto"):
        dtype = getattr(torch, dtype)
    kwargs = {
        **(training_args.model_init_kwargs or {}),
        "dtype": dtype,
        "trust_remote_code": training_args.trust_remote_code,
        "revision": model_args.model_revision,
    }
    kwargs.setdefault("use_safetensors", True)  # never unpickle weights
    if model_args.attn_implementation is not None:
        kwargs["attn_implementation"] = model_args.attn_implementation
    return kwargs


UNSAFE_CARD_WARNING = (
    "\n\n## Warning: code rewards ran without isolation\n\nThis model was trained with `code_sandbox: "
    "unsafe_local`: the programs it wrote during training ran with resource limits but without a sandbox (they "
    "could read and write the training machine's files and use its network). See stabledrl_trl's docs/code.md.\n"
)


def _start_code_sandbox(script_args, task):
    """For a code task: start the sandbox and run its start-up check now (SandboxError says why and what to do)."""
    from stabledrl_trl.tasks.code import configure_code_sandbox

    if not task.runs_code:
        return None
    box = configure_code_sandbox(script_args.sandbox_settings())
    print(f"code rewards: {box.description}", flush=True)
    if box.settings.backend == "unsafe_local":
        warnings.warn(
            "code_sandbox: unsafe_local runs the model's programs WITHOUT isolation; the model card will say so",
            UserWarning,
            stacklevel=2,
        )
    return box


def _warn_in_model_card(output_dir: str) -> None:
    path = os.path.join(output_dir, "README.md")
    if os.path.exists(path):
        with open(path, "a", encoding="utf-8") as f:
            f.write(UNSAFE_CARD_WARNING)


def eval_sampler_settings(args, script_args):
    """The held-out evaluation's sampler settings: the run's own rollout settings (approximate modes included),
    at eval_temperature when it is set (checked as training checks temperature)."""
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings

    if script_args.eval_temperature is None:
        return SamplerSettings.from_config(args)
    try:
        return SamplerSettings.from_config(args, temperature=script_args.eval_temperature)
    except ValueError as error:
        raise ValueError(f"eval_temperature={script_args.eval_temperature!r}: {error}") from None


def main_process_print(args, line: str) -> None:
    """Print `line` on the main process only: every process evaluates (the same numbers), one reports."""
    if args.process_index == 0:
        print(line, flush=True)


def _evaluate(model, tokenizer, dataset, task, args, script_args, label):
    """Held-out accuracy: one sampled evaluation, or (eval_draws > 1 / eval_greedy) the mean over eval_draws
    seeded draws with "std", "draws", "seeds" and "greedy" added."""
    from stabledrl_trl.evaluation import GRADING_RULES, evaluate_draws, evaluate_model

    sampler = eval_sampler_settings(args, script_args)
    temperature = sampler.temperature
    settings = dict(settings=sampler, batch_size=script_args.eval_batch_size, seed=args.seed,
                    grading=script_args.reward_style)  # fmt: skip
    if script_args.eval_draws == 1 and not script_args.eval_greedy:
        result = evaluate_model(model, tokenizer, dataset, task, desc=f"eval {label}", **settings)
        main_process_print(
            args,
            f"[{label}] held-out accuracy: {result['accuracy']:.4f} on {result['n']} prompts "
            f"({result['grading']} grading)",
        )
        return result
    draws = evaluate_draws(
        model, tokenizer, dataset, task, draws=script_args.eval_draws, greedy=script_args.eval_greedy,
        progress=False, **settings,
    )  # fmt: skip
    result = {
        "accuracy": draws["mean"],
        "grading_rule": GRADING_RULES[draws["grading"]],
        "full_score": None if draws["grading"] != "official" else task.official_full_score,
        **draws,
    }
    greedy = "" if draws["greedy"] is None else f", greedy {draws['greedy']:.4f}"
    main_process_print(
        args,
        f"[{label}] held-out accuracy: {draws['mean']:.4f} +- {draws['std']:.4f} (mean, std over "
        f"{len(draws['draws'])} draws at temperature {temperature}){greedy} on {draws['n']} prompts "
        f"({draws['grading']} grading)",
    )
    return result


def check_held_out_split(script_args, needs_test: bool) -> None:
    """One data file is one split: used for training it cannot also be the held-out set (the held-out accuracy
    would be measured on training rows). Require `test_data_files` then."""
    files = script_args.data_files
    single = (files is not None and not isinstance(files, dict)) or (
        files is None and script_args.dataset_path is not None and os.path.isfile(script_args.dataset_path)
    )
    if single and needs_test and script_args.test_data_files is None:
        given = f"data_files={files!r}" if files is not None else f"dataset_path={script_args.dataset_path!r}"
        raise ValueError(
            f"{given} is a single file, so it would be both the training and the held-out split (held-out accuracy "
            "on training rows). Give the held-out file with test_data_files, or turn off evaluate_before_after / "
            "eval_strategy."
        )


def load_datasets(script_args, seed: int, needs_test: bool):
    """(train, held-out or None) for the task, both posed in `prompt_style` (held-out: test_data_files if given)."""
    from stabledrl_trl.tasks import load_task_dataset

    def load(split, num, data_files=script_args.data_files, path=script_args.dataset_path, **options):
        return load_task_dataset(
            script_args.task,
            split,
            path=path,
            data_files=data_files,
            num_samples=num,
            system_prompt=script_args.system_prompt,
            seed=seed,
            prompt_style=script_args.prompt_style,
            **options,
        )

    check_held_out_split(script_args, needs_test)
    filters = {k: v for k, v in script_args.problem_filter().items() if v is not None}  # MATH only (checked above)
    train_dataset = load(script_args.dataset_train_split, script_args.num_train_samples, **filters)
    test_dataset = None
    if script_args.test_data_files is not None:
        test_dataset = load(
            script_args.dataset_test_split, script_args.num_eval_samples, data_files=script_args.test_data_files,
            path=None,
        )
    elif needs_test:
        test_dataset = load(script_args.dataset_test_split, script_args.num_eval_samples)
    return train_dataset, test_dataset


def _cli_help():
    """stabledrl_trl/cli_help.py, loaded by path: the help reads the fields from source, importing no torch."""
    import importlib.util

    name = "_stabledrl_cli_help"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "stabledrl_trl", "cli_help.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)  # its dataclass resolves through sys.modules
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def help_text(everything: bool = False) -> str:
    """`--help`: the description, the usage with `--config`, this script's fields, StableDRLConfig's own fields
    grouped by their section, and TRL's ModelConfig (model, dtype, LoRA); the fields StableDRLConfig inherits from
    TRL's GRPOConfig and transformers' TrainingArguments are named at the end, and listed in full by `--help-all`
    (`everything`). Read from the source files: nothing is imported."""
    cli = _cli_help()
    own = cli.source_fields(os.path.abspath(__file__), "TrainScriptArguments", "Task and data")
    config = cli.source_fields(os.path.join(ROOT, "stabledrl_trl", "stabledrl_config.py"), "StableDRLConfig")
    sections = cli.grouped(own, "scripts/train.py") + cli.grouped(config, "StableDRLConfig")
    inherited = []  # (title, fields), most derived first; a name is listed once, where it is last defined
    for package, relative, cls, title in (
        ("trl", "trainer/model_config.py", "ModelConfig", "TRL ModelConfig (model, dtype, LoRA)"),
        ("trl", "trainer/grpo_config.py", "GRPOConfig", "Inherited from TRL's GRPOConfig"),
        ("trl", "trainer/base_config.py", "_BaseConfig", "Inherited from TRL's base config"),
        ("transformers", "training_args.py", "TrainingArguments", "Inherited from transformers' TrainingArguments"),
    ):
        path = cli.installed_source(package, relative)
        if path is not None:
            inherited.append((title, cli.source_fields(path, cls)))
    seen = {f.name for _, fields in sections for f in fields}
    model_section, rest = inherited[:1], []
    for title, fields in inherited[1:]:
        fields = [f for f in fields if f.name not in seen]
        seen.update(f.name for f in fields)
        rest.append((title, fields))
    sections += [(t, f) for t, f in model_section if t.startswith("TRL ModelConfig")]
    names = [f.name for _, fields in rest for f in fields]
    if everything:
        sections += rest
        footer = ""
    else:
        common = [n for n in ("output_dir", "learning_rate", "per_device_train_batch_size", "num_generations",
                              "gradient_accumulation_steps", "max_steps", "num_train_epochs", "logging_steps",
                              "save_steps", "seed", "bf16", "gradient_checkpointing", "num_iterations", "beta",
                              "epsilon", "resume_from_checkpoint", "report_to") if n in names]  # fmt: skip
        footer = (
            f"Also accepted: the {len(names)} fields StableDRLConfig inherits from TRL's GRPOConfig and transformers' "
            f"TrainingArguments, with TRL's meaning, e.g. {', '.join('--' + n for n in common)}. "
            f"`python scripts/train.py {cli.HELP_ALL_FLAG}` lists them all."
        )
        footer = "\n".join(__import__("textwrap").wrap(footer, 100))
    return cli.help_page(__doc__, USAGE, sections, footer)


def main(script_args=None, training_args=None, model_args=None, argv=None):
    """Parse (unless given), train and evaluate; returns (trainer, results). With console 'short' the console shows
    one line per logged step and a final summary; the full record goes to log_file (output_dir/train.log).

    `--help` / `--help-all` print the help (`help_text`) and exit 0; no arguments at all print the usage and exit 2,
    before anything heavy is imported."""
    if script_args is None:
        given = sys.argv[1:] if argv is None else list(argv)
        request = _cli_help().help_request(given)
        if request is not None:
            print(help_text(everything=request == "all"), end="")
            raise SystemExit(0)
        if not given:
            sys.stderr.write(_cli_help().short_usage("scripts/train.py", USAGE))
            raise SystemExit(2)
    from stabledrl_trl.console import short_console

    caught = []
    if script_args is None:
        with warnings.catch_warnings(record=True) as caught:  # shown (or logged) once the console is set up
            warnings.simplefilter("default")
            script_args, training_args, model_args = make_parser().parse_args_and_config(argv)

    log_file = script_args.log_file or os.path.join(training_args.output_dir, "train.log")
    main_process = training_args.process_index == 0
    with short_console(log_file, short=script_args.console == "short", main_process=main_process):
        for w in caught:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        started = time.perf_counter()
        trainer, results = _run(script_args, training_args, model_args)
        if main_process:
            print(summary_lines(training_args, results, log_file, time.perf_counter() - started), flush=True)
    return trainer, results


def summary_lines(training_args, results: dict, log_file: str, seconds: float) -> str:
    """The final summary: where the model, the logs and the accuracy file are, and the before/after accuracy."""
    out = training_args.output_dir
    lines = [
        f"Done in {seconds:.0f} s." if seconds < 60 else f"Done in {seconds / 60:.1f} min.",
        f"  model:    {out}  (load it after `import stabledrl_trl`; the model card README.md there shows how)",
        f"  logs:     {log_file}  (everything, every logged metric)",
        f"            {os.path.join(out, 'trainer_state.json')}  (metrics per step; scripts/plot_training_curves.py draws them)",
    ]
    if "after" in results:
        lines.append(f"  accuracy: {os.path.join(out, 'accuracy_before_after.json')}")
        lines.append(
            f"  held-out accuracy ({results['after']['n']} prompts, {results['after']['grading']} grading): "
            f"before RL {results['before']['accuracy']:.4f} -> after RL {results['after']['accuracy']:.4f}"
        )
    return "\n".join(lines)


def _run(script_args, training_args, model_args):
    import torch
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from stabledrl_trl import StableDRLTrainer
    from stabledrl_trl.tasks import get_task

    check_script_args(script_args)  # before the SFT warm-up, not after it
    check_model_args(model_args)
    from stabledrl_trl.validation import check_seed

    check_seed(training_args.seed, "seed")  # seeds the warm-up, the data shuffle and transformers' set_seed
    if script_args.tiny_model and model_args.model_name_or_path is not None:
        raise ValueError(
            f"model_name_or_path={model_args.model_name_or_path!r} is set together with tiny_model: true, which "
            "builds its own tiny model and would ignore it. Set tiny_model: false to train that model, or remove "
            "model_name_or_path to train the embedded tiny model."
        )
    if script_args.evaluate_before_after:
        eval_sampler_settings(training_args, script_args)  # a bad eval_temperature: training's message, at once
    task = get_task(script_args.task)
    code_box = _start_code_sandbox(script_args, task)  # code tasks: the sandbox must start before any model loads
    if script_args.num_threads is not None:
        torch.set_num_threads(script_args.num_threads)

    model_path = model_args.model_name_or_path
    # Sets up torch.distributed when launched (accelerate / torchrun): the warm-up and the dataset caches below are
    # then shared between processes (README: Multi-node).
    _ = training_args.world_size
    if script_args.tiny_model:
        from stabledrl_trl.sft import prepare_sft_model

        model_path = prepare_sft_model(
            script_args.sft_cache_dir,
            task=script_args.task,
            seed=training_args.seed,
            max_steps=script_args.sft_max_steps,
            learning_rate=script_args.sft_learning_rate,
            num_samples=script_args.sft_num_samples,
            completion_length=training_args.max_completion_length,  # SFT canvas = RL generation length
            architecture=script_args.tiny_architecture,
        )
    if model_path is None:
        raise ValueError("model_name_or_path is not set: give a hub id or a local checkpoint (or tiny_model: true).")
    from stabledrl_trl.validation import check_model_source

    # before the tokenizer: a missing folder is not a hub "Repo id" error
    check_model_source(model_path, field="model_name_or_path", allow_pickle=training_args.allow_pickle_checkpoints)
    from stabledrl_trl.tokenizer_files import check_tokenizer_files

    check_tokenizer_files(model_path, field="model_name_or_path")  # not transformers' "missing sentencepiece"

    if model_args.use_peft and os.path.isdir(model_path):
        # the adapter records its base model (adapter_config.json): an absolute path loads from any working folder
        model_path = os.path.abspath(model_path)
    training_args.model_init_kwargs = build_model_init_kwargs(training_args, model_args)
    tokenizer = AutoTokenizer.from_pretrained(
        model_path, padding_side="left", trust_remote_code=training_args.trust_remote_code
    )

    needs_test = script_args.evaluate_before_after or training_args.eval_strategy != "no"
    # Global rank 0 downloads and caches the datasets first, then the others read them (a shared Hugging Face cache)
    # or fill their node's own (node-local caches).
    with training_args.main_process_first(local=False, desc="loading the datasets"):
        train_dataset, test_dataset = load_datasets(script_args, training_args.seed, needs_test)
    eval_dataset = test_dataset if training_args.eval_strategy != "no" else None

    trainer = StableDRLTrainer(
        model=model_path,
        reward_funcs=script_args.reward_funcs(),
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )

    results = {}
    if script_args.evaluate_before_after:
        results["before"] = _evaluate(
            trainer.model, tokenizer, test_dataset, task, training_args, script_args, "before RL"
        )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    # the model card (README.md: how to load and decode); TRL writes it with checkpoints only
    trainer.create_model_card(model_name=os.path.basename(os.path.normpath(training_args.output_dir)))
    if code_box is not None and code_box.settings.backend == "unsafe_local":
        _warn_in_model_card(training_args.output_dir)
    trainer.save_state()  # trainer_state.json with the log history, for scripts/plot_training_curves.py
    if script_args.evaluate_before_after:
        results["after"] = _evaluate(
            trainer.model, tokenizer, test_dataset, task, training_args, script_args, "after RL"
        )
        if trainer.accelerator.is_main_process:
            keys = ("accuracy", "n", "grading", "grading_rule", "std", "draws", "seeds", "temperature", "greedy")
            summary = {k: {key: v[key] for key in keys if key in v} for k, v in results.items()}
            with open(os.path.join(training_args.output_dir, "accuracy_before_after.json"), "w") as f:
                json.dump(summary, f, indent=2)
            from stabledrl_trl.protocol_card import write_heldout_cards

            write_heldout_cards(  # the same protocol cards as scripts/evaluate.py --protocol; the model card's results
                training_args.output_dir, results, task=task.name, seed=training_args.seed,
                settings=eval_sampler_settings(training_args, script_args),
                runtime={"dtype": str(trainer.model.dtype).replace("torch.", ""), "device": str(trainer.model.device),
                         "num_processes": trainer.accelerator.num_processes,
                         "batch_size": script_args.eval_batch_size},
                data={"path": script_args.test_data_files or script_args.dataset_path or task.name, "split": "test"},
            )  # fmt: skip
            print(
                f"held-out accuracy: before RL {results['before']['accuracy']:.4f} -> "
                f"after RL {results['after']['accuracy']:.4f}",
                flush=True,
            )
    return trainer, results


if __name__ == "__main__":
    main()
