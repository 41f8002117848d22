"""The lm-evaluation-harness model class end to end: a local generate_until task (no hub) on a tiny LLaDA and a tiny
SDAR, lm_eval's exact_match equal to the package's own decoding of the same prompts, and the refusals."""

from __future__ import annotations

import json

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from stabledrl_trl.lm_eval_model import DiffusionLMEval, cut_at_stop  # noqa: E402

TASK = """task: tiny_sum
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["x"]
  do_sample: false
  max_gen_toks: 6
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

CHOICE_TASK = """task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: ["1", "2"]
doc_to_target: 0
metric_list:
  - metric: acc
"""


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _task_dir(tmp_path, template, name):
    rows = [{"question": f"{i}+{i}=", "answer": str(2 * i)} for i in range(5)]
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    folder = tmp_path / f"tasks_{name}"
    folder.mkdir()
    (folder / f"{name}.yaml").write_text(template.format(data=data))
    return folder, rows


def _own_decoding(lm, rows):
    """The package's own decoding of the same prompts (family.generate, batch by batch), cut as the task asks."""
    from stabledrl_trl.evaluation import left_pad

    texts = []
    for start in range(0, len(rows), lm.batch_size):
        batch = rows[start : start + lm.batch_size]
        ids = [lm.tokenizer(r["question"], add_special_tokens=False)["input_ids"] for r in batch]
        prompt_ids, mask = left_pad(ids, lm.adapter.pad_token_id)
        generator = torch.Generator().manual_seed(lm.seed * 1_000_003 + start // lm.batch_size)
        out = lm.family.generate(lm.adapter, prompt_ids, mask, lm.settings, eos_token_ids=lm.adapter.eos_token_ids,
                                 generator=generator)  # fmt: skip
        for row_ids, row_mask in zip(out.completion_ids, out.completion_mask):
            tokens = row_ids[row_mask.bool()].tolist()[:6]
            texts.append(cut_at_stop(lm.tokenizer.decode(tokens, skip_special_tokens=True), ["x"]))
    return texts


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_lm_eval_runs_a_local_generative_task(tmp_path, tiny_llada, tiny_sdar, tiny_tokenizer, family):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    model = tiny_llada if family == "llada" else tiny_sdar()
    folder, rows = _task_dir(tmp_path, TASK, "tiny_sum")
    sampler = {"gen_length": 8, "steps": 4, "block_length": 8} if family == "llada" else {"gen_length": 8}
    lm = DiffusionLMEval(model=model, tokenizer=tiny_tokenizer, batch_size=2, temperature=0.9, **sampler)
    results = simple_evaluate(
        model=lm, tasks=["tiny_sum"], task_manager=TaskManager(include_path=str(folder), include_defaults=False),
        log_samples=True,
    )  # fmt: skip
    samples = sorted(results["samples"]["tiny_sum"], key=lambda s: s["doc_id"])
    responses = [s["resps"][0][0] for s in samples]
    # do_sample: false -> greedy; the same prompts through the package's own sampler give the same texts
    assert responses == _own_decoding(_greedy(lm), rows)
    expected = sum(text.strip() == row["answer"] for text, row in zip(responses, rows)) / len(rows)
    assert results["results"]["tiny_sum"]["exact_match,none"] == pytest.approx(expected)
    assert all(len(text) <= 6 and "x" not in text for text in responses)  # max_gen_toks and until applied


def _greedy(lm):
    import dataclasses

    lm.settings = dataclasses.replace(lm.settings, temperature=0.0)
    return lm


def test_lm_eval_refusals(tmp_path, tiny_llada, tiny_tokenizer):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    folder, _ = _task_dir(tmp_path, CHOICE_TASK, "tiny_choice")
    lm = DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, gen_length=8, steps=4, block_length=8)
    with pytest.raises(
        NotImplementedError, match="loglikelihood \\(multiple-choice\\) requests are refused.*likelihood_samples=N"
    ):
        simple_evaluate(model=lm, tasks=["tiny_choice"],
                        task_manager=TaskManager(include_path=str(folder), include_defaults=False))  # fmt: skip
    with pytest.raises(ValueError, match="generation_kwargs top_p have no counterpart"):
        lm._settings_for({"until": [], "top_p": 0.9})
    with pytest.raises(ValueError, match="unknown gen_lenght"):
        DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, gen_lenght=8)
    with pytest.raises(ValueError, match="diffusion_steps=64 is more than max_completion_length=8"):
        DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, gen_length=8, steps=64)
    assert cut_at_stop("12\n\nQ: next", ["\n\n", "Q:"]) == "12"


def test_registered_with_lm_eval():
    from lm_eval.api.registry import get_model

    assert get_model("stabledrl") is DiffusionLMEval and get_model("stabledrl_diffusion") is DiffusionLMEval


