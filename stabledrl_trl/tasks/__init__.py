"""Tasks: datasets with conversational prompts and TRL reward functions for GSM8K, MATH, Countdown and 4x4 Sudoku.

    from stabledrl_trl.tasks import get_task, load_task_dataset
    task = get_task("gsm8k")
    train = load_task_dataset("gsm8k", "train", num_samples=1000)   # columns: prompt, answer
    trainer = GRPOTrainer(..., train_dataset=train, reward_funcs=list(task.reward_funcs))

Every task asks for `<reasoning>...</reasoning><answer>...</answer>` (see `common`), has a correctness reward
(1.0 / 0.0) first in `reward_funcs` and a format reward (at most 0.5); Sudoku adds a partial-credit reward. Each
module's docstring states its exact grading rules.

Official style: GSM8K, MATH, Countdown and Sudoku can also be posed and graded as the official StableDRL code does:

    train = load_task_dataset("math", "train", prompt_style="official")     # official prompt wording
    reward_funcs = get_task("math").reward_funcs_for("official")            # [math_official_reward, anti_short_boxed_reward]

The official reward of a completion is the task's official score plus the anti-short-boxed term (0 / 1), which TRL
forms by summing the two reward functions (default weights 1).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from . import countdown, gsm8k, math, sudoku
from .common import (
    PROMPT_STYLES,
    anti_short_boxed_reward,
    completion_to_text,
    extract_final_answer,
    has_answer_format,
    last_boxed,
)

REWARD_STYLES = PROMPT_STYLES  # "tagged": the tasks' own rewards; "official": the official StableDRL grading


@dataclass(frozen=True)
class TaskSpec:
    """What a training or evaluation script needs to know about a task."""

    name: str
    # (split, *, path, data_files, num_samples, system_prompt, seed, prompt_style) -> datasets.Dataset
    loader: Callable[..., object]
    reward_funcs: tuple[Callable, ...]  # TRL reward functions; the correctness reward first
    system_prompt: str  # default instructions placed before the question in the user message
    extract_answer: Callable[[str], str | None]  # completion text -> the answer string the correctness reward grades
    format_example: Callable[..., dict]  # (row, system_prompt=...) -> formatted row
    description: str = ""
    official_reward: Callable | None = None  # the official StableDRL grading of the task (None: it has none)
    official_full_score: float = 1.0  # official score of a fully right completion (held-out accuracy counts these)
    styles: tuple[str, ...] | None = None  # the prompt styles it has when not the default rule (code: official only)
    official_anti_short_boxed: bool = True  # the official code adds the anti-short-boxed term (not to code rewards)
    runs_code: bool = False  # its rewards run model output as programs (the code sandbox starts before the model)

    @property
    def correctness_reward(self) -> Callable:
        return self.reward_funcs[0]

    @property
    def prompt_styles(self) -> tuple[str, ...]:
        """The prompt (and reward) styles this task has: ("tagged",) or ("tagged", "official")."""
        if self.styles is not None:
            return self.styles
        return PROMPT_STYLES if self.official_reward is not None else ("tagged",)

    def reward_funcs_for(self, style: str = "tagged", *, anti_short_boxed: bool | None = None) -> list[Callable]:
        """The reward functions of a reward style, for `GRPOTrainer(reward_funcs=...)`.

        "tagged": `reward_funcs`. "official": [`official_reward`]. `anti_short_boxed` appends
        `anti_short_boxed_reward` (None: on for "official", off for "tagged"), which TRL adds to the others.
        """
        if style not in PROMPT_STYLES:
            raise ValueError(f"reward_style: expected one of {', '.join(PROMPT_STYLES)}, got {style!r}")
        if style not in self.prompt_styles:
            raise ValueError(
                f"reward_style: task {self.name!r} has no official StableDRL grading; use reward_style 'tagged' "
                f"(official grading exists for {', '.join(n for n, t in TASKS.items() if t.official_reward)})"
            )
        funcs = list(self.reward_funcs) if style == "tagged" else [self.official_reward]
        if anti_short_boxed if anti_short_boxed is not None else style == "official" and self.official_anti_short_boxed:
            funcs.append(anti_short_boxed_reward)
        return funcs


TASKS: dict[str, TaskSpec] = {
    "gsm8k": TaskSpec(
        name="gsm8k",
        loader=gsm8k.load_gsm8k,
        reward_funcs=(gsm8k.gsm8k_correctness_reward, gsm8k.gsm8k_format_reward),
        system_prompt=gsm8k.SYSTEM_PROMPT,
        extract_answer=extract_final_answer,
        format_example=gsm8k.format_example,
        description="grade-school math word problems (openai/gsm8k), numeric answers",
        official_reward=gsm8k.gsm8k_official_reward,
    ),
    "math": TaskSpec(
        name="math",
        loader=math.load_math,
        reward_funcs=(math.math_correctness_reward, math.math_format_reward),
        system_prompt=math.SYSTEM_PROMPT,
        extract_answer=extract_final_answer,
        format_example=math.format_example,
        description="competition math (MATH-lighteval train, MATH-500 test), answers checked by math-verify",
        official_reward=math.math_official_reward,
    ),
    "countdown": TaskSpec(
        name="countdown",
        loader=countdown.load_countdown,
        reward_funcs=(countdown.countdown_correctness_reward, countdown.countdown_format_reward),
        system_prompt=countdown.SYSTEM_PROMPT,
        extract_answer=extract_final_answer,
        format_example=countdown.format_example,
        description="reach a target with + - * / using each given number exactly once",
        official_reward=countdown.countdown_official_reward,
    ),
    "sudoku": TaskSpec(
        name="sudoku",
        loader=sudoku.load_sudoku,
        reward_funcs=(
            sudoku.sudoku_correctness_reward,
            sudoku.sudoku_cell_accuracy_reward,
            sudoku.sudoku_format_reward,
        ),
        system_prompt=sudoku.SYSTEM_PROMPT,
        extract_answer=extract_final_answer,
        format_example=sudoku.format_example,
        description="4x4 Sudoku (local files or generated puzzles with unique solutions)",
        official_reward=sudoku.sudoku_official_reward,
    ),
}


def get_task(name: str) -> TaskSpec:
    """The registered task `name` (case-insensitive); a ValueError lists the known names otherwise."""
    key = str(name).strip().lower()
    if key not in TASKS:
        raise ValueError(f"task: unknown task {name!r}; known tasks are {', '.join(sorted(TASKS))}")
    return TASKS[key]


def code_task_names() -> tuple[str, ...]:
    """The registered tasks whose rewards run programs in the code sandbox (`TaskSpec.runs_code`), sorted."""
    return tuple(sorted(name for name, spec in TASKS.items() if spec.runs_code))


def register_task(spec: TaskSpec, *, replace: bool = False) -> TaskSpec:
    """Add `spec` to `TASKS` under its name, where `get_task` and the scripts find it; a task module calls this when
    imported. The name must be lower-case without surrounding spaces (how `get_task` looks names up); a taken name
    is refused unless `replace=True`. Returns `spec`."""
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"register_task needs a TaskSpec, got {type(spec).__name__}.")
    if not spec.name or spec.name != spec.name.strip().lower():
        raise ValueError(f"task name {spec.name!r}: use a non-empty lower-case name without surrounding spaces.")
    if spec.name in TASKS and not replace:
        raise ValueError(f"a task named {spec.name!r} is already registered; choose another name or pass replace=True.")
    TASKS[spec.name] = spec
    return spec


def load_task_dataset(
    task: str,
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    prompt_style: str = "tagged",
    **options,
):
    """A `datasets.Dataset` for `task` with a conversational "prompt" column and the columns its rewards need.

    path: hub id, local dataset folder or data file (default: the task's hub set; Sudoku: generated puzzles).
    data_files: local file(s) read with the builder of their extension (csv, json, jsonl, parquet).
    num_samples: keep this many rows after a shuffle seeded by `seed` (all rows when None).
    system_prompt: instructions placed before each question (None: the task's default; "" for none). Tagged only.
    prompt_style: "tagged" (the tasks' reasoning/answer format) or "official" (the official StableDRL wording; see
        each task module's docstring).
    options: the task loader's own options (MATH: max_level, max_problem_chars, max_problem_words).
    """
    spec = get_task(task)
    params = inspect.signature(spec.loader).parameters
    known = {"split", "path", "data_files", "num_samples", "system_prompt", "seed", "prompt_style"}
    own = sorted(name for name in params if name not in known)
    unknown = sorted(set(options) - set(own))
    if unknown:
        raise ValueError(
            f"load_task_dataset: task {spec.name!r} has no option {', '.join(unknown)}; its loader's own options are "
            f"{own or 'none'}"
        )
    return spec.loader(
        split,
        path=path,
        data_files=data_files,
        num_samples=num_samples,
        system_prompt=system_prompt,
        seed=seed,
        prompt_style=prompt_style,
        **options,
    )


__all__ = [
    "PROMPT_STYLES",
    "REWARD_STYLES",
    "TASKS",
    "TaskSpec",
    "anti_short_boxed_reward",
    "completion_to_text",
    "extract_final_answer",
    "get_task",
    "has_answer_format",
    "last_boxed",
    "load_task_dataset",
    "register_task",
]
# Each registers its tasks: "digit_sort" and "digit_sort_long" (generated; 32-64 scored tokens); "kodcode",
# "humaneval", "mbpp" and the generated "tiny_code" and "code_sort", graded in the code sandbox.
from . import code, code_sort, digit_sort, digit_sort_long, tiny_code  # noqa: E402, F401
