"""Code tasks: official prompts character for character, rewards, and parity with the official harness's semantics.

Prompts: the expected strings below were transcribed by hand from the official StableDRL code (@26ad014):
`evaluate/humaneval.py` (format_HumanEval_prompt_zero_shot), `evaluate/mbpp.py` (format_MBPP_prompt_zero_shot) and
`dataloaders/kodcode.py` (_format_prompt and its helpers).

Parity: the reference grader here restates the official semantics independently of the package: it builds the
official single program (HumanEval: problem prompt + code + test + `check(entry_point)`; MBPP: code + asserts;
KodCode: code + tests without the solution imports + a loop calling every global callable `test_*`), with the
official code extraction written here with string searches (not the package's regexes), and runs it as ONE program
in the sandbox with the official guard; it passes when that program runs to its end, as `check_correctness`
decides. The package's rewards must agree on every completion (>= 300 per task: right, wrong, crashing, syntax
errors, timing out, printing, exiting, several code blocks).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "fixtures"))

from code_problems import PROBLEMS, kodcode_test_source  # noqa: E402

from stabledrl_trl.sandbox import CodeJob, SandboxError, SandboxSettings  # noqa: E402
from stabledrl_trl.tasks import code as code_tasks  # noqa: E402
from stabledrl_trl.tasks import get_task  # noqa: E402

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)

FENCE = "`" * 3

# ---------------------------------------------------------------------------------------------------------------
# prompts, character for character


def test_humaneval_prompt_is_the_official_one():
    problem = {"entry_point": "incr", "prompt": "def incr(x):\n    \"\"\"Add one.\"\"\"\n\n\n"}
    expected = (
        "You are an expert Python programmer. Your task is to complete the implementation of a function named "
        "`incr`.\n"
        "\n"
        "Here is the function to complete:\n"
        "```python\n"
        "def incr(x):\n"
        "    \"\"\"Add one.\"\"\"\n"
        "```\n"
    )
    assert code_tasks.humaneval_prompt(problem) == expected
    rows = code_tasks.humaneval_problems()
    assert len(rows) == 164 and rows[0]["task_id"] == "HumanEval/0"
    dataset = code_tasks.load_humaneval(num_samples=3, seed=1)
    for row in dataset:
        original = next(r for r in rows if r["task_id"] == row["task_id"])
        assert row["prompt"][0]["content"].endswith(f"```python\n{original['prompt'].rstrip()}\n```\n")
        assert row["problem_prompt"] == original["prompt"]


MBPP_ROW = {
    "task_id": 11,
    "text": "Write a python function to remove first and last occurrence of a given character from the string.",
    "test_list": [
        'assert remove_Occ("hello","l") == "heo"',
        'assert remove_Occ("abcda","a") == "bcd"',
        'assert remove_Occ("PHP","P") == "H"',
    ],
}
MBPP_EXPECTED = (
    "You are an expert Python programmer. Your task is to complete the implementation of a function named "
    "`remove_Occ`.\n"
    "\n"
    "** TARGET FUNCTION **\n"
    "Write a python function to remove first and last occurrence of a given character from the string.\n"
    "\n"
    "** UNIT TESTS **\n"
    "Your code should pass unit tests like:\n"
    '    assert remove_Occ("hello","l") == "heo"\n'
    '    assert remove_Occ("abcda","a") == "bcd"\n'
    '    assert remove_Occ("PHP","P") == "H"\n'
    "\n"
    "Here is the function to complete:\n"
    "```python\n"
    "def remove_Occ(input_param_1, input_param_2):\n"
    '    """Write a python function to remove first and last occurrence of a given character from the string.\n'
    '    """\n'
    "```\n"
)


def test_mbpp_prompt_is_the_official_one():
    assert code_tasks.mbpp_prompt(MBPP_ROW) == MBPP_EXPECTED


def test_mbpp_declaration_edge_cases_follow_the_official_rules():
    # A first assert that does not parse: 2 parameters. The name is the text between the first space and "(".
    row = {"text": "T", "test_list": ["assert f(1, 2, 3 == 4"]}
    assert "def f(input_param_1, input_param_2):\n" in code_tasks.mbpp_prompt(row)
    # The name read by splitting ("math.isclose") is not a plain call's id: no parameters.
    row = {"text": "T", "test_list": ["assert math.isclose(area(2, 3), 6)"]}
    assert "named `math.isclose`" in code_tasks.mbpp_prompt(row)
    assert "def math.isclose():\n" in code_tasks.mbpp_prompt(row)
    # The first call found by the AST walk: the outer call of a nested one.
    row = {"text": "T", "test_list": ["assert g(g(1), 2) == 3"]}
    assert "def g(input_param_1, input_param_2):\n" in code_tasks.mbpp_prompt(row)


