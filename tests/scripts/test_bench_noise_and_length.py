"""scripts/bench_length_noise.py, scripts/bench_noise_dose.py and the digit_sort_long task: definitions by hand."""

import json
import math

import pytest
import torch

from stabledrl_trl import claims


def test_digit_sort_long_answers_are_32_to_64_scored_tokens_and_the_splits_share_no_answer():
    from stabledrl_trl.tasks import get_task, load_task_dataset
    from stabledrl_trl.tasks.digit_sort_long import MAX_DIGITS, MIN_DIGITS, split_digit_strings
    from stabledrl_trl.tiny import build_tiny_tokenizer

    train, test = split_digit_strings("train", 3000), split_digit_strings("test", 300)
    assert {len(s) for s in train} <= set(range(MIN_DIGITS, MAX_DIGITS + 1)) and len(set(map(len, train))) > 20
    assert not {"".join(sorted(s)) for s in train} & {"".join(sorted(s)) for s in test}
    assert split_digit_strings("test", 300) == test  # generated, not random per call
    rows = load_task_dataset("digit_sort_long", "test", num_samples=5, seed=1)
    tok = build_tiny_tokenizer()
    for row in rows:
        ids = tok(row["answer"], add_special_tokens=False)["input_ids"]
        assert len(ids) + 1 in range(32, 65)  # the answer and the EOS: the scored tokens
        assert row["answer"] == "".join(sorted(row["digits"]))
    task = get_task("digit_sort_long")
    rewards = task.correctness_reward(
        [None, None], [rows[0]["answer"], rows[0]["digits"]], answer=[rows[0]["answer"]] * 2
    )  # fmt: skip
    assert rewards == [1.0, 1.0 if rows[0]["digits"] == rows[0]["answer"] else 0.0]
    with pytest.raises(ValueError, match="reads no files"):
        load_task_dataset("digit_sort_long", "train", path="x")


def test_length_forms_by_hand(load_script):
    bench = load_script("bench_length_noise")
    log_r = torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=torch.float64)
    n = torch.tensor([10.0, 20.0, 5.0, 40.0], dtype=torch.float64)
    f = bench.forms(log_r, n)
    assert f["mean_form"]["weight_max"] == pytest.approx(math.exp(0.3))
    assert f["sum_form"]["weight_max"] == pytest.approx(math.exp(1.5))  # 0.3 x 5 tokens
    assert f["sum_form"]["log_ratio_sd"] == pytest.approx((log_r * n).std().item())
    assert f["sum_form"]["frac_above_clip_c"] == 0.0 and f["pairs"] == 4
    # the study's exact layout on the short canvas, the official block count (8) on the long one, one block
    assert bench.block_size(8, 8, short=True) == 2 and bench.block_size(64, 8, short=False) == 8
    assert bench.block_size(64, 1, short=False) == 64 and bench.block_size(64, None, short=False) is None
    with pytest.raises(SystemExit, match="31-63"):
        bench.parse_args(["--digits", "8"])


def _row(setting, digits, tokens, sd, w, sd_sum, w_sum):
    stats = dict(log_ratio_mean=0.0, log_ratio_abs_max=1.0, frac_above_clip_c=0.0)
    return {
        "task": "digit_sort_long", "digits": digits, "canvas": 64, "setting": setting,
        "likelihood_estimator": "block_random", "mc_samples": 2, "estimator_block_size": 8, "pairs": 512,
        "scored_tokens_mean": tokens, "scored_tokens_min": digits + 1, "scored_tokens_max": digits + 1,
        "mean_form": {**stats, "log_ratio_sd": sd, "weight_max": w},
        "sum_form": {**stats, "log_ratio_sd": sd_sum, "weight_max": w_sum},
    }  # fmt: skip


