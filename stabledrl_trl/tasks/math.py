"""MATH (competition mathematics): LaTeX answers checked for mathematical equivalence with math-verify.

Data. Train: hub id "DigitalLearningGmbH/MATH-lighteval" (all 7 subjects in one config, 7,500 train / 5,000 test
rows; columns `problem`, `solution`, `level`, `type`); the gold answer is the last \\boxed{} of `solution`. Test
(the default for split "test"): "HuggingFaceH4/MATH-500" (500 rows, split "test" only, with an `answer` column).
`format_example` writes `answer` from the `answer` column when present, else from the solution's last box.

Correctness reward (`math_correctness_reward`, 1.0 / 0.0). The model's answer is `extract_final_answer` (last
<answer> tag, its last \\boxed{} if it has one; else the last \\boxed{} in the text). It is read as ONE LaTeX
expression (surrounding `$...$` or `\\(...\\)` removed) and compared to the gold with math-verify's `verify`
(numeric, symbolic, set/interval and equation equivalence: "\\frac12" = "0.5", "x=5" = "5").
Safety: only math-verify's LaTeX extraction is used, never its plain-expression mode, because that one passes text
to sympy's `parse_expr`, which evaluates it as Python; answers longer than `MAX_ANSWER_CHARS` score 0 unparsed;
parsing and comparison each stop after `PARSE_TIMEOUT_S` / `VERIFY_TIMEOUT_S` seconds (math-verify's signal alarm,
main thread only; in other threads the length cap is the only bound); any exception scores 0.

Problem filter (`filter_problems`; `load_math(..., max_level=, max_problem_chars=, max_problem_words=)`): the
official MATH runs train on "qwedsacf/competition_math" (12,500 rows, one "train" split) keeping problems of level
at most 4, with 1 to 1,499 characters and at most 300 whitespace-separated words. A level is the last word of the
`level` column ("Level 3" is 3); one that does not read as an integer ("Level ?") counts as 5, as the official
loader reads it.

Format reward (`math_format_reward`, at most 0.5): 0.25 for the <reasoning>/<answer> layout, plus 0.25 when the
<answer> content holds a closed, non-empty \\boxed{...}.

Official style (`prompt_style="official"`, as the official StableDRL code poses and grades MATH and GSM8K):
  - prompt: the problem text as is, followed with no space by `OFFICIAL_BOXED_REQUEST`, one user message, no
    instructions before it. The request is written with doubled backslashes ("\\\\boxed{}"), as the official code
    writes it in a raw string, so the model sees two backslash characters before each "boxed".
  - columns: `prompt`, `answer` (as in the tagged style) and `solution` (the whole worked solution, None if absent).
  - reward (`math_official_reward`, +1.0 / -1.0): +1 when math-verify with its default settings (`parse` with LaTeX
    and plain-expression extraction, boxed answers first, then "answer is" phrases, then any expression or number;
    `verify(gold, prediction)`; 5-second time limits) finds the gold in the WHOLE completion, else -1 (also on any
    parser error or time-out). The gold is the whole `solution` (math-verify reads its box), else `answer`. Several
    boxed answers in a completion parse as a set and score -1 against a single gold.
  - unlike the tagged reward, this one hands model text to math-verify's plain-expression mode. That mode only ever
    sees digits, operators, parentheses, dots and spaces (its extraction regex), which sympy parses unevaluated, so
    no code runs, but comparing a huge power can take until the time limit. The limits use `signal.alarm`, so the
    official maths rewards refuse to run outside the main thread (TRL calls reward functions from the main thread).
"""

from __future__ import annotations

import logging
import threading

from .common import (
    ANSWER_FORMAT_INSTRUCTIONS,
    FORMAT_ANSWER_SCORE,
    FORMAT_STRUCTURE_SCORE,
    boxed_contents,
    choose_format,
    completion_to_text,
    extract_final_answer,
    extract_tag,
    format_dataset,
    has_answer_format,
    last_boxed,
    load_rows,
    reward_column,
    take_samples,
    user_prompt,
)

DEFAULT_TRAIN_PATH = "DigitalLearningGmbH/MATH-lighteval"
DEFAULT_TEST_PATH = "HuggingFaceH4/MATH-500"
SYSTEM_PROMPT = ANSWER_FORMAT_INSTRUCTIONS + "\nInside the answer tags, write the final answer as \\boxed{...}."

# Appended to the problem by the official prompts; two backslash characters before each "boxed", as the model sees it.
OFFICIAL_BOXED_REQUEST = r"(Please put the final answer in \\boxed{} tag, i.e. $\\boxed{answer here}$)"
OFFICIAL_TIMEOUT_S = 5  # math-verify's parse and verify time limits in the official grading

