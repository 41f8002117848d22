"""Every YAML file under configs/ goes through the real parser (TrlParser over the script's dataclasses)."""

import glob
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))
ACCELERATE_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "accelerate", "*.yaml")))


def test_there_are_configs():
    names = {os.path.basename(p) for p in TRAIN_CONFIGS}
    assert {
        "tiny.yaml",
        "llada_gsm8k_lora.yaml",
        "llada_gsm8k_full.yaml",
        "llada_math_full.yaml",
        "llada_countdown.yaml",
        "llada_sudoku.yaml",
        "tiny_moe.yaml",
        "llada2_mini_math_lora.yaml",
        "llada2_mini_math_full.yaml",
    } <= names
    assert {os.path.basename(p) for p in ACCELERATE_CONFIGS} >= {"ddp.yaml", "zero2.yaml", "zero3.yaml", "fsdp.yaml"}


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=os.path.basename)
def test_training_config_parses(path, load_script):
    train = load_script("train")
    # GPU configs ask for bf16; on this CPU-only machine bf16 is only allowed with use_cpu.
    script_args, training_args, model_args = train.make_parser().parse_args_and_config(
        ["--config", path, "--use_cpu", "true"]
    )
    with open(path) as f:
        raw = yaml.safe_load(f)
    from stabledrl_trl.tasks import get_task

    get_task(script_args.task)
    for key, value in raw.items():
        holder = next(obj for obj in (script_args, training_args, model_args) if hasattr(obj, key))
        got = getattr(holder, key)
        if key in ("lr_scheduler_type", "dtype"):
            got = getattr(got, "value", got)
        if key == "report_to" and value == "none":
            value = []  # transformers normalises "none" to no reporters
        assert got == value or str(got) == str(value), (key, got, value)


def test_unknown_yaml_key_is_an_error(tmp_path, load_script):
    train = load_script("train")
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: gsm8k\nlearning_rte: 1.0e-6\n")
    with pytest.raises(ValueError, match="learning_rte"):
        train.make_parser().parse_args_and_config(["--config", str(bad), "--use_cpu", "true"])


def test_command_line_overrides_yaml(tmp_path, load_script):
    train = load_script("train")
    path = os.path.join(ROOT, "configs", "llada_math_full.yaml")
    _, training_args, _ = train.make_parser().parse_args_and_config(
        ["--config", path, "--use_cpu", "true", "--learning_rate", "5e-7", "--clip_c", "3.0"]
    )
    assert training_args.learning_rate == 5e-7 and training_args.clip_c == 3.0


@pytest.mark.parametrize("name", ["llada_math_full.yaml", "llada_gsm8k_full.yaml"])
def test_official_recipe_values(load_script, name):
    train = load_script("train")
    path = os.path.join(ROOT, "configs", name)
    s, a, m = train.make_parser().parse_args_and_config(["--config", path, "--use_cpu", "true"])
    assert (a.num_generations, a.max_completion_length, a.diffusion_steps, a.block_length) == (16, 256, 128, 32)
    assert (a.temperature, a.learning_rate, a.adam_beta2, a.weight_decay, a.max_grad_norm) == (
        0.9,
        2e-6,
        0.99,
        0.1,
        0.2,
    )
    assert (a.num_iterations, a.gradient_accumulation_steps, a.per_device_train_batch_size, a.seed) == (2, 4, 16, 113)
    assert (a.loss_type, a.clip_c, a.likelihood_estimator, a.mc_samples, a.beta, a.scale_rewards) == (
        "stable_drl",
        5.0,
        "block_random",
        2,
        0.0,
        "none",
    )
    assert m.model_name_or_path == "GSAI-ML/LLaDA-8B-Instruct" and not m.use_peft
    assert (a.sandwich, a.sandwich_beta, a.sandwich_omega, a.p_mask_prompt, a.estimator_block_size) == (
        True,
        1.5,
        0.5,
        0.15,
        32,
    )
    assert (a.adam_beta1, a.lr_scheduler_type.value, a.warmup_steps, a.max_steps, a.remasking) == (
        0.9,
        "linear",
        0,
        2000,
        "low_confidence",
    )
    # 8 GPUs x 1 prompt per micro-batch x 4 accumulation steps = 32 prompts per optimiser step
    assert a.per_device_train_batch_size // a.num_generations * a.gradient_accumulation_steps * 8 == 32
    if s.task == "math":  # the official runs' training problems
        assert (s.dataset_path, s.math_max_level, s.max_problem_chars, s.max_problem_words) == (
            "qwedsacf/competition_math",
            4,
            1500,
            300,
        )
    else:
        assert (s.task, s.dataset_path) == ("gsm8k", None)  # openai/gsm8k, the task's default


