"""The official StableDRL task style: prompt wording, each official grading rule on a table of cases, the
anti-short-boxed term, the Python-arithmetic evaluator against Python itself, and where tagged and official grading
disagree (by design)."""

import random
import re
import subprocess
import sys
import threading
import warnings

import pytest

from stabledrl_trl.tasks import get_task, load_task_dataset
from stabledrl_trl.tasks.common import anti_short_boxed_reward, is_short_boxed, official_last_answer
from stabledrl_trl.tasks.countdown import (
    MAX_POWER_BITS,
    ExpressionError,
    countdown_correctness_reward,
    countdown_official_reward,
    evaluate_python_arithmetic,
)
from stabledrl_trl.tasks.gsm8k import gsm8k_correctness_reward, gsm8k_official_reward
from stabledrl_trl.tasks.math import math_correctness_reward, math_official_reward, official_math_score
from stabledrl_trl.tasks.sudoku import sudoku_correctness_reward, sudoku_official_reward

BS = "\\"  # one backslash character

# ----------------------------------------------------------------------------------------------------------------
# prompts


def test_official_prompts_word_for_word(tmp_path):
    request = "(Please put the final answer in " + BS * 2 + "boxed{} tag, i.e. $" + BS * 2 + "boxed{answer here}$)"
    gsm = get_task("gsm8k").loader
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text('{"question": "Tom has 3 apples. How many? ", "answer": "3 apples\\n#### 3"}\n')
    ds = gsm("train", data_files=str(rows), prompt_style="official")
    # The question as is (not stripped), the request glued on without a space; one user message.
    assert ds[0]["prompt"] == [{"role": "user", "content": "Tom has 3 apples. How many? " + request}]
    assert ds[0]["answer"] == "3" and sorted(ds.column_names) == ["answer", "prompt"]
    assert ds[0]["prompt"][0]["content"].count(BS * 2 + "boxed") == 2  # two backslash characters, twice

    math_rows = tmp_path / "math.jsonl"
    math_rows.write_text(
        '{"problem": "Half of 1?", "solution": "It is $' + BS * 2 + "boxed{" + BS * 2 + 'frac12}$."}\n'
    )
    ds = load_task_dataset("math", "train", data_files=str(math_rows), prompt_style="official")
    assert ds[0]["prompt"] == [{"role": "user", "content": "Half of 1?" + request}]
    assert ds[0]["solution"] == "It is $" + BS + "boxed{" + BS + "frac12}$." and ds[0]["answer"] == BS + "frac12"

    cd_rows = tmp_path / "countdown.jsonl"  # the official files' columns: input "30,100,93", output "23"
    cd_rows.write_text('{"input": "30,100,93", "output": "23"}\n')
    ds = load_task_dataset("countdown", "train", data_files=str(cd_rows), prompt_style="official")
    assert ds[0]["prompt"][0]["content"] == (
        "Given numbers [30, 100, 93], find an equation that equals 23. Please put the reasoning in <reasoning> tags "
        "and the final equation in <answer> tags, e.g. <answer> 1 + 1 </answer>."
    )
    assert (ds[0]["numbers"], ds[0]["target"]) == ([30, 100, 93], 23)

    sd_rows = tmp_path / "sudoku.csv"  # d1's CSV: capitalised columns, puzzles read as integers (leading 0 lost)
    sd_rows.write_text("Puzzle,Solution\n0034001221004301,1234341221434321\n")
    ds = load_task_dataset("sudoku", "train", data_files=str(sd_rows), prompt_style="official")
    assert ds[0]["prompt"][0]["content"] == (
        "Solve this 4x4 Sudoku puzzle: 0034001221004301. Use 0 for empty cells. Please put the reasoning in "
        "<reasoning> tags and the solution string in <answer> tags."
    )
    assert (ds[0]["puzzle"], ds[0]["solution"]) == ("0034001221004301", "1234341221434321")