@pytest.mark.slow
def test_two_processes_give_the_results_of_one(tmp_path, clean_env):
    """lm-eval under torchrun with two gloo processes: each decodes its share of the requests, lm-eval gathers them
    through the class, and the responses and metric equal one process's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    folder, _ = _task_dir(tmp_path, TASK, "tiny_sum")
    worker = str(Path(__file__).resolve().parent / "lm_eval_worker.py")
    outs = {}
    for processes in (1, 2):
        out = tmp_path / f"out{processes}.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               worker, "--tasks_dir", str(folder), "--out", str(out)]  # fmt: skip
        proc = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        outs[processes] = json.loads(out.read_text())
    assert (outs[1]["world_size"], outs[2]["world_size"]) == (1, 2)
    assert outs[2]["responses"] == outs[1]["responses"] and len(outs[1]["responses"]) == 5
    assert outs[2]["exact_match"] == outs[1]["exact_match"] and os.path.exists(tmp_path / "out2.json")


def test_model_args_string_loads_a_saved_model(tmp_path, tiny_llada, tiny_tokenizer):
    """`--model stabledrl --model_args pretrained=...,gen_length=...` as lm_eval's command line builds it: the model
    loads from its folder (safetensors) and decodes the task with the given sampler settings."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    model_dir = tmp_path / "tiny"
    tiny_llada.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    folder, rows = _task_dir(tmp_path, TASK, "tiny_sum")
    results = simple_evaluate(
        model="stabledrl", model_args=f"pretrained={model_dir},gen_length=8,steps=4,block_length=8,dtype=float32",
        tasks=["tiny_sum"], batch_size=2, device="cpu", log_samples=True,
        task_manager=TaskManager(include_path=str(folder), include_defaults=False),
    )  # fmt: skip
    lm = DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, batch_size=2, gen_length=8, steps=4,
                         block_length=8)  # fmt: skip
    samples = sorted(results["samples"]["tiny_sum"], key=lambda s: s["doc_id"])
    assert [s["resps"][0][0] for s in samples] == _own_decoding(_greedy(lm), rows)
    assert results["config"]["batch_size"] == 2
    with pytest.raises(ValueError, match="max_batch_size=4 bounds lm-eval's automatic batch size"):
        DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, max_batch_size=4)
    with pytest.raises(ValueError, match="pretrained=<model folder"):
        DiffusionLMEval(gen_length=8, steps=4, block_length=8)


class _Request:
    def __init__(self, *args):
        self.args = args


def test_opt_in_likelihood_is_the_estimator(tiny_llada, tiny_tokenizer):
    """likelihood_samples > 0: a one-token continuation under the coupled estimator is exactly log p(token | context,
    token masked); under mc_elbo_inv_t (LLaDA's 1/t ELBO) the mean over 4096 passes is within 4 standard errors of it;
    is_greedy says whether greedy decoding writes the continuation."""
    lm = DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, gen_length=8, steps=4, block_length=8,
                         likelihood_samples=2, likelihood_estimator="coupled")  # fmt: skip
    context = tiny_tokenizer("12+3=", add_special_tokens=False)["input_ids"]
    ids = torch.tensor([context + [lm.adapter.mask_token_id]])
    with torch.no_grad():
        logp = torch.log_softmax(lm.adapter(ids, torch.ones_like(ids))[0, -1], -1)  # (V,)
    best = int(logp.argmax())
    other = tiny_tokenizer("7", add_special_tokens=False)["input_ids"][0]
    other = other if other != best else other + 1
    best_text, other_text = tiny_tokenizer.decode([best]), tiny_tokenizer.decode([other])
    results = lm.loglikelihood([_Request("12+3=", best_text), _Request("12+3=", other_text)])
    assert results[0][0] == pytest.approx(float(logp[best]), abs=1e-5) and results[0][1] is True
    assert results[1][0] == pytest.approx(float(logp[other]), abs=1e-5) and results[1][1] is False
    lm.likelihood_estimator, lm.likelihood_samples = "mc_elbo_inv_t", 4096
    ((value, _),) = lm.loglikelihood([_Request("12+3=", other_text)])
    error = lm.likelihood_standard_errors[-1]
    assert 0 < error < 0.5 and abs(value - float(logp[other])) < 4 * error
    with pytest.raises(ValueError, match="likelihood_estimator='elbo'; choose one of"):
        DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, likelihood_estimator="elbo")


def test_multiple_choice_task_with_opt_in_likelihood(tmp_path, tiny_llada, tiny_tokenizer):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    folder, rows = _task_dir(tmp_path, CHOICE_TASK, "tiny_choice")
    lm = DiffusionLMEval(model=tiny_llada, tokenizer=tiny_tokenizer, gen_length=8, steps=4, block_length=8,
                         likelihood_samples=4)  # fmt: skip
    results = simple_evaluate(model=lm, tasks=["tiny_choice"], log_samples=True,
                              task_manager=TaskManager(include_path=str(folder), include_defaults=False))  # fmt: skip
    samples = sorted(results["samples"]["tiny_choice"], key=lambda s: s["doc_id"])
    picks = [max(range(2), key=lambda c: s["resps"][c][0][0]) for s in samples]
    assert results["results"]["tiny_choice"]["acc,none"] == pytest.approx(sum(p == 0 for p in picks) / len(rows))
    assert len(lm.likelihood_standard_errors) == 2 * len(rows)
