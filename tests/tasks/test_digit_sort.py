"""The built-in digit_sort task: generated splits, prompts, rewards and its registry entry."""

from __future__ import annotations

import itertools

import pytest

from stabledrl_trl.tasks import TASKS, get_task, load_task_dataset
from stabledrl_trl.tasks.digit_sort import (
    FORMAT_SCORE,
    digit_sort_correctness_reward,
    digit_sort_format_reward,
    extract_answer,
    format_example,
    load_digit_sort,
    normalize_digits,
    split_digit_strings,
)


def test_splits_partition_all_strings_and_hold_out_whole_answers():
    train, test = split_digit_strings("train"), split_digit_strings("test")
    every = ["".join(p) for p in itertools.product("0123456789", repeat=4)]
    assert sorted(train + test) == every  # disjoint and complete
    assert (len(train), len(test)) == (8661, 1339)
    # no test answer (multiset of digits) ever appears in training
    assert not {"".join(sorted(s)) for s in train} & {"".join(sorted(s)) for s in test}
    assert len({"".join(sorted(s)) for s in test}) == 100
    assert split_digit_strings("test") == test  # deterministic
    with pytest.raises(ValueError, match="split"):
        split_digit_strings("validation")


def test_loader_rows_and_seeded_selection():
    rows = load_digit_sort("test", num_samples=20, seed=1)
    assert len(rows) == 20 and set(rows.column_names) == {"prompt", "digits", "answer"}
    test = set(split_digit_strings("test"))
    for row in rows:
        assert row["digits"] in test
        assert row["prompt"] == [{"role": "user", "content": f"sort {row['digits']}"}]
        assert row["answer"] == "".join(sorted(row["digits"]))
    assert load_digit_sort("test", num_samples=20, seed=1)["digits"] == rows["digits"]
    assert load_digit_sort("test", num_samples=20, seed=2)["digits"] != rows["digits"]
    assert len(load_digit_sort("train")) == 8661
    prompt = load_digit_sort("test", num_samples=1, system_prompt="Sort.")[0]["prompt"][0]["content"]
    assert prompt.startswith("Sort.\n\nsort ")


def test_registry_entry():
    task = get_task("digit_sort")
    assert TASKS["digit_sort"] is task
    assert task.correctness_reward is digit_sort_correctness_reward
    assert task.reward_funcs == (digit_sort_correctness_reward, digit_sort_format_reward)
    rows = load_task_dataset("digit_sort", "train", num_samples=3, seed=0)
    assert len(rows) == 3


def test_format_example_and_normalize():
    assert format_example({"digits": "4131"}) == {
        "prompt": [{"role": "user", "content": "sort 4131"}],
        "digits": "4131",
        "answer": "1134",
    }
    assert normalize_digits(413) == "0413"
    for bad in ("41a1", "", "４１３１", True, "-413"):
        with pytest.raises(ValueError, match="digits"):
            normalize_digits(bad)


def test_rewards():
    completions = [
        "1134",
        " 1 1 3 4\n",
        "1134.",
        "113",
        "4311",
        "",
        [{"role": "assistant", "content": "1134"}],
    ]
    n = len(completions)
    kwargs = {"answer": ["1134"] * n, "digits": ["4131"] * n}
    assert digit_sort_correctness_reward([None] * n, completions, **kwargs) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert digit_sort_format_reward([None] * n, completions, **kwargs) == [
        FORMAT_SCORE, FORMAT_SCORE, 0.0, 0.0, FORMAT_SCORE, 0.0, FORMAT_SCORE,
    ]  # fmt: skip
    # a row of another task (gold None) is not scored
    assert digit_sort_correctness_reward([None], ["1"], answer=[None]) == [None]
    with pytest.raises(ValueError, match="answer"):
        digit_sort_correctness_reward([None], ["1"], digits=["1"])
    assert extract_answer(" 1 2 ") == "12" and extract_answer("  ") is None


def test_local_files(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("digits\n4131\n0099\n")
    rows = load_digit_sort("train", data_files=str(path))
    assert rows["answer"] == ["1134", "0099"]
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n1\n")
    with pytest.raises(ValueError, match="digits"):
        load_digit_sort("train", data_files=str(bad))
