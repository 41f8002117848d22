"""digit_sort_long's partial-credit reward: values worked out by hand."""

import pytest

from stabledrl_trl.tasks import get_task
from stabledrl_trl.tasks.digit_sort_long import common_subsequence_length, digit_sort_long_partial_reward


@pytest.mark.parametrize(
    "a, b, expected",
    [("", "123", 0), ("123", "123", 3), ("132", "123", 2), ("0011", "0101", 3), ("999", "000", 0), ("abcde", "ace", 3)],
)
def test_common_subsequence_length_by_hand(a, b, expected):
    assert common_subsequence_length(a, b) == expected
    assert common_subsequence_length(b, a) == expected


def test_partial_reward_by_hand():
    gold = "0112345"  # 7 digits
    completions = [
        "0112345",  # exact: 1.0
        " 0 1 1 2 3 4 5 ",  # whitespace removed: exact
        "012345",  # one digit missing: LCS 6, longer length 7
        "01123455",  # one extra digit: LCS 7, longer length 8
        "5432110",  # reversed: LCS 2 ("11"), 2 / 7
        "",  # empty: 0.0
        [{"role": "assistant", "content": "0112354"}],  # conversational; last two swapped: LCS 6 / 7
    ]
    rewards = digit_sort_long_partial_reward([None] * len(completions), completions, answer=[gold] * len(completions))
    assert rewards == pytest.approx([1.0, 1.0, 6 / 7, 7 / 8, 2 / 7, 0.0, 6 / 7])
    assert digit_sort_long_partial_reward([None], ["01"], answer=[None]) == [None]


def test_the_task_adds_the_partial_reward_after_digit_sorts_rewards():
    long, short = get_task("digit_sort_long"), get_task("digit_sort")
    assert long.reward_funcs == (*short.reward_funcs, digit_sort_long_partial_reward)
    assert long.correctness_reward is short.correctness_reward  # held-out grading stays exact match
