"""Tests for the task registry and `load_task_dataset` on local files (no hub access)."""

import csv
import json

import pytest

from stabledrl_trl.tasks import TASKS, TaskSpec, get_task, load_task_dataset
from stabledrl_trl.tasks.common import extract_final_answer


def test_registry_contents():
    assert {"gsm8k", "math", "countdown", "sudoku"} <= set(TASKS)
    for key, spec in TASKS.items():
        assert isinstance(spec, TaskSpec) and spec.name == key and spec.reward_funcs
    names = set()
    for key in ("gsm8k", "math", "countdown", "sudoku"):
        spec = TASKS[key]
        assert spec.system_prompt and "<answer>" in spec.system_prompt
        assert spec.correctness_reward is spec.reward_funcs[0]
        assert spec.extract_answer("<answer>7</answer>") == "7"
        for func in spec.reward_funcs:
            assert func.__name__.startswith(key) and func.__name__.endswith("_reward")
            names.add(func.__name__)
    # TRL logs each reward under its __name__: they must not collide.
    assert len(names) == sum(len(TASKS[key].reward_funcs) for key in ("gsm8k", "math", "countdown", "sudoku"))
    assert get_task(" GSM8K ") is TASKS["gsm8k"]
    assert TASKS["math"].extract_answer is extract_final_answer


def test_get_task_unknown_lists_known_names():
    with pytest.raises(ValueError, match="unknown task 'chess'") as info:
        get_task("chess")
    assert str(info.value).endswith("known tasks are " + ", ".join(sorted(TASKS)))
    assert all(name in str(info.value) for name in ("countdown", "gsm8k", "math", "sudoku"))


def _write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_load_gsm8k_from_csv(tmp_path):
    rows = [
        {"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i:,}"} for i in range(998, 1006)
    ]
    _write_csv(tmp_path / "gsm8k.csv", rows)
    ds = load_task_dataset("gsm8k", "train", data_files=str(tmp_path / "gsm8k.csv"))
    assert len(ds) == 8 and sorted(ds.column_names) == ["answer", "prompt"]
    assert ds["answer"][:3] == ["1,996", "1,998", "2,000"]
    assert ds[0]["prompt"] == [{"role": "user", "content": TASKS["gsm8k"].system_prompt + "\n\nWhat is 998 + 998?"}]
    # The rewards read the formatted columns directly, as TRL passes them.
    reward = get_task("gsm8k").correctness_reward
    assert reward(ds["prompt"][:2], ["<answer>1996</answer>", "<answer>1996</answer>"], answer=ds["answer"][:2]) == [
        1.0,
        0.0,
    ]
    # num_samples: seeded subset; system_prompt "" leaves the bare question.
    a = load_task_dataset("gsm8k", "train", data_files=str(tmp_path / "gsm8k.csv"), num_samples=3, seed=1)
    b = load_task_dataset("gsm8k", "train", data_files=str(tmp_path / "gsm8k.csv"), num_samples=3, seed=1)
    assert a["answer"] == b["answer"] and len(set(a["answer"])) == 3
    bare = load_task_dataset("gsm8k", "test", data_files=str(tmp_path / "gsm8k.csv"), system_prompt="")
    assert bare[0]["prompt"][0]["content"] == "What is 998 + 998?"
    with pytest.raises(ValueError, match="num_samples"):
        load_task_dataset("gsm8k", "train", data_files=str(tmp_path / "gsm8k.csv"), num_samples=9)


def test_load_math_from_jsonl_path(tmp_path):
    rows = [
        {"problem": "1+1?", "solution": r"$\boxed{2}$", "answer": "2"},
        {"problem": "Half?", "solution": r"It is $\boxed{\frac{1}{2}}$.", "answer": None},
    ]
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ds = load_task_dataset("math", "test", path=str(path), system_prompt="S")
    assert ds["answer"] == ["2", r"\frac{1}{2}"]
    assert ds[1]["prompt"] == [{"role": "user", "content": "S\n\nHalf?"}]


