"""Tests for the GSM8K answer parsing, rewards and row formatting."""

from fractions import Fraction

import pytest

from stabledrl_trl.tasks.gsm8k import (
    SYSTEM_PROMPT,
    format_example,
    gsm8k_correctness_reward,
    gsm8k_format_reward,
    gsm8k_gold,
    parse_number,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("72", Fraction(72)),
        ("1,234", Fraction(1234)),
        ("1,234,567", Fraction(1234567)),
        ("$1,234.00", Fraction(1234)),
        (r"\$18", Fraction(18)),
        ("72.0", Fraction(72)),
        ("72.", Fraction(72)),
        ("18.50", Fraction(37, 2)),
        (".5", Fraction(1, 2)),
        ("-5", Fraction(-5)),
        ("\u22125", Fraction(-5)),
        ("25%", Fraction(25)),
        ("x = 42 apples", Fraction(42)),
        ("1{,}000", Fraction(1000)),
        (r"1\,000", Fraction(1000)),
        ("12 or 14", None),  # two answers
        ("12,14", None),  # not a thousands grouping: two numbers
        ("3/4", None),
        ("5 + 3 = 8", None),
        ("", None),
        ("twelve", None),
        ("9" * 100_000, None),  # over the length cap (and over Python's int-from-string limit)
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_gsm8k_gold():
    assert gsm8k_gold("She has 3 + 4 = 7 apples.\n#### 7") == "7"
    assert gsm8k_gold("#### 1,200") == "1,200"
    assert gsm8k_gold("42") == "42"


def test_correctness_reward_exact_values():
    completions = [
        "<reasoning>3*24=72</reasoning><answer>72</answer>",  # correct
        "<reasoning>r</reasoning><answer>$72.00</answer>",  # correct, decorated
        r"work \boxed{72}",  # correct, box without tags
        "<answer>71</answer>",  # wrong
        "<answer>72 or 73</answer>",  # multiple answers
        "<answer>73</answer> then <answer>72</answer>",  # the last tag is graded
        "the answer is 72",  # no tag, no box
        "",  # empty
        "<answer></answer>",  # empty answer
        "<answer>" + "7" * 5000 + "</answer>",  # adversarially long
    ]
    golds = ["Natalia sold 48 + 24 = 72 clips.\n#### 72"] * len(completions)
    rewards = gsm8k_correctness_reward(["p"] * len(completions), completions, answer=golds)
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_correctness_reward_commas_conversational_and_missing_gold():
    completions = [
        [{"role": "assistant", "content": "<answer>1,200</answer>"}],
        [{"role": "assistant", "content": "<answer>1200</answer>"}],
        [{"role": "assistant", "content": "<answer>120</answer>"}],
        [{"role": "assistant", "content": "<answer>5</answer>"}],
    ]
    rewards = gsm8k_correctness_reward(None, completions, answer=["1200", "#### 1,200", "1,200", None])
    assert rewards == [1.0, 1.0, 0.0, None]


def test_correctness_reward_needs_the_answer_column():
    with pytest.raises(ValueError, match="'answer'"):
        gsm8k_correctness_reward(["p"], ["<answer>1</answer>"], question=["q"])


def test_format_reward_exact_values():
    completions = [
        "<reasoning>r</reasoning>\n<answer>42</answer>",
        "<reasoning>r</reasoning>\n<answer>forty-two</answer>",
        "<answer>42</answer>",
        "<reasoning>r</reasoning>\n<answer>4 or 2</answer>",
        "42",
        "",
    ]
    assert gsm8k_format_reward(None, completions) == [0.5, 0.25, 0.25, 0.25, 0.0, 0.0]
    assert gsm8k_format_reward.__name__ == "gsm8k_format_reward"
    assert gsm8k_correctness_reward.__name__ == "gsm8k_correctness_reward"


def test_format_example_on_a_local_dataset():
    from datasets import Dataset

    rows = Dataset.from_list(
        [
            {"question": " How many? ", "answer": "2 + 2 = 4\n#### 4"},
            {"question": "Cost?", "answer": "It costs 1,000.\n#### 1,000"},
        ]
    )
    out = rows.map(format_example, remove_columns=rows.column_names)
    assert sorted(out.column_names) == ["answer", "prompt"]
    assert out[0]["prompt"] == [{"role": "user", "content": SYSTEM_PROMPT + "\n\nHow many?"}]
    assert out["answer"] == ["4", "1,000"]
    assert format_example(rows[0], system_prompt="")["prompt"] == [{"role": "user", "content": "How many?"}]
