"""tiny_code: a built-in code task small enough for the tiny CPU model, graded by unit tests in the code sandbox.

Problem: a hidden function f(x) = x OP K (OP one of + - *, K in 1..9: 27 functions) shown by two examples, e.g.
the user message "f(2)=6 f(5)=9"; the completion is a Python expression in x, e.g. "x+4". The program
`def f(x):\\n    return <completion>` runs in the sandbox against ten asserts, f(0) ... f(9), so any expression
equal to the hidden function on 0..9 passes ("4+x", "x+2*2"); the completion is model output like any other and
gets no other treatment.

Data: generated, no download. Every function with every ordered pair of distinct example inputs from 0..9
(27 x 90 = 2,430 prompts); pairs whose inputs sum to a multiple of 5 form the test split (486 prompts), the rest
the train split (1,944): the functions are shared, the example pairs are not, so the model has to read the examples.
Columns: `prompt`, `answer` (the canonical expression, for the SFT warm-up), `function` (e.g. "x+4").

Reward (`tiny_code_reward`): 1.0 when all ten asserts pass, else 0.0. Identical completions of the same function in
one call are run once (the verdict of a program on fixed tests does not depend on which row asked).
"""

from __future__ import annotations

import itertools

from ..sandbox import CodeJob
from .common import check_generated_task, completion_to_text, format_dataset, reward_column, take_samples

OPS = ("+", "-", "*")
CONSTANTS = tuple(range(1, 10))
INPUTS = tuple(range(10))


def functions() -> list[str]:
    """The 27 hidden functions as expressions in x."""
    return [f"x{op}{k}" for op in OPS for k in CONSTANTS]


def apply(function: str, x: int) -> int:
    """The value of a hidden function (parsed from its own fixed form, never evaluated as code)."""
    op, k = function[1], int(function[2:])
    return x + k if op == "+" else x - k if op == "-" else x * k


def split_rows(split: str) -> list[dict]:
    if split not in ("train", "test"):
        raise ValueError(f"split: the built-in tiny_code task has 'train' and 'test', got {split!r}")
    rows = []
    for function in functions():
        for a, b in itertools.permutations(INPUTS, 2):
            if ((a + b) % 5 == 0) == (split == "test"):
                rows.append({"function": function, "x1": a, "x2": b})
    return rows


def format_example(row: dict, system_prompt: str = "") -> dict:
    function = row["function"]
    text = f"f({row['x1']})={apply(function, row['x1'])} f({row['x2']})={apply(function, row['x2'])}"
    content = f"{system_prompt}\n\n{text}" if system_prompt else text
    return {"prompt": [{"role": "user", "content": content}], "answer": function, "function": function}


def tiny_code_job(completion: str, function: str) -> CodeJob:
    program = "def f(x):\n    return " + completion.strip()
    checks = tuple(f"assert f({x}) == {apply(function, x)}" for x in INPUTS)
    return CodeJob(program=program, checks=checks)


def tiny_code_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when `def f(x): return <completion>` passes f(0) ... f(9) in the sandbox, else 0.0."""
    from .code import grade_distinct

    targets = reward_column(kwargs, "function", len(completions), "tiny_code_reward")
    keys = [None if t is None else (completion_to_text(c).strip(), t) for c, t in zip(completions, targets)]
    return [None if r is None else float(r.passed) for r in grade_distinct(keys, tiny_code_job)]


def load_tiny_code(split="train", *, path=None, data_files=None, num_samples=None, system_prompt=None, seed=0,
                   prompt_style="tagged"):  # fmt: skip
    """The generated split (see the module docstring); no local files (the task is defined by its generator)."""
    from datasets import Dataset

    check_generated_task("tiny_code", path, data_files, prompt_style)
    rows = take_samples(Dataset.from_list(split_rows(split)), num_samples, seed)
    return format_dataset(rows, format_example, system_prompt or "")


def _register() -> None:
    from . import TaskSpec, register_task

    register_task(
        TaskSpec(
            name="tiny_code",
            loader=load_tiny_code,
            reward_funcs=(tiny_code_reward,),
            system_prompt="",
            extract_answer=lambda text: text.strip() or None,
            format_example=format_example,
            description="write x OP K from two examples; graded by ten asserts in the code sandbox (generated)",
            runs_code=True,
        )
    )


_register()