KOD_HEAD = "You are an expert Python programmer. Your task is to complete the implementation of a function named "


def test_kodcode_prompt_from_test_info():
    row = {
        "question": "Sum two numbers.",
        "test": "from solution import add\n\ndef test_add():\n    assert add(1, 2) == 3\n",
        "test_info": [{"function_name": "add", "parameter_list": "(a, b)", "function_declaration": "def add(a, b):",
                       "docstring": "Returns a + b."}],  # fmt: skip
    }
    expected = (
        KOD_HEAD + "`add`.\n\n"
        "Here is the function to complete:\n"
        "```python\n"
        "def add(a, b):\n"
        '    """Returns a + b.\n'
        '    """\n'
        "```\n"
    )
    assert code_tasks.kodcode_prompt(row) == expected
    no_doc = dict(row, test_info=[{"function_name": "add", "function_declaration": "def add(a, b):", "docstring": None}])
    assert code_tasks.kodcode_prompt(no_doc) == KOD_HEAD + "`add`.\n\nHere is the function to complete:\n```python\ndef add(a, b):\n```\n"


def test_kodcode_prompt_from_question_then_tests_then_plain():
    question = "Write it.\n```python\ndef solve(n):\n    \"\"\"  Solve n.  \"\"\"\n    pass\n```\n"
    row = {"question": question, "test": "def test_x():\n    pass\n", "test_info": None}
    assert code_tasks.kodcode_prompt(row) == (
        KOD_HEAD + "`solve`.\n\nHere is the function to complete:\n```python\ndef solve(n):\n"
        '    """Solve n.\n    """\n```\n'
    )
    row = {"question": "Count things.", "test": "from solution import Counter, count_things\n", "test_info": []}
    assert code_tasks.kodcode_prompt(row) == (
        KOD_HEAD + "`count_things`.\n\nHere is the function to complete:\n```python\ndef count_things():\n```\n"
    )
    row = {"question": "  Print hello.  ", "test": "def test_x():\n    pass\n"}
    assert code_tasks.kodcode_prompt(row) == (
        "You are an expert Python programmer.\n"
        "Write a correct, efficient Python solution.\n"
        "Return only valid Python code (no explanations).\n"
        "\n"
        "Task:\n"
        "Print hello.\n"
    )


def test_code_tasks_are_official_only_and_without_anti_short_boxed():
    for name in ("kodcode", "humaneval", "mbpp"):
        task = get_task(name)
        assert task.prompt_styles == ("official",)
        assert task.reward_funcs_for("official") == [task.official_reward]
    with pytest.raises(ValueError, match="prompt_style: task 'humaneval' is posed only as the official"):
        code_tasks.load_humaneval(prompt_style="tagged")
    with pytest.raises(ValueError, match="system_prompt"):
        code_tasks.load_humaneval(system_prompt="Be brief.")
    with pytest.raises(ValueError, match="only a 'test' split"):
        code_tasks.load_humaneval("train")


def test_kodcode_and_mbpp_load_local_rows(tmp_path):
    import json

    path = tmp_path / "kod.jsonl"
    rows = [{"question_id": "q1", "question": "Add.", "test": kodcode_test_source("add_two", PROBLEMS[0][4])},
            {"question_id": "q2", "question": "", "test": "def test_a():\n    pass\n"},
            {"question_id": "q3", "question": "No tests.", "test": ""}]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows))
    data = code_tasks.load_kodcode(data_files=str(path))
    assert data["task_id"] == ["q1"]  # rows without a question or tests are dropped, as officially
    assert data[0]["prompt"][0]["content"].startswith(KOD_HEAD + "`add_two`")
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps(MBPP_ROW))
    data = code_tasks.load_mbpp(data_files=str(mbpp))
    assert data[0]["prompt"][0]["content"] == MBPP_EXPECTED and data[0]["test_list"] == MBPP_ROW["test_list"]


# ---------------------------------------------------------------------------------------------------------------
# the reference grader (official semantics, restated here)


