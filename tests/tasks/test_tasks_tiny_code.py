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
    assert (len(train), len(test)) == (1382, 346) and len(tiny_code.functions()) == 12**3
    # held-out pipelines: no test program appears in training
    assert not {r["function"] for r in train} & {r["function"] for r in test}
    row = load_task_dataset("tiny_code", "test", num_samples=1, seed=3)[0]
    words = row["prompt"][0]["content"].split()
    names = {word: name for word, name, _ in tiny_code.HELPERS}
    a, b, c = (names[w] for w in words)
    assert row["answer"] == row["function"] == f"{c}({b}({a}(s)))"
    index = {name: i for i, (_, name, _) in enumerate(tiny_code.HELPERS)}
    assert (index[a] + 2 * index[b] + 3 * index[c]) % 5 == 0
    with pytest.raises(ValueError, match="only its own prompt"):
        load_task_dataset("tiny_code", prompt_style="official")


def test_expected_values_by_hand():
    # rev, then upp, then even: "aBcDe" -> "eDcBa" -> "EDCBA" -> "ECA"
    assert tiny_code.steps("e(u(r(s)))") == ["r", "u", "e"]
    assert tiny_code.apply("e(u(r(s)))", "aBcDe") == "ECA"
    assert tiny_code.apply("z(d(h(s)))", "Hello") == "HHee"  # "He" -> "HeHe" -> sorted
    assert tiny_code.apply("c(w(t(s)))", "zz Top") == "Z top"  # "z Top" -> "Z tOP" -> "Z top"
    assert tiny_code.apply("o(i(l(s)))", "") == ""


def test_reward_runs_the_program_against_seven_asserts(sandbox_batches):
    code_tasks.configure_code_sandbox(SandboxSettings(timeout=1.0, num_workers=2))
    reward = get_task("tiny_code").correctness_reward
    target = "e(u(r(s)))"
    completions = [
        "e(u(r(s)))",
        "e(r(u(s)))",  # upper-casing and reversing commute: equal on every input
        " e(u(r(s)))\n",
        "s[::-1].upper()[::2]",  # the same function without the helpers
        "u(r(e(s)))",  # even positions before reversing: "2ZX", not "Q1Y", for "xyZ12q"
        "e(l(r(s)))",
        "",
        "__import__('os')._exit(0)",
        "e(u(r(s))) if s != 'zz Top' else ''",  # wrong on one assert only
    ]
    expected = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert reward(None, completions, function=[target] * len(completions)) == expected
    assert reward(None, [target], function=[None]) == [None]
    # Identical completions of the same function are run once.
    calls = sandbox_batches()
    assert reward(None, ["d(d(d(s)))", "d(d(d(s)))", " d(d(d(s)))", "d(d(s))"], function=["d(d(d(s)))"] * 4) == [
        1.0,
        1.0,
        1.0,
        0.0,
    ]
    assert calls == [2]


def test_every_canonical_program_passes_its_own_asserts():
    """The helpers' source in the program and their Python twins agree: each test row's answer earns 1.0."""
    code_tasks.configure_code_sandbox(SandboxSettings(timeout=1.0, num_workers=2))
    rows = tiny_code.split_rows("test")
    reward = get_task("tiny_code").correctness_reward
    functions = [r["function"] for r in rows]
    assert reward(None, functions, function=functions) == [1.0] * len(rows)
    # and a program of other helpers fails: the asserts tell the pipelines apart
    shifted = functions[1:] + functions[:1]
    different = [
        (s, f)
        for s, f in zip(shifted, functions)
        if any(tiny_code.apply(s, x) != tiny_code.apply(f, x) for x in tiny_code.TEST_INPUTS)
    ]
    assert len(different) > 300
    assert reward(None, [s for s, _ in different], function=[f for _, f in different]) == [0.0] * len(different)
