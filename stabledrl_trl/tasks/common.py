"""Shared pieces of the tasks: completion text, answer extraction, the answer format, dataset loading.

Answer format (all tasks). The prompt asks the model to reason first and then give the final answer in tags:

    <reasoning>
    ...
    </reasoning>
    <answer>
    ...
    </answer>

`extract_final_answer` reads the answer the correctness rewards grade:
  1. the content of the LAST complete `<answer>...</answer>` pair; if that content holds a `\\boxed{...}`, the
     content of its last top-level box (so `<answer>\\boxed{42}</answer>` and `<answer>42</answer>` agree);
  2. without an answer tag: the content of the last top-level `\\boxed{...}` in the whole text;
  3. otherwise None (reward 0). There is no fallback to "the last number in the text".

Format rewards (all tasks, at most 0.5): `FORMAT_STRUCTURE_SCORE` (0.25) when `has_answer_format(text)` holds, plus
`FORMAT_ANSWER_SCORE` (0.25) when the answer content is well formed for the task (each task documents its rule).

Rewards follow TRL's protocol `reward(prompts, completions, **kwargs) -> list[float | None]`: completions are strings
or lists of chat messages; kwargs carry the dataset's other columns as lists. A row whose gold column is None gets
None (TRL then ignores that reward for the row, as for a row of another task in a mixed dataset).

Prompt styles (`PROMPT_STYLES`). "tagged" (the default) is the format above. "official" poses each task as the
official StableDRL code does (one user message, no instruction block before the question; each task module states
its exact wording) and comes with that code's grading as `<task>_official_reward`, plus `anti_short_boxed_reward`,
the term the official code adds to every task's reward (see its docstring). `official_last_answer` is the official
code's answer-tag reading.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
FORMAT_STRUCTURE_SCORE = 0.25
FORMAT_ANSWER_SCORE = 0.25

ANSWER_FORMAT_INSTRUCTIONS = (
    "Think the problem through step by step inside <reasoning> </reasoning> tags, then write only the final answer "
    "inside <answer> </answer> tags, exactly in this layout:\n"
    "<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>"
)

PROMPT_STYLES = ("tagged", "official")

# File extensions of local data files and the `datasets` builder that reads them.
_BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}


# ----------------------------------------------------------------------------------------------------------------
# completion text and answer extraction


def completion_to_text(completion: Any) -> str:
    """The text of one completion: a string as is, or the joined contents of a list of chat messages.

    TRL passes plain strings for standard datasets and `[{"role": "assistant", "content": ...}]` for conversational
    ones. A message content may also be a list of parts (`{"type": "text", "text": ...}`); text parts are joined.
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        pieces = []
        for message in completion:
            if not isinstance(message, dict):
                raise ValueError(
                    f"completions: expected a string or a list of message dicts, got a list holding {message!r}; "
                    "pass decoded completion strings or [{'role': 'assistant', 'content': ...}] lists"
                )
            if message.get("role", "assistant") != "assistant":
                continue
            content = message.get("content")
            if content is None:
                continue
            if isinstance(content, str):
                pieces.append(content)
            else:
                pieces.extend(part.get("text", "") for part in content if isinstance(part, dict))
        return "".join(pieces)
    raise ValueError(
        f"completions: expected a string or a list of message dicts, got {type(completion).__name__} "
        f"({completion!r:.80}); pass decoded completion strings or [{{'role': 'assistant', 'content': ...}}] lists"
    )


def extract_tag(text: str, open_tag: str = ANSWER_OPEN, close_tag: str = ANSWER_CLOSE) -> str | None:
    """Stripped content of the last complete `open_tag ... close_tag` pair, or None.

    Plain string search (no regex backtracking), linear in the text length.
    """
    end = text.rfind(close_tag)
    if end < 0:
        return None
    start = text.rfind(open_tag, 0, end)
    if start < 0:
        return None
    return text[start + len(open_tag) : end].strip()