def test_prompt_style_errors(tmp_path):
    rows = tmp_path / "gsm8k.jsonl"
    rows.write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(ValueError, match="prompt_style: expected one of tagged, official, got 'offical'"):
        load_task_dataset("gsm8k", "train", data_files=str(rows), prompt_style="offical")
    with pytest.raises(ValueError, match="system_prompt: got 'Think.' with prompt_style 'official'"):
        load_task_dataset("gsm8k", "train", data_files=str(rows), prompt_style="official", system_prompt="Think.")
    # "" (no instructions) is what official prompts have anyway.
    assert len(load_task_dataset("gsm8k", "train", data_files=str(rows), prompt_style="official", system_prompt=""))
    with pytest.raises(ValueError, match="task 'digit_sort' has no official StableDRL form"):
        load_task_dataset("digit_sort", "test", prompt_style="official")
    with pytest.raises(ValueError, match="task 'digit_sort' has no official StableDRL grading"):
        get_task("digit_sort").reward_funcs_for("official")
    with pytest.raises(ValueError, match="reward_style: expected one of tagged, official"):
        get_task("gsm8k").reward_funcs_for("exact")


def test_reward_funcs_for_styles():
    names = lambda funcs: [f.__name__ for f in funcs]  # noqa: E731
    for task in ("gsm8k", "math", "countdown", "sudoku"):
        spec = get_task(task)
        assert names(spec.reward_funcs_for("official")) == [f"{task}_official_reward", "anti_short_boxed_reward"]
        assert names(spec.reward_funcs_for("official", anti_short_boxed=False)) == [f"{task}_official_reward"]
        assert spec.reward_funcs_for("tagged") == list(spec.reward_funcs)
        assert spec.reward_funcs_for("tagged", anti_short_boxed=True)[-1] is anti_short_boxed_reward
    assert get_task("digit_sort").prompt_styles == ("tagged",)


# ----------------------------------------------------------------------------------------------------------------
# GSM8K and MATH: math-verify with its default settings on the whole completion, +1 / -1

GSM8K_CASES = [
    ("So the total is " + BS + "boxed{72}.", 1.0),
    ("The answer is 72", 1.0),  # no tags, no box: math-verify's "answer is" rule
    ("We get 18 + 54 = 72", 1.0),  # a bare number after "=" still counts
    ("It costs $72.", 1.0),
    (BS + "boxed{72.0}", 1.0),  # numeric equivalence
    ("First " + BS + "boxed{70}, then " + BS + "boxed{72}", -1.0),  # several boxes: the set {70, 72} != 72
    ("<reasoning>...</reasoning><answer>70</answer> so " + BS + "boxed{72}", 1.0),  # the box wins over the tag
    ("<answer>72</answer>", -1.0),  # a number glued to ">" is not extracted
    ("The answer is 72 but wait, 73", 1.0),  # "answer is" comes before "any number"
    ("The answer is 73", -1.0),
    ("no idea", -1.0),
    ("", -1.0),
]


@pytest.mark.parametrize("completion, score", GSM8K_CASES)
def test_gsm8k_official_table(completion, score):
    messages = [{"role": "assistant", "content": completion}]  # conversational completions read the same
    assert gsm8k_official_reward(None, [completion, messages], answer=["72", "72"]) == [score, score]


HALF = BS + "frac{1}{2}"
MATH_SOLUTION = "Half of one: $" + HALF + "$. So the answer is $" + BS + "boxed{" + HALF + "}$."
MATH_CASES = [
    (BS + "boxed{0.5}", 1.0),
    (BS + "boxed{1/2}", 1.0),
    ("The answer is $" + BS + "dfrac{1}{2}$.", 1.0),
    ("it is " + HALF, 1.0),  # unboxed LaTeX still counts
    (BS + "boxed{" + BS + "frac12} or " + BS + "boxed{1}", -1.0),  # two boxes -> a set
    ("<answer>1/2</answer>", -1.0),  # the tag hides the expression from math-verify's anchored patterns
    (BS + "boxed{2}", -1.0),
]


@pytest.mark.parametrize("completion, score", MATH_CASES)
def test_math_official_table(completion, score):
    # The gold is the whole solution (math-verify reads its box); without a solution, the answer column.
    assert math_official_reward(None, [completion], solution=[MATH_SOLUTION]) == [score]
    assert math_official_reward(None, [completion], answer=[HALF]) == [score]


def test_math_official_columns_and_none():
    assert math_official_reward(
        None, ["x", BS + "boxed{3}"], solution=[None, "$" + BS + "boxed{3}$"], answer=["3", None]
    ) == [
        -1.0,
        1.0,
    ]
    assert math_official_reward(None, ["x"], solution=[None], answer=[None]) == [None]
    with pytest.raises(ValueError, match="'solution' or 'answer'"):
        math_official_reward(None, ["x"], problem=["p"])


