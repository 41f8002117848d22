"""Two CPU processes as the README says: configs/accelerate/cpu_2proc.yaml makes accelerate start two CPU processes
(torchrun, use_cpu), the SFT warm-up keeps its global batch and steps whatever the process count, DDP's
unused-parameter search follows the RL trainer's rule in the warm-up too, and accuracy lines print once."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CPU_2PROC = ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"


def readme_two_process_command() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Two CPU processes\n", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^accelerate launch [^\n]+$", section, flags=re.M)
    assert len(commands) == 1, "the README's 'Two CPU processes' section shows one accelerate launch command"
    return commands[0]


def test_readme_command_and_yaml_agree_and_accelerate_starts_two_cpu_processes():
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    command = readme_two_process_command()
    assert command in CPU_2PROC.read_text(), "the yaml's comment shows the README's command"
    config = yaml.safe_load(CPU_2PROC.read_text())
    assert config["use_cpu"] is True and config["num_processes"] == 2
    readme = (ROOT / "README.md").read_text()
    assert "`use_cpu: true`" in readme.split("\n## Two CPU processes\n", 1)[1].split("\n## ", 1)[0]
    # what `accelerate launch` makes of it: its multi-process launcher (torchrun) with two processes, CPU settings
    argv = shlex.split(command)[2:]
    args = launch_command_parser().parse_args(argv)
    args, _, _ = _validate_launch_command(args)
    assert args.multi_gpu and args.use_cpu and args.num_processes == 2
    assert yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())["use_cpu"] is True  # the README's other half


def test_sft_warm_up_splits_its_global_batch_between_processes(monkeypatch, tmp_path):
    from stabledrl_trl import multinode, sft

    captured = []

    def fake_run_sft(model, tokenizer, dataset, args):
        captured.append(args)
        return {}

    monkeypatch.setattr(sft, "run_sft", fake_run_sft)
    monkeypatch.setattr(multinode, "broadcast_object", lambda x: x)
    monkeypatch.setattr(multinode, "barrier", lambda: None)
    monkeypatch.setattr(multinode, "check_shared_directory", lambda *a, **k: None)
    for world_size in (1, 2, 4):
        monkeypatch.setattr(multinode, "world", lambda w=world_size: (0, w))
        sft.prepare_sft_model(str(tmp_path / f"cache{world_size}"), max_steps=7, batch_size=32, num_samples=64,
                              progress=False)  # fmt: skip
    assert [a.per_device_train_batch_size * w for a, w in zip(captured, (1, 2, 4))] == [32, 32, 32]
    assert [a.max_steps for a in captured] == [7, 7, 7]
    monkeypatch.setattr(multinode, "world", lambda: (0, 3))
    with pytest.raises(ValueError, match=r"global batch of 32 rows .* between 3 processes"):
        sft.prepare_sft_model(str(tmp_path / "cache3"), max_steps=7, batch_size=32, num_samples=64, progress=False)


def test_sft_trainer_needs_no_unused_parameter_search_for_llada(tmp_path, tiny_llada, tiny_tokenizer, tiny_sdar):
    from stabledrl_trl.sft import MaskedDiffusionSFTConfig, MaskedDiffusionSFTTrainer

    def trainer(model, **kw):
        args = MaskedDiffusionSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)
        return MaskedDiffusionSFTTrainer(model=model, args=args, processing_class=tiny_tokenizer)

    assert trainer(tiny_llada).accelerator.ddp_handler.find_unused_parameters is False  # as the RL step
    assert trainer(tiny_llada, ddp_find_unused_parameters=True).accelerator.ddp_handler.find_unused_parameters is True
    sdar = tiny_sdar(vocab_size=len(tiny_tokenizer), mask_token_id=tiny_tokenizer.mask_token_id)
    assert trainer(sdar).accelerator.ddp_handler.find_unused_parameters is True  # transformers' default kept


def test_accuracy_lines_print_on_the_main_process_only(load_script, monkeypatch, capsys):
    train = load_script("train")
    import stabledrl_trl.evaluation as evaluation

    monkeypatch.setattr(train, "eval_sampler_settings", lambda args, script_args: SimpleNamespace(temperature=0.9))
    monkeypatch.setattr(evaluation, "evaluate_model",
                        lambda *a, **k: {"accuracy": 0.25, "n": 4, "grading": "tagged"})  # fmt: skip
    script_args = SimpleNamespace(eval_batch_size=4, reward_style="tagged", eval_draws=1, eval_greedy=False)
    for rank in (0, 1):
        args = SimpleNamespace(seed=0, process_index=rank)
        assert train._evaluate(None, None, None, None, args, script_args, "before RL")["accuracy"] == 0.25
    assert capsys.readouterr().out == "[before RL] held-out accuracy: 0.2500 on 4 prompts (tagged grading)\n"


@pytest.mark.slow
def test_readme_two_process_command_runs_with_the_warm_up_on_one_process_data(tmp_path, clean_env):
    """The README's command (steps shortened): the warm-up covers 4 x 32 rows = 2 epochs of 64 rows, as one process
    would (it covered 4 epochs with two processes before), and each accuracy line appears once."""
    argv = shlex.split(readme_two_process_command())
    argv[argv.index("--config_file") + 1] = str(CPU_2PROC)
    argv[argv.index("scripts/train.py")] = str(ROOT / "scripts" / "train.py")
    argv[argv.index("--config") + 1] = str(ROOT / "configs" / "tiny.yaml")
    argv += ["--sft_cache_dir", str(tmp_path / "cache"), "--sft_max_steps", "4", "--sft_num_samples", "64",
             "--max_steps", "1", "--num_eval_samples", "8", "--eval_batch_size", "8",
             "--output_dir", str(tmp_path / "out")]  # fmt: skip
    accelerate = [sys.executable, "-m", "accelerate.commands.launch"]
    done = subprocess.run(accelerate + argv[2:], cwd=tmp_path, env=clean_env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (settings,) = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*/sft_settings.json")]
    assert settings["settings"]["world_size"] == 2
    assert settings["metrics"]["epoch"] == pytest.approx(4 * 32 / 64)
    out = done.stdout
    assert out.count("[before RL] held-out accuracy") == 1 and out.count("[after RL] held-out accuracy") == 1
    assert os.path.isfile(tmp_path / "out" / "accuracy_before_after.json")