def _balanced_braces_end(text: str, open_index: int) -> int | None:
    """Index just past the `}` closing the `{` at `open_index`, or None if it never closes.

    A backslash escapes the next character, so `\\{` and `\\}` (literal braces in LaTeX) are not counted.
    """
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def boxed_contents(text: str) -> list[str | None]:
    """Contents of the top-level `\\boxed{...}` groups of `text`, left to right.

    A box nested inside another is part of the outer one's content, not a separate entry. An unclosed box (a
    truncated generation) ends the scan with a None entry.
    """
    contents: list[str | None] = []
    i = 0
    while True:
        i = text.find("\\boxed", i)
        if i < 0:
            return contents
        j = i + len("\\boxed")
        while j < len(text) and text[j] == " ":
            j += 1
        if j >= len(text) or text[j] != "{":
            # `\boxed` without a brace group (or `\boxedfoo`): not a box we read.
            i = j
            continue
        end = _balanced_braces_end(text, j)
        if end is None:
            contents.append(None)
            return contents
        contents.append(text[j + 1 : end - 1].strip())
        i = end


def last_boxed(text: str) -> str | None:
    """Content of the last top-level `\\boxed{...}`, unwrapping boxes that fill it entirely; None if none/unclosed.

    `\\boxed{\\boxed{5}}` gives "5"; `\\boxed{3} ... \\boxed{4` (unclosed last box) gives None.
    """
    contents = boxed_contents(text)
    content = contents[-1] if contents else None
    while content is not None:
        inner = boxed_contents(content)
        # Unwrap only when the whole content is a single box.
        if len(inner) == 1 and inner[0] is not None and content.startswith("\\boxed") and content.endswith("}"):
            end = _balanced_braces_end(content, content.index("{"))
            if end == len(content):
                content = inner[0]
                continue
        break
    return content


def extract_final_answer(text: str) -> str | None:
    """The graded answer: last `<answer>` content (its last box if it has one), else the last box, else None."""
    answer = extract_tag(text)
    if answer is None:
        return last_boxed(text)
    if "\\boxed" in answer:
        return last_boxed(answer)
    return answer