def test_official_maths_grading_refuses_other_threads():
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_raises(lambda: official_math_score("1", "1"))))
    thread.start()
    thread.join()
    assert isinstance(errors[0], RuntimeError) and "main thread" in str(errors[0])


def _raises(func):
    try:
        func()
    except Exception as error:  # noqa: BLE001
        return error
    return None


# ----------------------------------------------------------------------------------------------------------------
# Countdown: the last <answer>, 1.0 / 0.1 / 0.0, a subset of the numbers, Python's arithmetic without eval

COUNTDOWN_CASES = [
    # (completion, numbers, target, official score)
    ("<answer>44 + 19 + 35</answer>", [44, 19, 35], 98, 1.0),
    ("<reasoning>r</reasoning>\n<answer> (44 + 19) + 35 </answer>", [44, 19, 35], 98, 1.0),
    ("<answer>44 + 19 + 35 = 98</answer>", [44, 19, 35], 98, 0.1),  # "=" is outside the character set
    ("<answer>2 + 3</answer>", [2, 3, 5], 5, 1.0),  # a subset of the numbers is accepted
    ("<answer>5 + 5 - 5</answer>", [2, 3, 5], 5, 0.1),  # 5 used three times
    ("<answer>2 * 3</answer>", [2, 3, 5], 5, 0.1),  # tagged but wrong
    ("<answer></answer>", [2, 3, 5], 5, 0.1),  # tagged, empty
    (BS + "boxed{2 + 3}", [2, 3, 5], 5, 0.0),  # no tags at all
    ("2 + 3", [2, 3, 5], 5, 0.0),
    ("<answer>2+3</answer> then <answer>2*3</answer>", [2, 3, 5], 5, 0.1),  # the LAST answer counts
    ("<answer>2*3</answer> then <answer>2+3</answer>", [2, 3, 5], 5, 1.0),
    ("<answer>1 / 49 * 49</answer>", [1, 49, 49], 1, 1.0),  # float arithmetic: 0.9999999999999999, within 1e-5
    ("<answer>1 / 3</answer>", [1, 3], 0, 0.1),
    ("<answer>2 ** 3</answer>", [2, 3, 1], 8, 1.0),  # Python's power operator is allowed
    ("<answer>7 // 2</answer>", [7, 2], 3, 1.0),  # ... and floor division
    ("<answer>-3 + 5</answer>", [3, 5], 2, 1.0),  # ... and a unary minus
    ("<answer>1.5 * 2</answer>", [1, 5, 2], 3, 1.0),  # "1.5" uses the numbers 1 and 5
    ("<answer>05 + 3</answer>", [5, 3], 8, 0.1),  # Python refuses leading zeros in an integer
    ("<answer>5 +\n3</answer>", [5, 3], 8, 0.1),  # a line break outside parentheses is a syntax error
    ("<answer>(5 +\n3)</answer>", [5, 3], 8, 1.0),  # ... inside them it is not
    ("<answer>(5)(3)</answer>", [5, 3], 15, 0.1),  # a call, not a product
    ("<answer>5 / 0</answer>", [5, 0], 1, 0.1),  # division by zero
    ("<answer>95**36**32</answer>", [95, 36, 32], 5, 0.1),  # refused without computing it (see the test below)
    ("<answer>1<answer>2+3</answer>", [1, 2, 3], 5, 0.1),  # official tag reading: "1<answer>2+3"
]


@pytest.mark.parametrize("completion, numbers, target, score", COUNTDOWN_CASES)
def test_countdown_official_table(completion, numbers, target, score):
    assert countdown_official_reward(None, [completion], numbers=[numbers], target=[target]) == [score]


def test_countdown_official_columns():
    # `nums` as the hub set names it; numbers may come as a string (CSV); rows without a target score None.
    assert countdown_official_reward(
        None, ["<answer>1+2</answer>"] * 2, nums=["[1, 2]", [1, 2]], target=[3, None]
    ) == [
        1.0,
        None,
    ]


