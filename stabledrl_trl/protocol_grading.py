"""Answer extraction and grading of the d1 and SPG evaluations (arXiv 2504.12216, arXiv 2510.09541), rewritten.

d1 (github dllm-reasoning/d1, `eval/parse_and_get_acc.py` with `eval/parser_helper.py`) and SPG (github
facebookresearch/SPG, the same files with one more GSM8K fallback) grade the decoded canvas of every completion
*with its special tokens* (`skip_special_tokens=False`: `<|eot_id|>`, `<|endoftext|>` stay in the text). Their rules,
as implemented here (each function's docstring gives the exact rule; the parity tests in
`tests/test_protocol_grading.py` hold an independent reference of each on >= 1000 completions):

- GSM8K (`d1_gsm8k_answer`): the first `\\boxed{...}` (shortest match, one line) whose content is not empty or dots
  and reads as a float (or holds a number: its first); else the first `<answer>...</answer>`: its content as a float,
  else its last number; SPG then also reads the text after the last `<answer>` (up to `</answer>`) the same way.
  Correct when that float equals the gold float (d1's gold: the number after `####`, commas dropped; a negative
  gold has no match and no prediction equals it, as in d1).
- MATH-500 (`d1_math_answer`, `hendrycks_is_equiv`): the last `\\boxed{...}` / `\\fbox{...}` (brace-matched; or the
  text after the last `\\boxed ` up to a `$`) without its wrapper; with no box at all the *whole text* is the answer;
  an unclosed box gives none, and then the first `<answer>` content is used. Correct when the Hendrycks MATH
  normalisation (`hendrycks_normalize`) of answer and gold are equal strings (raw strings when it fails).
- Countdown (`d1_countdown_equation`, `d1_countdown_correct`): the boxed content as above (an unclosed box: the
  first `<answer>` content, else the whole text); LaTeX `\\div`, `\\times`, `\\cdot` become / * *; an "expr = number"
  keeps the expression; correct when its integer literals are exactly the given numbers (as multisets) and its value
  as a Python arithmetic expression is within 1e-5 of the target. The value is computed by
  `tasks.countdown.evaluate_python_arithmetic` (Python's semantics, never `eval`); where d1's `eval` would run out
  of time or memory (a huge power) the answer is wrong here, and so is one nesting parentheses and powers more
  than 100 deep (the evaluator's limit; Python's parser allows 200).
- Sudoku (`d1_sudoku_cells`): the first of five patterns that captures non-blank text (an `<answer>` with a fenced
  block of digits; the `<answer>` content up to `<|eot_id|>`, `<|endoftext|>` or `</answer>`; the text after
  `</answer>`; 16 digits before `</answer>`; any standalone 16 digits), whitespace removed, padded with "0" or cut to
  16; the score is the number of the puzzle's empty cells it gets right. d1 reports the *cell* accuracy: all right
  cells over all empty cells of the evaluated puzzles (not the fraction of solved puzzles).
"""

from __future__ import annotations

import re

__all__ = [
    "d1_countdown_correct",
    "d1_countdown_equation",
    "d1_gsm8k_answer",
    "d1_gsm8k_gold",
    "d1_last_box",
    "d1_math_answer",
    "d1_strip_box",
    "d1_sudoku_cells",
    "d1_sudoku_solution",
    "hendrycks_is_equiv",
    "hendrycks_normalize",
]

_BOX = "\\boxed"
_BOX_SPACE = "\\boxed "


class _NoBox(Exception):
    """d1's extraction raised (an unclosed box, or a malformed "\\boxed " prefix): the caller's fallback applies."""


# ----------------------------------------------------------------------------------------------------------------
# boxes


def d1_last_box(text: str) -> str | None:
    """The last box of `text` with its wrapper, d1's `last_boxed_only_string` rule.

    - a "\\boxed " (with a space) anywhere: "\\boxed " + the text after the last one, up to its first "$";
    - else from the last "\\boxed" (else the last "\\fbox"; neither: the whole `text` is returned) to the first "}"
      that brings the running brace count (every "{" +1, every "}" -1, counted from there) back to exactly 0;
      None when that never happens (an unclosed box, or a "}" before its "{").
    """
    if _BOX_SPACE in text:
        return _BOX_SPACE + text.rsplit(_BOX_SPACE, 1)[1].split("$", 1)[0]
    start = text.rfind(_BOX)
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return text
    depth = 0
    for index in range(start, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start : index + 1]
    return None