def ref_first_python_block(text: str) -> str:
    start = text.find(FENCE + "python\n")
    if start < 0:
        return text
    body = start + len(FENCE + "python\n")
    end = text.find(FENCE, body)
    return text if end < 0 else text[body:end].strip()


def _blocks(text: str, opener: str, case_insensitive: bool) -> list[str]:
    haystack = text.lower() if case_insensitive else text
    found, pos = [], 0
    while True:
        start = haystack.find(opener, pos)
        if start < 0:
            return found
        end = text.find(FENCE, start + len(opener))
        if end < 0:
            return found
        found.append(text[start + len(opener) : end].strip())
        pos = end + len(FENCE)


def ref_last_block(text: str) -> str:
    for blocks in (_blocks(text, FENCE + "python", True), _blocks(text, FENCE, False)):
        if blocks:
            return blocks[-1]
    return text.strip()


REF_LOOP = (
    "\n\nfor _n, _o in list(globals().items()):\n"
    "    if callable(_o) and isinstance(_n, str) and _n.startswith('test_'):\n"
    "        _o()\n"
)


def ref_kodcode_program(completion, test_source):
    code = ref_last_block(completion).strip() or "# empty solution"
    kept = [line for line in test_source.split("\n")
            if not line.lstrip().startswith("from solution import") and not line.lstrip().startswith("import solution")]  # fmt: skip
    return code + "\n\n" + "\n".join(kept) + REF_LOOP


def reference_verdicts(box, programs):
    return [r.passed for r in box.run_many([CodeJob(program=p) for p in programs])]


@pytest.fixture(scope="module")
def box():
    sandbox = code_tasks.configure_code_sandbox(SandboxSettings(timeout=3.0, num_workers=2))
    yield sandbox


def test_reference_loop_and_official_loop_hack_differ_as_documented(box):
    # The official KodCode loop calls whatever is callable and named test_*: a program rebinding `callable`
    # makes it call nothing and pass. The package calls the test functions of the trusted source: it fails.
    wrong = "def add_two(a, b):\n    return 0\nimport builtins\nbuiltins.callable = lambda o: False\n"
    test_source = kodcode_test_source("add_two", PROBLEMS[0][4])
    assert reference_verdicts(box, [ref_kodcode_program(wrong, test_source)]) == [True]
    assert code_tasks.kodcode_reward(None, [wrong], tests=[test_source]) == [-1.0]


# ---------------------------------------------------------------------------------------------------------------
# completion families


def _variants(name, right, wrong, with_timeout):
    b = FENCE + "python\n"
    out = [
        b + right + "\n" + FENCE,
        right,
        "Here is the solution:\n" + b + right + "\n" + FENCE + "\nIt adds.",
        b + wrong + "\n" + FENCE + "\nActually:\n" + b + right + "\n" + FENCE,
        b + right + "\n" + FENCE + "\nOr:\n" + b + wrong + "\n" + FENCE,
        b + wrong + "\n" + FENCE,
        b + f"def {name}(*args):\n    raise ValueError('no')\n" + FENCE,
        b + right.replace("):", ":", 1) + "\n" + FENCE,
        b + right + "\n1 / 0\n" + FENCE,
        b + right + "\nprint('debug ' * 1000)\n" + FENCE,
        b + right + "\nimport sys\nsys.exit(0)\n" + FENCE,
        FENCE + "\n" + right + "\n" + FENCE,
        "",
        b + right + "\nx = input()\n" + FENCE,
        b + "import os\n" + right + "\nos.remove('/tmp/nothing')\n" + FENCE,
        b + right + "\nif __name__ == '__main__':\n    assert False\n" + FENCE,
        b + right,
        "```PYTHON\n" + right + "\n" + FENCE,
    ]
    if with_timeout:
        out.append(b + right + "\nwhile True:\n    pass\n" + FENCE)
    return out


