"""tiny_code: a built-in code task small enough for the tiny CPU model, graded by unit tests in the code sandbox.

Problem: write a string function as a pipeline of three helpers named in words. The user message names the steps
in order, e.g. "rev upp even" (reverse, then upper-case, then keep the even positions); the completion is a Python
expression in `s` calling the one-letter helpers, e.g. "e(u(r(s)))" (the innermost call runs first, so the order
of the words is reversed in the program). The program is the helpers' definitions (`HELPER_SOURCE`) followed by
`def f(s):\n    return <completion>`; it runs in the sandbox against seven asserts on fixed strings
(`TEST_INPUTS`), so any expression equal to the pipeline on those strings passes (`e(r(u(s)))`: upper-casing and
reversing commute); the completion is model output like any other and gets no other treatment.

Data: generated, no download. Twelve helpers (`HELPERS`), every pipeline of three (12^3 = 1,728). A pipeline (a, b,
c) of helper indices is in the test split when (a + 2b + 3c) % 5 == 0 (346 prompts), else in the train split
(1,382): the held-out pipelines are compositions never seen in training, so the model has to compose, not recall.
Columns: `prompt`, `answer` (the canonical program, for the SFT warm-up), `function` (the same canonical program,
which the reward's asserts are computed from).

Reward (`tiny_code_reward`): 1.0 when all seven asserts pass, else 0.0. Identical completions of the same function in
one call are run once (the verdict of a program on fixed tests does not depend on which row asked). The expected
values come from the helpers' Python twins in this module (`_TWINS`), never from evaluating a string.
"""

from __future__ import annotations

from ..sandbox import CodeJob
from .common import check_generated_task, completion_to_text, format_dataset, reward_column, take_samples

# (word in the prompt, one-letter name in the program, body). The bodies are the program's helper source.
HELPERS = (
    ("rev", "r", "s[::-1]"),
    ("upp", "u", "s.upper()"),
    ("low", "l", "s.lower()"),
    ("dup", "d", "s + s"),
    ("half", "h", "s[: len(s) // 2]"),
    ("tail", "t", "s[1:]"),
    ("even", "e", "s[::2]"),
    ("swap", "w", "s.swapcase()"),
    ("init", "i", "s[:-1]"),
    ("cap", "c", "s.capitalize()"),
    ("sort", "z", "''.join(sorted(s))"),
    ("odd", "o", "s[1::2]"),
)
# The same helpers as trusted Python functions: they compute the asserts' expected values.
_TWINS = {
    "r": lambda s: s[::-1], "u": str.upper, "l": str.lower, "d": lambda s: s + s, "h": lambda s: s[: len(s) // 2],
    "t": lambda s: s[1:], "e": lambda s: s[::2], "o": lambda s: s[1::2], "w": str.swapcase, "i": lambda s: s[:-1],
    "c": str.capitalize, "z": lambda s: "".join(sorted(s)),
}  # fmt: skip
HELPER_SOURCE = "".join(f"def {name}(s):\n    return {body}\n" for _, name, body in HELPERS)
TEST_INPUTS = ("aBcDe", "Hello", "xyZ12q", "", "a", "AbCdEfG", "zz Top")
STEPS = 3  # helpers per pipeline


def functions() -> list[str]:
    """Every pipeline as its canonical program: the steps (a, b, c) are "c(b(a(s)))"."""
    names = [name for _, name, _ in HELPERS]
    return [f"{c}({b}({a}(s)))" for a in names for b in names for c in names]


def steps(function: str) -> list[str]:
    """The helper names of a canonical program in the order they run: "e(u(r(s)))" -> ["r", "u", "e"]."""
    return [function[2 * i] for i in range(STEPS)][::-1]


def apply(function: str, s: str) -> str:
    """The value of a canonical program at `s`, from the helpers' Python twins (never evaluated as code)."""
    for name in steps(function):
        s = _TWINS[name](s)
    return s


def split_rows(split: str) -> list[dict]:
    if split not in ("train", "test"):
        raise ValueError(f"split: the built-in tiny_code task has 'train' and 'test', got {split!r}")
    index = {name: i for i, (_, name, _) in enumerate(HELPERS)}
    words = {name: word for word, name, _ in HELPERS}
    rows = []
    for function in functions():
        names = steps(function)
        a, b, c = (index[name] for name in names)
        if ((a + 2 * b + 3 * c) % 5 == 0) == (split == "test"):
            rows.append({"function": function, "words": " ".join(words[name] for name in names)})
    return rows


def format_example(row: dict, system_prompt: str = "") -> dict:
    content = f"{system_prompt}\n\n{row['words']}" if system_prompt else row["words"]
    return {"prompt": [{"role": "user", "content": content}], "answer": row["function"], "function": row["function"]}


def tiny_code_job(completion: str, function: str) -> CodeJob:
    program = HELPER_SOURCE + "def f(s):\n    return " + completion.strip()
    checks = tuple(f"assert f({x!r}) == {apply(function, x)!r}" for x in TEST_INPUTS)
    return CodeJob(program=program, checks=checks)


def tiny_code_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when the helpers + `def f(s): return <completion>` pass the seven asserts in the sandbox, else 0.0."""
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
            description="compose three string helpers named in words; graded by seven asserts in the code sandbox "
            "(generated)",
            runs_code=True,
        )
    )


_register()