def d1_strip_box(boxed: str | None) -> str:
    """The content of a box returned by `d1_last_box`, d1's `remove_boxed` rule: "\\boxed " + x -> x; "\\boxed{x}" ->
    x; anything else unchanged. Raises `_NoBox` where d1's code raises (None, or a "\\boxed " not at the start)."""
    if boxed is None:
        raise _NoBox("no closed box")
    if _BOX_SPACE in boxed:
        if not boxed.startswith(_BOX_SPACE):
            raise _NoBox("'\\boxed ' not at the start")
        return boxed[len(_BOX_SPACE) :]
    if boxed.startswith(_BOX + "{") and boxed.endswith("}") and len(boxed) > len(_BOX) + 1:
        return boxed[len(_BOX) + 1 : -1]
    return boxed


def _boxed_content(text: str) -> str | None:
    """`d1_strip_box(d1_last_box(text))`, None where d1's code raises."""
    try:
        return d1_strip_box(d1_last_box(text))
    except _NoBox:
        return None


def _first_answer_tag(text: str) -> str | None:
    match = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    return None if match is None else match.group(1).strip()


# ----------------------------------------------------------------------------------------------------------------
# GSM8K


def d1_gsm8k_gold(solution: str) -> float | None:
    """d1's gold number of a GSM8K solution: the first "#### [$]digits[,digits][.digits]" as a float (None: none)."""
    match = re.search(r"####\s*\$?([\d,]+(?:\.\d+)?)", solution)
    if match is None:
        return None
    try:
        return float(match.group(1).replace(",", ""))
    except ValueError:  # "####  ," holds no digit
        return None


def _float_or_number(text: str, which: int) -> float | None:
    """`text` as a Python float, else the `which`-th (0 first, -1 last) "-?digits[.digits]" run in it, else None."""
    try:
        return float(text)
    except ValueError:
        pass
    numbers = re.findall(r"-?\d+\.?\d*", text)
    if not numbers:
        return None
    try:
        return float(numbers[which])
    except ValueError:  # a run of non-ASCII digits Python's float refuses
        return None


def d1_gsm8k_answer(text: str, *, spg_fallback: bool = False) -> float | None:
    """The number d1 (or, with `spg_fallback`, SPG) reads from a GSM8K completion (module docstring)."""
    for content in re.findall(r"\\boxed{(.*?)}", text):
        content = content.strip()
        if not content or re.fullmatch(r"\.+", content):
            continue
        value = _float_or_number(content, 0)
        if value is not None:
            return value
    match = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if match is not None:
        content = match.group(1).strip()
        if content:
            value = _float_or_number(content, -1)
            if value is not None:
                return value
    if spg_fallback:
        content = text.split("<answer>")[-1].split("</answer>")[0].strip()
        if content:
            return _float_or_number(content, -1)
    return None


# ----------------------------------------------------------------------------------------------------------------
# MATH-500


def d1_math_answer(text: str) -> str | None:
    """The answer d1 reads from a MATH completion: the last box's content (the whole text without a box); when that
    is empty or the box is unclosed, the first `<answer>` content (None without one)."""
    answer = _boxed_content(text)
    if not answer:
        tagged = _first_answer_tag(text)
        if tagged is not None:
            return tagged
    return answer


class _NormalizeError(Exception):
    """Hendrycks' normalisation raised; `hendrycks_is_equiv` then compares the raw strings."""


def _fix_fracs(text: str) -> str:
    """ "\\frac12" -> "\\frac{1}{2}", "\\frac1{2}" -> "\\frac{1}{2}"; a "\\frac" with fewer than 2 characters after it
    (not "{") leaves the whole text unchanged; one with nothing after it raises."""
    head, *parts = text.split("\\frac")
    out = [head]
    for part in parts:
        out.append("\\frac")
        if not part:
            raise _NormalizeError("\\frac at the end")
        if part[0] == "{":
            out.append(part)
            continue
        if len(part) < 2:
            return text
        first, second, rest = part[0], part[1], part[2:]
        out.append("{" + first + "}" + ("{" + second + "}" if second != "{" else second) + rest)
    return "".join(out)


def _fix_sqrt(text: str) -> str:
    """ "\\sqrt3" -> "\\sqrt{3}"; a "\\sqrt" at the end raises."""
    if "\\sqrt" not in text:
        return text
    head, *parts = text.split("\\sqrt")
    out = head
    for part in parts:
        if not part:
            raise _NormalizeError("\\sqrt at the end")
        out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def _fix_slash(text: str) -> str:
    """ "a/b" of two Python ints written canonically -> "\\frac{a}{b}"; a side that is no int raises."""
    pieces = text.split("/")
    if len(pieces) != 2:
        return text
    try:
        numerator, denominator = int(pieces[0]), int(pieces[1])
    except ValueError as error:
        raise _NormalizeError("not integers") from error
    if text != f"{numerator}/{denominator}":
        return text
    return "\\frac{" + str(numerator) + "}{" + str(denominator) + "}"


