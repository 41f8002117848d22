"""Long digit sorting: `digit_sort` with 31 to 63 digits, so an answer is 32 to 64 scored tokens (digits and EOS).

Problem: a random string of n decimal digits, n uniform in [`MIN_DIGITS`, `MAX_DIGITS`] (31-63); the answer is the
same digits in ascending order. The user message is "sort <digits>"; the completion is the bare answer, so with the
char-level tiny tokenizer it takes n + 1 scored tokens (the answer and the EOS): 32-64, within a 64-token canvas.
It exists to make the likelihood estimator's noise and the policy's drift act on answers of realistic length on a
CPU (`scripts/bench_length_noise.py`), where `digit_sort`'s answers are 5 tokens.

Data: generated, no download. Row i of a split is drawn by `random.Random(f"{SPLIT_SEED}-{i}")` (length, then
digits). A string belongs to the test split when the sorted string's CRC32 is divisible by `TEST_MODULUS` (10), so
no test answer (a multiset of digits) ever appears in training; the first `TRAIN_ROWS` (20,000) strings of the
stream that fall in the train split form it, the first `TEST_ROWS` (2,000) test strings the test split. The split
never depends on the `seed` argument, which only picks `num_samples` rows (seeded shuffle).

Rewards: `digit_sort`'s correctness (1.0 when the completion with whitespace removed equals the sorted digits
exactly, else 0.0) and format (0.25 when it is a permutation of the given digits), plus a partial-credit reward
(`digit_sort_long_partial_reward`): the length of the longest common subsequence of the completion (whitespace
removed) and the sorted digits, divided by the longer of the two. On 32-64-token answers an exact match is rare for
a small model, so with the first two alone most groups of completions earn equal rewards and give RL no signal; the
partial reward is graded like the official Sudoku reward (the share of the answer that is right). It is 1.0 exactly
when the answer is correct, (n - 1) / n for a sorted answer missing one of n digits or with one extra, and 0.0 for
an empty completion. Held-out grading (the correctness reward) stays exact match.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

from . import get_task, register_task
from .common import choose_format, completion_to_text, format_dataset, reward_column, take_samples
from .digit_sort import (
    SYSTEM_PROMPT,
    extract_answer,
    format_example,
    sort_digits,
)

MIN_DIGITS, MAX_DIGITS = 31, 63
SPLIT_SEED = 4321
TEST_MODULUS = 10
TRAIN_ROWS, TEST_ROWS = 20_000, 2_000


def is_test_answer(answer: str) -> bool:
    """Whether a sorted digit string belongs to the test split (CRC32 divisible by TEST_MODULUS)."""
    return zlib.crc32(answer.encode()) % TEST_MODULUS == 0


def split_digit_strings(split: str, rows: int | None = None) -> list[str]:
    """The digit strings of `split` ("train" or "test"), `rows` of them (default the split's size), in stream order."""
    if split not in ("train", "test"):
        raise ValueError(f"split: the built-in digit_sort_long task has 'train' and 'test', got {split!r}")
    want = rows if rows is not None else (TRAIN_ROWS if split == "train" else TEST_ROWS)
    out, i = [], 0
    while len(out) < want:
        rng = random.Random(f"{SPLIT_SEED}-{i}")
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(MIN_DIGITS, MAX_DIGITS)))
        if is_test_answer(sort_digits(digits)) == (split == "test"):
            out.append(digits)
        i += 1
    return out


def common_subsequence_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of two strings (dynamic programming, O(len(a) x len(b)))."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def digit_sort_long_partial_reward(prompts, completions, **kwargs) -> list[float | None]:
    """LCS(completion with whitespace removed, sorted digits) / the longer length: 1.0 only when exactly right."""
    answers = reward_column(kwargs, "answer", len(completions), "digit_sort_long_partial_reward")
    rewards: list[float | None] = []
    for completion, gold in zip(completions, answers):
        if gold is None:
            rewards.append(None)
            continue
        answer, gold = extract_answer(completion_to_text(completion)) or "", str(gold)
        rewards.append(common_subsequence_length(answer, gold) / max(len(answer), len(gold), 1))
    return rewards


def load_digit_sort_long(
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    prompt_style: str = "tagged",
):
    """Long digit sorting as a conversational dataset with columns `prompt`, `digits` and `answer` (generated; local
    files are refused: use `digit_sort` with `path` / `data_files` for your own digit strings)."""
    from datasets import Dataset

    if path is not None or data_files is not None:
        raise ValueError(
            "digit_sort_long is generated and reads no files; for your own digit strings use task 'digit_sort' "
            "with dataset_path / data_files (any length)."
        )
    formatter, instructions = choose_format(
        "digit_sort_long", prompt_style, system_prompt, format_example, None, SYSTEM_PROMPT
    )
    rows = Dataset.from_dict({"digits": split_digit_strings(split)})
    rows = take_samples(rows, num_samples, seed)
    return format_dataset(rows, formatter, instructions)


# digit_sort's rewards (plus the partial one), prompt and grading (registered when .digit_sort was imported above),
# with its own data.
register_task(
    dataclasses.replace(
        get_task("digit_sort"),
        name="digit_sort_long",
        loader=load_digit_sort_long,
        reward_funcs=(*get_task("digit_sort").reward_funcs, digit_sort_long_partial_reward),
        description="sort 31-63 digits ascending: 32-64 scored tokens per answer (generated, no download)",
    )
)
