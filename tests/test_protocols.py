"""Protocol presets: prompts equal to the official code's character for character, refusals, overrides recorded as
deviations, d1's row selection, and the runner (data parallel equal to one process, resumable results file) and
its protocol card, end to end through scripts/evaluate.py on a tiny model."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

from stabledrl_trl.protocol_card import (
    build_card,
    ratio_interval,
    read_cards,
    score_block,
    update_model_card,
    wilson_interval,
    write_card,
)
from stabledrl_trl.protocol_eval import collect_records, read_results, run_protocol
from stabledrl_trl.protocols import (
    D1_COUNTDOWN_SYSTEM,
    D1_GSM8K_SYSTEM,
    D1_MATH500_SYSTEM,
    D1_SUDOKU_SYSTEM,
    SPG_SUDOKU_SHOTS,
    STABLEDRL_MATH_REQUEST,
    get_protocol,
    load_protocol_rows,
    render_prompt,
    select_indices,
)

BS = "\\"

# sha256 of each string as it stands in the official sources (computed from the files named, with Python's parser):
# StableDRL @26ad014 dataloaders/collate_fn_math.py `instruct`; d1 @837888f eval/{gsm8k,math500,countdown,sudoku}.py
# system prompts; SPG @a1c7120 eval/sudoku.py short_example_1..3.
OFFICIAL_SHA256 = {
    "stabledrl_math_request": "2688a51b0527503687b4ba2906219fb7bc4bd0db0c10f65df1ca09b56e3cd308",
    "d1_gsm8k": "f11d75a706090b9523845d4a5314e268dcc1bd4bb3c76fdac3377e1504c0f1c2",
    "d1_math500": "3e82f3bac66b3bc1c8c3e02b804c0ac8388513b60cf078a30e30c7e35e7297e8",
    "d1_countdown": "a303f737bca286cbdcc4b6e837caa783665115cc2fb96d3a25a4e68d7a1d4fd1",
    "d1_sudoku": "758dc4e1b10cba4dca68348f590e014545d57b5a36e7370c36e73ed5c25f58d7",
    "spg_shot_1": "9b2d0c0ff48d7fc4435c1264a34e4fd89456e89b0d8d4d038b5255e4eff2d248",
    "spg_shot_2": "546b38f88e43029c956a98b940b1f8d40b552b2d0ab4f25f353375bd9f8b906d",
    "spg_shot_3": "a51f4df006dc944e2a631de1d58b2c3fb16bfe4a3d06c073f43de99b7553cba9",
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tokenizer():
    """The tiny character tokenizer, reading runs of newlines one character at a time (the presets' "\\n\\n")."""
    from tokenizers import Regex, pre_tokenizers

    from stabledrl_trl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    return tok


# ----------------------------------------------------------------------------------------------------------------
# prompts


def test_official_strings_match_the_sources():
    strings = {
        "stabledrl_math_request": STABLEDRL_MATH_REQUEST,
        "d1_gsm8k": D1_GSM8K_SYSTEM,
        "d1_math500": D1_MATH500_SYSTEM,
        "d1_countdown": D1_COUNTDOWN_SYSTEM,
        "d1_sudoku": D1_SUDOKU_SYSTEM,
        **{f"spg_shot_{i + 1}": shot for i, shot in enumerate(SPG_SUDOKU_SHOTS)},
    }
    assert {name: _sha(text) for name, text in strings.items()} == OFFICIAL_SHA256
    # the raw string of the evaluation request has ONE backslash before "boxed" (the training request has two)
    assert STABLEDRL_MATH_REQUEST.count(BS + "boxed") == 2 and BS * 2 not in STABLEDRL_MATH_REQUEST


def test_rendered_prompts_character_for_character(tokenizer):
    # official StableDRL: no chat template; GSM8K is the raw question, MATH the problem glued to the request
    gsm = get_protocol("stabledrl", "gsm8k")
    assert render_prompt(gsm, {"question": "Tom has 3 apples. ", "answer": "#### 3"}) == "Tom has 3 apples. "
    mth = get_protocol("stabledrl", "math500")
    assert render_prompt(mth, {"problem": "Half of 1?"}) == (
        "Half of 1?(Please put the final answer in " + BS + "boxed{} tag, i.e. $" + BS + "boxed{answer here}$)"
    )
    # d1: instructions, a blank line, the question, through the chat template, then "<reasoning>"
    d1 = get_protocol("d1", "gsm8k")
    expected = (
        "<|user|>You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final "
        "answer in a " + BS + "boxed{}. \nRespond in the following format:\n<reasoning>\nYour reasoning here\n"
        "</reasoning>\n<answer>\n" + BS + "boxed{...}\n</answer>\n\nWhat is 2+2?<|eot_id|><|assistant|><reasoning>"
    )
    assert render_prompt(d1, {"question": "What is 2+2?"}, tokenizer) == expected
    countdown = render_prompt(get_protocol("d1", "countdown"), {"input": "30,100,93", "output": "23"}, tokenizer)
    assert countdown.endswith("</answer>\n\nNumbers: [30, 100, 93]\nTarget: 23<|eot_id|><|assistant|><reasoning>")
    sudoku = render_prompt(get_protocol("d1", "sudoku"), {"Puzzle": "0034001221004301"}, tokenizer)
    assert sudoku.endswith(
        "</answer>\n\n\nSolve the following Sudoku puzzle: 0034001221004301\n<|eot_id|><|assistant|><reasoning>"
    )
    # SPG's three-shot Sudoku: "{shots}\n\nQuestion: {question}\nAnswer:\n" after the instructions
    spg_protocol = get_protocol("spg", "sudoku")
    message = (
        spg_protocol.prompt.instructions
        + "\n\n"
        + "\n\n".join(SPG_SUDOKU_SHOTS)
        + ("\n\nQuestion: Solve the following Sudoku puzzle: 0034001221004301\n\nAnswer:\n")
    )
    spg = render_prompt(spg_protocol, {"Puzzle": "0034001221004301"}, _PlainChat())
    assert spg == "[user]" + message + "[/user]<reasoning>"


class _PlainChat:
    """A stand-in chat template that shows the one user message verbatim (the SPG shots hold non-ASCII arrows)."""

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize and len(messages) == 1 and messages[0]["role"] == "user"
        return "[user]" + messages[0]["content"] + "[/user]"


def test_prompt_hash_changes_with_the_template():
    a, b = get_protocol("d1", "gsm8k"), get_protocol("spg", "gsm8k")
    assert a.prompt.hash() == b.prompt.hash()  # same prompt, different graders
    assert a.prompt.hash() != get_protocol("d1", "math500").prompt.hash()
    card = a.to_dict()
    assert card["prompt"]["sha256"] == a.prompt.hash() and "{question}" in card["prompt"]["template"]


# ----------------------------------------------------------------------------------------------------------------
# presets, refusals, overrides


def test_preset_settings():
    s = get_protocol("stabledrl", "gsm8k")
    assert (s.sampler["max_completion_length"], s.sampler["diffusion_steps"], s.sampler["block_length"]) == (
        256,
        256,
        8,
    )
    assert s.sampler["temperature"] == 0.0 and s.seeds == (112,) and (s.batch_size, s.num_processes) == (8, 8)
    assert s.decode == "prompt_and_canvas" and not s.samples
    for length, batch in ((128, 8), (256, 8), (512, 4)):
        d = get_protocol("d1", "math500", gen_length=length)
        assert (d.sampler["max_completion_length"], d.sampler["diffusion_steps"], d.sampler["block_length"]) == (
            length,
            length // 2,
            32,
        )
        assert d.batch_size == batch and d.decode == "canvas_with_special_tokens" and d.deviations == ()
    assert get_protocol("d1", "sudoku").metric == "cell_accuracy"
    assert get_protocol("spg", "sudoku").data.path == "test_sudoku_split_new.csv"


def test_refusals():
    with pytest.raises(ValueError, match="no 'countdown' evaluation.*--protocol d1"):
        get_protocol("stabledrl", "countdown")
    # the code benchmarks are a stabledrl preset (tests/test_protocol_code.py); d1 has none: refused, naming it
    with pytest.raises(ValueError, match="d1's eval/ covers.*--protocol stabledrl"):
        get_protocol("d1", "humaneval")
    with pytest.raises(ValueError, match="reports lengths 128, 256, 512"):
        get_protocol("d1", "gsm8k", gen_length=300)
    with pytest.raises(ValueError, match="decodes 256 tokens"):
        get_protocol("stabledrl", "gsm8k", gen_length=512)
    with pytest.raises(ValueError, match="not a preset; choose one of stabledrl, d1, spg"):
        get_protocol("lm-eval", "gsm8k")
    with pytest.raises(ValueError, match="MATH-500 is 'math500'"):
        get_protocol("d1", "math")
    with pytest.raises(ValueError, match="unknown field\\(s\\) temprature"):
        get_protocol("d1", "gsm8k", overrides={"temprature": 0.5})


def test_overrides_are_deviations():
    p = get_protocol("d1", "gsm8k", overrides={"temperature": 0.9, "block_length": 32, "count": 10, "seeds": [1, 2]})
    assert {d["field"]: (d["protocol"], d["used"]) for d in p.deviations} == {
        "sampler.temperature": (0.0, 0.9),  # block_length 32 is the preset's: no deviation
        "data.count": (None, 10),
        "seeds": ([42], [1, 2]),
    }
    assert p.samples and p.seeds == (1, 2) and p.data.count == 10


def test_d1_row_selection_is_numpy_seed_42():
    import numpy as np

    spec = get_protocol("d1", "sudoku").data
    state = np.random.get_state()
    try:
        np.random.seed(42)  # what d1's init_seed(42) does before the dataset draws its subsample
        expected = np.random.choice(500, 256, replace=False).tolist()
    finally:
        np.random.set_state(state)
    assert select_indices(500, spec) == expected
    assert sorted(select_indices(256, get_protocol("d1", "countdown").data)) == list(range(256))  # a permutation


def test_data_file_hash_is_checked(tmp_path):
    path = tmp_path / "countdown.jsonl"
    path.write_text('{"input": "30,100,93", "output": "23"}\n' * 256)
    protocol = get_protocol("d1", "countdown")
    with pytest.raises(ValueError, match="pass its path with --data_files"):
        load_protocol_rows(protocol, None)
    rows, data = load_protocol_rows(protocol, str(path))
    assert len(rows) == 256 and data["deviations"][0]["field"] == "data.file_sha256"
    import dataclasses

    same = dataclasses.replace(protocol, data=dataclasses.replace(protocol.data, file_sha256=_sha(path.read_text())))
    assert load_protocol_rows(same, str(path))[1]["deviations"] == []


# ----------------------------------------------------------------------------------------------------------------
# runner and card


def _small(name="stabledrl", task="gsm8k", **more):
    overrides = {"max_completion_length": 8, "diffusion_steps": 4, "block_length": 8, "batch_size": 3, **more}
    return get_protocol(name, task, overrides=overrides)


def _gsm_rows(n=7):
    return [{"question": f"{i}+{i}=", "answer": f"{i} plus {i}\n#### {2 * i}"} for i in range(n)]


def test_data_parallel_equals_one_process_and_resume(tiny_llada, tokenizer, tmp_path):
    protocol, rows = _small(), _gsm_rows()
    one = run_protocol(tiny_llada, tokenizer, protocol, rows, results_file=str(tmp_path / "one.jsonl"), progress=False)
    assert one["new_rows"] == 7 and [r["index"] for r in one["records"]] == list(range(7))
    shards = str(tmp_path / "dp.jsonl")
    for rank in (0, 1):
        run_protocol(
            tiny_llada, tokenizer, protocol, rows, results_file=shards, rank=rank, world_size=2, progress=False
        )
    merged = collect_records(shards, protocol, 112, len(rows), world_size=2)
    assert merged == one["records"]  # texts, grades and order identical to one process
    # the graded text is the prompt and the canvas decoded together, without special tokens
    assert all(r["graded_text"].startswith(r["prompt"]) for r in merged)

    # an interrupted run: two finished rows and half a line; the rerun decodes only the other five
    lines = (tmp_path / "one.jsonl").read_text().split("\n")
    (tmp_path / "one.jsonl").write_text("\n".join(lines[:3]) + '\n{"index": 5, "se')
    again = run_protocol(
        tiny_llada, tokenizer, protocol, rows, results_file=str(tmp_path / "one.jsonl"), progress=False
    )
    assert (again["resumed_rows"], again["new_rows"]) == (2, 5) and again["records"] == one["records"]
    with pytest.raises(ValueError, match="written by another protocol or seed"):
        read_results(str(tmp_path / "one.jsonl"), "another-key")
    with pytest.raises(ValueError, match="1 row\\(s\\) are missing"):
        collect_records(shards, protocol, 112, len(rows) + 1, world_size=2)


def test_card_scores_and_intervals():
    # Wilson at k = 3, n = 10 by hand: p = 0.3, z = 1.96
    z = 1.959963984540054
    centre = (0.3 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.3 * 0.7 / 10 + z * z / 400) / (1 + z * z / 10)
    assert wilson_interval(3, 10) == pytest.approx((centre - half, centre + half))
    assert wilson_interval(3, 10) == pytest.approx((0.1078, 0.6032), abs=1e-4)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0
    # cell accuracy: R = 15 / 20; residuals a - R b: (0, 0, 1, -1, 0) -> se = sqrt(2 / (5 * 4)) / 4
    low, high = ratio_interval([3, 3, 4, 2, 3], [4, 4, 4, 4, 4])
    assert (low + high) / 2 == pytest.approx(0.75) and (high - low) / 2 == pytest.approx(z * math.sqrt(0.1) / 4)
    # several seeds: mean, spread and a t interval over seeds
    block = score_block(
        "accuracy",
        {1: [{"correct": True}] * 3 + [{"correct": False}], 2: [{"correct": True}] * 2 + [{"correct": False}] * 2},
    )
    assert block["value"] == pytest.approx(0.625) and block["std_over_seeds"] == pytest.approx(math.sqrt(0.03125))
    assert set(block["per_seed"]) == {"1", "2"} and block["per_seed"]["1"]["value"] == 0.75


def test_card_and_model_card_rendered_from_cards(tiny_llada, tokenizer, tmp_path):
    protocol, rows = _small(), _gsm_rows(4)
    run = run_protocol(tiny_llada, tokenizer, protocol, rows, progress=False)
    records = [dict(r, correct=(i % 2 == 0)) for i, r in enumerate(run["records"])]  # 2 of 4 right
    runtime = {"dtype": "float32", "device": "cpu", "num_processes": 1, "batch_size": 3}
    card = build_card(protocol, {112: records}, model="tiny", runtime=runtime, data={"path": "local"})
    assert card["score"]["value"] == 0.5 and card["score"]["interval"] == pytest.approx(list(wilson_interval(2, 4)))
    fields = {d["field"] for d in card["deviations"]}
    assert {"sampler.max_completion_length", "batch_size", "runtime.num_processes", "runtime.dtype"} <= fields
    assert card["protocol"]["prompt"]["sha256"] == protocol.prompt.hash() and card["versions"]["torch"]
    model_dir = tmp_path / "model"
    (model_dir / "eval_cards").mkdir(parents=True)
    (model_dir / "README.md").write_text("# my model\n")
    write_card(str(model_dir / "eval_cards" / "a.json"), card)
    update_model_card(str(model_dir))
    text = (model_dir / "README.md").read_text()
    assert text.startswith("# my model\n") and "## Evaluation results" in text
    assert "| gsm8k | stabledrl (length 8) | accuracy | 50.0 [" in text
    card["score"]["value"] = 0.75  # re-rendering replaces the block, never appends a second one
    write_card(str(model_dir / "eval_cards" / "a.json"), card)
    update_model_card(str(model_dir))
    text = (model_dir / "README.md").read_text()
    assert text.count("## Evaluation results") == 1 and "| 75.0 [" in text and "| 50.0 [" not in text
    (model_dir / "eval_cards" / "other.json").write_text(json.dumps({"accuracy": 1}))
    with pytest.raises(ValueError, match="is not a protocol card"):
        read_cards(str(model_dir / "eval_cards"))


def test_evaluate_script_writes_the_card(tiny_llada, tokenizer, tmp_path, load_script):
    model_dir = tmp_path / "tiny"
    tiny_llada.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _gsm_rows(5)))
    evaluate = load_script("evaluate")
    argv = [
        "--model_name_or_path",
        str(model_dir),
        "--protocol",
        "stabledrl",
        "--task",
        "gsm8k",
        "--dataset_path",
        str(data),
        "--gen_length",
        "8",
        "--steps",
        "4",
        "--block_length",
        "8",
        "--limit",
        "3",
        "--dtype",
        "float32",
        "--device",
        "cpu",
        "--no_progress",
        "--update_model_card",
    ]
    out = evaluate.main(argv=argv)
    card = json.loads((model_dir / "eval_cards" / "stabledrl-gsm8k-8.json").read_text())
    assert card == json.loads(json.dumps(out["card"]))
    assert card["score"]["n"] == 3 and card["data"]["count"] == 3 and card["data"]["source_rows"] == 5
    assert {"data.source", "data.count", "sampler.max_completion_length", "dtype"} <= {
        d["field"] for d in card["deviations"]
    }
    assert card["protocol"]["seeds"] == [112] and card["runtime"]["num_processes"] == 1
    assert "stabledrl (length 8)" in (model_dir / "README.md").read_text()
    records = (model_dir / "eval_cards" / "stabledrl-gsm8k-8.records.jsonl").read_text().strip().split("\n")
    assert len(records) == 4  # the header and three rows
    with pytest.raises(ValueError, match="fixes the prompt, the grading and the rows; drop --prompt_style"):
        evaluate.main(argv=argv + ["--prompt_style", "official"])
    with pytest.raises(ValueError, match="--limit apply only with --protocol"):
        evaluate.main(argv=["--model_name_or_path", str(model_dir), "--task", "gsm8k", "--limit", "3"])


