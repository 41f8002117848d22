"""Tests for the MATH rewards: math-verify equivalence, safety guards and row formatting."""

import threading

import pytest

from stabledrl_trl.tasks import math as math_task
from stabledrl_trl.tasks.math import (
    answers_match,
    format_example,
    math_correctness_reward,
    math_format_reward,
    math_gold,
)


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("0.5", r"\frac{1}{2}", True),
        (r"\dfrac12", r"\frac{1}{2}", True),
        (r"$\frac{3}{4}$", r"\frac34", True),  # math delimiters are stripped
        ("x=5", "5", True),
        (r"\text{(C)}", "C", True),
        ("2, 3", "3,2", True),
        (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}", True),
        ("6", "5", False),
        ("(1,3)", "[1,3)", False),
        (r"\frac{{{", "5", False),  # LaTeX garbage
        ("}}}{{", "5", False),
        ("", "5", False),
        (None, "5", False),
        ("5", None, False),
    ],
)
def test_answers_match(prediction, gold, expected):
    assert answers_match(prediction, gold) is expected


def test_correctness_reward_exact_values():
    completions = [
        r"<reasoning>r</reasoning><answer>\boxed{\frac{1}{2}}</answer>",  # correct
        "<reasoning>r</reasoning><answer>0.5</answer>",  # correct, no box inside the tag
        r"so the answer is \boxed{\boxed{0.5}}",  # nested boxes
        r"<answer>\boxed{\frac{1}{3}}</answer>",  # wrong
        r"<answer>\boxed{\frac{1}{2}</answer>",  # unclosed box
        r"<answer>\frac{1{2}}}}</answer>",  # garbage
        "1/2",  # no tag, no box
        "",
    ]
    rewards = math_correctness_reward(None, completions, answer=[r"\frac12"] * len(completions))
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_correctness_reward_gold_from_solution_and_missing_gold():
    completions = [r"<answer>\boxed{\frac{3}{4}}</answer>", "<answer>0.75</answer>", "<answer>1</answer>"]
    solutions = [r"Thus $x = \boxed{\frac34}$.", r"We get \boxed{\dfrac{3}{4}}.", None]
    assert math_correctness_reward(None, completions, solution=solutions) == [1.0, 1.0, None]
    conversational = [[{"role": "assistant", "content": c}] for c in completions]
    assert math_correctness_reward(None, conversational, answer=["3/4", "0.7", None]) == [1.0, 0.0, None]
    with pytest.raises(ValueError, match="'answer' or 'solution'"):
        math_correctness_reward(None, completions, problem=["p"] * 3)


def test_model_output_is_never_evaluated_as_python(monkeypatch):
    import math_verify.parser

    calls = []
    monkeypatch.setattr(math_verify.parser, "parse_expr", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(math_verify.parser, "parse_expr_cached", lambda *a, **k: calls.append(a))
    completions = [
        "<answer>__import__('os').system('echo hacked')</answer>",
        r"<answer>\boxed{exec('1')}</answer>",
        "<answer>2*(3+4)</answer>",  # plain expression: math-verify's default config would hand it to parse_expr
        "<answer>5</answer>",
    ]
    assert math_correctness_reward(None, completions, answer=["5"] * 4) == [0.0, 0.0, 0.0, 1.0]
    assert calls == []
    # The hook is live: math-verify's default extraction does reach parse_expr for such text.
    math_verify.parser.parse("2*(3+4)")
    assert calls


def test_overlong_answers_score_zero_without_parsing(monkeypatch):
    import math_verify

    def fail(*args, **kwargs):
        raise AssertionError("must not be called")

    monkeypatch.setattr(math_verify, "verify", fail)
    long_answer = "+".join(["0"] * (math_task.MAX_ANSWER_CHARS // 2)) + "+5"
    assert len(long_answer) > math_task.MAX_ANSWER_CHARS
    assert math_correctness_reward(None, [f"<answer>{long_answer}</answer>"], answer=["5"]) == [0.0]


def test_verify_exceptions_score_zero(monkeypatch):
    import math_verify

    def boom(*args, **kwargs):
        raise RuntimeError("sympy exploded")

    monkeypatch.setattr(math_verify, "verify", boom)
    assert math_correctness_reward(None, ["<answer>5</answer>"], answer=["5"]) == [0.0]


def test_slow_comparisons_time_out_to_zero(monkeypatch):
    monkeypatch.setattr(math_task, "VERIFY_TIMEOUT_S", 1)
    monkeypatch.setattr(math_task, "PARSE_TIMEOUT_S", 1)
    # A tower of powers: sympy would run for a very long time comparing it with 5.
    assert math_correctness_reward(None, [r"<answer>\boxed{9^{9^{9^{9}}}}</answer>"], answer=["5"]) == [0.0]


def test_reward_works_outside_the_main_thread():
    result = {}

    def run():
        result["rewards"] = math_correctness_reward(
            None, ["<answer>0.5</answer>", "<answer>2</answer>"], answer=["1/2"] * 2
        )

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert result["rewards"] == [1.0, 0.0]


def test_format_reward_exact_values():
    completions = [
        r"<reasoning>r</reasoning><answer>\boxed{5}</answer>",
        "<reasoning>r</reasoning><answer>5</answer>",
        r"<answer>\boxed{5}</answer>",
        r"<reasoning>r</reasoning><answer>\boxed{}</answer>",  # empty box
        r"<reasoning>r</reasoning><answer>\boxed{5</answer>",  # unclosed box
        r"\boxed{5}",
        "",
    ]
    assert math_format_reward(None, completions) == [0.5, 0.25, 0.25, 0.25, 0.25, 0.0, 0.0]


def test_math_gold_and_format_example():
    from datasets import Dataset

    assert math_gold({"solution": r"So \boxed{\boxed{12}}.", "answer": None}) == "12"
    assert math_gold({"solution": r"\boxed{1} then \boxed{2}"}) == "2"
    assert math_gold({"solution": "no box"}) is None
    rows = Dataset.from_list(
        [
            {"problem": "What is 1+1?", "solution": r"It is $\boxed{2}$.", "answer": "2"},  # MATH-500 style
            {"problem": "Half of 1?", "solution": r"$\boxed{\frac{1}{2}}$", "answer": ""},  # no answer: from box
        ]
    )
    out = rows.map(format_example, fn_kwargs={"system_prompt": "S"}, remove_columns=rows.column_names)
    assert sorted(out.column_names) == ["answer", "prompt"]
    assert out["answer"] == ["2", r"\frac{1}{2}"]
    assert out[1]["prompt"] == [{"role": "user", "content": "S\n\nHalf of 1?"}]
