"""Tests for the Countdown expression parser, rewards and row formatting."""

from fractions import Fraction

import pytest

from stabledrl_trl.tasks.countdown import (
    MAX_EXPRESSION_CHARS,
    ExpressionError,
    countdown_correctness_reward,
    countdown_format_reward,
    evaluate_expression,
    format_example,
    is_countdown_solution,
    split_equation,
    tokenize,
)


@pytest.mark.parametrize(
    "expression, value, numbers",
    [
        ("1+2*3", Fraction(7), [1, 2, 3]),  # precedence
        ("(1+2)*3", Fraction(9), [1, 2, 3]),
        ("10-4-3", Fraction(3), [10, 4, 3]),  # left associative
        ("100/10/5", Fraction(2), [100, 10, 5]),
        ("8/3", Fraction(8, 3), [8, 3]),  # exact, no float rounding
        ("6 / (1 - 3/4)", Fraction(24), [6, 1, 3, 4]),
        ("2*(3+4)-5", Fraction(9), [2, 3, 4, 5]),
        ("((7))", Fraction(7), [7]),
        ("  44 + 19\n- 35 ", Fraction(28), [44, 19, 35]),
        ("3 \u00d7 4 \u2212 5 \u00f7 5", Fraction(11), [3, 4, 5, 5]),  # Unicode times/minus/division
        ("0", Fraction(0), [0]),
    ],
)
def test_evaluate_expression_hand_computed(expression, value, numbers):
    assert evaluate_expression(expression) == (value, numbers)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "2**99999",
        "2//3",
        "2^3",
        "1/0",
        "1/(2-2)",
        "(1+2",
        "1+2)",
        "-3+5",  # unary minus is not a Countdown operation
        "+3",
        "1.5+2",
        "1 2",
        "1+",
        "()",
        "",
        "   ",
        "abc",
        "2x3",
        "1e5",
        "\u0661+1",  # an Arabic-Indic digit is not an ASCII integer
        "9" * 13,  # over the digit cap
        "(" * 40 + "1" + ")" * 40,  # nested too deep
        "+".join(["1"] * 200),  # too long
    ],
)
def test_evaluate_expression_rejects(expression):
    with pytest.raises(ExpressionError):
        evaluate_expression(expression)


def test_tokenize_and_limits():
    assert tokenize("12*(3 - 4)") == ["12", "*", "(", "3", "-", "4", ")"]
    assert len("+".join(["1"] * 128)) <= MAX_EXPRESSION_CHARS  # 255 characters: accepted
    assert evaluate_expression("+".join(["1"] * 128))[0] == 128
    assert evaluate_expression("(" * 32 + "1" + ")" * 32)[0] == 1  # 32 levels: accepted


def test_split_equation():
    assert split_equation("1+2") == ("1+2", None)
    assert split_equation("1+2 = 3") == ("1+2 ", 3)
    for bad in ("1+2 = 3 = 3", "1+2 = x", "1+2 = -3", "1+2 ="):
        with pytest.raises(ExpressionError):
            split_equation(bad)


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("3*7+2", True),
        ("2 + 7*3", True),  # any order
        ("(3*7)+2 = 23", True),  # trailing "= target" allowed
        ("3*7+2 = 24", False),  # stated value is not the target
        ("3*7+2+2-2", False),  # a number reused
        ("3*7", False),  # a number unused
        ("3*7+2+0", False),  # an extra number
        ("3*(7+2)", False),  # wrong value (27)
        ("-2+3*7+4", False),
        (None, False),
    ],
)
def test_is_countdown_solution(answer, expected):
    assert is_countdown_solution(answer, [2, 3, 7], 23) is expected


def test_exactly_once_counts_duplicates():
    assert is_countdown_solution("5*5-1", [5, 5, 1], 24)
    assert not is_countdown_solution("5*5-1", [5, 1], 24)  # 5 given once, used twice
    assert not is_countdown_solution("5-1", [5, 5, 1], 4)


def test_correctness_reward_exact_values():
    completions = [
        "<reasoning>r</reasoning><answer>3*7+2</answer>",
        r"\boxed{2+3*7}",
        [{"role": "assistant", "content": "<answer>(7*3)+2</answer>"}],
        "<answer>__import__('os').system('ls')</answer>",
        "<answer>2**99999</answer>",
        "<answer>1/0</answer>",
        "<answer>3*7+2+2-2</answer>",
        "<answer>" + "1+" * 100_000 + "1</answer>",
        "3*7+2",  # no tag, no box
        "",
    ]
    n = len(completions)
    rewards = countdown_correctness_reward(None, completions, numbers=[[2, 3, 7]] * n, target=[23] * n)
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_correctness_reward_columns():
    # The raw hub column name `nums`, string-encoded numbers and a row without a target.
    rewards = countdown_correctness_reward(
        None, ["<answer>44+19-35</answer>"] * 3, nums=[[44, 19, 35], "[44, 19, 35]", [1]], target=[28, 28, None]
    )
    assert rewards == [1.0, 1.0, None]
    with pytest.raises(ValueError, match="'target'"):
        countdown_correctness_reward(None, ["x"], numbers=[[1]])


def test_format_reward_exact_values():
    completions = [
        "<reasoning>r</reasoning>\n<answer>1 + 2</answer>",
        "<reasoning>r</reasoning>\n<answer>1 + 2 = 3</answer>",
        "<reasoning>r</reasoning>\n<answer>one plus two</answer>",
        "<answer>(1+2)*99</answer>",  # parses; numbers and value are not checked here
        "<answer>1 +</answer>",
        "",
    ]
    assert countdown_format_reward(None, completions) == [0.5, 0.5, 0.25, 0.25, 0.0, 0.0]


def test_format_example_on_a_local_dataset():
    from datasets import Dataset

    rows = Dataset.from_list([{"target": 28, "nums": [44, 19, 35]}, {"target": 10, "nums": [2, 5, 1]}])
    out = rows.map(format_example, fn_kwargs={"system_prompt": ""}, remove_columns=rows.column_names)
    assert sorted(out.column_names) == ["numbers", "prompt", "target"]
    assert out["numbers"] == [[44, 19, 35], [2, 5, 1]]
    assert out["target"] == [28, 10]
    content = out[0]["prompt"][0]["content"]
    assert out[0]["prompt"][0]["role"] == "user"
    assert "[44, 19, 35]" in content and "28" in content and "exactly once" in content
    assert format_example({"target": "7", "nums": "3 4"})["numbers"] == [3, 4]