def has_answer_format(text: str) -> bool:
    """True for `<reasoning>R</reasoning> <answer>A</answer>` with nothing else around (whitespace allowed).

    Rules: after stripping surrounding whitespace the text starts with `<reasoning>` and ends with `</answer>`; each of
    the four tags occurs exactly once; only whitespace separates `</reasoning>` from `<answer>`; the answer content is
    not blank. The reasoning may be empty.
    """
    text = text.strip()
    tags = (REASONING_OPEN, REASONING_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
    if any(text.count(tag) != 1 for tag in tags):
        return False
    if not (text.startswith(REASONING_OPEN) and text.endswith(ANSWER_CLOSE)):
        return False
    reasoning_end = text.index(REASONING_CLOSE)
    answer_start = text.index(ANSWER_OPEN)
    if answer_start < reasoning_end or text[reasoning_end + len(REASONING_CLOSE) : answer_start].strip():
        return False
    return bool(text[answer_start + len(ANSWER_OPEN) : -len(ANSWER_CLOSE)].strip())


def official_last_answer(text: str) -> str | None:
    """Stripped content of the last `<answer>...</answer>` match as the official code reads it, or None.

    The official code takes the last of the non-overlapping, shortest matches scanned left to right: each match runs
    from an `<answer>` to the first `</answer>` after it, and the scan resumes after that close tag. This differs
    from `extract_tag` when tags nest: "<answer>1<answer>2</answer>" gives "1<answer>2" here, "2" there.
    Plain string search, linear in the text length.
    """
    last, i = None, 0
    while True:
        start = text.find(ANSWER_OPEN, i)
        if start < 0:
            return last
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            return last
        last = text[start + len(ANSWER_OPEN) : end].strip()
        i = end + len(ANSWER_CLOSE)


# ----------------------------------------------------------------------------------------------------------------
# the official anti-short-boxed term

ANTI_SHORT_MIN_CHARS = 200  # completions with this many non-space characters always score 1
ANTI_SHORT_MAX_UNBOXED_SHARE = 0.85  # ... shorter ones score 0 when under this share of them lies outside boxes
_BOX_OPEN = "\\boxed{"
_CLOSING_PUNCTUATION = ".?!'\"\u201c\u201d\u2019"


def _count_non_space(text: str) -> int:
    return sum(1 for char in text if not char.isspace())


def _skip(text: str, i: int, allowed) -> int:
    while i < len(text) and allowed(text[i]):
        i += 1
    return i


def _is_lone_box(text: str) -> bool:
    """`text` (stripped) is one `\\boxed{...}` without "}" inside, with only whitespace and "$" around it and
    optional closing punctuation after it (the official rule, checked by a linear scan instead of a regex)."""
    i = _skip(text, 0, lambda c: c.isspace() or c == "$")
    if not text.startswith(_BOX_OPEN, i):
        return False
    close = text.find("}", i + len(_BOX_OPEN))
    if close < 0:
        return False
    i = _skip(text, close + 1, lambda c: c.isspace() or c == "$")
    i = _skip(text, i, lambda c: c in _CLOSING_PUNCTUATION)
    return _skip(text, i, str.isspace) == len(text)


def _cut_boxes(text: str) -> str:
    """`text` without its `\\boxed{` ... first following `}` spans (non-overlapping, left to right)."""
    pieces, i = [], 0
    while True:
        start = text.find(_BOX_OPEN, i)
        close = -1 if start < 0 else text.find("}", start + len(_BOX_OPEN))
        if close < 0:
            pieces.append(text[i:])
            return "".join(pieces)
        pieces.append(text[i:start])
        i = close + 1


def is_short_boxed(text: str) -> bool:
    """True when a completion is short (under 200 non-space characters) and mostly a `\\boxed{}` answer.

    The official rule, on the stripped text with n = its number of non-whitespace characters:
      short-boxed  <=>  n < 200  and  (the text is a lone box  or  u / (n + 1e-6) < 0.85),
    where "a lone box" is `\\boxed{...}` (no "}" inside) with only whitespace and "$" around it and optional
    closing punctuation (. ? ! ' " and curly quotes) after it, and u counts the non-whitespace characters left when
    every `\\boxed{` ... first following `}` span is cut out (a nested group ends the span early; an unclosed box
    is not cut). So an empty completion is short-boxed (u = n = 0), a short completion without a box is not (u = n).
    Whitespace is `str.isspace` (the same set as the regex class `\\s`). Linear in the text length.
    """
    text = text.strip()
    total = _count_non_space(text)
    if total >= ANTI_SHORT_MIN_CHARS:
        return False
    if _is_lone_box(text):
        return True
    return _count_non_space(_cut_boxes(text)) / (total + 1e-6) < ANTI_SHORT_MAX_UNBOXED_SHARE


def anti_short_boxed_reward(prompts, completions, **kwargs) -> list[float]:
    """The official StableDRL term added to every task's reward: 0.0 for a short, mostly-boxed completion, else 1.0.

    See `is_short_boxed` for the rule. The official code adds it to the task's reward with weight 1; TRL does the
    same when this function is one of `reward_funcs` (default `reward_weights`: all 1, rewards summed).
    """
    return [0.0 if is_short_boxed(completion_to_text(c)) else 1.0 for c in completions]


def format_score(text: str, answer_is_well_formed: Callable[[str], bool]) -> float:
    """0.25 for the reasoning/answer layout plus 0.25 when the answer content passes the task's check."""
    score = FORMAT_STRUCTURE_SCORE if has_answer_format(text) else 0.0
    answer = extract_final_answer(text)
    if answer is not None and answer_is_well_formed(answer):
        score += FORMAT_ANSWER_SCORE
    return score


def reward_column(kwargs: dict, names: str | Sequence[str], n: int, reward_name: str) -> list:
    """The dataset column a reward needs, checked to hold one entry per completion.

    `names` lists accepted column names in order of preference (e.g. `("numbers", "nums")`).
    """
    names = (names,) if isinstance(names, str) else tuple(names)
    for name in names:
        if name in kwargs and kwargs[name] is not None:
            values = list(kwargs[name])
            if len(values) != n:
                raise ValueError(
                    f"{reward_name}: column {name!r} has {len(values)} entries for {n} completions; the dataset "
                    "columns must be passed row-aligned with the completions (as TRL does)"
                )
            return values
    raise ValueError(
        f"{reward_name}: needs the dataset column {' or '.join(map(repr, names))}, got columns {sorted(kwargs)}; "
        "load the data with stabledrl_trl.tasks.load_task_dataset or add that column"
    )


# ----------------------------------------------------------------------------------------------------------------
# prompts and datasets


def user_prompt(content: str, system_prompt: str | None) -> list[dict[str, str]]:
    """A one-message conversational prompt; the task instructions lead the user message.

    The instructions go into the user turn (as d1 does for LLaDA) rather than a system turn, so chat templates
    without a system role work unchanged. An empty `system_prompt` adds nothing.
    """
    if system_prompt:
        content = f"{system_prompt}\n\n{content}"
    return [{"role": "user", "content": content}]


def choose_format(
    task: str,
    prompt_style: str,
    system_prompt: str | None,
    tagged: Callable[..., dict],
    official: Callable[..., dict] | None,
    default_system_prompt: str,
) -> tuple[Callable[..., dict], str]:
    """(row formatter, instructions) for a loader: the tagged formatter with the task's or the given instructions,
    or the official formatter (its own wording, no instructions). Raises for an unknown style, an official style
    the task does not have, or instructions given with the official style."""
    if prompt_style == "tagged":
        return tagged, default_system_prompt if system_prompt is None else system_prompt
    if prompt_style != "official":
        raise ValueError(f"prompt_style: expected one of {', '.join(PROMPT_STYLES)}, got {prompt_style!r}")
    if official is None:
        raise ValueError(
            f"prompt_style: task {task!r} has no official StableDRL form; use prompt_style 'tagged' (official forms "
            "exist for gsm8k, math, countdown and sudoku)"
        )
    if system_prompt:
        raise ValueError(
            f"system_prompt: got {system_prompt!r:.60} with prompt_style 'official', whose prompts carry their own "
            "wording; leave system_prompt unset or use prompt_style 'tagged'"
        )
    return official, ""


def _builder_for(files: Any) -> str:
    first = files
    while isinstance(first, (list, tuple, dict)):
        if not first:
            raise ValueError("data_files: got an empty collection; pass a file path, a list of paths or a split dict")
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    ext = os.path.splitext(str(first))[1].lower()
    if ext not in _BUILDERS:
        raise ValueError(
            f"data_files: cannot tell the file type of {first!r} (extension {ext!r}); use one of "
            f"{sorted(_BUILDERS)}, or pass path='csv'/'json'/'parquet' to name the builder"
        )
    return _BUILDERS[ext]


def load_rows(split: str, *, path: str | None, config: str | None, data_files: Any = None):
    """Load one split as a `datasets.Dataset`.

    - `data_files` given: local files read by the builder `path` ("csv", "json", ...) or, when `path` is None, the
      builder matching the file extension. A single path or a list is taken as the requested split.
    - `path` an existing local file: read it by its extension as the requested split.
    - otherwise `path` is a hub id or a local dataset folder, loaded with `config`.
    """
    from datasets import load_dataset

    if data_files is not None:
        builder = path or _builder_for(data_files)
        if not isinstance(data_files, dict):
            data_files = {split: data_files}
        return _load_local(load_dataset, builder, data_files, split)
    if path is None:
        raise ValueError("path: no dataset given; pass a hub id, a local folder or file, or data_files")
    if os.path.isfile(path):
        return _load_local(load_dataset, _builder_for(path), {split: path}, split)
    return load_dataset(path, config, split=split)


def _local_files(data_files) -> list[str]:
    files = data_files
    if isinstance(files, dict):
        files = [f for v in files.values() for f in (v if isinstance(v, (list, tuple)) else [v])]
    elif not isinstance(files, (list, tuple)):
        files = [files]
    return [str(f) for f in files]


def _load_local(load_dataset, builder: str, data_files: dict, split: str):
    """`load_dataset` of local files; an empty, unreadable or corrupt file is an error naming it (datasets reports
    "An error occurred while generating the dataset" or a bare StopIteration, without the file)."""
    files = _local_files(data_files.get(split, data_files))
    for file in files:
        if os.path.isfile(file) and os.path.getsize(file) == 0:
            raise ValueError(f"data file {file!r} is empty (0 bytes): nothing to train or evaluate on.")
    try:
        dataset = load_dataset(builder, data_files=data_files, split=split)
    except (FileNotFoundError, KeyboardInterrupt):
        raise
    except Exception as error:  # DatasetGenerationError, ArrowInvalid, JSONDecodeError, StopIteration, ...
        cause = error.__cause__ or error.__context__ or error
        names = ", ".join(repr(f) for f in files[:3])
        raise ValueError(
            f"data file(s) {names} could not be read as {builder} ({type(cause).__name__}: {str(cause)[:200]}). "
            "Check the file: one JSON object per line for .jsonl, one JSON list of objects for .json, a header row "
            "for .csv."
        ) from error
    if len(dataset) == 0:
        raise ValueError(f"data file(s) {', '.join(repr(f) for f in files[:3])} hold no rows for split {split!r}.")
    return dataset


def check_generated_task(task: str, path, data_files, prompt_style: str) -> None:
    """A generated task reads no files and has only its own ('tagged') prompt: refuse anything else, named."""
    if prompt_style != "tagged":
        raise ValueError(f"prompt_style: {task} has only its own prompt ('tagged'), got {prompt_style!r}")
    if path is not None or data_files is not None:
        raise ValueError(f"path / data_files: {task} is generated; remove them")


def take_samples(dataset, num_samples: int | None, seed: int):
    """The first `num_samples` rows after a seeded shuffle (all rows, unshuffled, when `num_samples` is None)."""
    if num_samples is None:
        return dataset
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
        raise ValueError(f"num_samples: expected a positive integer or None, got {num_samples!r}")
    if num_samples > len(dataset):
        raise ValueError(
            f"num_samples: asked for {num_samples} rows but the split has only {len(dataset)}; pass at most "
            f"{len(dataset)} or None for all rows"
        )
    return dataset.shuffle(seed=seed).select(range(num_samples))


def _formatted_with_prefix(row: dict, format_example: Callable[..., dict], system_prompt: str) -> dict:
    return {_NEW_COLUMN_PREFIX + key: value for key, value in format_example(row, system_prompt=system_prompt).items()}


_NEW_COLUMN_PREFIX = "__formatted__"


def format_dataset(dataset, format_example: Callable[..., dict], system_prompt: str):
    """Apply `format_example` to every row, keeping only the columns it returns.

    The new columns are written under temporary names and renamed afterwards: `map` would otherwise keep the old
    type of a column the function rewrites (a CSV `solution` column read as float64 would stay float64).
    """
    formatted = dataset.map(
        _formatted_with_prefix,
        fn_kwargs={"format_example": format_example, "system_prompt": system_prompt},
        remove_columns=dataset.column_names,
        desc="formatting prompts",
    )
    return formatted.rename_columns({name: name[len(_NEW_COLUMN_PREFIX) :] for name in formatted.column_names})
