"""GSM8K: grade-school word problems with a single numeric answer.

Data: hub id "openai/gsm8k", config "main", splits "train" / "test", columns `question` and `answer` (a worked
solution ending in "#### <number>"). `format_example` keeps the number after the last "####" as `answer`.

Correctness reward (`gsm8k_correctness_reward`, 1.0 / 0.0). The model's answer is `extract_final_answer` of the
completion (last <answer> tag, or last \\boxed{}). It is read as a number by `parse_number`:
  - "$", "\\$", "%", LaTeX thin spaces ("\\,", "\\!") and "{,}" are dropped; a Unicode minus becomes "-";
  - the text must then hold exactly ONE number: optional "-", digits with optional comma thousands groups
    ("1,234,567"), optional decimals ("18.50", ".5"); surrounding words are ignored ("x = 42 apples" is 42);
  - no number, two or more ("12 or 14", "3/4", "5 + 3 = 8"), or one longer than 64 characters gives no answer
    (reward 0).
Gold and prediction are compared exactly as fractions, so "72", "72.0", "$72", "72.00" all equal 72.

Format reward (`gsm8k_format_reward`, at most 0.5): 0.25 for the <reasoning>/<answer> layout, plus 0.25 when the
answer parses as a single number by the rule above.

Official style (`prompt_style="official"`, as the official StableDRL code poses and grades GSM8K): the question as
is, followed with no space by `math.OFFICIAL_BOXED_REQUEST`; columns `prompt` and `answer` (the text after the last
"####"); reward `gsm8k_official_reward`, +1.0 when math-verify with its default settings finds that answer in the
whole completion, else -1.0 (the rule of `math.official_math_score`: several boxes score -1, an untagged, unboxed
"the answer is 72" can score +1).
"""

from __future__ import annotations

import re
from fractions import Fraction

from .common import (
    ANSWER_FORMAT_INSTRUCTIONS,
    choose_format,
    completion_to_text,
    extract_final_answer,
    format_dataset,
    format_score,
    load_rows,
    reward_column,
    take_samples,
    user_prompt,
)
from .math import OFFICIAL_BOXED_REQUEST, official_math_score

DEFAULT_PATH = "openai/gsm8k"
DEFAULT_CONFIG = "main"
SYSTEM_PROMPT = ANSWER_FORMAT_INSTRUCTIONS + "\nThe final answer is a single number, without units."

# A number: "-" optional, then digits with comma thousands groups or plain digits, then optional decimals; or ".5".
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")
MAX_NUMBER_CHARS = 64
# Characters that may decorate a number but never change it.
_DROP = ("\\$", "$", "\\%", "%", "\\,", "\\!", "{,}")


def gsm8k_gold(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after the last "####" (the whole text when absent)."""
    return answer.rsplit("####", 1)[-1].strip()


def parse_number(text: str) -> Fraction | None:
    """The single number written in `text` as an exact Fraction, or None when there is none or more than one."""
    for token in _DROP:
        # "{,}" is LaTeX's thousands comma; keep it as a comma so the grouping rule still applies.
        text = text.replace(token, "," if token == "{,}" else "")
    text = text.replace("\u2212", "-")
    numbers = _NUMBER.findall(text)
    # Python refuses int() of strings over 4300 digits; no GSM8K answer is anywhere near this cap.
    if len(numbers) != 1 or len(numbers[0]) > MAX_NUMBER_CHARS:
        return None
    return Fraction(numbers[0].replace(",", ""))


def gsm8k_correctness_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when the completion's single final number equals the gold answer's, else 0.0 (None: no gold)."""
    golds = reward_column(kwargs, "answer", len(completions), "gsm8k_correctness_reward")
    rewards: list[float | None] = []
    for completion, gold in zip(completions, golds):
        if gold is None:
            rewards.append(None)
            continue
        gold_value = parse_number(gsm8k_gold(str(gold)))
        answer = extract_final_answer(completion_to_text(completion))
        value = parse_number(answer) if answer is not None else None
        rewards.append(1.0 if value is not None and gold_value is not None and value == gold_value else 0.0)
    return rewards


def gsm8k_format_reward(prompts, completions, **kwargs) -> list[float]:
    """0.25 for the reasoning/answer layout + 0.25 when the answer is a single number."""
    return [format_score(completion_to_text(c), lambda answer: parse_number(answer) is not None) for c in completions]


def gsm8k_official_reward(prompts, completions, **kwargs) -> list[float | None]:
    """The official GSM8K grading: +1.0 / -1.0 by math-verify on the whole completion (None: no gold)."""
    golds = reward_column(kwargs, "answer", len(completions), "gsm8k_official_reward")
    return [
        None if gold is None else official_math_score(completion_to_text(completion), gsm8k_gold(str(gold)))
        for completion, gold in zip(completions, golds)
    ]


def format_example_official(row: dict, system_prompt: str = "") -> dict:
    """A GSM8K row -> {"prompt": [question + OFFICIAL_BOXED_REQUEST], "answer": final answer string}."""
    return {"prompt": user_prompt(row["question"] + OFFICIAL_BOXED_REQUEST, None), "answer": gsm8k_gold(row["answer"])}


def format_example(row: dict, system_prompt: str = SYSTEM_PROMPT) -> dict:
    """A GSM8K row -> {"prompt": [user message], "answer": final number string}."""
    return {"prompt": user_prompt(row["question"].strip(), system_prompt), "answer": gsm8k_gold(row["answer"])}


def load_gsm8k(
    split: str = "train",
    *,
    path: str | None = None,
    data_files=None,
    num_samples: int | None = None,
    system_prompt: str | None = None,
    seed: int = 0,
    prompt_style: str = "tagged",
):
    """GSM8K as a conversational dataset with columns `prompt` and `answer`."""
    formatter, instructions = choose_format(
        "gsm8k", prompt_style, system_prompt, format_example, format_example_official, SYSTEM_PROMPT
    )
    if path is None and data_files is None:
        path = DEFAULT_PATH
    rows = load_rows(split, path=path, config=DEFAULT_CONFIG if path == DEFAULT_PATH else None, data_files=data_files)
    rows = take_samples(rows, num_samples, seed)
    return format_dataset(rows, formatter, instructions)
