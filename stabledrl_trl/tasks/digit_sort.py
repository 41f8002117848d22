"""Digit sorting: a built-in, generated, verifiable task small enough for a tiny model trained on a CPU.

Problem: a string of `NUM_DIGITS` (4) decimal digits, repeats allowed, e.g. "4131"; the answer is the same digits
in ascending order, "1134". The user message is "sort 4131" (after the optional instructions); the completion is
the bare answer, a few characters, so a generation length of 8 suffices with the char-level tiny tokenizer.

Data: generated, no download. All 10**4 digit strings are grouped by their multiset of digits (715 groups: strings
that are permutations of each other share the answer); the groups are shuffled by `random.Random(SPLIT_SEED)` and
the first `TEST_GROUPS` (100) form the test split, the rest the train split. So the splits are disjoint, and more:
no test answer is ever seen in training, the model must actually sort. The split never depends on the `seed`
argument, which only picks `num_samples` rows (seeded shuffle). Split sizes: train 8,661 rows, test 1,339 rows.
With `path` / `data_files`, rows are read from local files with a `digits` column (string or integer; an integer
is left-padded with zeros to `NUM_DIGITS`).

Correctness reward (`digit_sort_correctness_reward`, 1.0 / 0.0): the completion text with all whitespace removed
equals the gold answer exactly ("1134" and " 1 1 3 4 " score 1.0; "1134." or "113" score 0.0).
Format reward (`digit_sort_format_reward`, 0.25 / 0.0): the completion (whitespace removed) is a permutation of the
given digits: the right digits in any order. It rewards a well-formed answer, not a correct one.
"""

from __future__ import annotations

import itertools
import random

from . import TaskSpec, register_task
from .common import (
    choose_format,
    completion_to_text,
    format_dataset,
    load_rows,
    reward_column,
    take_samples,
    user_prompt,
)

NUM_DIGITS = 4
SPLIT_SEED = 1234
TEST_GROUPS = 100
FORMAT_SCORE = 0.25
SYSTEM_PROMPT = ""  # the prompt is just "sort <digits>": short prompts keep the tiny CPU runs fast


def sort_digits(digits: str) -> str:
    """The gold answer: the digits in ascending order."""
    return "".join(sorted(digits))


def normalize_digits(value) -> str:
    """A digit string from a string ("0413") or an integer (413 -> "0413"); anything else raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"digits: expected a string of digits, got {value!r}")
    text = str(value).zfill(NUM_DIGITS) if isinstance(value, int) else str(value).strip()
    if not text or not text.isascii() or not text.isdigit():
        raise ValueError(f"digits: expected a string of decimal digits such as '4131', got {value!r}")
    return text


def extract_answer(text: str) -> str | None:
    """The graded answer: the completion with all whitespace removed (None when nothing is left)."""
    answer = "".join(text.split())
    return answer or None


def split_digit_strings(split: str, num_digits: int = NUM_DIGITS, split_seed: int = SPLIT_SEED) -> list[str]:
    """Every digit string of `split` ("train" or "test"), in lexicographic order (see the module docstring)."""
    if split not in ("train", "test"):
        raise ValueError(f"split: the built-in digit_sort task has 'train' and 'test', got {split!r}")
    groups = sorted({sort_digits("".join(p)) for p in itertools.product("0123456789", repeat=num_digits)})
    random.Random(split_seed).shuffle(groups)
    test_groups = set(groups[:TEST_GROUPS])
    strings = ("".join(p) for p in itertools.product("0123456789", repeat=num_digits))
    return [s for s in strings if (sort_digits(s) in test_groups) == (split == "test")]


def format_example(row: dict, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """{"digits": "4131"} -> {"prompt": [user message "sort 4131"], "digits": "4131", "answer": "1134"}."""
    digits = normalize_digits(row["digits"])
    return {"prompt": user_prompt(f"sort {digits}", system_prompt), "digits": digits, "answer": sort_digits(digits)}


def digit_sort_correctness_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when the completion (whitespace removed) is exactly the sorted digits, else 0.0."""
    answers = reward_column(kwargs, "answer", len(completions), "digit_sort_correctness_reward")
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answers):
        if gold is None:
            rewards.append(None)
            continue
        rewards.append(1.0 if extract_answer(completion_to_text(completion)) == str(gold) else 0.0)
    return rewards


def digit_sort_format_reward(prompts, completions, **kwargs) -> list[float | None]:
    """0.25 when the completion (whitespace removed) holds exactly the given digits, in any order."""
    all_digits = reward_column(kwargs, "digits", len(completions), "digit_sort_format_reward")
    rewards: list[float | None] = []
    for completion, digits in zip(completions, all_digits):
        if digits is None:
            rewards.append(None)
            continue
        answer = extract_answer(completion_to_text(completion))
        well_formed = answer is not None and sorted(answer) == sorted(normalize_digits(digits))
        rewards.append(FORMAT_SCORE if well_formed else 0.0)
    return rewards


def load_digit_sort(
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    prompt_style: str = "tagged",
):
    """Digit sorting as a conversational dataset with columns `prompt`, `digits` and `answer`.

    Without `path` / `data_files` the split is generated (see the module docstring); with them, `split` names the
    split of the local files to read (they need a `digits` column).
    """
    from datasets import Dataset

    formatter, instructions = choose_format(
        "digit_sort", prompt_style, system_prompt, format_example, None, SYSTEM_PROMPT
    )
    if path is None and data_files is None:
        rows = Dataset.from_dict({"digits": split_digit_strings(split)})
    else:
        rows = load_rows(split, path=path, config=None, data_files=data_files)
        if "digits" not in rows.column_names:
            raise ValueError(f"digit_sort: the data needs a 'digits' column, got columns {rows.column_names}")
    rows = take_samples(rows, num_samples, seed)
    return format_dataset(rows, formatter, instructions)


# The package defines TaskSpec and register_task before it imports this module.
register_task(
    TaskSpec(
        name="digit_sort",
        loader=load_digit_sort,
        reward_funcs=(digit_sort_correctness_reward, digit_sort_format_reward),
        system_prompt=SYSTEM_PROMPT,
        extract_answer=extract_answer,
        format_example=format_example,
        description="sort 4 digits ascending (generated, no download; the built-in task of the tiny CPU default)",
    )
)
