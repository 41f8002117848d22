"""scripts/train.py end to end on the embedded tiny default, shrunk to seconds (SFT warm-up, RL, before/after)."""

import json
import os

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_pipeline_runs_and_caches_sft(tmp_path, load_script, capsys):
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
    # the console: short lines, one per logged step, and a summary with the paths and the before/after accuracy
    console = capsys.readouterr().out
    lines = console.splitlines()
    out = tmp_path / "out"
    assert [line.split()[1] for line in lines if line.startswith("step ")][-2:] == ["1/2", "2/2"]
    assert max(len(line) for line in lines) < 250 and "{'loss'" not in console
    assert any(line.startswith("Done in ") and line.endswith(" s.") for line in lines)  # seconds, not "0.0 min"
    for label, path in (
        ("model:", out),
        ("logs:", out / "train.log"),
        ("accuracy:", out / "accuracy_before_after.json"),
    ):
        assert any(line.split()[:2] == [label, str(path)] for line in lines), (label, console)
        assert path.exists()
    card = (out / "README.md").read_text()  # the summary points to it for how to load the model
    assert "import stabledrl_trl" in card and "stable_drl" in card
    before, after = results["before"]["accuracy"], results["after"]["accuracy"]
    assert f"before RL {before:.4f} -> after RL {after:.4f}" in lines[-1]
    # the full record: every logged dict, as JSON, in the log file
    logged = [json.loads(line.split("stabledrl_trl.run: ", 1)[1]) for line in
              (out / "train.log").read_text().splitlines() if "stabledrl_trl.run: {" in line]  # fmt: skip
    assert [h["step"] for h in logged if "reward" in h] == [1, 2] and "stabledrl/clip_frac" in logged[-2]
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


def test_a_flag_abbreviated_or_misspelt_is_refused_not_taken_for_the_field_it_starts(load_script, tmp_path):
    """argparse would read --learning_rat as --learning_rate (a prefix); the parsers refuse it and name the field."""
    import pytest

    train = load_script("train")
    config = tmp_path / "ok.yaml"
    config.write_text("use_cpu: true\nbf16: false\n")
    base = ["--config", str(config), "--output_dir", str(tmp_path)]
    for flag, field in (("--learning_rat", "learning_rate"), ("--max_ste", "max_steps")):
        with pytest.raises(ValueError, match=rf"Unknown command-line flag\(s\): {flag}\. .*did you mean '{field}'"):
            train.make_parser().parse_args_and_config([*base, flag, "1"])
    config.write_text("use_cpu: true\nbf16: false\noutput-dir: x\n")
    with pytest.raises(ValueError, match=r"Unknown key\(s\) in the config file: output-dir\. 'output-dir': did you mean"):
        train.make_parser().parse_args_and_config(["--config", str(config), "--output_dir", str(tmp_path)])
    config.write_text("use_cpu: true\nbf16: false\n")
    (_, args, _) = train.make_parser().parse_args_and_config([*base[:2], "--output-dir", str(tmp_path)])
    assert args.output_dir == str(tmp_path)  # the dashed spelling of a field stays accepted


def test_model_path_with_tiny_model_is_refused_before_the_warm_up(tmp_path, load_script):
    """tiny.yaml plus a model_name_or_path (a newcomer adapting the quick start): an error, not the tiny model."""
    import pytest

    train = load_script("train")
    argv = [
        "--config", os.path.join(ROOT, "configs", "tiny.yaml"), "--model_name_or_path", str(tmp_path / "my-model"),
        "--sft_cache_dir", str(tmp_path / "cache"), "--output_dir", str(tmp_path / "out"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"model_name_or_path='.*my-model' is set together with tiny_model: true"):
        train.main(argv=argv)
    assert not (tmp_path / "cache").exists()  # refused before the SFT warm-up


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
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(ckpt / "model.safetensors"))
    for name in ("optimizer.pt", "scheduler.pt"):
        torch.save({}, ckpt / name)
    (ckpt / "trainer_state.json").write_text("{}")
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


