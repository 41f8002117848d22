"""The built-in code_sort task: digit_sort's splits, and its reward graded by an assert in the code sandbox."""

from __future__ import annotations

import os

import pytest

from stabledrl_trl.sandbox import SandboxSettings
from stabledrl_trl.tasks import code as code_tasks
from stabledrl_trl.tasks import code_sort, code_task_names, digit_sort, get_task, load_task_dataset

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)


def test_splits_and_rows_are_digit_sorts_with_a_string_literal_answer():
    for split, size in (("train", 8661), ("test", 1339)):
        rows = load_task_dataset("code_sort", split)
        assert len(rows) == size
        assert sorted(rows["digits"]) == sorted(digit_sort.split_digit_strings(split))
    row = load_task_dataset("code_sort", "test", num_samples=1, seed=4)[0]
    assert row["prompt"] == [{"role": "user", "content": f"sort {row['digits']}"}]
    assert row["answer"] == "'" + "".join(sorted(row["digits"])) + "'"
    assert code_sort.canonical_answer("4131") == "'1134'" and code_sort.canonical_answer("0090") == "'0009'"
    with pytest.raises(ValueError, match="code_sort is generated"):
        load_task_dataset("code_sort", data_files="rows.jsonl")
    with pytest.raises(ValueError, match="only its own prompt"):
        load_task_dataset("code_sort", prompt_style="official")


def test_the_program_and_its_assert():
    job = code_sort.code_sort_job(" '1134'\n", "4131")
    assert job.program == "def sorted_digits(s):\n    return '1134'"
    assert job.checks == ("assert sorted_digits('4131') == '1134'",)


def test_reward_runs_the_expression_against_the_assert(sandbox_batches):
    code_tasks.configure_code_sandbox(SandboxSettings(timeout=1.0, num_workers=2))
    reward = get_task("code_sort").correctness_reward
    completions = ["'1134'", " '1134' \n", "'11'+'34'", "''.join(sorted(s))", "1134", "'1134", "'4131'", "'1143'",
                   "", "__import__('os')._exit(0)", "print('1134')"]  # fmt: skip
    expected = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert reward(None, completions, digits=["4131"] * len(completions)) == expected
    assert reward(None, ["'1134'"], digits=[None]) == [None]
    assert reward(None, ["'0009'", "'0009'"], digits=["0900", 900]) == [1.0, 1.0]  # an int is zero-padded
    # Identical completions of the same digits are run once.
    calls = sandbox_batches()
    assert reward(None, ["'12'", "'12'", " '12'", "'21'"], digits=["21", "21", "21", "21"]) == [1.0, 1.0, 1.0, 0.0]
    assert calls == [2]


def test_the_code_tasks_are_read_from_the_registry():
    assert code_task_names() == ("code_sort", "humaneval", "kodcode", "mbpp", "tiny_code")
    assert not get_task("digit_sort").runs_code and get_task("code_sort").runs_code