def test_length_reading_is_backed_by_the_json(load_script):
    bench = load_script("bench_length_noise")
    data = {
        "provenance": {"commit": "abc", "dirty": False, "command": "python scripts/bench_length_noise.py",
                       "versions": {"python": "3", "torch": "t", "transformers": "x", "trl": "y"}},
        "settings": {"pairs": 512, "clip_c": 5.0, "estimators": {"block_random_8_blocks": {}}},
        "rows": [_row("block_random_8_blocks", 31, 32.0, 0.111, 1.5, 3.552, 40.0),
                 _row("block_random_8_blocks", 63, 64.0, 0.0917, 1.4, 5.8688, 300.0)],
        "seconds": 60.0,
    }  # fmt: skip
    text = bench.reading(data)
    assert "0.111 -> 0.092" in text and "3.552 -> 5.869" in text and "32.0 to 64.0" in text
    for sentence in text.splitlines():
        assert claims.check_sentence(sentence, [data]) == []
    assert "| digit_sort_long, 63 |" in bench.render(data)


def test_noise_dose_definitions_by_hand(load_script):
    bench = load_script("bench_noise_dose")
    acc = {"0": 0.30, "10": 0.40, "20": 0.50, "40": 0.50}
    assert bench.area_under_curve(acc) == pytest.approx((10 * 0.35 + 10 * 0.45 + 20 * 0.50) / 40)
    falling = {"0": 0.30, "10": 0.27, "20": 0.25, "30": 0.20, "40": 0.31}
    assert bench.collapsed(falling, [1.0], margin=0.02, evals=3)  # 0.27, 0.25, 0.20 all below 0.28
    assert not bench.collapsed(falling, [1.0], margin=0.02, evals=4)
    assert not bench.collapsed({"0": 0.3, "10": 0.29, "20": 0.27, "30": 0.29}, [1.0], 0.02, 2)  # not in a row
    assert bench.collapsed(acc, [1.0, float("nan")], 0.02, 3)  # a non-finite grad norm
    assert bench.is_flat([0.1, 0.3, 0.305, 0.30, 0.31], delta=0.02, evals=3)
    assert not bench.is_flat([0.1, 0.2, 0.25, 0.30, 0.35], delta=0.02, evals=3)
    assert bench.is_flat([0.3, 0.3], delta=0.02, evals=3) is None  # too short to tell


def test_noise_dose_cell_summary_and_breaking_point(load_script):
    bench = load_script("bench_noise_dose")

    def rec(name, seed, final, auc, collapsed):
        return {"objective": name, "seed": seed, "best": final + 0.01, "final": final, "auc": auc, "start": 0.3,
                "collapsed": collapsed, "param_distance": {"l2": 2.0}, "accuracies": {"0": 0.3, "10": final}}  # fmt: skip

    records = [rec("grpo_seq", s, f, 0.2, c) for s, f, c in [(0, 0.1, True), (1, 0.2, True), (2, 0.3, False)]]
    records += [rec("stable_drl", s, f, 0.4, False) for s, f in [(0, 0.4), (1, 0.5), (2, 0.5)]]
    summary = bench.cell_summary(records, flat_delta=0.01, flat_evals=1)
    sd = summary["objectives"]["stable_drl"]
    assert summary["objectives"]["grpo_seq"]["collapsed"] == 2 and sd["collapsed"] == 0
    assert summary["objectives"]["grpo_seq"]["collapsed_ended_below_start"] == 2  # 0.1 and 0.2, below 0.3 - 0.02
    # a run that collapsed (a dip) and ended above its start counts as collapsed, not as ended below the start
    dipped = [dict(r, collapsed=True) if r["seed"] == 0 else r for r in records if r["objective"] == "stable_drl"]
    dip = bench.cell_summary(records[:3] + dipped, 0.01, 1)["objectives"]["stable_drl"]
    assert (dip["collapsed"], dip["collapsed_ended_below_start"]) == (1, 0)
    cell = {"noise_sd": 0.6, "mc_samples": 2, "added_noise_std": 0.5, "learning_rate": 5e-5, "runs": records[:3] + dipped,
            "summary": bench.cell_summary(records[:3] + dipped, 0.01, 1)}  # fmt: skip
    (line,) = [x for x in bench.cell_reading(cell, {"delta": 0.01, "evals": 1}) if "recovered" in x]
    assert "stable_drl 1 of its 1" in line and "grpo_seq" not in line and claims.check_sentence(line, [cell]) == []
    assert sd["final"] == pytest.approx(1.4 / 3) and sd["final_vs_grpo_seq"]["mean"] == pytest.approx(0.8 / 3)
    assert sd["auc_vs_grpo_seq"]["mean"] == pytest.approx(0.2) and sd["param_distance"] == 2.0
    assert summary["best_objective"] == "stable_drl" and summary["flat"] is False  # rose from 0.3 to 0.467
    assert bench.flat_state(records, "stable_drl", {"delta": 0.01, "evals": 1}) is False
    assert bench.flat_state(records, "stable_drl", {"delta": 0.01, "evals": 2}) is None
    cells = [
        {"learning_rate": 5e-5, "noise_sd": 0.3, "summary": {"objectives": {
            "grpo_seq": {"collapsed": 0, "seeds": 3}, "stable_drl": {"collapsed": 0, "seeds": 3}}}},
        {"learning_rate": 5e-5, "noise_sd": 1.1, "summary": summary},
        {"learning_rate": 1.5e-4, "noise_sd": 1.1, "summary": {"objectives": {
            "grpo_seq": {"collapsed": 1, "seeds": 3}, "stable_drl": {"collapsed": 0, "seeds": 3}}}},
    ]  # fmt: skip
    assert bench.breaking_point(cells) == {"5e-05": 1.1, "0.00015": None}
    with pytest.raises(ValueError, match="count='ended'"):
        bench.breaking_point(cells, "ended")