def test_wrong_solutions_pass_some_checks_and_fraction_rewards(box):
    # Hand-counted: add_two's wrong solution passes add_two(1, 2) and add_two(-1, 1), fails add_two(0, 5).
    name, _, right, wrong, asserts = PROBLEMS[0]
    assert code_tasks.mbpp_fraction_reward(None, [wrong, right, "x"], test_list=[asserts] * 3) == [2 / 3, 1.0, 0.0]
    assert code_tasks.mbpp_reward(None, [wrong, right], test_list=[asserts] * 2) == [0.0, 1.0]
    tests = kodcode_test_source(name, asserts)
    assert code_tasks.kodcode_fraction_reward(None, [wrong, right], tests=[tests] * 2) == [2 / 3, 1.0]
    assert code_tasks.kodcode_reward(None, [wrong, right, ""], tests=[tests] * 3) == [-1.0, 1.0, -1.0]
    assert code_tasks.kodcode_reward(None, [right], tests=[None]) == [None]
    # Every fixture: the right solution passes all asserts, the wrong one some but not all.
    fractions = code_tasks.mbpp_fraction_reward(
        None, [p[3] for p in PROBLEMS] + [p[2] for p in PROBLEMS], test_list=[p[4] for p in PROBLEMS] * 2
    )
    assert all(0 < f < 1 for f in fractions[: len(PROBLEMS)]), fractions
    assert fractions[len(PROBLEMS) :] == [1.0] * len(PROBLEMS)


@pytest.mark.slow
def test_mbpp_parity_with_the_official_semantics(box):
    completions, test_lists, programs = [], [], []
    for i, (name, _, right, wrong, asserts) in enumerate(PROBLEMS):
        for completion in _variants(name, right, wrong, with_timeout=i < 2):
            completions.append(completion)
            test_lists.append(asserts)
            programs.append(ref_first_python_block(completion) + "\n" + "\n".join(asserts))
    assert len(completions) >= 300
    ours = [r == 1.0 for r in code_tasks.mbpp_reward(None, completions, test_list=test_lists)]
    reference = reference_verdicts(box, programs)
    mismatches = [(c, o, r) for c, o, r in zip(completions, ours, reference) if o != r]
    assert not mismatches, mismatches[:3]
    assert 0.2 < sum(ours) / len(ours) < 0.8  # both outcomes are well represented


@pytest.mark.slow
def test_kodcode_parity_with_the_official_semantics(box):
    completions, tests, programs = [], [], []
    for i, (name, _, right, wrong, asserts) in enumerate(PROBLEMS):
        source = kodcode_test_source(name, asserts)
        for completion in _variants(name, right, wrong, with_timeout=i < 2):
            completions.append(completion)
            tests.append(source)
            programs.append(ref_kodcode_program(completion, source))
    assert len(completions) >= 300
    ours = [r == 1.0 for r in code_tasks.kodcode_reward(None, completions, tests=tests)]
    reference = reference_verdicts(box, programs)
    mismatches = [(c, o, r) for c, o, r in zip(completions, ours, reference) if o != r]
    assert not mismatches, mismatches[:3]
    assert 0.2 < sum(ours) / len(ours) < 0.8


@pytest.mark.slow
def test_humaneval_parity_with_the_official_semantics(box):
    problems = code_tasks.humaneval_problems()[:50]
    completions, columns, programs = [], {"problem_prompt": [], "test": [], "entry_point": []}, []
    for i, p in enumerate(problems):
        body = p["canonical_solution"]
        b = FENCE + "python\n"
        family = [
            body,
            b + p["prompt"] + body + FENCE,
            "    return None\n",
            "    raise RuntimeError('x')\n",
            "    return (\n",
            "    print('hi')\n" + body,
            b + body + FENCE,
        ]
        if i < 2:
            family.append("    while True:\n        pass\n")
        for completion in family:
            completions.append(completion)
            for key in columns:
                columns[key].append(p["prompt"] if key == "problem_prompt" else p[key])
            code = ref_first_python_block(completion)
            programs.append(p["prompt"] + code + "\n" + p["test"] + "\n" + f"check({p['entry_point']})")
    assert len(completions) >= 300
    ours = [r == 1.0 for r in code_tasks.humaneval_reward(None, completions, **columns)]
    reference = reference_verdicts(box, programs)
    mismatches = [(c, o, r) for c, o, r in zip(completions, ours, reference) if o != r]
    assert not mismatches, mismatches[:3]
    assert 0.2 < sum(ours) / len(ours) < 0.8


def test_sandbox_failing_mid_run_stops_the_reward(box, monkeypatch):
    name, _, right, _, asserts = PROBLEMS[0]

    def broken(jobs):
        raise SandboxError("code sandbox (bwrap) failed: the sandbox exited with status 1 before the harness started")

    monkeypatch.setattr(box, "run_many", broken)
    with pytest.raises(SandboxError, match="before the harness started"):
        code_tasks.mbpp_reward(None, [right], test_list=[asserts])
