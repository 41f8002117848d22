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

Official style (`prompt_style="official"`, as the official StableDRL code poses and grades Countdown):
  - prompt: "Given numbers [44, 19, 35], find an equation that equals 98." followed by `OFFICIAL_REQUEST` (reasoning
    in <reasoning> tags, the final equation in <answer> tags, example "<answer> 1 + 1 </answer>").
  - reward (`countdown_official_reward`, 1.0 / 0.1 / 0.0): the answer is the content of the LAST <answer> match read
    as the official code reads it (`common.official_last_answer`); none: 0.0. It scores 1.0 when every digit run in
    it is one of the given numbers, each used at most once (a SUBSET of the numbers is accepted; "1.5" uses 1 and 5),
    and its value as a Python arithmetic expression is within 1e-5 of the target; any other tagged answer scores 0.1.
  - the official code computes that value with Python's eval after a character filter (digits, + - * / ( ) . and
    whitespace). Here `evaluate_python_arithmetic` computes the same value WITHOUT evaluating anything as code: a
    small parser of that character set with Python's grammar and number semantics (** right-associative and binding
    tighter than a unary sign on its left, //, unary + and -, int and float literals, int/int true division, float
    rounding, complex results of fractional powers of negatives, the same errors: leading zeros in an integer,
    division by zero, overflow, a newline outside parentheses). Two documented limits where eval would differ:
    an integer power whose result would exceed `MAX_POWER_BITS` bits is refused instead of computed (eval of
    "95**36**32" never returns; here it is a non-evaluable answer, 0.1, at once), and parentheses and power
    exponents nested deeper than `MAX_PYTHON_DEPTH` (100) in all are refused (Python allows 200 parentheses).
"""

from __future__ import annotations

import re
from collections import Counter
from fractions import Fraction

from .common import (
    ANSWER_FORMAT_INSTRUCTIONS,
    choose_format,
    completion_to_text,
    extract_final_answer,
    format_dataset,
    format_score,
    load_rows,
    official_last_answer,
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

OFFICIAL_REQUEST = (
    " Please put the reasoning in <reasoning> tags and the final equation in <answer> tags, e.g. <answer> 1 + 1 "
    "</answer>."
)
OFFICIAL_FORMAT_SCORE = 0.1  # the official score of a tagged answer that does not reach the target
OFFICIAL_TOLERANCE = 1e-5
MAX_POWER_BITS = 1 << 16  # integer powers beyond this size are refused, not computed
MAX_PYTHON_DEPTH = 100

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


# ----------------------------------------------------------------------------------------------------------------
# the official grading: Python's arithmetic semantics on the official character set, without eval

_PY_SPACES = " \t\f"  # whitespace Python's tokenizer skips anywhere
_PY_NEWLINES = "\n\r"  # ... and these only inside parentheses
_PY_OPERATORS = ("**", "//", "+", "-", "*", "/", "(", ")")


def _python_tokens(expression: str) -> list:
    """Number values (int / float) and operator strings, as Python's tokenizer reads them; anything else raises."""
    tokens: list = []
    depth, i, n = 0, 0, len(expression)
    while i < n:
        char = expression[i]
        if char in _PY_SPACES:
            i += 1
        elif char in _PY_NEWLINES:
            if depth == 0:
                raise ExpressionError("a line break outside parentheses")
            i += 1
        elif "0" <= char <= "9" or (char == "." and i + 1 < n and "0" <= expression[i + 1] <= "9"):
            j = i
            while j < n and "0" <= expression[j] <= "9":
                j += 1
            is_float = j < n and expression[j] == "."
            if is_float:
                j += 1
                while j < n and "0" <= expression[j] <= "9":
                    j += 1
            literal = expression[i:j]
            try:
                if is_float:
                    tokens.append(float(literal))
                elif literal.lstrip("0") and literal[0] == "0":
                    raise ExpressionError(f"leading zeros in the integer {literal!r}")
                else:
                    tokens.append(int(literal))  # ValueError beyond 4300 digits, as Python refuses such literals
            except ValueError as error:
                raise ExpressionError(str(error)) from error
            i = j
        else:
            op = next((op for op in _PY_OPERATORS if expression.startswith(op, i)), None)
            if op is None:
                raise ExpressionError(f"unexpected character {char!r}")
            depth += {"(": 1, ")": -1}.get(op, 0)
            tokens.append(op)
            i += len(op)
    return tokens


def _power(base, exponent):
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent > 0
        and exponent * (abs(base).bit_length() - 1) > MAX_POWER_BITS
    ):
        raise ExpressionError(f"an integer power of more than {MAX_POWER_BITS} bits")
    return base**exponent


_BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "**": _power,
}


class _PythonArithmetic:
    """Python's expression grammar restricted to numbers, + - * / // ** and parentheses, evaluated on the way:
    sum := term (('+'|'-') term)*    term := factor (('*'|'/'|'//') factor)*    factor := ('+'|'-')* power
    power := atom ['**' factor]      atom := NUMBER | '(' sum ')'"""

    def __init__(self, tokens: list):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self):
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self):
        token = self.peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self.pos += 1
        return token

    def nested(self, parse):
        """Run `parse` one level deeper (a parenthesised group or a power's exponent), within MAX_PYTHON_DEPTH."""
        self.depth += 1
        if self.depth > MAX_PYTHON_DEPTH:
            raise ExpressionError(f"parentheses and powers nested deeper than {MAX_PYTHON_DEPTH}")
        value = parse()
        self.depth -= 1
        return value

    @staticmethod
    def apply(op: str, a, b):
        try:
            return _BINARY[op](a, b)
        except (ArithmeticError, TypeError, ValueError) as error:  # division by zero, overflow, complex // ...
            raise ExpressionError(f"{type(error).__name__}: {error}") from error

    def sum(self):
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            value = self.apply(op, value, self.term())
        return value

    def term(self):
        value = self.factor()
        while self.peek() in ("*", "/", "//"):
            op = self.take()
            value = self.apply(op, value, self.factor())
        return value

    def factor(self):
        signs = []
        while self.peek() in ("+", "-"):
            signs.append(self.take())
        value = self.power()
        for sign in reversed(signs):
            value = -value if sign == "-" else +value
        return value

    def power(self):
        base = self.atom()
        if self.peek() == "**":
            self.take()
            return self.apply("**", base, self.nested(self.factor))
        return base

    def atom(self):
        token = self.take()
        if token == "(":
            value = self.nested(self.sum)
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return value
        if isinstance(token, str):
            raise ExpressionError(f"expected a number or '(', got {token!r}")
        return token


