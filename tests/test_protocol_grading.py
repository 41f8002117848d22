"""Grading parity of the protocol presets: each preset's grader against an independent reference of the official
grader, on >= 1000 seeded completions per benchmark (well-formed, malformed and hostile), plus hand-checked cases.

The references below are written separately from `stabledrl_trl.protocol_grading`, following the official code's
control flow (d1 `eval/parse_and_get_acc.py`, `eval/parser_helper.py`; SPG's GSM8K fallback; the official StableDRL
`math_metrics.py` calling math-verify's parse / verify); the Countdown reference computes values by walking Python's
own parse tree (`ast`), not by the package's evaluator, and nothing is eval'd.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re

import pytest

from stabledrl_trl.protocol_grading import (
    d1_countdown_correct,
    d1_gsm8k_answer,
    d1_gsm8k_gold,
    d1_math_answer,
    d1_sudoku_cells,
    hendrycks_is_equiv,
)
from stabledrl_trl.protocols import get_protocol

N = 1000
BS = "\\"

# ----------------------------------------------------------------------------------------------------------------
# independent references


def ref_last_boxed_only_string(string):
    idx = string.rfind(BS + "boxed")
    if BS + "boxed " in string:
        return BS + "boxed " + string.split(BS + "boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind(BS + "fbox")
        if idx < 0:
            return string
    opened = 0
    i = idx
    while i < len(string):
        if string[i] == "{":
            opened += 1
        if string[i] == "}":
            opened -= 1
            if opened == 0:
                return string[idx : i + 1]
        i += 1
    return None


def ref_remove_boxed(s):
    if BS + "boxed " in s:  # TypeError for None, as the original
        assert s[:7] == BS + "boxed "
        return s[7:]
    try:
        assert s[:7] == BS + "boxed{"
        assert s[-1] == "}"
        return s[7:-1]
    except (AssertionError, IndexError):
        return s


def ref_gsm8k_gold(text):
    m = re.search(r"####\s*\$?([\d,]+(?:\.\d+)?)", text)
    if not m:
        return None
    try:
        return float(m.group(1).replace(",", ""))
    except ValueError:
        return None


def _ref_number(text, pick):
    try:
        return float(text)
    except ValueError:
        found = re.findall(r"-?\d+\.?\d*", text)
        if found:
            try:
                return float(found[pick])
            except ValueError:
                return None
    return None


def ref_gsm8k_parse(raw, spg):
    parsed = None
    for content in re.findall(r"\\boxed{(.*?)}", raw):
        content = content.strip()
        if content and content != "..." and not re.match(r"^\.+$", content):
            value = _ref_number(content, 0)
            if value is not None:
                parsed = value
                break
    if parsed is None:
        m = re.search(r"<answer>(.*?)</answer>", raw, re.DOTALL)
        if m and m.group(1).strip():
            parsed = _ref_number(m.group(1).strip(), -1)
    if parsed is None and spg:
        tail = raw.split("<answer>")[-1].split("</answer>")[0].strip()
        if tail:
            parsed = _ref_number(tail, -1)
    return parsed


def ref_strip_string(string):
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in string:
        parts = string.split("\\text{ ")
        assert len(parts) == 2
        string = parts[0]
    string = string.replace("\\%", "")
    string = string.replace(" .", " 0.").replace("{.", "{0.")
    if len(string) == 0:
        return string
    if string[0] == ".":
        string = "0" + string
    if len(string.split("=")) == 2 and len(string.split("=")[0]) <= 2:
        string = string.split("=")[1]
    if "\\sqrt" in string:
        pieces = string.split("\\sqrt")
        rebuilt = pieces[0]
        for piece in pieces[1:]:
            rebuilt += ("\\sqrt{" + piece[0] + "}" + piece[1:]) if piece[0] != "{" else "\\sqrt" + piece
        string = rebuilt
    string = string.replace(" ", "")
    # fracs
    pieces = string.split("\\frac")
    rebuilt = pieces[0]
    done = False
    for piece in pieces[1:]:
        rebuilt += "\\frac"
        if piece[0] == "{":
            rebuilt += piece
        else:
            if len(piece) < 2:
                done = True
                break
            a, b = piece[0], piece[1]
            rebuilt += "{" + a + "}" + ("{" + b + "}" + piece[2:] if b != "{" else b + piece[2:])
    if not done:
        string = rebuilt
    if string == "0.5":
        string = "\\frac{1}{2}"
    if len(string.split("/")) == 2:
        a, b = string.split("/")
        a, b = int(a), int(b)  # ValueError propagates, as in the original
        if string == f"{a}/{b}":
            string = "\\frac{" + str(a) + "}{" + str(b) + "}"
    return string


def ref_is_equiv(a, b):
    if a is None and b is None:
        return True
    if a is None or b is None:
        return False
    try:
        return ref_strip_string(a) == ref_strip_string(b)
    except Exception:
        return a == b


def ref_math_correct(raw, gold):
    try:
        parsed = ref_remove_boxed(ref_last_boxed_only_string(raw))
    except Exception:
        parsed = None
    if not parsed:
        m = re.search(r"<answer>(.*?)</answer>", raw, re.DOTALL)
        if m:
            parsed = m.group(1).strip()
    return parsed is not None and ref_is_equiv(parsed, gold)


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class _Refused(Exception):
    pass


def _walk(node):
    if isinstance(node, ast.Expression):
        return _walk(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_walk(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
            if right * math.log2(abs(left)) > 4096:  # far beyond any sane answer: d1's eval would not finish
                raise _Refused
        return _BINARY[type(node.op)](left, right)
    raise _Refused  # a tuple, a call, ...


def ref_countdown_value(equation):
    if not re.match(r"^[\d+\-*/().\s]+$", equation):
        return float("inf")
    try:
        return _walk(ast.parse(equation.strip(), mode="eval"))
    except (SyntaxError, _Refused, ZeroDivisionError, OverflowError, ValueError, TypeError, RecursionError):
        return float("inf")


def ref_countdown_correct(raw, numbers, target):
    try:
        equation = ref_remove_boxed(ref_last_boxed_only_string(raw))
    except Exception:
        m = re.search(r"<answer>(.*?)</answer>", raw, re.DOTALL)
        equation = m.group(1).strip() if m else raw
    equation = equation.replace(r"\div", "/").replace(r"\times", "*").replace(r"\cdot", "*")
    m = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", equation)
    if m:
        equation = m.group(1).strip()
    try:
        valid = sorted(int(n) for n in re.findall(r"\d+", equation)) == sorted(numbers)
    except Exception:
        valid = False
    return bool(valid and abs(ref_countdown_value(equation) - target) < 1e-5)


def ref_sudoku(raw, puzzle, truth):
    empty = [i for i in range(16) if puzzle[i] == "0"]
    patterns = [
        r"<answer>.*?```\s*([\d\s]+)```",
        r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
        r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
        r".*?(\d{16})\s*</answer>",
        r"\b(\d{16})\b",
    ]
    found = ""
    for pattern in patterns:
        if found:
            break
        m = re.search(pattern, raw, re.DOTALL)
        if m and m.group(1).strip():
            found = m.group(1).strip()
    found = re.sub(r"\s", "", found)
    if not found:
        return 0, len(empty)
    found = (found + "0" * 16)[:16]
    return sum(1 for i in empty if found[i] == truth[i]), len(empty)


# ----------------------------------------------------------------------------------------------------------------
# seeded completions: fragments glued at random, with malformed and hostile pieces

NOISE = [
    "",
    " ",
    "\n",
    "<|eot_id|>",
    "<|endoftext|>",
    "<reasoning>",
    "</reasoning>",
    "<answer>",
    "</answer>",
    "$",
    "{",
    "}",
    BS + "boxed{",
    BS + "boxed ",
    BS + "fbox{",
    "...",
    "The answer is ",
    "=",
    "####",
    "٣",
    "\u00a0",
    "\t",
    "```",
    "x" * 300,
    "9" * 800,
    "{" * 50,
    "}" * 50,
    "\\\\",
    "\\!",
]


SHORT_NOISE = [piece for piece in NOISE if len(piece) < 100] + ["9" * 120]  # d1's Sudoku patterns are quadratic


def _glue(rng, pieces, count):
    return "".join(rng.choice(pieces) for _ in range(count))


def gsm8k_cases(rng):
    for _ in range(N):
        gold_value = rng.choice([72, 0, 5, 1234, 18.5, -3, 1e3, 100000])
        gold = rng.choice(
            [
                f"so\n#### {gold_value}",
                f"#### ${gold_value:,}" if isinstance(gold_value, int) and gold_value >= 0 else f"#### {gold_value}",
                "no final marker",
                "#### ,",
            ]
        )
        numbers = [str(gold_value)] * 12 + [
            "72",
            "72.0",
            "1,234",
            "-3",
            "inf",
            "nan",
            "1e3",
            "1_000",
            " 5 ",
            "18.50",
            "٣",
            "3/4",
            "$72",
            "72 apples",
            "",
        ]
        pieces = (
            NOISE
            + [BS + "boxed{" + rng.choice(numbers) + "}" for _ in range(20)]
            + [
                "<answer>" + rng.choice(numbers) + "</answer>",
                "<answer> it is " + rng.choice(numbers) + " </answer>",
                rng.choice(numbers),
                BS + "boxed{...}",
                BS + "boxed{}",
                BS + "boxed{..}",
            ]
        )
        yield _glue(rng, pieces, rng.randint(0, 8)), gold


def test_gsm8k_parity_d1_and_spg():
    rng = random.Random(0)
    right = {False: 0, True: 0}
    for text, gold_text in gsm8k_cases(rng):
        gold = d1_gsm8k_gold(gold_text)
        assert gold == ref_gsm8k_gold(gold_text) or (gold != gold and ref_gsm8k_gold(gold_text) != gold)
        for spg in (False, True):
            ours = d1_gsm8k_answer(text, spg_fallback=spg)
            theirs = ref_gsm8k_parse(text, spg)
            assert (ours == theirs) or (ours != ours and theirs != theirs), (text[:200], spg, ours, theirs)
            correct = ours is not None and ours == gold
            assert correct == (theirs is not None and theirs == gold)
            right[spg] += correct
    # not a trivial agreement: both outcomes occur, and SPG's fallback accepts more
    assert 50 < right[False] < N - 50 and right[True] > right[False]


MATH_ANSWERS = [
    "\\frac{1}{2}",
    "0.5",
    "1/2",
    "\\dfrac12",
    "\\tfrac{1}{2}",
    "\\sqrt3",
    "\\sqrt{3}",
    "x = 5",
    "5",
    "5\\text{ cm}",
    "5\\text{ cm}\\text{ m}",
    "50\\%",
    "90^\\circ",
    "90",
    "\\left( 1, 2 \\right)",
    "(1,2)",
    ".5",
    "\\frac",
    "\\sqrt",
    "3/4",
    "1_0/2",
    "a/b",
    "\\frac1",
    "\\$5",
    "{.5}",
    " 12 ",
    "\\!3",
    "\\\\frac12",
    "\n7",
    "k=7",
    "abc=7",
    "٣/4",
    "",
]


def math_cases(rng):
    for _ in range(N):
        gold = rng.choice(MATH_ANSWERS[:16])
        answer = gold if rng.random() < 0.5 else rng.choice(MATH_ANSWERS)
        pieces = (
            NOISE
            + [BS + "boxed{" + answer + "}"] * 10
            + [
                BS + "boxed " + answer + "$",
                BS + "fbox{" + answer + "}",
                BS + "boxed{" + answer,
                "<answer>" + answer + "</answer>",
                answer,
                BS + "boxed{" + BS + "frac{1}{2}}",
                "}" + BS + "boxed{" + answer + "}",
            ]
        )
        yield _glue(rng, pieces, rng.randint(0, 6)), gold


def test_math_parity_d1():
    rng = random.Random(1)
    right = 0
    for text, gold in math_cases(rng):
        ours = hendrycks_is_equiv(d1_math_answer(text), gold) if d1_math_answer(text) is not None else False
        assert ours == ref_math_correct(text, gold), (text[:300], gold)
        right += ours
    assert 50 < right < N - 50
    # the normalisation alone, on every pair of the answer pool (raising paths included)
    for a in MATH_ANSWERS:
        for b in MATH_ANSWERS:
            assert hendrycks_is_equiv(a, b) == ref_is_equiv(a, b), (a, b)


def countdown_cases(rng):
    for _ in range(N):
        numbers = [rng.randint(1, 99) for _ in range(3)]
        a, b, c = numbers
        target = rng.choice([a + b - c, a * b - c, a + b + c, (a + b) * c, 24])
        expressions = [
            f"{a} + {b} - {c}",
            f"{a} * {b} - {c}",
            f"{a}+{b}+{c}",
            f"({a} + {b}) * {c}",
            f"{a} {BS}times {b} - {c}",
            f"({a} + {b}) {BS}cdot {c}",
            f"{a} {BS}div {b} + {c}",
            f"{a} + {b}",
            f"{a} + {b} + {c} + 1",
            f"{a} + {b} - {c} = {target}",
            f"0{a} + {b} - {c}",
            f"{a}**2 + {b} - {c}",
            f"{a}**{b}**{c}**99 + 0",
            "9**9**9**9",
            f"({a})({b}){c}",
            f"{a} / 0 + {b} + {c}",
            f"({a} - {b}) ** 0.5 + {c}",
            f"{a} // {b} + {c}",
            f"{a}.0 + {b} - {c}",
            f"__import__('os') + {a}",
            f"{a} + {b}\n- {c}",
            f"({a} + {b}\n- {c})",
            f"{a}\u00a0+ {b} - {c}",
            f"{a} % {b} + {c}",
            "((" * 30 + f"{a}" + "))" * 30 + f" + {b} - {c}",
        ]
        expression = rng.choice(expressions[:4]) if rng.random() < 0.5 else rng.choice(expressions)
        pieces = (
            NOISE
            + [BS + "boxed{" + expression + "}"] * 10
            + ["<answer>" + expression + "</answer>", expression, BS + "boxed{" + expression, f"= {target}"]
        )
        yield _glue(rng, pieces, rng.randint(1, 3)), numbers, target


def test_countdown_parity_d1():
    rng = random.Random(2)
    right = 0
    for text, numbers, target in countdown_cases(rng):
        ours = d1_countdown_correct(text, numbers, target)
        assert ours == ref_countdown_correct(text, numbers, target), (text[:300], numbers, target)
        right += ours
    assert 50 < right < N - 50


def sudoku_cases(rng):
    for _ in range(N):
        truth = "".join(rng.choice("1234") for _ in range(16))
        puzzle = "".join(ch if rng.random() < 0.5 else "0" for ch in truth)
        guess = "".join(ch if rng.random() < 0.8 else rng.choice("1234") for ch in truth)
        answers = [
            guess,
            guess[:10],
            guess + "1234",
            " ".join(guess),
            f"```\n{guess}\n```",
            "",
            "abc",
            truth,
            guess[:8] + "\n" + guess[8:],
            "12345678901234567",
        ]
        answer = rng.choice(answers)
        pieces = SHORT_NOISE + [
            "<answer>\n" + answer + "\n</answer>",
            "<answer>" + answer,
            "</answer> " + answer,
            answer,
            answer + "<|eot_id|>",
            " " + guess + " ",
        ]
        yield _glue(rng, pieces, rng.randint(0, 5)), puzzle, truth


def test_sudoku_parity_d1():
    rng = random.Random(3)
    cells = [0, 0]
    for text, puzzle, truth in sudoku_cases(rng):
        ours = d1_sudoku_cells(text, puzzle, truth)
        assert ours == ref_sudoku(text, puzzle, truth), (text[:300], puzzle, truth)
        cells[0] += ours[0]
        cells[1] += ours[1]
    assert 0.1 < cells[0] / cells[1] < 0.9


def test_official_stabledrl_math_verify_parity():
    """The official StableDRL grading (math_metrics.py: math-verify parse / verify of gold and the decoded text)
    against the preset's grader, on 1000 GSM8K and 1000 MATH texts."""
    pytest.importorskip("math_verify")
    from math_verify import parse, verify

    from stabledrl_trl.protocol_eval import grade

    def official(gold, text):
        try:
            return bool(verify(parse(str(gold)), parse(str(text)), timeout_seconds=5))
        except Exception:
            return False

    gsm, mth = get_protocol("stabledrl", "gsm8k"), get_protocol("stabledrl", "math500")
    rng = random.Random(4)
    counts = [0, 0]
    for text, gold in gsm8k_cases(rng):
        answer = "x\n#### " + gold.split("####")[-1].strip() if "####" in gold else "#### 72"
        expected = official(answer.split("####")[-1].strip(), text)
        assert grade(gsm, text, {"answer": answer})["correct"] == expected, (text[:200], answer)
        counts[0] += expected
    for text, gold in math_cases(rng):
        solution = "So $" + BS + "boxed{" + gold + "}$."
        expected = official(solution, text)
        assert grade(mth, text, {"solution": solution})["correct"] == expected, (text[:200], solution)
        counts[1] += expected
    assert all(20 < c < N - 20 for c in counts), counts