def test_exponent_bomb_is_refused_not_computed():
    # 95**(36**32) has about 4e50 bits: Python's eval of it never returns. It is refused by its size alone.
    with pytest.raises(ExpressionError, match=f"more than {MAX_POWER_BITS} bits"):
        evaluate_python_arithmetic("95**36**32")
    # In a fresh interpreter with a hard limit: a hang here would be a test failure, not a stuck suite.
    code = (
        "from stabledrl_trl.tasks.countdown import countdown_official_reward as r\n"
        "print(r(None, ['<answer>95**36**32</answer>', '<answer>-(99**99**99)</answer>'], "
        "numbers=[[95, 36, 32], [99, 99, 99]], target=[5, 1]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[0.1, 0.1]"


def test_python_arithmetic_hand_computed():
    cases = {
        "2**-2**2": 0.0625,  # right-associative, unary minus inside the exponent
        "-2**2": -4,  # ** binds tighter than a unary minus on its left
        "7//-2": -4,  # floor division rounds down
        "2**10000//2**9999": 2,  # big integers within the limit are exact
        "2**10000/2**9999": 2.0,
        "00 + 1": 1,  # all-zero integers are fine
        "01.5 + .5 + 1.": 3.0,  # float literals may have leading zeros
        "+-+3": -3,
        "(((7)))": 7,
    }
    for expression, value in cases.items():
        got = evaluate_python_arithmetic(expression)
        assert got == value and type(got) is type(value), expression
    assert evaluate_python_arithmetic("(-8)**0.5") == pytest.approx(complex(0, 8**0.5))
    for bad in ("", "()", "...", "1..2", "1 2", "2***3", "2 * * 3", "(1", "1)", "0**-1", "2//0.0", "(2**1024)/1"):
        with pytest.raises(ExpressionError):
            evaluate_python_arithmetic(bad)


def _python_value(expression):
    """What eval gives the expression (the official code's evaluation), or "error"; for the test's own strings."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "'int' object is not callable; perhaps you missed a comma?"
        try:
            value = eval(expression, {"__builtins__": {}}, {})  # noqa: S307  (trusted, test-generated text)
        except Exception:  # noqa: BLE001
            return "error"
    return _key(value) if type(value) in (int, float, complex) else "error"


def _key(value):
    # hex for ints: repr refuses integers over 4300 digits
    return (type(value).__name__, hex(value) if type(value) is int else repr(value))


def _ours(expression):
    try:
        return _key(evaluate_python_arithmetic(expression))
    except ExpressionError:
        return "error"


def _random_expression(rng, depth=0):
    if depth > 2 or rng.random() < 0.3:
        return rng.choice(["0", "00", "05", "7", "12", "99", "1.5", ".5", "3.", "100"])
    left, right = _random_expression(rng, depth + 1), _random_expression(rng, depth + 1)
    shape = rng.random()
    if shape < 0.15:
        return f"({left})"
    if shape < 0.3:
        return rng.choice(["-", "+", "- "]) + left
    op = rng.choice(["+", "-", "*", "/", "//", "**", " * ", " / "])
    return left + rng.choice(["", " ", "\n", "\t"]) + op + rng.choice(["", " ", "\f"]) + right


def test_python_arithmetic_matches_python_itself():
    # Python's own eval is the reference: random well-formed expressions and random strings over the official
    # character set (plus characters Python rejects), stripped as the official code strips the answer. At most one
    # "**" each, so eval itself always finishes.
    rng = random.Random(0)
    alphabet = list("0123456789+-*/(). ") + ["\n", "\t", "\r", "\f", "\x0b", "\xa0", "\u0663"]
    strings = [_random_expression(rng) for _ in range(3000)]
    strings += ["(" + s + ")" for s in strings[:500]]
    strings += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10))) for _ in range(6000)]
    strings = [s.strip() for s in strings]
    checked = 0
    for s in strings:
        if s.count("**") > 1:
            continue
        assert _ours(s) == _python_value(s), repr(s)
        checked += 1
    values = sum(_python_value(s) != "error" for s in strings if s.count("**") <= 1)
    assert checked > 7000 and values > 1500  # both outcomes well represented


# ----------------------------------------------------------------------------------------------------------------
# Sudoku: digits inside the last <answer>, padded or cut to 16, fraction of the blank cells right

SOLUTION = "1234341221434321"
BLANKS = (1, 4, 5, 10, 11, 14)
PUZZLE = "".join("0" if i in BLANKS else c for i, c in enumerate(SOLUTION))
ROWS = [SOLUTION[i : i + 4] for i in range(0, 16, 4)]
SUDOKU_CASES = [
    ("<answer>" + SOLUTION + "</answer>", 1.0),
    ("<answer>\n" + "\n".join(" ".join(r) for r in ROWS) + "\n</answer>", 1.0),  # spaces and line breaks
    ("<answer>" + "-".join(SOLUTION) + "</answer>", 1.0),  # any separator
    ("<answer>" + "|".join(ROWS) + "</answer>", 1.0),
    ("<answer>1234</answer>", 1 / 6),  # padded with 0: only blank cell 1 ("2") is right
    ("<answer>" + SOLUTION + "9999</answer>", 1.0),  # cut to 16
    ("<answer>" + "9" + SOLUTION + "</answer>", 0.0),  # shifted by one: every blank cell wrong
    ("<answer>" + SOLUTION[:4] + "11" + SOLUTION[6:] + "</answer>", 4 / 6),  # blanks 4 and 5 wrong
    ("<answer>4" + SOLUTION[1:] + "</answer>", 1.0),  # a wrong GIVEN is not scored
    ("<answer>0000000000000000</answer>", 0.0),
    ("<answer>no digits</answer>", 0.0),
    (SOLUTION, 0.0),  # no tags
    ("<answer>" + SOLUTION + "</answer><answer>1111111111111111</answer>", 0.0),  # the LAST answer counts
]


@pytest.mark.parametrize("completion, score", SUDOKU_CASES)
def test_sudoku_official_table(completion, score):
    assert sudoku_official_reward(None, [completion], puzzle=[PUZZLE], solution=[SOLUTION]) == [pytest.approx(score)]


def test_sudoku_official_no_blank_and_solved_solution():
    # A puzzle without a blank scores 0 (the official rule), even for the right grid.
    assert sudoku_official_reward(
        None, ["<answer>" + SOLUTION + "</answer>"], puzzle=[SOLUTION], solution=[SOLUTION]
    ) == [0.0]
    # Without a solution column the (unique) solution is solved for; "." blanks read as 0.
    from stabledrl_trl.tasks.sudoku import generate_puzzles

    (row,) = generate_puzzles(1, seed=3)
    dotted = row["puzzle"].replace("0", ".")
    assert sudoku_official_reward(None, ["<answer>" + row["solution"] + "</answer>"], puzzle=[dotted]) == [1.0]


def test_official_last_answer():
    assert official_last_answer("a <answer> 1 </answer> b <answer>2</answer>") == "2"
    assert official_last_answer("<answer>1<answer>2</answer>") == "1<answer>2"
    assert official_last_answer("<answer>1</answer><answer>2") == "1"  # an unclosed tag is no match
    assert official_last_answer("</answer><answer>") is None


# ----------------------------------------------------------------------------------------------------------------
# the anti-short-boxed term

A_BOX = BS + "boxed{5}"
ANTI_CASES = [
    # (completion, reward): short = under 200 non-space characters; u = unboxed share of them
    (A_BOX, 0.0),  # a lone box
    ("  $" + A_BOX + "$.  ", 0.0),  # ... with "$", whitespace and closing punctuation
    (A_BOX + "\u201d", 0.0),
    ("", 0.0),  # u = 0 / 1e-6
    ("   ", 0.0),
    ("42", 1.0),  # short without a box: u = 1
    ("The answer is " + A_BOX + ".", 0.0),  # 21 characters, 12 unboxed: u = 0.571
    ("a" * 60 + " " + A_BOX, 1.0),  # u = 60/69 = 0.870 >= 0.85
    ("a" * 50 + " " + A_BOX, 0.0),  # u = 50/59 = 0.847 < 0.85
    ("a " * 50 + A_BOX, 0.0),  # spaces do not count: still 50/59
    ("a" * 190 + A_BOX, 1.0),  # 199 characters, u = 0.955
    (BS + "boxed{" + "1" * 300 + "}", 1.0),  # 308 characters: long, whatever it holds
    (BS + "boxed{5", 1.0),  # an unclosed box is not cut: u = 1
    (BS + "boxed{" + HALF + "}", 0.0),  # cut at the first "}": "{2}}" is left, u = 4/19
    (A_BOX + " " + BS + "boxed{4}", 0.0),  # two boxes: not lone, u = 0
]


def _reference_is_short_boxed(text):
    """The rule written with regular expressions, independently of the linear scan under test."""
    text = text.strip()
    total = len(re.sub(r"\s+", "", text))
    lone = re.fullmatch(r"[\s$]*\\boxed\{[^}]*\}[\s$]*[.?!'\"\u201c\u201d\u2019]*\s*", text) is not None
    unboxed = len(re.sub(r"\s+", "", re.sub(r"\\boxed\{.*?\}", "", text, flags=re.DOTALL)))
    return total < 200 and (lone or unboxed / (total + 1e-6) < 0.85)


@pytest.mark.parametrize("completion, reward", ANTI_CASES)
def test_anti_short_boxed_table(completion, reward):
    assert anti_short_boxed_reward(None, [completion, [{"role": "assistant", "content": completion}]]) == [reward] * 2
    assert is_short_boxed(completion) == _reference_is_short_boxed(completion)


def test_anti_short_boxed_matches_the_regex_rule_on_random_text():
    rng = random.Random(1)
    pieces = [A_BOX, BS + "boxed{", "}", "{", "$", " ", "\n", "\xa0", ".", "!", "\u2019", "a", "bb", "7", "x" * 40]
    for _ in range(4000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert is_short_boxed(text) == _reference_is_short_boxed(text), repr(text)


# ----------------------------------------------------------------------------------------------------------------
# tagged vs official: the same completions graded both ways (documented differences, not bugs)

DISAGREEMENTS = [
    # (tagged reward, columns, completion, tagged score, official score, why)
    (gsm8k_correctness_reward, gsm8k_official_reward, {"answer": ["72"]},
     "First " + BS + "boxed{70}, then " + BS + "boxed{72}", 1.0, -1.0, "tagged: last box; official: a set"),
    (gsm8k_correctness_reward, gsm8k_official_reward, {"answer": ["72"]},
     "The answer is 72", 0.0, 1.0, "tagged needs a tag or a box"),
    (gsm8k_correctness_reward, gsm8k_official_reward, {"answer": ["72"]},
     "<answer>72</answer>", 1.0, -1.0, "official: math-verify does not see a number glued to '>'"),
    (math_correctness_reward, math_official_reward, {"answer": [HALF], "solution": [MATH_SOLUTION]},
     "it is " + HALF, 0.0, 1.0, "official reads unboxed LaTeX"),
    (countdown_correctness_reward, countdown_official_reward, {"numbers": [[2, 3, 5]], "target": [5]},
     "<answer>2 + 3</answer>", 0.0, 1.0, "tagged: every number once; official: a subset"),
    (countdown_correctness_reward, countdown_official_reward, {"numbers": [[2, 3, 5]], "target": [10]},
     BS + "boxed{2 + 3 + 5}", 1.0, 0.0, "tagged falls back to the last box; official needs <answer>"),
    (countdown_correctness_reward, countdown_official_reward, {"numbers": [[2, 3, 1]], "target": [8]},
     "<answer>2**3*1</answer>", 0.0, 1.0, "official allows Python's **"),
    (sudoku_correctness_reward, sudoku_official_reward, {"puzzle": [PUZZLE], "solution": [SOLUTION]},
     "<answer>" + "-".join(SOLUTION) + "</answer>", 0.0, 1.0, "official keeps only the digits"),
    (sudoku_correctness_reward, sudoku_official_reward, {"puzzle": [PUZZLE], "solution": [SOLUTION]},
     "<answer>4" + SOLUTION[1:] + "</answer>", 0.0, 1.0, "official ignores the givens"),
]  # fmt: skip


@pytest.mark.parametrize("tagged, official, columns, completion, tagged_score, official_score, why", DISAGREEMENTS)
def test_tagged_and_official_grading_disagree(
    tagged, official, columns, completion, tagged_score, official_score, why
):
    assert tagged(None, [completion], **columns) == [tagged_score], why
    assert official(None, [completion], **columns) == [official_score], why


def test_math_verify_is_the_series_the_official_grading_is_checked_against():
    from importlib.metadata import version

    installed = version("math-verify")
    major_minor = tuple(int(part) for part in installed.split(".")[:2])
    assert major_minor == (0, 9), (
        f"math-verify {installed} is installed; the official GSM8K / MATH grading is checked against the 0.9 series "
        "and its rewards can change between versions. Install the pinned range: "
        "pip install 'math-verify>=0.9,<0.10' (the [math] extra)."
    )