def evaluate_python_arithmetic(expression: str):
    """The value Python's eval gives an arithmetic expression (int, float or complex), computed without eval.

    For text made of ASCII digits, + - * / ( ) . and whitespace (the official character filter), this returns what
    `eval(expression)` returns and raises ExpressionError where eval raises (or returns a non-number, such as
    "()" or "..."), except for the two limits in the module docstring (huge integer powers, deep nesting).
    """
    tokens = _python_tokens(expression)
    parser = _PythonArithmetic(tokens)
    value = parser.sum()
    if parser.pos != len(tokens):
        raise ExpressionError(f"unexpected {tokens[parser.pos]!r} after a complete expression")
    return value


def uses_available_numbers(answer: str, numbers: list[int]) -> bool:
    """True when every run of ASCII digits in `answer`, read as an int, is one of `numbers`, each at most once.

    Runs are compared as digit strings without leading zeros ("007" is 7), never converted with int(): Python
    refuses int() of more than 4,300 digits, and a model can write such a run.
    """
    available = Counter(str(int(n)) for n in numbers)
    used = Counter(run.lstrip("0") or "0" for run in re.findall(r"[0-9]+", answer))
    return all(available[number] >= count for number, count in used.items())


def countdown_official_score(text: str, numbers: list[int], target: int) -> float:
    """The official Countdown score of a completion: 1.0, 0.1 (a tagged answer that misses) or 0.0 (no tags)."""
    answer = official_last_answer(text)
    if answer is None:
        return 0.0
    if not uses_available_numbers(answer, numbers):
        return OFFICIAL_FORMAT_SCORE
    try:
        value = evaluate_python_arithmetic(answer)
    except ExpressionError:
        return OFFICIAL_FORMAT_SCORE
    return 1.0 if abs(value - target) < OFFICIAL_TOLERANCE else OFFICIAL_FORMAT_SCORE


def countdown_official_reward(prompts, completions, **kwargs) -> list[float | None]:
    """The official Countdown grading: 1.0 / 0.1 / 0.0 (see the module docstring; None: no numbers or target)."""
    n = len(completions)
    all_numbers = reward_column(kwargs, ("numbers", "nums"), n, "countdown_official_reward")
    targets = reward_column(kwargs, "target", n, "countdown_official_reward")
    return [
        None
        if numbers is None or target is None
        else countdown_official_score(completion_to_text(completion), parse_numbers(numbers), int(target))
        for completion, numbers, target in zip(completions, all_numbers, targets)
    ]


# ----------------------------------------------------------------------------------------------------------------
# data


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


def row_numbers_target(row: dict) -> tuple[list[int], int]:
    """The numbers and target of a data row: columns `numbers` or `nums` and `target`, or the official files'
    `input` ("30,100,93") and `output` ("23")."""
    for numbers_key, target_key in (("numbers", "target"), ("nums", "target"), ("input", "output")):
        if row.get(numbers_key) is not None and row.get(target_key) is not None:
            return parse_numbers(row[numbers_key]), int(str(row[target_key]).strip())
    raise ValueError(
        f"countdown: a row needs columns numbers (or nums) and target, or input and output; got columns {sorted(row)}"
    )


def format_example_official(row: dict, system_prompt: str = "") -> dict:
    """A Countdown row -> {"prompt": [the official question and request], "numbers": list[int], "target": int}."""
    numbers, target = row_numbers_target(row)
    question = f"Given numbers {numbers}, find an equation that equals {target}.{OFFICIAL_REQUEST}"
    return {"prompt": user_prompt(question, None), "numbers": numbers, "target": target}


def format_example(row: dict, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """A Countdown row -> {"prompt": [user message], "numbers": list[int], "target": int}."""
    numbers, target = row_numbers_target(row)
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
    prompt_style: str = "tagged",
):
    """Countdown as a conversational dataset with columns `prompt`, `numbers` and `target`.

    With the default hub source, "train" / "test" are carved from its single split (the last TEST_SIZE rows are the
    test set). With `path` or `data_files`, `split` names the split to read.
    """
    formatter, instructions = choose_format(
        "countdown", prompt_style, system_prompt, format_example, format_example_official, SYSTEM_PROMPT
    )
    if path is None and data_files is None:
        if split not in ("train", "test"):
            raise ValueError(f"split: the default Countdown source has 'train' and 'test', got {split!r}")
        rows = load_rows("train", path=DEFAULT_PATH, config=None)
        cut = len(rows) - TEST_SIZE
        rows = rows.select(range(cut) if split == "train" else range(cut, len(rows)))
    else:
        rows = load_rows(split, path=path, config=None, data_files=data_files)
    rows = take_samples(rows, num_samples, seed)
    return format_dataset(rows, formatter, instructions)