def hendrycks_normalize(text: str) -> str:
    """The Hendrycks MATH answer normalisation (d1's `strip_string`), in its order:
    drop newlines and "\\!"; "\\\\" -> "\\"; tfrac / dfrac -> frac; drop "\\left", "\\right", "^{\\circ}", "^\\circ",
    "\\$"; with one "\\text{ " keep what precedes it (two or more raise); drop "\\%"; " ." -> " 0.", "{." -> "{0.";
    a leading "." gets a "0"; "x = v" with a left side of at most 2 characters -> "v"; "\\sqrtN" -> "\\sqrt{N}";
    drop spaces; "\\fracAB" -> "\\frac{A}{B}"; "0.5" -> "\\frac{1}{2}"; "int/int" -> "\\frac{int}{int}".
    Raises `_NormalizeError` where d1's code raises."""
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    for token in ("\\left", "\\right", "^{\\circ}", "^\\circ", "\\$"):
        text = text.replace(token, "")
    if "\\text{ " in text:
        pieces = text.split("\\text{ ")
        if len(pieces) != 2:
            raise _NormalizeError("several units")
        text = pieces[0]
    text = text.replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _fix_sqrt(text).replace(" ", "")
    text = _fix_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _fix_slash(text)


def hendrycks_is_equiv(answer: str | None, gold: str | None) -> bool:
    """d1's `is_equiv`: normalised strings equal (raw strings equal when normalising either raises); None vs None is
    True, None vs a string False."""
    if answer is None or gold is None:
        return answer is None and gold is None
    try:
        return hendrycks_normalize(answer) == hendrycks_normalize(gold)
    except (_NormalizeError, RecursionError):
        return answer == gold


# ----------------------------------------------------------------------------------------------------------------
# Countdown


def d1_countdown_equation(text: str) -> str:
    """The equation d1 grades in a Countdown completion (module docstring), LaTeX operators replaced."""
    equation = _boxed_content(text)
    if equation is None:
        tagged = _first_answer_tag(text)
        equation = tagged if tagged is not None else text
    equation = equation.replace("\\div", "/").replace("\\times", "*").replace("\\cdot", "*")
    match = re.search(r"([0-9+\-*/() ]+)=[0-9. ]+", equation)
    if match is not None:
        equation = match.group(1).strip()
    return equation


def _uses_exactly(equation: str, numbers) -> bool:
    """d1's `validate_equation`: the sorted ints of every digit run equal the sorted numbers (False on any error)."""
    try:
        return sorted(int(run) for run in re.findall(r"\d+", equation)) == sorted(numbers)
    except (ValueError, TypeError):
        return False


def d1_countdown_value(equation: str):
    """The value d1's `evaluate_equation` gives (float("inf") where it fails), computed without eval."""
    from .tasks.countdown import ExpressionError, evaluate_python_arithmetic

    if not re.match(r"^[\d+\-*/().\s]+$", equation):
        return float("inf")
    try:
        return evaluate_python_arithmetic(equation.strip())
    except (ExpressionError, ZeroDivisionError, OverflowError, ValueError, RecursionError):
        return float("inf")


def d1_countdown_correct(text: str, numbers, target) -> bool:
    """True when d1 counts the completion as solving the Countdown problem (numbers, target)."""
    equation = d1_countdown_equation(text)
    if not _uses_exactly(equation, numbers):
        return False
    return abs(d1_countdown_value(equation) - target) < 1e-5


# ----------------------------------------------------------------------------------------------------------------
# Sudoku

_SUDOKU_PATTERNS = (
    r"<answer>.*?```\s*([\d\s]+)```",
    r"<answer>(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|</answer>)",
    r"</answer>\s*(.*?)(?:<\|eot_id\|>|<\|endoftext\|>|$)",
    r".*?(\d{16})\s*</answer>",
    r"\b(\d{16})\b",
)


def d1_sudoku_solution(text: str) -> str:
    """The solution string d1 reads: the first pattern capturing non-blank text, whitespace removed ("" if none)."""
    for pattern in _SUDOKU_PATTERNS:
        match = re.search(pattern, text, re.DOTALL)
        if match is not None and match.group(1).strip():
            return re.sub(r"\s", "", match.group(1).strip())
    return ""


def d1_sudoku_cells(text: str, puzzle: str, solution: str) -> tuple[int, int]:
    """(right empty cells, empty cells) of a completion for a 16-character puzzle ("0" = empty) and its solution."""
    empty = [i for i in range(16) if puzzle[i] == "0"]
    answer = d1_sudoku_solution(text)
    if not answer:
        return 0, len(empty)
    answer = answer[:16].ljust(16, "0")
    return sum(answer[i] == solution[i] for i in empty), len(empty)
