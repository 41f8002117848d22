"""The built-in tiny_code task: generated splits, and its reward graded in the code sandbox."""

from __future__ import annotations

import os

import pytest

from stabledrl_trl.sandbox import SandboxSettings
from stabledrl_trl.tasks import code as code_tasks
from stabledrl_trl.tasks import get_task, load_task_dataset, tiny_code

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)


def test_splits_are_generated_disjoint_and_sized():
    train, test = tiny_code.split_rows("train"), tiny_code.split_rows("test")
    assert (len(train), len(test)) == (1944, 486) and len(tiny_code.functions()) == 27
    key = lambda r: (r["function"], r["x1"], r["x2"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert {r["function"] for r in test} == set(tiny_code.functions())
    row = load_task_dataset("tiny_code", "test", num_samples=1, seed=3)[0]
    f = row["function"]
    x1, x2 = (int(part.split(")")[0][2:]) for part in row["prompt"][0]["content"].split())
    assert row["prompt"][0]["content"] == f"f({x1})={tiny_code.apply(f, x1)} f({x2})={tiny_code.apply(f, x2)}"
    assert (x1 + x2) % 5 == 0 and row["answer"] == f
    assert tiny_code.apply("x-3", 1) == -2 and tiny_code.apply("x*4", 2) == 8 and tiny_code.apply("x+9", 0) == 9
    with pytest.raises(ValueError, match="only its own prompt"):
        load_task_dataset("tiny_code", prompt_style="official")


def test_reward_runs_the_expression_against_ten_asserts(sandbox_batches):
    code_tasks.configure_code_sandbox(SandboxSettings(timeout=1.0, num_workers=2))
    reward = get_task("tiny_code").correctness_reward
    completions = ["x+4", "4+x", "x+2*2", " x+4\n", "x+3", "x*4", "", "__import__('os')._exit(0)", "x+4 if x < 9 else 0"]
    expected = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # the last is wrong at x = 9 only
    assert reward(None, completions, function=["x+4"] * len(completions)) == expected
    assert reward(None, ["x+4"], function=[None]) == [None]
    # Identical completions of the same function are run once.
    calls = sandbox_batches()
    assert reward(None, ["x*2", "x*2", " x*2", "x+2"], function=["x*2", "x*2", "x*2", "x*2"]) == [1.0, 1.0, 1.0, 0.0]
    assert calls == [2]