def test_noise_dose_persistent_breaking_point_ignores_recovered_dips(load_script, tmp_path, monkeypatch):
    """With only StableDRL's recovered dip counted, the breaking point moves down to the cell with the dip; the
    summaries recomputed from a JSON's records (--summaries-only) give it without training anything."""
    from stabledrl_trl import results

    bench = load_script("bench_noise_dose")

    def rec(name, seed, final, collapsed):
        return {"objective": name, "seed": seed, "best": max(final, 0.3), "final": final, "auc": 0.3, "start": 0.3,
                "collapsed": collapsed, "param_distance": {"l2": 1.0}, "accuracies": {"0": 0.3, "20": final}}  # fmt: skip

    def cell(sd, added, records):
        return {"mc_samples": 2, "added_noise_std": added, "learning_rate": 5e-5, "noise_sd": sd, "runs": records}

    low = [rec("grpo_seq", s, 0.35, False) for s in range(3)] + [rec("stable_drl", s, 0.35, False) for s in range(3)]
    # grpo_seq: 2 of 3 collapse and stay down; stable_drl: seed 0 dips (collapsed) and ends at 0.40 > 0.3 - 0.02
    mid = [rec("grpo_seq", 0, 0.05, True), rec("grpo_seq", 1, 0.10, True), rec("grpo_seq", 2, 0.35, False),
           rec("stable_drl", 0, 0.40, True), rec("stable_drl", 1, 0.38, False), rec("stable_drl", 2, 0.36, False)]
    high = [rec("grpo_seq", s, 0.0, True) for s in range(3)] + [rec("stable_drl", s, 0.33, False) for s in range(3)]
    data = {"provenance": {"commit": "a" * 40, "dirty": False, "command": "python scripts/bench_noise_dose.py",
                           "versions": {"python": "3", "torch": "t", "transformers": "x", "trl": "y"}},
            "pilot": False, "preset": "long-all", "seconds": 60.0,
            "settings": {"study": {}, "objectives": ["grpo_seq", "stable_drl"], "seeds": [0, 1, 2], "max_steps": 20,
                         "eval_every": 20, "eval_samples": 8, "eval_draws": 1,
                         "collapse": {"margin": 0.02, "evals": 1}, "flat": {"delta": 0.01, "evals": 1}},
            "cells": [cell(0.3, 0.0, low), cell(0.6, 0.5, mid), cell(1.1, 1.0, high)]}  # fmt: skip
    results.write_json(str(tmp_path / "bench_noise_dose_long_all.json"), data)
    page = tmp_path / "page.md"
    page.write_text("<!-- noise_dose_long_all:start -->\nold\n<!-- noise_dose_long_all:end -->\n")
    monkeypatch.setattr(bench, "run", lambda *a: pytest.fail("--summaries-only must not train"))
    out = bench.main(["--preset", "long-all", "--summaries-only", "--output-dir", str(tmp_path), "--page", str(page)])
    assert out["breaking_point"] == {"5e-05": 1.1} and out["breaking_point_persistent"] == {"5e-05": 0.6}
    mine = out["cells"][1]["summary"]["objectives"]["stable_drl"]
    assert (mine["collapsed"], mine["collapsed_ended_below_start"]) == (1, 0)
    assert out["cells"][1]["runs"] == mid and out["provenance"] == data["provenance"]  # kept as they were
    assert out["summarized_by"]["command"].startswith("python scripts/bench_noise_dose.py --preset long-all")
    written = results.read_json(str(tmp_path / "bench_noise_dose_long_all.json"))
    assert json.dumps(written, sort_keys=True) == json.dumps(out, sort_keys=True)  # (tuples are written as lists)
    lines = bench.breaking_point_sentences(out)
    assert lines == [
        "lr 5e-05: smallest measured noise sd at which grpo_seq collapses in most seeds and stable_drl in none: 1.100 "
        "(grpo_seq 3 of 3 seeds, stable_drl 0 of 3).",
        "lr 5e-05, counting only the collapsed runs that ended below the start - 0.02: smallest measured noise sd at "
        "which grpo_seq collapses in most seeds and stable_drl in none: 0.600 (grpo_seq 2 of 3 seeds, stable_drl 0 "
        "of 3).",
    ]
    for line in lines:
        assert claims.check_sentence(line, [out]) == []
    with pytest.raises(SystemExit, match="no .*bench_noise_dose_long.json to recompute; run the study first"):
        bench.main(["--preset", "long", "--summaries-only", "--output-dir", str(tmp_path), "--page", str(page)])
    block = results.marked_blocks(page.read_text())["noise_dose_long_all"]
    assert lines[1] in block and "Summaries recomputed from the runs' records by `python scripts/" in block


