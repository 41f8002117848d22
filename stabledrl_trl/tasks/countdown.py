"""Countdown: combine the given numbers with + - * / and parentheses to reach a target.

Data: hub id "Jiayi-Pan/Countdown-Tasks-3to4" (columns `target` int, `nums` list of 3-4 ints; one "train" split
of about 490k rows). As that set has no test split, with the default source split "train" is every row except the
last `TEST_SIZE` (1024) and split "test" is those last rows. `format_example` writes `numbers` (list[int]) and
`target` (int); `nums` may also be a string such as "[44, 19, 35]" or "44 19 35" (local CSV files).

Correctness reward (`countdown_correctness_reward`, 1.0 / 0.0). The answer is `extract_final_answer` of the
completion (last <answer> tag, or last \\boxed{}). It scores 1.0 only when ALL of these hold:
  - it is an expression, optionally followed by one "= N" where the integer N equals the target;
  - the expression is at most `MAX_EXPRESSION_CHARS` (256) characters and nests at most `MAX_DEPTH` (32) levels;
  - it uses only non-negative integer literals (at most 12 digits), the binary operators + - * / (the Unicode
    minus, times and division signs count as their ASCII forms) and parentheses; no unary signs, no
    decimals, no letters, no "**" or "//", nothing else;
  - the multiset of its integer literals equals the given numbers: each number used EXACTLY once (as d1 does);
  - evaluated exactly with Fractions (no division by zero), it equals the target.
The expression is evaluated by the small recursive-descent parser below, never by eval/exec.

Format reward (`countdown_format_reward`, at most 0.5): 0.25 for the <reasoning>/<answer> layout, plus 0.25 when
the answer parses as an expression by the grammar above (whatever its numbers or value).
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from .common import (
    ANSWER_FORMAT_INSTRUCTIONS,
    completion_to_text,
    extract_final_answer,
    format_dataset,
    format_score,
    load_rows,
    reward_column,
    take_samples,
    user_prompt,
)

DEFAULT_PATH = "Jiayi-Pan/Countdown-Tasks-3to4"
TEST_SIZE = 1024
SYSTEM_PROMPT = (
    ANSWER_FORMAT_INSTRUCTIONS + "\nInside the answer tags, write only the arithmetic expression, for example "
    "<answer>(1 + 2) * 3</answer>."
)

MAX_EXPRESSION_CHARS = 256
MAX_DEPTH = 32
MAX_DIGITS = 12
_OPERATORS = {"+": "+", "-": "-", "*": "*", "/": "/", "\u2212": "-", "\u00d7": "*", "\u00f7": "/"}


class ExpressionError(ValueError):
    """The text is not a well-formed Countdown expression (or divides by zero)."""


def tokenize(expression: str) -> list[str]:
    """Integer literals, the four operators (canonical ASCII form) and parentheses; anything else raises."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    tokens: list[str] = []
    i = 0
    while i < len(expression):
        char = expression[i]
        if char.isspace():
            i += 1
        elif "0" <= char <= "9":
            j = i
            while j < len(expression) and "0" <= expression[j] <= "9":
                j += 1
            if j - i > MAX_DIGITS:
                raise ExpressionError(f"integer literal longer than {MAX_DIGITS} digits")
            tokens.append(expression[i:j])
            i = j
        elif char in _OPERATORS:
            tokens.append(_OPERATORS[char])
            i += 1
        elif char in "()":
            tokens.append(char)
            i += 1
        else:
            raise ExpressionError(f"unexpected character {char!r}")
    return tokens


class _Parser:
    """Recursive descent over   expr := term (('+'|'-') term)*   term := atom (('*'|'/') atom)*
    atom := INTEGER | '(' expr ')'.   Binary operators only; evaluation is exact (Fraction)."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.pos = 0
        self.numbers: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return token

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.atom(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            rhs = self.atom(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ExpressionError("division by zero")
            else:
                value = value / rhs
        return value

    def atom(self, depth: int) -> Fraction:
        token = self.take()
        if token == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return value
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        raise ExpressionError(f"expected a number or '(', got {token!r}")


def evaluate_expression(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of a Countdown expression and the integer literals it uses, in order of appearance.

    Raises ExpressionError for anything outside the grammar (see the module docstring) or a division by zero.
    """
    tokens = tokenize(expression)
    if not tokens:
        raise ExpressionError("empty expression")
    parser = _Parser(tokens)
    value = parser.expr(depth=0)
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[parser.pos]!r} after a complete expression")
    return value, parser.numbers


