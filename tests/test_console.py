"""The scripts' short console: one line per logged step, warnings kept, the full record in the log file, and
everything restored afterwards."""

from __future__ import annotations

import logging
import warnings

import transformers.trainer as trainer_module
from transformers.utils import logging as hf_logging

from stabledrl_trl.console import ShortLogCallback, format_step_line, short_console


def test_step_line_shows_the_known_metrics_in_order():
    logs = {"learning_rate": 1e-4, "loss": 0.012345, "reward": 0.5, "completions/mean_length": 7.0, "kl": "0.25"}
    assert format_step_line(logs, 10, 300, 12.4) == "step 10/300  loss 0.01235  reward 0.5  kl 0.25  lr 0.0001  (12 s)"
    assert format_step_line({}, 3, -1, 0.0) == "step 3  (0 s)"


def test_short_console_routes_and_restores(tmp_path, capfd):
    log_file = tmp_path / "run" / "train.log"
    callback_before = trainer_module.DEFAULT_PROGRESS_CALLBACK
    hf_levels = [h.level for h in hf_logging.get_logger("transformers").handlers]
    root_handlers = list(logging.getLogger().handlers)
    with short_console(str(log_file)), warnings.catch_warnings():
        warnings.simplefilter("always")  # pytest's configuration ignores FutureWarning
        assert trainer_module.DEFAULT_PROGRESS_CALLBACK is ShortLogCallback
        logging.getLogger("stabledrl_trl.example").warning("kept on the console")
        hf_logging.get_logger("transformers.example").warning("file only")
        warnings.warn("a deprecation", FutureWarning, stacklevel=1)
        warnings.warn("worth seeing", UserWarning, stacklevel=1)
    err = capfd.readouterr().err
    assert "kept on the console" in err and "worth seeing" in err
    assert "file only" not in err and "a deprecation" not in err
    text = log_file.read_text()
    for message in ("kept on the console", "file only", "a deprecation", "worth seeing"):
        assert message in text, message
    assert trainer_module.DEFAULT_PROGRESS_CALLBACK is callback_before
    assert [h.level for h in hf_logging.get_logger("transformers").handlers] == hf_levels
    assert logging.getLogger().handlers == root_handlers