def test_gsm8k_lora_differs_from_the_official_run_as_its_header_says(load_script):
    import dataclasses

    from stabledrl_trl.diffusion.estimators import ESTIMATORS

    train = load_script("train")
    lora, full = (
        train.make_parser().parse_args_and_config(
            ["--config", os.path.join(ROOT, "configs", name), "--use_cpu", "true"]
        )
        for name in ("llada_gsm8k_lora.yaml", "llada_gsm8k_full.yaml")
    )
    differ = {
        f.name: (getattr(lora[1], f.name), getattr(full[1], f.name))
        for f in dataclasses.fields(lora[1])
        if getattr(lora[1], f.name) != getattr(full[1], f.name)
    }
    # not recipe: where outputs go, how many checkpoints are kept, the memory chunking, and a derived field
    for name in ("output_dir", "save_total_limit", "estimator_chunk_size", "generation_batch_size"):
        differ.pop(name, None)
    assert differ == {
        "num_generations": (8, 16),  # 8 completions per prompt instead of 16
        "per_device_train_batch_size": (8, 16),  # one prompt per micro-batch in both
        "learning_rate": (3e-6, 2e-6),
        "sandwich": (False, True),
        "p_mask_prompt": (None, 0.15),  # None: block_random's default, the same 0.15
    }
    assert inspect_default(ESTIMATORS["block_random"], "p_mask_prompt") == 0.15
    assert lora[2].use_peft and lora[2].lora_r == 128 and not full[2].use_peft
    assert lora[0] == full[0]  # same task, data, prompts and grading


def inspect_default(fn, name):
    import inspect

    return inspect.signature(fn).parameters[name].default


@pytest.mark.parametrize(
    "path", [p for p in TRAIN_CONFIGS if os.path.basename(p).startswith("llada_")], ids=os.path.basename
)
def test_official_configs_use_the_official_estimator_inputs(path, load_script):
    train = load_script("train")
    _, a, _ = train.make_parser().parse_args_and_config(["--config", path, "--use_cpu", "true"])
    assert (a.mask_seed_mode, a.eos_tail, a.completion_end) == ("fresh", "masked", "tokenizer_eos")


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=os.path.basename)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(path)
    assert config.num_processes >= 1
    assert config.distributed_type.value in ("MULTI_GPU", "DEEPSPEED", "FSDP")
    if "zero3" in path:
        assert config.deepspeed_config["zero_stage"] == 3


def test_safe_model_loading_defaults(load_script):
    train = load_script("train")
    _, training_args, model_args = train.make_parser().parse_args_and_config(
        ["--config", os.path.join(ROOT, "configs", "llada_gsm8k_lora.yaml"), "--use_cpu", "true"]
    )
    kwargs = train.build_model_init_kwargs(training_args, model_args)
    assert kwargs["use_safetensors"] is True and kwargs["trust_remote_code"] is False
    import torch

    assert kwargs["dtype"] is torch.bfloat16


OFFICIAL_CONFIGS = {
    "llada_math_full.yaml": "math",
    "llada_gsm8k_lora.yaml": "gsm8k",
    "llada_gsm8k_full.yaml": "gsm8k",
    "llada_countdown.yaml": "countdown",
    "llada_sudoku.yaml": "sudoku",
}


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=os.path.basename)
def test_task_style_of_each_config(path, load_script):
    train = load_script("train")
    script_args, training_args, _ = train.make_parser().parse_args_and_config(["--config", path, "--use_cpu", "true"])
    names = [f.__name__ for f in script_args.reward_funcs()]
    task = OFFICIAL_CONFIGS.get(os.path.basename(path))
    if script_args.task in ("kodcode", "humaneval", "mbpp"):  # code: official prompts, unit-test reward only
        assert (script_args.prompt_style, script_args.anti_short_boxed) == ("official", False)
        assert names == [f"{script_args.task}_reward"]
    elif task is not None:  # the official recipes: official prompts and grading, plus the anti-short-boxed term
        assert (script_args.prompt_style, script_args.reward_style, script_args.anti_short_boxed) == (
            "official",
            "official",
            True,
        )
        assert names == [f"{task}_official_reward", "anti_short_boxed_reward"]
        assert training_args.reward_text == "canvas"  # graded on the whole decoded canvas, as the official code
    else:  # everything else: the tagged tasks, no anti-short-boxed term
        assert (script_args.prompt_style, script_args.reward_style, script_args.anti_short_boxed) == (
            "tagged",
            "tagged",
            False,
        )
        assert "anti_short_boxed_reward" not in names and not any("official" in n for n in names)
        assert training_args.reward_text == "completion"


def test_task_style_defaults_and_errors(tmp_path, load_script):
    train = load_script("train")
    args = train.TrainScriptArguments(task="countdown", prompt_style="official")
    assert (args.reward_style, args.anti_short_boxed) == ("official", True)  # both follow prompt_style
    args = train.TrainScriptArguments(task="countdown", prompt_style="official", reward_style="tagged")
    assert args.anti_short_boxed is False and args.reward_funcs()[0].__name__ == "countdown_correctness_reward"
    args = train.TrainScriptArguments(task="gsm8k", anti_short_boxed=True)
    assert [f.__name__ for f in args.reward_funcs()][-1] == "anti_short_boxed_reward"
    with pytest.raises(ValueError, match="prompt_style: expected one of tagged, official, got 'offical'"):
        train.TrainScriptArguments(task="gsm8k", prompt_style="offical")
    with pytest.raises(ValueError, match="reward_style: task 'digit_sort' has no official StableDRL form"):
        train.TrainScriptArguments(task="digit_sort", reward_style="official")
    with pytest.raises(ValueError, match="system_prompt: got 'Think.' with prompt_style 'official'"):
        train.TrainScriptArguments(task="math", prompt_style="official", system_prompt="Think.")
    bad = tmp_path / "bad.yaml"  # through the parser too: the error names the field
    bad.write_text("task: sudoku\nreward_style: exact\n")
    with pytest.raises(ValueError, match="reward_style: expected one of tagged, official, got 'exact'"):
        train.make_parser().parse_args_and_config(["--config", str(bad), "--use_cpu", "true"])