def split_equation(answer: str) -> tuple[str, int | None]:
    """("expr", None) for "expr"; ("expr", N) for "expr = N". Raises for two "=" or a right side not an integer."""
    parts = answer.split("=")
    if len(parts) == 1:
        return answer, None
    if len(parts) != 2:
        raise ExpressionError("more than one '='")
    right = parts[1].strip()
    if not (right.isascii() and right.isdigit() and len(right) <= MAX_DIGITS):
        raise ExpressionError(f"the right side of '=' is {right!r}, not an integer")
    return parts[0], int(right)


def is_countdown_solution(answer: str | None, numbers: list[int], target: int) -> bool:
    """True when `answer` is an expression using each of `numbers` exactly once and equal to `target`."""
    if answer is None:
        return False
    try:
        expression, stated = split_equation(answer)
        value, used = evaluate_expression(expression)
    except ExpressionError:
        return False
    if stated is not None and stated != target:
        return False
    return Counter(used) == Counter(int(n) for n in numbers) and value == target


def _is_expression(answer: str) -> bool:
    try:
        evaluate_expression(split_equation(answer)[0])
    except ExpressionError:
        return False
    return True


def parse_numbers(value) -> list[int]:
    """A list of ints from a list/tuple of ints or a string such as "[44, 19, 35]" or "44 19 35"."""
    if isinstance(value, str):
        return [int(n) for n in re.findall(r"-?\d+", value)]
    return [int(n) for n in value]


def countdown_correctness_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when the answer uses every given number exactly once and evaluates to the target, else 0.0."""
    n = len(completions)
    all_numbers = reward_column(kwargs, ("numbers", "nums"), n, "countdown_correctness_reward")
    targets = reward_column(kwargs, "target", n, "countdown_correctness_reward")
    rewards: list[float | None] = []
    for completion, numbers, target in zip(completions, all_numbers, targets):
        if numbers is None or target is None:
            rewards.append(None)
            continue
        answer = extract_final_answer(completion_to_text(completion))
        rewards.append(1.0 if is_countdown_solution(answer, parse_numbers(numbers), int(target)) else 0.0)
    return rewards


def countdown_format_reward(prompts, completions, **kwargs) -> list[float]:
    """0.25 for the reasoning/answer layout + 0.25 when the answer parses as an arithmetic expression."""
    return [format_score(completion_to_text(c), _is_expression) for c in completions]


def format_example(row: dict, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """A Countdown row -> {"prompt": [user message], "numbers": list[int], "target": int}."""
    numbers = parse_numbers(row["numbers"] if "numbers" in row else row["nums"])
    target = int(row["target"])
    question = (
        f"Using the numbers {numbers}, write an arithmetic expression that equals {target}. Use each number "
        "exactly once, combined with +, -, * and / and parentheses."
    )
    return {"prompt": user_prompt(question, system_prompt), "numbers": numbers, "target": target}


def load_countdown(
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
):
    """Countdown as a conversational dataset with columns `prompt`, `numbers` and `target`.

    With the default hub source, "train" / "test" are carved from its single split (the last TEST_SIZE rows are the
    test set). With `path` or `data_files`, `split` names the split to read.
    """
    if path is None and data_files is None:
        if split not in ("train", "test"):
            raise ValueError(f"split: the default Countdown source has 'train' and 'test', got {split!r}")
        rows = load_rows("train", path=DEFAULT_PATH, config=None)
        cut = len(rows) - TEST_SIZE
        rows = rows.select(range(cut) if split == "train" else range(cut, len(rows)))
    else:
        rows = load_rows(split, path=path, config=None, data_files=data_files)
    rows = take_samples(rows, num_samples, seed)
    return format_dataset(rows, format_example, SYSTEM_PROMPT if system_prompt is None else system_prompt)