MAX_ANSWER_CHARS = 512
PARSE_TIMEOUT_S = 2
VERIFY_TIMEOUT_S = 2

logger = logging.getLogger(__name__)


MAX_LEVEL = 5  # MATH levels run from 1 to 5


def problem_level(level) -> int:
    """The level of a MATH row's `level` value: the integer of its last word ("Level 3" -> 3); 5 when unreadable."""
    try:
        return int(str(level).split()[-1])
    except (IndexError, ValueError):
        return MAX_LEVEL


def check_problem_filter(max_level=None, max_problem_chars=None, max_problem_words=None, level_name="max_level"):
    """Raise a ValueError naming the field when a filter bound is not None or a positive int (level: 1 to 5)."""
    for name, value, top in (
        (level_name, max_level, MAX_LEVEL),
        ("max_problem_chars", max_problem_chars, None),
        ("max_problem_words", max_problem_words, None),
    ):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (top is not None and value > top):
            bound = f"an integer from 1 to {top}" if top is not None else "a positive integer"
            raise ValueError(f"{name}: expected {bound} or None (no filter), got {value!r}")


def keep_problem(row: dict, max_level=None, max_problem_chars=None, max_problem_words=None) -> bool:
    """Whether a MATH row passes the filter: level <= max_level, 0 < characters < max_problem_chars,
    words <= max_problem_words (None: no bound)."""
    problem = str(row.get("problem") or "")
    if max_level is not None and problem_level(row.get("level")) > max_level:
        return False
    if max_problem_chars is not None and not 0 < len(problem) < max_problem_chars:
        return False
    return max_problem_words is None or len(problem.split()) <= max_problem_words


def filter_problems(rows, *, max_level=None, max_problem_chars=None, max_problem_words=None):
    """The rows of a MATH `datasets.Dataset` that pass `keep_problem` (all rows when every bound is None).

    The official runs use max_level=4, max_problem_chars=1500, max_problem_words=300.
    """
    check_problem_filter(max_level, max_problem_chars, max_problem_words)
    if max_level is None and max_problem_chars is None and max_problem_words is None:
        return rows
    if max_level is not None and "level" not in rows.column_names:
        raise ValueError(
            f"max_level: the MATH data has no 'level' column (columns {rows.column_names}); use a source with "
            "levels, such as qwedsacf/competition_math, or leave max_level unset"
        )
    bounds = dict(max_level=max_level, max_problem_chars=max_problem_chars, max_problem_words=max_problem_words)
    return rows.filter(keep_problem, fn_kwargs=bounds, desc="filtering MATH problems")


def math_gold(row: dict) -> str | None:
    """The gold answer of a MATH row: its `answer` column, else the last \\boxed{} of its `solution`."""
    answer = row.get("answer")
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    solution = row.get("solution")
    return last_boxed(solution) if solution else None


def _strip_math_delimiters(text: str) -> str:
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(text) >= len(left) + len(right) and text.startswith(left) and text.endswith(right):
            return text[len(left) : -len(right)].strip()
    return text


def _parse_latex(expression: str, timeout: int | None):
    from math_verify import LatexExtractionConfig, parse

    # Wrapping in \boxed{} makes math-verify read the whole string as one expression (box extraction first).
    return parse(
        "\\boxed{" + expression + "}",
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=timeout,
    )


def answers_match(prediction: str | None, gold: str | None) -> bool:
    """True when math-verify finds the two LaTeX answers equivalent; False on anything odd (never raises)."""
    if prediction is None or gold is None:
        return False
    prediction, gold = _strip_math_delimiters(prediction), _strip_math_delimiters(gold)
    if not prediction or not gold or len(prediction) > MAX_ANSWER_CHARS:
        return False
    # math-verify's timeouts use signal.alarm, which only the main thread may set.
    in_main = threading.current_thread() is threading.main_thread()
    try:
        from math_verify import verify

        gold_parsed = _parse_latex(gold, PARSE_TIMEOUT_S if in_main else None)
        pred_parsed = _parse_latex(prediction, PARSE_TIMEOUT_S if in_main else None)
        if not gold_parsed or not pred_parsed:
            return False
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=VERIFY_TIMEOUT_S if in_main else None))
    except Exception:  # a reward must never stop training: any parser/sympy failure is a wrong answer
        logger.debug("math-verify failed on prediction %r vs gold %r", prediction, gold, exc_info=True)
        return False


def _has_box_in_answer(text: str) -> bool:
    answer = extract_tag(text)
    if answer is None:
        return False
    boxes = boxed_contents(answer)
    return bool(boxes) and all(box is not None for box in boxes) and bool(boxes[-1])


