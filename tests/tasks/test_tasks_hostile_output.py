"""No reward function may raise on model output: every task's rewards (tagged and official, the anti-short-boxed term
included) score hostile completions with a finite number, in bounded time. A raising reward stops training, and the
official Countdown grader raises on a digit run over Python's 4,300-digit int-string limit."""

import math
import time

import pytest

from stabledrl_trl.tasks import TASKS, anti_short_boxed_reward
from stabledrl_trl.tasks.countdown import countdown_official_score, uses_available_numbers

HUGE = "9" * 5000  # beyond Python's int-string limit (4,300 digits)
HOSTILE = {
    "huge digit run": f"<answer>{HUGE}</answer> \\boxed{{{HUGE}}} {HUGE}",
    "huge digit run in an equation": f"<reasoning>x</reasoning><answer>1 + {HUGE} = {HUGE}</answer>",
    "huge decimal": f"<answer>0.{HUGE}</answer> \\boxed{{{HUGE}.{HUGE}}}",
    "deep nesting": "<answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>" + "\\boxed{" * 2000 + "1" + "}" * 2000,
    "NUL bytes": "\x00" * 1000 + "<answer>1\x00+\x002</answer>\x00\\boxed{\x00}",
    "huge exponents": "<answer>9**9**9**9</answer> \\boxed{10^{10^{10^{10}}}} $2^{99999999}$ 1e999999 "
    "<answer>95**36**32</answer>",
    "unbalanced braces and tags": "\\boxed{" * 3000 + "}" * 10 + "<answer>" * 3000 + "</answer>" * 2 + "<reasoning>",
    "closing tags only": "}" * 5000 + "</answer>" * 1000 + "</reasoning>",
    "1 MB of text": "a" * 1_000_000,
    "1 MB of arithmetic": "<answer>" + ("12+" * 340_000) + "1</answer>",
    "1 MB of boxes": "\\boxed{1}" * 110_000,
    "empty": "",
}
# The columns each task's rewards read, for one row.
COLUMNS = {
    "gsm8k": {"answer": "72"},
    "math": {"answer": "5", "solution": "So the answer is $\\boxed{5}$."},
    "countdown": {"numbers": [1, 2, 3], "target": 6},
    "sudoku": {"puzzle": "0234301221034320", "solution": "1234341221434321"},
    "digit_sort": {"answer": "1134", "digits": "4131"},
    "digit_sort_long": {"answer": "0" * 15 + "1" * 16, "digits": "01" * 15 + "1"},
    # code tasks: the completions run in the code sandbox (stabledrl_trl/sandbox.py)
    "kodcode": {"tests": "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n"},
    "humaneval": {"problem_prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(1, 2) == 3\n",
                  "entry_point": "add"},  # fmt: skip
    "mbpp": {"test_list": ["assert add(1, 2) == 3"]},
    "tiny_code": {"function": "e(u(r(s)))"},
    "code_sort": {"digits": "4131"},
}
REWARDS = [
    (name, func)
    for name, spec in TASKS.items()
    for func in (
        *spec.reward_funcs,
        *([spec.official_reward] if spec.official_reward else []),
        anti_short_boxed_reward,
    )
]
TIME_LIMIT_S = 120  # for all the hostile completions together: catches hangs (eval of 95**36**32 never returns)


def test_every_task_and_reward_is_covered():
    assert set(COLUMNS) == set(TASKS)
    assert len(REWARDS) == sum(len(s.reward_funcs) + (s.official_reward is not None) + 1 for s in TASKS.values())


@pytest.mark.parametrize("task, reward", REWARDS, ids=[f"{t}-{f.__name__}" for t, f in REWARDS])
def test_reward_scores_hostile_completions_with_a_number(task, reward):
    completions = list(HOSTILE.values())
    n = len(completions)
    kwargs = {column: [value] * n for column, value in COLUMNS[task].items()}
    started = time.perf_counter()
    scores = reward(["prompt"] * n, completions, **kwargs)
    elapsed = time.perf_counter() - started
    assert len(scores) == n
    for name, score in zip(HOSTILE, scores):
        assert isinstance(score, float) and math.isfinite(score), (name, score)
    assert elapsed < TIME_LIMIT_S, elapsed


def test_official_countdown_digit_runs_beyond_the_int_limit():
    # Python refuses int() of such a run; the answer is simply not made of the given numbers (a tagged miss, 0.1).
    assert not uses_available_numbers(HUGE, [9, 99])
    assert countdown_official_score(f"<answer>{HUGE} - {HUGE}</answer>", [1, 2], 0) == 0.1
    assert uses_available_numbers("007 + 3", [7, 3]) and not uses_available_numbers("7 + 07", [7, 3])
    assert (
        countdown_official_score("<answer>00044 + 19 + 35</answer>", [44, 19, 35], 98) == 0.1
    )  # 00044: a syntax error
    assert countdown_official_score("<answer>44 + 19 + 35</answer>", [44, 19, 35], 98) == 1.0