def test_noise_dose_arguments(load_script):
    bench = load_script("bench_noise_dose")
    args = bench.parse_args(["--cells", "2:1.0:5e-5", "1:0:1e-4"])
    assert args.cells == [(2, 1.0, 5e-5), (1, 0.0, 1e-4)] and args.objectives == list(bench.OBJECTIVES)
    full = bench.parse_args([])
    assert len(full.cells) == 3 * 4 * 2 and full.seeds == [0, 1, 2, 3, 4] and full.max_steps == 1500
    pilot = bench.parse_args(["--pilot"])
    assert pilot.objectives == ["grpo_seq", "stable_drl"] and len(pilot.cells) == 2 and pilot.max_steps == 60
    preset = bench.parse_args(["--preset", "k2-added-noise"])
    assert preset.cells == [(2, 0.0, 5e-5), (2, 0.5, 5e-5), (2, 1.0, 5e-5), (2, 2.0, 5e-5)]
    assert preset.seeds == [0, 1, 2, 3, 4]
    assert preset.objectives == list(bench.OBJECTIVES) and not preset.pilot
    # a preset of explicit cells: the K = 2 slice, K = 8 and K = 1 without added noise, the second lr at noise 0.5
    dose = bench.parse_args(["--preset", "dose-k-lr"])
    assert dose.cells == preset.cells + [(8, 0.0, 5e-5), (1, 0.0, 5e-5), (2, 0.5, 1.5e-4)]
    assert (dose.seeds, dose.max_steps, dose.objectives) == (preset.seeds, preset.max_steps, preset.objectives)
    assert bench.parse_args(["--preset", "dose-k-lr", "--cells", "8:0:5e-5"]).cells == [(8, 0.0, 5e-5)]
    assert {tuple(c) for c in bench.grid_record(dose)["cells"]} == set(dose.cells)
    # the long preset: GRPO and StableDRL, 480 steps, K = 2 at the added noise 0 / 0.5 / 1, its own JSON and block
    long = bench.parse_args(["--preset", "long"])
    assert long.cells == preset.cells[:3] and long.max_steps == 480 and long.objectives == ["grpo_seq", "stable_drl"]
    assert (long.eval_every, long.eval_samples, long.eval_draws) == (dose.eval_every, dose.eval_samples, dose.eval_draws)
    assert bench.outputs("long") == ("bench_noise_dose_long.json", "noise_dose_long")
    assert bench.outputs("dose-k-lr") == bench.outputs(None) == (bench.JSON_NAME, bench.BLOCK)
    with pytest.raises(SystemExit, match="give one of them"):
        bench.parse_args(["--preset", "k2-added-noise", "--pilot"])
    with pytest.raises(SystemExit, match="--summaries-only rewrites it"):
        bench.parse_args(["--readme-only", "--summaries-only"])
    with pytest.raises(SystemExit, match="K:NOISE:LR"):
        bench.parse_args(["--cells", "2:1.0"])
    with pytest.raises(SystemExit, match="include grpo_seq"):
        bench.parse_args(["--objectives", "stable_drl"])


