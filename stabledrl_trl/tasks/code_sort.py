"""code_sort: digit sorting answered as a Python expression and graded by an assert in the code sandbox.

Problem: the user message is `sort 4131` (the digit strings and splits of `digit_sort`: 4 digits, train 8,661 rows,
test 1,339, no test answer seen in training); the completion is a Python expression, e.g. `'1134'`. The program

    def sorted_digits(s):
        return <completion>

runs in the sandbox against `assert sorted_digits('4131') == '1134'`, so any expression of the right value passes
(`'11'+'34'`, `''.join(sorted(s))` when it fits the completion length); the completion is model output like any other
and gets no other treatment. A bare `1134` (an int) or `'1134` (unterminated) fails.

What it exercises: a code reward in a learning run on a CPU. The skill RL improves is `digit_sort`'s (ordering
digits), written as a string literal, so the tiny model learns it in minutes; `tiny_code` (compose string helpers
named in words into a program, tested on held-out pipelines) is the program-synthesis task (docs/code.md).

Columns: `prompt`, `digits` (the given digits), `answer` (the canonical completion `'1134'`, for the SFT warm-up).
Reward (`code_sort_reward`): 1.0 when the assert passes, else 0.0. Identical completions of the same digits in one
call are run once.
"""

from __future__ import annotations

from ..sandbox import CodeJob
from .common import (
    check_generated_task,
    completion_to_text,
    format_dataset,
    reward_column,
    take_samples,
    user_prompt,
)
from .digit_sort import normalize_digits, sort_digits, split_digit_strings

FUNCTION_NAME = "sorted_digits"


def canonical_answer(digits: str) -> str:
    """The SFT target: the sorted digits as a single-quoted string literal, e.g. "'1134'"."""
    return repr(sort_digits(digits))


def format_example(row: dict, system_prompt: str = "") -> dict:
    """{"digits": "4131"} -> {"prompt": [user message "sort 4131"], "digits": "4131", "answer": "'1134'"}."""
    digits = normalize_digits(row["digits"])
    return {"prompt": user_prompt(f"sort {digits}", system_prompt), "digits": digits,
            "answer": canonical_answer(digits)}  # fmt: skip


def code_sort_job(completion: str, digits: str) -> CodeJob:
    """The program `def sorted_digits(s): return <completion>` and its one assert."""
    program = f"def {FUNCTION_NAME}(s):\n    return " + completion.strip()
    return CodeJob(program=program, checks=(f"assert {FUNCTION_NAME}({digits!r}) == {sort_digits(digits)!r}",))


def code_sort_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when `def sorted_digits(s): return <completion>` returns the sorted digits in the sandbox, else 0.0."""
    from .code import grade_distinct

    given = reward_column(kwargs, "digits", len(completions), "code_sort_reward")
    keys = [
        None if d is None else (completion_to_text(c).strip(), normalize_digits(d)) for c, d in zip(completions, given)
    ]
    return [None if r is None else float(r.passed) for r in grade_distinct(keys, code_sort_job)]


def load_code_sort(split="train", *, path=None, data_files=None, num_samples=None, system_prompt=None, seed=0,
                   prompt_style="tagged"):  # fmt: skip
    """The generated split (digit_sort's digit strings); no local files (the task is defined by its generator)."""
    from datasets import Dataset

    check_generated_task("code_sort", path, data_files, prompt_style)
    rows = take_samples(Dataset.from_dict({"digits": split_digit_strings(split)}), num_samples, seed)
    return format_dataset(rows, format_example, system_prompt or "")


def _register() -> None:
    from . import TaskSpec, register_task

    register_task(
        TaskSpec(
            name="code_sort",
            loader=load_code_sort,
            reward_funcs=(code_sort_reward,),
            system_prompt="",
            extract_answer=lambda text: text.strip() or None,
            format_example=format_example,
            description="sort 4 digits, answered as a Python expression; graded by an assert in the code sandbox",
            runs_code=True,
        )
    )


_register()