def test_training_heldout_evaluation_writes_the_same_card(tmp_path, load_script, tiny_llada, tiny_tokenizer):
    from stabledrl_trl import StableDRLConfig
    from stabledrl_trl.protocol_card import write_heldout_cards
    from stabledrl_trl.tasks import get_task, load_task_dataset

    train = load_script("train")
    args = StableDRLConfig(
        output_dir=str(tmp_path), use_cpu=True, max_completion_length=8, block_length=4, diffusion_steps=4,
        per_device_train_batch_size=4, num_generations=4, temperature=1.0, seed=5,
    )  # fmt: skip
    rows = load_task_dataset("digit_sort", "test", num_samples=4)
    task = get_task("digit_sort")
    one = train._evaluate(
        tiny_llada,
        tiny_tokenizer,
        rows,
        task,
        args,
        train.TrainScriptArguments(task="digit_sort", eval_batch_size=4),
        "before RL",
    )
    draws = train._evaluate(
        tiny_llada,
        tiny_tokenizer,
        rows,
        task,
        args,
        train.TrainScriptArguments(task="digit_sort", eval_draws=2, eval_batch_size=4),
        "after RL",
    )
    (tmp_path / "README.md").write_text("# model card\n")
    runtime = {"dtype": "float32", "device": "cpu", "num_processes": 1, "batch_size": 4}
    paths = write_heldout_cards(
        str(tmp_path),
        {"before": one, "after": draws},
        task="digit_sort",
        seed=5,
        settings=train.eval_sampler_settings(args, train.TrainScriptArguments()),
        runtime=runtime,
    )
    before, after = read_cards(paths)
    assert before["schema"] == after["schema"] and before["protocol_name"] == "training_heldout"
    assert before["score"]["value"] == one["accuracy"] and before["score"]["n"] == 4
    assert before["score"]["seeds"] == ["5"]
    assert after["score"]["seeds"] == ["5", "6"] and after["score"]["value"] == pytest.approx(draws["mean"])
    assert [after["score"]["per_seed"][s]["value"] for s in ("5", "6")] == draws["draws"]
    assert after["protocol"]["sampler"]["max_completion_length"] == 8
    text = (tmp_path / "README.md").read_text()
    assert text.startswith("# model card") and text.count("| digit_sort | training_heldout") == 2