def math_correctness_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when the completion's final answer is equivalent to the gold (math-verify), else 0.0 (None: no gold)."""
    n = len(completions)
    if kwargs.get("answer") is not None:
        golds = reward_column(kwargs, "answer", n, "math_correctness_reward")
    else:
        solutions = reward_column(kwargs, ("answer", "solution"), n, "math_correctness_reward")
        golds = [last_boxed(s) if s is not None else None for s in solutions]
    rewards: list[float | None] = []
    for completion, gold in zip(completions, golds):
        if gold is None:
            rewards.append(None)
            continue
        prediction = extract_final_answer(completion_to_text(completion))
        rewards.append(1.0 if answers_match(prediction, str(gold)) else 0.0)
    return rewards


def math_format_reward(prompts, completions, **kwargs) -> list[float]:
    """0.25 for the reasoning/answer layout + 0.25 when the <answer> content holds a closed, non-empty \\boxed{}."""
    rewards = []
    for completion in completions:
        text = completion_to_text(completion)
        score = FORMAT_STRUCTURE_SCORE if has_answer_format(text) else 0.0
        rewards.append(score + (FORMAT_ANSWER_SCORE if _has_box_in_answer(text) else 0.0))
    return rewards


def official_math_score(completion: str, gold: str) -> float:
    """+1.0 when math-verify (default settings) finds `gold` in the whole `completion`, else -1.0 (never raises)."""
    from math_verify import parse, verify

    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "official maths grading: math-verify's time limits use signal.alarm, which works only in the main thread; "
            "call the official rewards from the main thread (TRL does) or use reward_style 'tagged'"
        )
    try:
        gold_parsed = parse(str(gold), parsing_timeout=OFFICIAL_TIMEOUT_S)
        pred_parsed = parse(str(completion), parsing_timeout=OFFICIAL_TIMEOUT_S)
        return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=OFFICIAL_TIMEOUT_S) else -1.0
    except Exception:  # the official grading scores any failure as a wrong answer
        logger.debug("math-verify failed on completion %r vs gold %r", completion, gold, exc_info=True)
        return -1.0


def math_official_reward(prompts, completions, **kwargs) -> list[float | None]:
    """The official MATH grading: +1.0 / -1.0 by math-verify on the whole completion (None: no gold)."""
    n = len(completions)
    if kwargs.get("solution") is None and kwargs.get("answer") is None:
        reward_column(kwargs, ("solution", "answer"), n, "math_official_reward")  # raises, naming both columns
    columns = {
        name: reward_column(kwargs, name, n, "math_official_reward") if kwargs.get(name) is not None else [None] * n
        for name in ("solution", "answer")
    }
    rewards: list[float | None] = []
    for completion, solution, answer in zip(completions, columns["solution"], columns["answer"]):
        gold = solution if solution is not None else answer
        rewards.append(None if gold is None else official_math_score(completion_to_text(completion), str(gold)))
    return rewards


def format_example_official(row: dict, system_prompt: str = "") -> dict:
    """A MATH row -> {"prompt": [problem + OFFICIAL_BOXED_REQUEST], "answer": gold answer, "solution": solution}."""
    solution = row.get("solution")
    return {
        "prompt": user_prompt(row["problem"] + OFFICIAL_BOXED_REQUEST, None),
        "answer": math_gold(row),
        "solution": None if solution is None else str(solution),
    }


def format_example(row: dict, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """A MATH / MATH-500 row -> {"prompt": [user message], "answer": gold LaTeX answer}."""
    return {"prompt": user_prompt(row["problem"].strip(), system_prompt), "answer": math_gold(row)}


def load_math(
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    prompt_style: str = "tagged",
    max_level: int | None = None,
    max_problem_chars: int | None = None,
    max_problem_words: int | None = None,
):
    """MATH as a conversational dataset with columns `prompt` and `answer` (official style: also `solution`).

    Without `path`/`data_files`: split "train" reads MATH-lighteval's train split, split "test" reads MATH-500.
    Pass `path="DigitalLearningGmbH/MATH-lighteval", split="test"` for the full 5,000-problem test set.
    max_level, max_problem_chars, max_problem_words: keep only the problems `filter_problems` keeps (before
    `num_samples` are drawn); the official runs: `path="qwedsacf/competition_math"`, 4, 1500, 300.
    """
    check_problem_filter(max_level, max_problem_chars, max_problem_words)
    formatter, instructions = choose_format(
        "math", prompt_style, system_prompt, format_example, format_example_official, SYSTEM_PROMPT
    )
    if path is None and data_files is None:
        path = DEFAULT_TEST_PATH if split == "test" else DEFAULT_TRAIN_PATH
    rows = load_rows(split, path=path, config=None, data_files=data_files)
    rows = filter_problems(
        rows, max_level=max_level, max_problem_chars=max_problem_chars, max_problem_words=max_problem_words
    )
    rows = take_samples(rows, num_samples, seed)
    return format_dataset(rows, formatter, instructions)