def test_noise_dose_runs_are_kept_and_reused_only_under_the_same_settings(load_script, tmp_path):
    bench = load_script("bench_noise_dose")
    args = bench.parse_args(["--preset", "k2-added-noise"])
    study = {"mc_samples": 2, "learning_rate": 5e-5, "test_log_ratio_noise_std": 0.5}
    key = bench.run_key(study, {"loss_type": "stable_drl"}, 3, args)
    cell = str(tmp_path / "k2-noise0.5-lr5e-05")
    assert bench.read_cached_run(cell, "stable_drl", 3, key) is None  # nothing kept yet
    summary = {"objective": "stable_drl", "seed": 3, "accuracies": {0: 0.25, 20: 0.5}, "grad_norm": [1.0, float("nan")]}
    before = {"mean": 0.25, "draws": [0.25, 0.25]}
    written = bench.write_cached_run(cell, "stable_drl", 3, key, summary, before)
    assert written[0]["accuracies"] == {"0": 0.25, "20": 0.5} and written[1] == before  # as read back
    reused = bench.read_cached_run(cell, "stable_drl", 3, key)
    assert reused[0]["accuracies"] == written[0]["accuracies"] and reused[0]["grad_norm"][1] != reused[0]["grad_norm"][1]
    assert bench.run_record(reused[0] | {"accuracy_best": 0.5, "accuracy_after": 0.5, "accuracy_before": 0.25},
                            0.02, 3)["auc"] == pytest.approx(0.375)  # fmt: skip
    # Any setting the run depends on changes the key: the kept run is not reused.
    assert bench.read_cached_run(cell, "stable_drl", 4, key) is None  # another seed's folder
    for changed in (bench.run_key({**study, "learning_rate": 1e-4}, {"loss_type": "stable_drl"}, 3, args),
                    bench.run_key(study, {"loss_type": "stable_drl"}, 3, bench.parse_args(["--max-steps", "60"])),
                    bench.run_key(study, {"loss_type": "grpo"}, 3, args)):  # fmt: skip
        assert bench.read_cached_run(cell, "stable_drl", 3, changed) is None


def test_noise_dose_wall_time_counts_the_kept_runs(load_script):
    bench = load_script("bench_noise_dose")
    fresh = {"seconds": 90.0, "cells": [{"runs": [{"seconds": 40.0, "kept": False}, {"seconds": 50.0, "kept": False}]}]}
    assert bench.wall_time(fresh) == "Wall time 1.5 min."
    kept = {"seconds": 60.0, "cells": [{"runs": [{"seconds": 600.0, "kept": True}, {"seconds": 300.0, "kept": False}]}]}
    assert bench.wall_time(kept) == ("Wall time 1.0 min for the last invocation, which reused 1 of the 2 runs from "
                                     "earlier ones over the same --runs-dir; training the 2 runs took 15.0 min in all.")


