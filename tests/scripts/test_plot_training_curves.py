"""Tests for scripts/plot_training_curves.py: log loading, series extraction, smoothing and the PNG it writes."""

import importlib.util
import json
import os

import pytest

_PLOT_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "plot_training_curves.py")
_spec = importlib.util.spec_from_file_location("plot_training_curves_script", _PLOT_PATH)
plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot)


def _log_history(scale):
    history = []
    for step in range(1, 11):
        history.append(
            {
                "step": step,
                "epoch": step / 10,
                "reward": scale * step / 10,
                "grad_norm": 1.0 / step,
                "stabledrl/weight_mean": 1.0 + 0.01 * step,
                "stabledrl/weight_max": 2.0 + 0.1 * step,
                "stabledrl/clip_frac": 0.05,
                "learning_rate": 1e-6,
            }
        )
    history.append({"step": 10, "train_runtime": 12.5, "train_loss": 0.1})  # TRL's end-of-training entry
    return history


def _write_run(root, name, scale):
    run = root / name
    run.mkdir()
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": _log_history(scale)}))
    return run


def test_extract_series_returns_the_written_numbers(tmp_path):
    run = _write_run(tmp_path, "grpo", scale=1.0)
    history = plot.load_log_history(str(run))
    steps, values = plot.extract_series(history, "reward")
    assert steps == [float(s) for s in range(1, 11)]
    assert values == [s / 10 for s in range(1, 11)]
    assert plot.extract_series(history, "grad_norm")[1] == [1.0 / s for s in range(1, 11)]
    assert plot.extract_series(history, "stabledrl/ess") == ([], [])
    # Non-numeric, non-finite and step-less entries are left out.
    odd = [
        {"step": 1, "m": 1.0},
        {"step": 2, "m": float("nan")},
        {"m": 3.0},
        {"step": 4, "m": "x"},
        {"step": 5, "m": 5},
    ]
    assert plot.extract_series(odd, "m") == ([1.0, 5.0], [1.0, 5.0])


def test_loaders_read_state_file_jsonl_and_checkpoints(tmp_path):
    run = _write_run(tmp_path, "a", scale=1.0)
    assert plot.load_log_history(str(run / "trainer_state.json")) == _log_history(1.0)
    jsonl = tmp_path / "logs.jsonl"
    jsonl.write_text("\n".join(json.dumps(e) for e in _log_history(2.0)) + "\n")
    assert plot.extract_series(plot.load_log_history(str(jsonl)), "reward")[1] == [2.0 * s / 10 for s in range(1, 11)]
    # A run still training: only checkpoint-N folders; the highest N (numerically) is read.
    ongoing = tmp_path / "ongoing"
    for step, scale in ((5, 1.0), (20, 3.0), (100, 4.0)):
        (ongoing / f"checkpoint-{step}").mkdir(parents=True)
        state = {"log_history": _log_history(scale)}
        (ongoing / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state))
    assert plot.extract_series(plot.load_log_history(str(ongoing)), "reward")[1][0] == pytest.approx(0.4)
    assert plot.run_label(str(ongoing / "checkpoint-100" / "trainer_state.json")) == "ongoing"
    assert plot.run_label(str(jsonl)) == "logs"
    with pytest.raises(ValueError, match="run"):
        plot.load_log_history(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="trainer_state.json"):
        plot.load_log_history(str(tmp_path / "empty"))


def test_moving_average():
    assert plot.moving_average([1.0, 2.0, 3.0, 4.0, 5.0], 1) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert plot.moving_average([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.0, 1.5, 2.5, 3.5, 4.5]
    assert plot.moving_average([3.0, 6.0, 9.0, 0.0], 3) == [3.0, 4.5, 6.0, 5.0]
    with pytest.raises(ValueError, match="smooth"):
        plot.moving_average([1.0], 0)


def test_main_writes_a_png_and_reports_missing_metrics(tmp_path, capsys):
    run_a = _write_run(tmp_path, "grpo", scale=1.0)
    run_b = _write_run(tmp_path, "stabledrl", scale=2.0)
    out = tmp_path / "plots" / "curves.png"
    argv = [str(run_a), str(run_b), "--output", str(out), "--smooth", "3", "--metrics", "learning_rate", "no/such"]
    assert plot.main(argv) == 0
    printed = capsys.readouterr().out
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # six subplots with lines and legends, not an empty canvas
    assert "'no/such'" in printed and "skipped" in printed
    assert "'stabledrl/ess'" in printed  # a default metric absent from both runs
    assert "'reward'" not in printed.split("wrote")[0]  # present metrics are not reported as missing
    assert "6 metrics, 2 runs" in printed


def test_main_argument_errors(tmp_path, capsys):
    run = _write_run(tmp_path, "a", scale=1.0)
    with pytest.raises(ValueError, match="--labels"):
        plot.main([str(run), "--labels", "x", "y", "--output", str(tmp_path / "o.png")])
    with pytest.raises(ValueError, match="--smooth"):
        plot.main([str(run), "--smooth", "0", "--output", str(tmp_path / "o.png")])
    # Nothing plottable: a note and a non-zero status, no file.
    empty = tmp_path / "e.jsonl"
    empty.write_text(json.dumps({"step": 1, "loss": 0.3}) + "\n")
    assert plot.main([str(empty), "--output", str(tmp_path / "none.png")]) == 1
    assert not (tmp_path / "none.png").exists()
    assert "none of the metrics" in capsys.readouterr().out
    assert plot.make_parser().parse_args(["r"]).smooth == 1