def test_held_out_file_is_posed_in_the_training_prompt_style(tmp_path, load_script):
    """prompt_style official: rows from test_data_files get the official wording, as the training rows do."""
    train = load_script("train")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "What is 1+1?", "answer": "1+1=2\\n#### 2"}\n')
    argv = [
        "--config", os.path.join(ROOT, "configs", "tiny.yaml"), "--output_dir", str(tmp_path / "out"),
        "--task", "gsm8k", "--prompt_style", "official", "--data_files", str(rows), "--test_data_files", str(rows),
        "--num_train_samples", "1", "--num_eval_samples", "1",
    ]  # fmt: skip
    script_args, training_args, _ = train.make_parser().parse_args_and_config(argv)
    train_rows, test_rows = train.load_datasets(script_args, training_args.seed, needs_test=True)
    assert test_rows[0]["prompt"] == train_rows[0]["prompt"]
    assert "boxed" in train_rows[0]["prompt"][-1]["content"]  # the official request for a \boxed{} answer


def test_math_problem_filter_fields(tmp_path, load_script):
    import pytest

    train = load_script("train")
    args = train.TrainScriptArguments(task="math", math_max_level=4, max_problem_chars=1500, max_problem_words=300)
    assert args.problem_filter() == {"max_level": 4, "max_problem_chars": 1500, "max_problem_words": 300}
    assert train.TrainScriptArguments(task="math").problem_filter() == dict.fromkeys(args.problem_filter())
    for kwargs, match in (
        (dict(task="gsm8k", math_max_level=4), "math_max_level: filters MATH problems, but task is 'gsm8k'"),
        (dict(task="countdown", max_problem_words=300), "max_problem_words: filters MATH problems"),
        (dict(task="math", math_max_level=6), r"math_max_level: expected an integer from 1 to 5 or None \(.*, got 6"),
        (
            dict(task="math", max_problem_chars=0),
            r"max_problem_chars: expected a positive integer or None \(.*, got 0",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            train.TrainScriptArguments(**kwargs)
    bad = tmp_path / "bad.yaml"  # through the parser too
    bad.write_text("task: math\nmax_problem_words: -3\n")
    with pytest.raises(ValueError, match="max_problem_words: expected a positive integer"):
        train.make_parser().parse_args_and_config(["--config", str(bad), "--use_cpu", "true"])


def test_math_problem_filter_applies_to_the_training_split_only(tmp_path, load_script, tiny_tokenizer, monkeypatch):
    import pytest

    import stabledrl_trl
    from stabledrl_trl.tasks.math import OFFICIAL_BOXED_REQUEST

    train = load_script("train")
    rows = [("Level 2", "short one"), ("Level 5", "too hard"), ("Level 3", "x" * 1600), ("Level 4", "fine")]
    for name in ("train", "test"):
        lines = [json.dumps({"problem": p, "level": lv, "solution": "\\boxed{1}"}) for lv, p in rows]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    tiny_tokenizer.save_pretrained(tmp_path / "tokenizer")

    class Built(Exception):
        pass

    def capture(**kwargs):  # stands in for the trainer: the datasets main() built are all this test needs
        raise Built(kwargs)

    monkeypatch.setattr(stabledrl_trl, "StableDRLTrainer", capture)
    argv = [
        "--config", os.path.join(ROOT, "configs", "llada_math_full.yaml"), "--use_cpu", "true",
        "--model_name_or_path", str(tmp_path / "tokenizer"), "--output_dir", str(tmp_path / "out"),
        "--dataset_path", "json", "--data_files", str(tmp_path / "train.jsonl"),
        "--test_data_files", str(tmp_path / "test.jsonl"), "--eval_strategy", "steps", "--per_device_eval_batch_size", "16",
    ]  # fmt: skip
    with pytest.raises(Built) as built:
        train.main(argv=argv)
    kwargs = built.value.args[0]
    problems = {split: [p[-1]["content"] for p in kwargs[key]["prompt"]]
                for split, key in (("train", "train_dataset"), ("test", "eval_dataset"))}  # fmt: skip
    assert problems["train"] == ["short one" + OFFICIAL_BOXED_REQUEST, "fine" + OFFICIAL_BOXED_REQUEST]
    assert problems["test"] == [p + OFFICIAL_BOXED_REQUEST for _, p in rows]  # held out: unfiltered, same style


def test_before_after_evaluation_over_several_draws(tmp_path, load_script, tiny_llada, tiny_tokenizer):
    import pytest

    from stabledrl_trl import StableDRLConfig
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
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
    one = evaluate_model(tiny_llada, tiny_tokenizer, rows, "digit_sort", settings=SamplerSettings.from_config(args),
                         seed=6, batch_size=4, progress=False)  # fmt: skip
    assert result["draws"][1] == one["accuracy"]
    with pytest.raises(ValueError, match="eval_draws: expected a positive integer, got 0"):
        train.TrainScriptArguments(task="digit_sort", eval_draws=0)


def test_held_out_evaluation_decodes_with_the_runs_sampler_settings(tmp_path, load_script):
    """The run's rollout settings, approximate modes included; eval_temperature replaces the temperature only, and
    a bad one is refused with training's message."""
    import dataclasses

    import pytest

    from stabledrl_trl import StableDRLConfig
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings

    train = load_script("train")
    args = StableDRLConfig(
        output_dir=str(tmp_path), use_cpu=True, max_completion_length=8, block_length=4, diffusion_steps=4,
        per_device_train_batch_size=4, num_generations=4, rollout_cache="dual", parallel_threshold=0.7,
        max_tokens_per_step=2, top_k=3,
    )  # fmt: skip
    script_args = train.TrainScriptArguments(task="digit_sort")
    settings = train.eval_sampler_settings(args, script_args)
    assert settings == SamplerSettings.from_config(args)
    assert (settings.rollout_cache, settings.parallel_threshold, settings.max_tokens_per_step) == ("dual", 0.7, 2)
    script_args = train.TrainScriptArguments(task="digit_sort", eval_temperature=0.0)
    assert train.eval_sampler_settings(args, script_args) == dataclasses.replace(settings, temperature=0.0)
    with pytest.raises(ValueError) as training:
        StableDRLConfig(output_dir=str(tmp_path), use_cpu=True, temperature=-0.5)
    script_args = train.TrainScriptArguments(task="digit_sort", eval_temperature=-0.5)
    with pytest.raises(ValueError) as evaluation:
        train.eval_sampler_settings(args, script_args)
    assert str(evaluation.value) == f"eval_temperature=-0.5: {training.value}"


def test_summary_gives_seconds_under_a_minute_and_minutes_above(load_script):
    from types import SimpleNamespace

    train = load_script("train")
    args = SimpleNamespace(output_dir="out")
    assert train.summary_lines(args, {}, "out/train.log", 8.4).splitlines()[0] == "Done in 8 s."
    assert train.summary_lines(args, {}, "out/train.log", 90.0).splitlines()[0] == "Done in 1.5 min."


def test_seed_and_num_threads_checks_bounds(load_script):
    """Seeds: integers 0 .. 2**32 - 1 (numpy's legacy generator, seeded by transformers' set_seed); threads: None or
    a positive integer. Both name the field given, and evaluate.py's flags share them."""
    import pytest

    train = load_script("train")
    for seed in (0, 113, 2**32 - 1):
        train.check_seed(seed)
    for seed in (-1, 2**32, True, 1.5, "3"):
        with pytest.raises(ValueError, match=f"^seed={seed!r} is not a valid seed"):
            train.check_seed(seed)
    train.check_seed(2**40, "--dataset_seed", high=None)  # datasets' shuffle takes any non-negative integer
    with pytest.raises(ValueError, match=r"^--dataset_seed=-1 is not a valid seed: give an integer >= 0"):
        train.check_seed(-1, "--dataset_seed", high=None)
    for threads in (None, 1, 16):
        train.check_num_threads(threads)
    for threads in (0, -2, True, 2.0):
        with pytest.raises(ValueError, match=f"^num_threads={threads!r} must be a positive integer"):
            train.check_num_threads(threads)
    script_args = train.TrainScriptArguments(task="digit_sort", num_threads=0)
    with pytest.raises(ValueError, match="^num_threads=0 must be a positive integer"):
        train.check_script_args(script_args)