@pytest.mark.parametrize("script", ["bench_length_noise", "bench_noise_dose"])
def test_docs_pages_equal_the_rendering_of_their_committed_json(load_script, script):
    from pathlib import Path

    from stabledrl_trl import results

    docs = Path(__file__).resolve().parents[2] / "docs"
    bench = load_script(script)
    blocks = [b for _, b in bench.OUTPUTS.values()] if script == "bench_noise_dose" else [bench.BLOCK]
    rendered = bench.readme_blocks(str(docs))
    for block in blocks:
        page = results.marked_blocks(Path(results.block_page(block)).read_text())
        assert block in page
        if block not in rendered:  # no committed JSON: the block is empty, it shows no numbers
            assert page[block] == ""
            continue
        assert page[block] == rendered[block], f"run python scripts/{script}.py --readme-only"
    if script == "bench_length_noise":  # its reading rests on the JSON's numbers
        data = results.read_json(str(docs / bench.JSON_NAME))
        for sentence in bench.reading(data).splitlines():
            assert claims.check_sentence(sentence, [data]) == []


def test_gold_batch_holds_the_answer_and_its_eos(load_script):
    from stabledrl_trl.tiny import build_tiny_tokenizer

    bench = load_script("bench_length_noise")
    tok = build_tiny_tokenizer()
    examples = bench.make_examples("digit_sort_long", 31, 3, seed=0)
    assert all(len(e["digits"]) == 31 and e["answer"] == "".join(sorted(e["digits"])) for e in examples)
    pid, pm, cid, cm = bench.gold_batch(tok, examples, 64)
    assert cid.shape == cm.shape == (3, 64) and (cm.sum(-1) == 32).all()  # 31 digits and the EOS
    for row, e in enumerate(examples):
        assert tok.decode(cid[row, :31].tolist()) == e["answer"] and cid[row, 31] == tok.eos_token_id
        assert (cid[row, 32:] == tok.pad_token_id).all() and pm[row].sum() > 0
    with pytest.raises(ValueError, match="does not fit"):
        bench.gold_batch(tok, examples, 16)


@pytest.mark.slow
def test_length_noise_quick_run_end_to_end(load_script, tmp_path):
    bench = load_script("bench_length_noise")
    data = bench.main(["--quick", "--output-dir", str(tmp_path / "out"), "--sft-cache-dir", str(tmp_path / "sft"),
                       "--runs-dir", str(tmp_path / "runs"), "--pairs", "8"])  # fmt: skip
    rows = data["rows"]
    assert len(rows) == (2 + 2) * len(bench.SETTINGS)  # digit_sort rollouts and gold, two long lengths
    for r in rows:
        if r["task"] == "digit_sort_long":
            assert r["scored_tokens_min"] == r["scored_tokens_max"] == r["digits"] + 1
        if r["scored_tokens_min"] == r["scored_tokens_max"]:  # one length: the sum form is exactly n x the mean form
            n = r["scored_tokens_min"]
            assert r["sum_form"]["log_ratio_sd"] == pytest.approx(n * r["mean_form"]["log_ratio_sd"])
    assert (tmp_path / "out" / bench.JSON_NAME).is_file()


