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


# ----------------------------------------------------------------------------------------------------------------
# the official runs' problem filter (qwedsacf/competition_math: level <= 4, under 1,500 characters, <= 300 words)

FILTER_ROWS = {  # problem name -> (level, problem text); the expected verdict under (4, 1500, 300) follows
    "level 1": ("Level 1", "What is $1+1$?"),
    "level 4": ("Level 4", "Solve $x^2=4$."),
    "level 5": ("Level 5", "Prove it."),
    "level ?": ("Level ?", "Unknown level."),
    "1499 chars": ("Level 3", "x" * 1499),
    "1500 chars": ("Level 3", "x" * 1500),
    "300 words": ("Level 2", " ".join(["w"] * 300)),
    "301 words": ("Level 2", " ".join(["w"] * 301)),
    "empty": ("Level 1", ""),
}
KEPT = {"level 1", "level 4", "1499 chars", "300 words"}


def _filter_file(tmp_path):
    import json

    path = tmp_path / "competition_math.jsonl"
    lines = [
        json.dumps({"problem": text, "level": level, "type": name, "solution": f"\\boxed{{{i}}}"})
        for i, (name, (level, text)) in enumerate(FILTER_ROWS.items())
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("prompt_style", ["official", "tagged"])
def test_official_problem_filter_on_a_local_dataset(tmp_path, prompt_style):
    from stabledrl_trl.tasks import load_task_dataset

    path = _filter_file(tmp_path)
    names = {text: name for name, (_, text) in FILTER_ROWS.items()}
    full = load_task_dataset("math", "train", data_files=path, prompt_style=prompt_style)
    assert len(full) == len(FILTER_ROWS)  # no filter unless asked
    kept = load_task_dataset(
        "math", "train", data_files=path, prompt_style=prompt_style, max_level=4, max_problem_chars=1500,
        max_problem_words=300,
    )  # fmt: skip
    request = math_task.OFFICIAL_BOXED_REQUEST if prompt_style == "official" else ""
    texts = [p[-1]["content"].removesuffix(request).split("\n\n")[-1] for p in kept["prompt"]]
    assert {names[t] for t in texts} == KEPT
    # each bound alone
    assert len(load_task_dataset("math", "train", data_files=path, max_level=4)) == 7  # drops levels 5 and ?
    assert len(load_task_dataset("math", "train", data_files=path, max_level=5)) == 9  # "Level ?" counts as 5
    assert len(load_task_dataset("math", "train", data_files=path, max_problem_chars=1500)) == 7  # 1500 chars, empty
    assert len(load_task_dataset("math", "train", data_files=path, max_problem_words=300)) == 8
    # the bounds apply before num_samples rows are drawn
    assert len(load_task_dataset("math", "train", data_files=path, max_level=1, num_samples=2)) == 2
    with pytest.raises(ValueError, match="num_samples: asked for 3 rows but the split has only 2"):
        load_task_dataset("math", "train", data_files=path, max_level=1, num_samples=3)


def test_problem_level_reads_the_last_word():
    assert [math_task.problem_level(v) for v in ("Level 3", "Level ?", "", None, "4", "Level 10")] == [
        3,
        5,
        5,
        5,
        4,
        10,
    ]


def test_problem_filter_errors_name_the_field(tmp_path):
    import json

    from stabledrl_trl.tasks import load_task_dataset

    path = _filter_file(tmp_path)
    for kwargs, match in (
        (dict(max_level=0), "max_level: expected an integer from 1 to 5 or None"),
        (dict(max_level=6), "max_level: expected an integer from 1 to 5 or None"),
        (dict(max_problem_chars=-1), "max_problem_chars: expected a positive integer or None"),
        (dict(max_problem_words=True), "max_problem_words: expected a positive integer or None"),
        (dict(max_problem_words=2.5), "max_problem_words: expected a positive integer or None"),
    ):
        with pytest.raises(ValueError, match=match):
            load_task_dataset("math", "train", data_files=path, **kwargs)
    with pytest.raises(ValueError, match="task 'gsm8k' has no option max_level; its loader's own options are none"):
        load_task_dataset("gsm8k", "train", data_files=path, max_level=4)
    no_level = tmp_path / "no_level.jsonl"
    no_level.write_text(json.dumps({"problem": "1+1?", "solution": "\\boxed{2}"}) + "\n")
    with pytest.raises(ValueError, match="max_level: the MATH data has no 'level' column"):
        load_task_dataset("math", "train", data_files=str(no_level), max_level=4)
    assert len(load_task_dataset("math", "train", data_files=str(no_level), max_problem_words=300)) == 1