def test_load_countdown_from_json(tmp_path):
    rows = [{"target": 28, "nums": [44, 19, 35]}, {"target": 24, "nums": [5, 5, 1]}]
    path = tmp_path / "countdown.json"
    path.write_text(json.dumps(rows))
    ds = load_task_dataset("countdown", "train", data_files=[str(path)])
    assert ds["numbers"] == [[44, 19, 35], [5, 5, 1]] and ds["target"] == [28, 24]
    reward = get_task("countdown").correctness_reward
    assert reward(None, ["<answer>44+19-35</answer>", "<answer>5*5-1</answer>"], **ds.remove_columns("prompt")[:]) == [
        1.0,
        1.0,
    ]


def test_load_sudoku_generated_and_from_csv(tmp_path):
    ds = load_task_dataset("sudoku", "train", num_samples=6, seed=3)
    again = load_task_dataset("sudoku", "train", num_samples=6, seed=3)
    assert ds["puzzle"] == again["puzzle"] and len(set(ds["puzzle"])) == 6
    assert sorted(ds.column_names) == ["prompt", "puzzle", "solution"]
    test = load_task_dataset("sudoku", "test", num_samples=4, seed=3)
    assert not set(test["puzzle"]) & set(ds["puzzle"])
    reward = get_task("sudoku").correctness_reward
    solved = [f"<answer>{s}</answer>" for s in ds["solution"]]
    assert reward(None, solved, puzzle=ds["puzzle"]) == [1.0] * 6
    # A CSV whose puzzle column pandas reads as integers (leading zeros dropped) and one with "." blanks.
    csv_path = tmp_path / "sudoku.csv"
    csv_path.write_text("puzzle,solution\n0030001221004000,1234341221434321\n1.3...1221..4...,\n")
    local = load_task_dataset("sudoku", "train", data_files=str(csv_path))
    assert local["puzzle"] == ["0030001221004000", "1030001221004000"]
    assert local["solution"] == ["1234341221434321", "1234341221434321"]
    with pytest.raises(ValueError, match="split"):
        load_task_dataset("sudoku", "validation")


def test_register_task_adds_a_task_and_refuses_a_taken_or_ill_formed_name():
    from dataclasses import replace

    from stabledrl_trl.tasks import register_task

    base = TASKS["digit_sort"]
    toy = replace(base, name="toy_sort", description="a registered copy")
    try:
        assert register_task(toy) is toy and get_task("Toy_Sort") is toy and TASKS["toy_sort"] is toy
        with pytest.raises(ValueError, match="a task named 'toy_sort' is already registered"):
            register_task(replace(toy, description="another"))
        assert TASKS["toy_sort"] is toy  # the refused registration left the first one
        other = replace(toy, description="replaced")
        assert register_task(other, replace=True) is other and get_task("toy_sort") is other
    finally:
        TASKS.pop("toy_sort", None)
    for name in ("Toy", " toy", ""):
        with pytest.raises(ValueError, match="use a non-empty lower-case name"):
            register_task(replace(base, name=name))
        assert name not in TASKS
    with pytest.raises(TypeError, match="register_task needs a TaskSpec, got dict"):
        register_task({"name": "toy"})


def test_digit_sort_long_is_digit_sort_with_its_own_data():
    short, long = TASKS["digit_sort"], TASKS["digit_sort_long"]
    assert long.name == "digit_sort_long" and long.loader is not short.loader
    assert long.loader.__name__ == "load_digit_sort_long" and "31-63 digits" in long.description
    for field in ("system_prompt", "extract_answer", "format_example", "official_reward", "styles"):
        assert getattr(long, field) == getattr(short, field), field
    assert long.reward_funcs[:2] == short.reward_funcs  # plus the partial reward (tests/tasks/test_tasks_digit_sort_long.py)