def test_noise_dose_partial_grid_names_what_it_leaves_out(load_script):
    bench = load_script("bench_noise_dose")
    args = bench.parse_args(["--preset", "k2-added-noise"])
    grid = bench.grid_record(args)
    # the full grid: K 8, 2, 1 x noise 0, 0.5, 1, 2 x lr 5e-5, 1.5e-4 = 24 cells, 5 objectives; the preset runs 4 cells
    assert bench.not_run(grid) == ["K 8, 1", "lr 0.00015",
                                   "20 of the full grid's 24 (K, noise, lr) cells in all"]  # fmt: skip
    data = {"pilot": False, "preset": "k2-added-noise", "grid": grid,
            "settings": {"objectives": args.objectives, "max_steps": args.max_steps}}  # fmt: skip
    label = bench.grid_label(data)
    assert label.startswith("PARTIAL GRID `k2-added-noise`") and "the full grid's 1500 steps" in label
    full = bench.parse_args([])
    data = {"pilot": False, "preset": None, "grid": bench.grid_record(full),
            "settings": {"objectives": full.objectives, "max_steps": full.max_steps}}  # fmt: skip
    assert bench.grid_label(data) == "The full grid. "
    some = bench.parse_args(["--cells", "2:1.0:5e-5", "8:0:1.5e-4"])  # 2 of the 2 x 2 x 2 combinations they span
    assert "6 of the remaining (K, noise, lr) combinations" in bench.not_run(bench.grid_record(some))
    assert bench.grid_label({"pilot": True}).startswith("PILOT")
    # explicit cells (not a product of the axes): listed as cells, and every axis value they span counts as run
    dose = bench.parse_args(["--preset", "dose-k-lr"])
    grid = bench.grid_record(dose)
    assert bench.not_run(grid) == ["17 of the remaining (K, noise, lr) combinations",
                                   "17 of the full grid's 24 (K, noise, lr) cells in all"]  # fmt: skip
    label = bench.grid_label({"pilot": False, "preset": "dose-k-lr", "grid": grid,
                              "settings": {"objectives": dose.objectives, "max_steps": dose.max_steps}})  # fmt: skip
    assert label.startswith("PARTIAL GRID `dose-k-lr`: the (K, added noise, lr) cells (2, 0, 5e-05), (2, 0.5, 5e-05)")
    assert "(8, 0, 5e-05), (1, 0, 5e-05), (2, 0.5, 0.00015), objectives grpo_seq" in label
    # cells beyond the full grid (a third learning rate): none of the grid's 24 cells was run, and the label says so
    low = bench.parse_args(["--preset", "long-low-lr"])
    assert low.cells == [(2, 0.5, 1.5e-5), (2, 1.0, 1.5e-5)] and low.max_steps == 480
    assert bench.outputs("long-low-lr") == ("bench_noise_dose_long_low_lr.json", "noise_dose_long_low_lr")
    grid = bench.grid_record(low)
    assert bench.outside_grid(grid) == ["lr 1.5e-05"] and bench.outside_grid(bench.grid_record(dose)) == []
    assert bench.not_run(grid)[-1] == "24 of the full grid's 24 (K, noise, lr) cells in all"
    label = bench.grid_label({"pilot": False, "preset": "long-low-lr", "grid": grid,
                              "settings": {"objectives": low.objectives, "max_steps": low.max_steps}})  # fmt: skip
    assert label.startswith("PARTIAL GRID `long-low-lr`: the cells K = 2 x added noise 0.5, 1 x lr 1.5e-05 (beyond "
                            "the full grid: lr 1.5e-05), objectives grpo_seq, stable_drl. Not run from the full grid:")


def test_noise_dose_names_an_objective_whose_scoring_ignores_k(load_script):
    bench = load_script("bench_noise_dose")

    def cell(k):
        noise = {"grpo_seq": {"likelihood_estimator": "block_random", "mc_samples": k, "log_ratio_sd": 0.3 / k},
                 "diffu_grpo": {"likelihood_estimator": "mean_field", "mc_samples": 1, "log_ratio_sd": 0.0}}  # fmt: skip
        return {"mc_samples": k, "noise": {"objectives": noise},
                "summary": {"objectives": {"grpo_seq": {}, "diffu_grpo": {}}}}  # fmt: skip

    notes = bench.estimator_notes({"cells": [cell(2), cell(8), cell(1)]})
    assert notes == [
        "diffu_grpo scores with its own estimator (mean_field, K = 1) in every cell, whatever the cell's K: its runs "
        "do not depend on K, so its rows at the same added noise and learning rate are equal."
    ]
    assert bench.estimator_notes({"cells": [cell(2), cell(2)]}) == []  # one K: nothing to say
    assert bench.estimator_notes({"cells": []}) == []


