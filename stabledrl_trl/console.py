"""A readable console for the scripts: one short line per logged step, everything else in a log file.

transformers' Trainer prints every logged dict (dozens of metrics, lines over 1,000 characters) and datasets /
transformers draw a progress bar for every map, load and save. `short_console(log_file)` keeps, on the console, one
line per logged step (`ShortLogCallback`), warnings of this package and TRL, and errors; the full record (every logged
dict as JSON, every warning of transformers, TRL, Python and this package) goes to `log_file`. Everything is
restored on exit, so a script's `main()` can run several times in one process (tests).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time

from transformers import TrainerCallback

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FILE_LOGGER = "stabledrl_trl.run"  # every logged dict, as one JSON line per log call

# The metrics a step line shows, in this order, when logged: (key, label).
STEP_FIELDS = (
    ("loss", "loss"),
    ("reward", "reward"),
    ("grad_norm", "grad_norm"),
    ("stabledrl/clip_frac", "clip"),
    ("kl", "kl"),
    ("learning_rate", "lr"),
)


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def format_step_line(logs: dict, step: int, max_steps: int, elapsed: float) -> str:
    """`step 10/300  loss 0.0123  reward 0.41  grad_norm 0.52  lr 0.0001  (12 s)`: the shown fields only."""
    parts = [f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"]
    for key, label in STEP_FIELDS:
        value = _number(logs.get(key))
        if value is not None:
            parts.append(f"{label} {value:.4g}")
    return "  ".join(parts) + f"  ({elapsed:.0f} s)"


class ShortLogCallback(TrainerCallback):
    """Replaces transformers' progress callback: one short console line per log call (train and eval), the full
    dict as JSON in the log file. Only the main process prints."""

    def __init__(self, stream=None):
        self.stream = stream
        self.started = None
        self.logger = logging.getLogger(FILE_LOGGER)

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()
        if state.is_world_process_zero:
            kind = "RL" if hasattr(args, "num_generations") else "SFT"
            self._print(f"{kind} training: {state.max_steps} steps, a line every {args.logging_steps:g} step(s)")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        self.logger.info(json.dumps({"step": state.global_step, **logs}, default=str))
        elapsed = time.perf_counter() - (self.started or time.perf_counter())
        if "train_runtime" in logs:
            self._print(f"training done: {state.global_step} steps in {_number(logs['train_runtime']) or 0:.0f} s")
        elif any(k.startswith("eval_") for k in logs):
            shown = {k[len("eval_") :]: v for k, v in logs.items() if k.startswith("eval_")}
            self._print("eval " + format_step_line(shown, state.global_step, state.max_steps, elapsed))
        else:
            self._print(format_step_line(logs, state.global_step, state.max_steps, elapsed))

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stdout, flush=True)


@contextlib.contextmanager
def short_console(log_file: str | None, short: bool = True, main_process: bool = True):
    """Route the full record to `log_file` (None: no file) and, with `short`, keep the console to one line per
    logged step, this package's warnings and errors. Yields the log file's path."""
    import datasets
    import transformers.trainer as trainer_module
    from transformers.utils import logging as hf_logging

    root, hf_root = logging.getLogger(), hf_logging.get_logger("transformers")
    package = logging.getLogger("stabledrl_trl")
    saved = {
        "root_level": root.level,
        "hf_level": hf_root.level,
        "hf_handler_levels": [(h, h.level) for h in hf_root.handlers],
        "package_level": package.level,
        "callback": trainer_module.DEFAULT_PROGRESS_CALLBACK,
        "printer": trainer_module.PrinterCallback,
        "hf_bars": hf_logging.is_progress_bar_enabled(),
        "ds_bars": datasets.is_progress_bar_enabled(),
    }
    added: list[tuple[logging.Logger, logging.Handler]] = []
    if log_file is not None and main_process:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        file_handler = logging.FileHandler(log_file, mode="a", encoding="utf-8")
        file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
        file_handler.setLevel(logging.INFO)
        for logger in (root, hf_root):  # transformers' loggers do not propagate to the root logger
            logger.addHandler(file_handler)
            added.append((logger, file_handler))
        root.setLevel(logging.INFO)
        hf_root.setLevel(logging.INFO)
    console = logging.StreamHandler(sys.stderr)  # this package's and TRL's warnings stay on the console
    console.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    console.setLevel(logging.WARNING)
    for logger in (package, logging.getLogger("trl")):
        logger.addHandler(console)
        added.append((logger, console))
    package.setLevel(logging.INFO)
    logging.captureWarnings(True)  # Python warnings go through logging: all to the file, the console ...
    shown = logging.StreamHandler(sys.stderr)  # ... shows those that are not deprecation notices, on one line
    shown.setFormatter(_FirstLine())
    shown.addFilter(lambda record: not any(k in record.getMessage() for k in ("FutureWarning", "DeprecationWarning")))
    warnings_logger = logging.getLogger("py.warnings")
    warnings_logger.addHandler(shown)
    added.append((warnings_logger, shown))
    if short:
        for handler in hf_root.handlers:
            if handler not in [h for _, h in added]:
                handler.setLevel(logging.ERROR)  # transformers' own console handler: errors only
        callback = ShortLogCallback if main_process else _Silent
        trainer_module.DEFAULT_PROGRESS_CALLBACK = trainer_module.PrinterCallback = callback  # also for disable_tqdm
        hf_logging.disable_progress_bar()
        datasets.disable_progress_bars()
    try:
        yield log_file
    finally:
        logging.captureWarnings(False)
        for logger, handler in added:
            logger.removeHandler(handler)
        for handler in {id(h): h for _, h in added}.values():
            handler.close()
        root.setLevel(saved["root_level"])
        hf_root.setLevel(saved["hf_level"])
        package.setLevel(saved["package_level"])
        for handler, level in saved["hf_handler_levels"]:
            handler.setLevel(level)
        trainer_module.DEFAULT_PROGRESS_CALLBACK = saved["callback"]
        trainer_module.PrinterCallback = saved["printer"]
        if saved["hf_bars"]:
            hf_logging.enable_progress_bar()
        if saved["ds_bars"]:
            datasets.enable_progress_bars()


class _FirstLine(logging.Formatter):
    """A captured Python warning as `Category: message` (its first line, without the file and the source line)."""

    def format(self, record):
        text = record.getMessage().strip().splitlines()[0]  # "path:line: Category: message"
        return text.split(": ", 1)[-1] if "Warning: " in text else text


class _Silent(TrainerCallback):
    """The progress callback of the non-main processes: nothing on the console."""
