"""Checks that a sentence of interpretation rests on measured numbers.

A results script renders its reading of a study ("StableDRL ends ahead of GRPO by 0.069, p = 0.006") from the study's
JSON. `unbacked_numbers(sentence, sources)` returns the numbers of the sentence that are not a value of the JSON
(at the precision printed, in any of the formats the scripts use); `check_sentence` also refuses a sentence with no
number at all, so a comparison ("noisier", "ahead", "more stable") cannot be stated without its figure.

    problems = check_sentence("sd 0.472 against 0.312", [summary], constants=(0.05,))
    assert not problems

Only the summary parts of a JSON count as sources (`SKIPPED_KEYS` drops per-step curves such as every grad norm of
every run, which would back almost any number by chance).
"""

from __future__ import annotations

import math
import re

# a number not glued to a word or an identifier: "0.312", "+0.069", "-0.066", "512", "1e+06"
NUMBER = re.compile(r"(?<![\w.])[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w])")
# per-step or per-draw series: left out of the sources
SKIPPED_KEYS = frozenset({"grad_norm", "reward", "accuracy_draws", "accuracy_std", "runs", "versions", "provenance"})
FORMATS = ("{:.0f}", "{:.1f}", "{:.2f}", "{:.3f}", "{:.4f}", "{:.2g}", "{:.3g}", "{:.4g}", "{:g}")


def numeric_leaves(data, skipped=SKIPPED_KEYS) -> list[float]:
    """Every finite int / float value in a nested dict / list (bools excluded), without the `skipped` keys."""
    out = []
    stack = [data]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            stack += [v for k, v in x.items() if k not in skipped]
        elif isinstance(x, list | tuple):
            stack += list(x)
        elif isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x):
            out.append(float(x))
    return out


def printed_forms(values) -> set[str]:
    """The strings `values` print as in `FORMATS`, unsigned (a printed sign or magnitude of either sign matches)."""
    forms = set()
    for v in values:
        for fmt in FORMATS:
            for x in (v, -v):
                text = fmt.format(x)
                if not text.startswith("-"):
                    forms.add(text)
    return forms


def numbers_in(sentence: str) -> list[str]:
    """The numbers of a sentence, as printed (without a leading sign)."""
    return [m.group(0).lstrip("+-") for m in NUMBER.finditer(sentence)]


def unbacked_numbers(sentence: str, sources, constants=()) -> list[str]:
    """Numbers of `sentence` that are no value of the `sources` (dicts) nor of `constants` at the printed precision."""
    forms = printed_forms([v for s in sources for v in numeric_leaves(s)] + [float(c) for c in constants])
    return [n for n in numbers_in(sentence) if n not in forms]


def check_sentence(sentence: str, sources, constants=()) -> list[str]:
    """Problems of one interpretation sentence: no number at all, or numbers its sources do not hold."""
    if not numbers_in(sentence):
        return [f"no measured number in: {sentence!r}"]
    bad = unbacked_numbers(sentence, sources, constants)
    return [f"{', '.join(bad)} not in the JSON it is rendered from: {sentence!r}"] if bad else []