def test_noise_dose_long_preset_writes_its_own_json_and_block(load_script, tmp_path, monkeypatch):
    """A study run with the long preset goes to bench_noise_dose_long.json and the noise_dose_long block; the main
    study's JSON and block are left as they were."""
    from stabledrl_trl import results

    bench = load_script("bench_noise_dose")
    page = tmp_path / "page.md"
    page.write_text("<!-- noise_dose:start -->\nmain\n<!-- noise_dose:end -->\n"
                    "<!-- noise_dose_long:start -->\n<!-- noise_dose_long:end -->\n")  # fmt: skip
    monkeypatch.setattr(bench, "run", lambda args, argv: {"preset": args.preset, "cells": []})
    monkeypatch.setattr(bench, "render", lambda data: f"rendered {data['preset']}")
    bench.main(["--preset", "long", "--output-dir", str(tmp_path), "--page", str(page)])
    assert results.read_json(str(tmp_path / "bench_noise_dose_long.json")) == {"preset": "long", "cells": []}
    assert not (tmp_path / bench.JSON_NAME).exists()
    blocks = results.marked_blocks(page.read_text())
    assert blocks["noise_dose_long"].strip() == "rendered long" and blocks["noise_dose"].strip() == "main"
    # --readme-only renders every study whose JSON is there, each into its own block
    results.write_json(str(tmp_path / bench.JSON_NAME), {"preset": "dose-k-lr", "cells": []})
    bench.main(["--readme-only", "--output-dir", str(tmp_path), "--page", str(page)])
    blocks = results.marked_blocks(page.read_text())
    assert {k: v.strip() for k, v in blocks.items()} == {"noise_dose": "rendered dose-k-lr", "noise_dose_long": "rendered long"}


def test_rerun_sentences_compare_the_runs_two_studies_share_by_hand(load_script):
    bench = load_script("bench_noise_dose")
    settings = {"study": {"mc_samples": 2}, "max_steps": 480, "eval_every": 20, "eval_samples": 256, "eval_draws": 2}

    def run(objective, seed, start, final, collapsed):
        return {"objective": objective, "seed": seed, "start": start, "final": final, "collapsed": collapsed}

    def study(preset, runs, mc=2):
        return {"preset": preset, "settings": settings,
                "cells": [{"mc_samples": mc, "added_noise_std": 0.5, "learning_rate": 5e-5, "runs": runs}]}  # fmt: skip

    long = study("long", [run("grpo_seq", 0, 0.25, 0.0, True), run("grpo_seq", 1, 0.25, 0.0, True),
                          run("stable_drl", 0, 0.25, 0.40, False), run("stable_drl", 1, 0.25, 0.50, False)])  # fmt: skip
    again = study("long-all", [run("grpo_seq", 0, 0.25, 0.0, True), run("grpo_seq", 1, 0.25, 0.1, False),
                               run("stable_drl", 0, 0.25, 0.40, False), run("stable_drl", 1, 0.25, 0.44, False),
                               run("dgpo", 0, 0.25, 0.3, False)])  # fmt: skip
    assert len(bench.shared_runs(again, long)) == 4  # dgpo has no counterpart
    again["reruns"] = bench.compare_reruns(again, {"noise_dose_long": long})
    assert again["reruns"][0]["objectives"]["grpo_seq"] == {"runs": 2, "final_there": 0.0, "final_here": 0.05,
                                                            "collapsed_there": 2, "collapsed_here": 1}  # fmt: skip
    (line,) = bench.rerun_sentences(again)
    assert line == (
        "4 runs here train again runs of the `long` study (same cell, objective, seed and settings): 4 of 4 start from "
        "the same accuracy and 2 of 4 end at the same final accuracy; grpo_seq mean final 0.000 there and 0.050 "
        "here, collapsed 2 and 1 of 2; stable_drl mean final 0.450 there and 0.420 here, collapsed 0 and 0 of 2."
    )
    assert claims.check_sentence(line, [again]) == []
    # other settings, or another cell: nothing shared, nothing said
    assert bench.compare_reruns(again, {"b": {**long, "settings": {**settings, "max_steps": 120}}}) == []
    assert bench.compare_reruns(study("x", again["cells"][0]["runs"], mc=8), {"noise_dose_long": long}) == []
    assert bench.rerun_sentences({"cells": []}) == []