# ----------------------------------------------------------------------------------------------------------------
# hand-checked cases (the rules as read in the official code)


@pytest.mark.parametrize(
    "text, expected",
    [
        (BS + "boxed{72}", 72.0),
        (BS + "boxed{...} then " + BS + "boxed{72}", 72.0),  # dots are skipped
        (BS + "boxed{$1,234}", 1.0),  # not a float: the first number run "1"
        ("<answer> about 5 or 7 </answer>", 7.0),  # the tag's last number
        ("<answer>x</answer>", None),
        ("The answer is 72", None),  # d1 reads no untagged, unboxed number
    ],
)
def test_d1_gsm8k_rules(text, expected):
    assert d1_gsm8k_answer(text) == expected


def test_spg_fallback_reads_an_unclosed_answer():
    assert d1_gsm8k_answer("<answer> 72") is None
    assert d1_gsm8k_answer("<answer> 72", spg_fallback=True) == 72.0
    assert d1_gsm8k_answer("no tags, 12 then 72", spg_fallback=True) == 72.0  # the whole text's last number


def test_d1_math_rules():
    assert d1_math_answer("so " + BS + "boxed{" + BS + "frac{1}{2}}.") == BS + "frac{1}{2}"
    assert d1_math_answer("no box, just 5") == "no box, just 5"  # the whole text is the answer
    assert d1_math_answer(BS + "boxed{5 <answer>7</answer>") == "7"  # unclosed box: the tag
    assert hendrycks_is_equiv("0.5", BS + "frac{1}{2}") and hendrycks_is_equiv(BS + "dfrac12", "1/2")
    assert not hendrycks_is_equiv("0.50", "0.5")


def test_d1_countdown_rules():
    assert d1_countdown_correct(BS + "boxed{(3 + 5) " + BS + "times 2}", [3, 5, 2], 16)
    assert d1_countdown_correct("<answer>3 + 5 + 2 = 10</answer>", [3, 5, 2], 10)  # box absent: whole text, "= 10"
    assert not d1_countdown_correct(BS + "boxed{3 + 5}", [3, 5, 2], 8)  # every number exactly once
    assert not d1_countdown_correct(BS + "boxed{9**9**9**9 + 3 + 5 + 2}", [3, 5, 2], 10)  # no hang: wrong


def test_d1_sudoku_rules():
    puzzle, truth = "0" * 16, "1234341221434321"
    assert d1_sudoku_cells("<answer>\n" + truth + "\n</answer>", puzzle, truth) == (16, 16)
    assert d1_sudoku_cells("<answer>\n1234\n</answer>", puzzle, truth) == (4, 16)  # padded with 0
    assert d1_sudoku_cells("nothing", puzzle, truth) == (0, 16)
