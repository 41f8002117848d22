"""scripts/train.py end to end on the embedded tiny default, shrunk to seconds (SFT warm-up, RL, before/after)."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_pipeline_runs_and_caches_sft(tmp_path, load_script):
    train = load_script("train")
    argv = [
        "--config", os.path.join(ROOT, "configs", "tiny.yaml"),
        "--sft_cache_dir", str(tmp_path / "cache"), "--sft_max_steps", "5", "--sft_num_samples", "64",
        "--max_steps", "2", "--num_eval_samples", "16", "--eval_batch_size", "16",
        "--output_dir", str(tmp_path / "out"), "--logging_steps", "1",
    ]  # fmt: skip
    trainer, results = train.main(argv=argv)
    assert 0.0 <= results["before"]["accuracy"] <= 1.0 and results["before"]["n"] == 16
    summary = json.loads((tmp_path / "out" / "accuracy_before_after.json").read_text())
    assert summary["after"]["n"] == 16
    assert summary["before"]["grading"] == summary["after"]["grading"] == "tagged"  # tiny.yaml: tagged digit_sort
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2]
    assert trainer.is_diffusion and trainer.args.loss_type == "stable_drl"
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1  # the SFT warm-up is cached: a second run reuses it
    mtime = os.path.getmtime(cached[0])
    train.main(argv=argv)
    assert list((tmp_path / "cache").iterdir()) == cached and os.path.getmtime(cached[0]) == mtime


def test_single_training_file_is_not_used_as_the_held_out_split(tmp_path, load_script):
    import pytest

    train = load_script("train")
    data = tmp_path / "rows.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    argv = ["--config", os.path.join(ROOT, "configs", "tiny.yaml"), "--output_dir", str(tmp_path / "out")]
    for flag in (["--data_files", str(data)], ["--dataset_path", str(data)]):
        script_args, _, _ = train.make_parser().parse_args_and_config(argv + flag)
        with pytest.raises(ValueError, match="both the training and the held-out split.*test_data_files"):
            train.check_held_out_split(script_args, needs_test=True)
        train.check_held_out_split(script_args, needs_test=False)  # no held-out evaluation: nothing to refuse
    script_args, _, _ = train.make_parser().parse_args_and_config(
        argv + ["--data_files", str(data), "--test_data_files", str(data)]
    )
    train.check_held_out_split(script_args, needs_test=True)  # an explicit held-out file is the user's choice


def test_misspelt_yaml_key_suggests_the_field(tmp_path, load_script):
    import pytest

    train = load_script("train")
    config = tmp_path / "bad.yaml"
    config.write_text("use_cpu: true\nbf16: false\nnum_generatons: 4\n")
    with pytest.raises(ValueError, match="did you mean 'num_generations'"):
        train.make_parser().parse_args_and_config(["--config", str(config), "--output_dir", str(tmp_path)])


def test_resume_from_checkpoint_true_on_the_command_line_means_latest(tmp_path, load_script):
    from stabledrl_trl.safety import resolve_resume

    train = load_script("train")
    _, training_args, _ = train.make_parser().parse_args_and_config(
        [
            "--config",
            os.path.join(ROOT, "configs", "tiny.yaml"),
            "--output_dir",
            str(tmp_path),
            "--resume_from_checkpoint",
            "true",
        ]
    )
    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"):
        (ckpt / name).write_text("{}")
    # what train.py hands to trainer.train(), as the trainer resolves it
    assert resolve_resume(training_args.resume_from_checkpoint, training_args.output_dir) == str(ckpt)


def test_before_after_evaluation_uses_the_runs_reward_style(tmp_path, load_script, tiny_llada, tiny_tokenizer):
    from stabledrl_trl import StableDRLConfig
    from stabledrl_trl.tasks import get_task, load_task_dataset

    train = load_script("train")
    args = StableDRLConfig(
        output_dir=str(tmp_path), use_cpu=True, max_completion_length=8, block_length=4, diffusion_steps=4,
        per_device_train_batch_size=4, num_generations=4,
    )  # fmt: skip
    rows = load_task_dataset("sudoku", "test", num_samples=3, prompt_style="official")
    for style, full_score in (("official", 1.0), ("tagged", None)):
        script_args = train.TrainScriptArguments(task="sudoku", prompt_style="official", reward_style=style)
        result = train._evaluate(tiny_llada, tiny_tokenizer, rows, get_task("sudoku"), args, script_args, style)
        assert (result["grading"], result["full_score"], result["n"]) == (style, full_score, 3)


def test_before_after_evaluation_over_several_draws(tmp_path, load_script, tiny_llada, tiny_tokenizer):
    import pytest

    from stabledrl_trl import StableDRLConfig
    from stabledrl_trl.evaluation import evaluate_model
    from stabledrl_trl.tasks import get_task, load_task_dataset

    train = load_script("train")
    args = StableDRLConfig(
        output_dir=str(tmp_path), use_cpu=True, max_completion_length=8, block_length=4, diffusion_steps=4,
        per_device_train_batch_size=4, num_generations=4, temperature=1.0, seed=5,
    )  # fmt: skip
    rows = load_task_dataset("digit_sort", "test", num_samples=4)
    script_args = train.TrainScriptArguments(task="digit_sort", eval_draws=3, eval_greedy=True, eval_batch_size=4)
    result = train._evaluate(tiny_llada, tiny_tokenizer, rows, get_task("digit_sort"), args, script_args, "x")
    assert result["seeds"] == [5, 6, 7] and len(result["draws"]) == 3 and result["greedy"] is not None
    assert result["accuracy"] == result["mean"] == pytest.approx(sum(result["draws"]) / 3)
    one = evaluate_model(tiny_llada, tiny_tokenizer, rows, "digit_sort", gen_length=8, block_length=4, steps=4,
                         temperature=1.0, seed=6, batch_size=4, progress=False)  # fmt: skip
    assert result["draws"][1] == one["accuracy"]
    with pytest.raises(ValueError, match="eval_draws: expected a positive integer, got 0"):
        train.TrainScriptArguments(task="digit_sort", eval_draws=0)