@pytest.mark.slow
def test_two_launched_processes_write_the_card_of_one(tiny_llada, tokenizer, tmp_path, clean_env, load_script):
    """scripts/evaluate.py --protocol under torchrun with two gloo processes: each decodes every other row into its
    shard, the main process merges them and writes a card whose records and score equal one process's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    model_dir = tmp_path / "tiny"
    tiny_llada.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _gsm_rows(5)))
    script = str(Path(__file__).resolve().parent.parent / "scripts" / "evaluate.py")
    common = ["--model_name_or_path", str(model_dir), "--protocol", "stabledrl", "--task", "gsm8k",
              "--dataset_path", str(data), "--gen_length", "8", "--steps", "4", "--block_length", "8",
              "--batch_size", "2", "--dtype", "float32", "--no_progress"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", script, *common,
           "--card_file", str(tmp_path / "two.json")]  # fmt: skip
    proc = subprocess.run(cmd, env=clean_env, capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    two = json.loads((tmp_path / "two.json").read_text())
    one = load_script("evaluate").main(argv=common + ["--device", "cpu", "--card_file", str(tmp_path / "one.json")])
    one = json.loads(json.dumps(one["card"]))
    assert two["runtime"]["num_processes"] == 2 and one["runtime"]["num_processes"] == 1
    assert two["score"] == one["score"] and two["data"]["rows_sha256"] == one["data"]["rows_sha256"]
    shards = [tmp_path / f"two.records.jsonl.rank{r}-of-2" for r in (0, 1)]
    lines = [json.loads(line) for path in shards for line in path.read_text().strip().split("\n")[1:]]
    ones = [json.loads(line) for line in (tmp_path / "one.records.jsonl").read_text().strip().split("\n")[1:]]
    assert sorted(lines, key=lambda r: r["index"]) == ones and os.path.getsize(shards[1]) > 0


def test_sampling_override_scores_several_seeds(tiny_llada, tokenizer, tmp_path, load_script):
    model_dir = tmp_path / "tiny"
    tiny_llada.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "gsm.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _gsm_rows(3)))
    evaluate = load_script("evaluate")
    argv = ["--model_name_or_path", str(model_dir), "--protocol", "stabledrl", "--task", "gsm8k",
            "--dataset_path", str(data), "--gen_length", "8", "--steps", "4", "--block_length", "8",
            "--dtype", "float32", "--device", "cpu", "--no_progress", "--temperature", "0.9", "--seed", "7"]  # fmt: skip
    card = evaluate.main(argv=argv + ["--draws", "2"])["card"]
    score = card["score"]
    assert score["seeds"] == ["7", "8"] and set(score["per_seed"]) == {"7", "8"}
    assert score["value"] == pytest.approx((score["per_seed"]["7"]["value"] + score["per_seed"]["8"]["value"]) / 2)
    assert {"sampler.temperature", "seeds"} <= {d["field"] for d in card["deviations"]}
    texts = {
        seed: [json.loads(line)["graded_text"] for line in path.read_text().strip().split("\n")[1:]]
        for seed, path in ((s, tmp_path / "tiny" / "eval_cards" / f"stabledrl-gsm8k-8.records.seed{s}.jsonl")
                           for s in (7, 8))
    }  # fmt: skip
    assert texts[7] != texts[8]  # the draws differ
    three = evaluate.main(argv=argv + ["--card_file", str(tmp_path / "three.json")])["card"]
    assert len(three["score"]["per_seed"]) == 3  # default: 3 draws when sampling
    with pytest.raises(ValueError, match="decodes greedily"):
        evaluate.main(argv=argv[:-4] + ["--draws", "2"])


def test_hub_data_unreachable_names_the_local_copy_flag(monkeypatch):
    """Without the hub, a preset's hub data set fails with the fix (--data_files), not a bare ConnectionError."""
    import datasets

    from stabledrl_trl.protocols import get_protocol, load_protocol_rows

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"'openai/gsm8k'.*could not be loaded from the hub.*--data_files"):
        load_protocol_rows(get_protocol("stabledrl", "gsm8k"))
