"""Tests for the shared answer extraction and format rules of the tasks."""

import pytest

from stabledrl_trl.tasks.common import (
    boxed_contents,
    completion_to_text,
    extract_final_answer,
    extract_tag,
    format_score,
    has_answer_format,
    last_boxed,
    reward_column,
    take_samples,
    user_prompt,
)


def test_completion_to_text_accepts_strings_and_messages():
    assert completion_to_text("abc") == "abc"
    assert completion_to_text([{"role": "assistant", "content": "abc"}]) == "abc"
    assert (
        completion_to_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]) == "ab"
    )
    assert completion_to_text([{"role": "assistant", "content": None}]) == ""
    # Only assistant turns are graded.
    assert completion_to_text([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]) == "y"
    with pytest.raises(ValueError, match="completions"):
        completion_to_text(42)
    with pytest.raises(ValueError, match="completions"):
        completion_to_text(["not a message"])


def test_extract_tag_takes_last_complete_pair():
    assert extract_tag("<answer> 5 </answer>") == "5"
    assert extract_tag("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_tag("<answer>1</answer> <answer>2") == "1"  # the unclosed last tag is ignored
    assert extract_tag("<answer>5") is None
    assert extract_tag("5</answer>") is None
    assert extract_tag("") is None


def test_boxed_contents_and_last_boxed():
    assert boxed_contents(r"a \boxed{1} b \boxed{\frac{1}{2}}") == ["1", r"\frac{1}{2}"]
    assert last_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{\boxed{5}}") == "5"  # nested box that fills the content is unwrapped
    assert last_boxed(r"\boxed{\boxed{\boxed{7}}}") == "7"
    assert last_boxed(r"\boxed{\boxed{5} + 1}") == r"\boxed{5} + 1"  # not the whole content: kept
    assert last_boxed(r"\boxed{3} and \boxed{4") is None  # truncated last box
    assert last_boxed(r"\boxed{a \{ b}") == r"a \{ b"  # escaped brace not counted
    assert last_boxed(r"\boxed {9}") == "9"
    assert last_boxed(r"\boxed{}") == ""
    assert last_boxed(r"\boxed 5") is None
    assert last_boxed("no box") is None


def test_extract_final_answer_precedence():
    assert extract_final_answer("<answer>12</answer>") == "12"
    assert extract_final_answer(r"<answer>so \boxed{12}</answer>") == "12"
    assert extract_final_answer(r"\boxed{3} <answer>4</answer>") == "4"  # the tag wins over a box outside it
    assert extract_final_answer(r"reasoning \boxed{3}") == "3"
    assert extract_final_answer(r"<answer>\boxed{3</answer>") is None
    assert extract_final_answer("the answer is 3") is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<reasoning>r</reasoning><answer>a</answer>", True),
        ("  <reasoning>\nr\n</reasoning>\n<answer>\na\n</answer>\n", True),
        ("<reasoning></reasoning><answer>a</answer>", True),
        ("<reasoning>r</reasoning><answer> </answer>", False),  # blank answer
        ("<answer>a</answer>", False),  # no reasoning
        ("<reasoning>r</reasoning>x<answer>a</answer>", False),  # text between the blocks
        ("<reasoning>r</reasoning><answer>a</answer> trailing", False),
        ("intro <reasoning>r</reasoning><answer>a</answer>", False),
        ("<reasoning>r</reasoning><answer>a</answer><answer>b</answer>", False),  # two answers
        ("<answer>a</answer><reasoning>r</reasoning>", False),
        ("", False),
    ],
)
def test_has_answer_format(text, expected):
    assert has_answer_format(text) is expected


def test_format_score_adds_structure_and_answer_parts():
    def is_digit(answer):
        return answer.isdigit()

    assert format_score("<reasoning>r</reasoning><answer>7</answer>", is_digit) == 0.5
    assert format_score("<reasoning>r</reasoning><answer>seven</answer>", is_digit) == 0.25
    assert format_score("<answer>7</answer>", is_digit) == 0.25
    assert format_score("7", is_digit) == 0.0


def test_reward_column_checks_presence_and_length():
    assert reward_column({"nums": [1, 2]}, ("numbers", "nums"), 2, "r") == [1, 2]
    with pytest.raises(ValueError, match="'answer'"):
        reward_column({"other": [1]}, "answer", 1, "r")
    with pytest.raises(ValueError, match="2 entries for 3 completions"):
        reward_column({"answer": [1, 2]}, "answer", 3, "r")


def test_user_prompt():
    assert user_prompt("Q", "S") == [{"role": "user", "content": "S\n\nQ"}]
    assert user_prompt("Q", "") == [{"role": "user", "content": "Q"}]


def test_take_samples_is_seeded_and_checked():
    from datasets import Dataset

    ds = Dataset.from_dict({"x": list(range(20))})
    a, b = take_samples(ds, 5, seed=3)["x"], take_samples(ds, 5, seed=3)["x"]
    assert a == b and len(set(a)) == 5
    assert take_samples(ds, 5, seed=4)["x"] != a
    assert take_samples(ds, None, seed=0)["x"] == list(range(20))
    with pytest.raises(ValueError, match="num_samples"):
        take_samples(ds, 21, seed=0)
    with pytest.raises(ValueError, match="num_samples"):
        take_samples(ds, 0, seed=0)
