"""scripts/plan.py never says "fits" for what training would not run: the rollout rows are TRL's (generation_batch_size
honoured), every value is checked as training checks it, bad model folders and config files are one clear error
(exit status 2, no traceback), and --write-comment never writes a config it cannot read back."""

import json
import os

import pytest

from stabledrl_trl.memory_plan import rollout_rows, settings_from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "tests", "fixtures", "llada-tiny")


def write(tmp_path, text: str, name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(f"model_name_or_path: {TINY}\ndtype: bfloat16\n" + text)
    return str(path)


def run_plan(plan, capsys, argv):
    """(exit status, stderr) of plan.main(argv); status 0 when it returned."""
    capsys.readouterr()
    try:
        plan.main(argv)
    except SystemExit as error:
        return error.code, capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_rollout_rows_follow_trls_derivation():
    # TRL: generation_batch_size = per_device x processes x steps_per_generation (default: gradient accumulation)
    assert rollout_rows(4, 2, gradient_accumulation_steps=3) == (12, 3)
    assert rollout_rows(4, 2, steps_per_generation=5, gradient_accumulation_steps=3) == (20, 5)
    assert rollout_rows(4, 2, generation_batch_size=64) == (32, 8)
    with pytest.raises(ValueError, match="not a multiple of the global batch"):
        rollout_rows(4, 2, generation_batch_size=12)
    with pytest.raises(ValueError, match="both set"):
        rollout_rows(4, 2, generation_batch_size=64, steps_per_generation=8)
    with pytest.raises(ValueError, match="not a multiple of num_generations=16"):
        rollout_rows(4, 2, steps_per_generation=1, num_generations=16)


def test_generation_batch_size_plans_the_same_rows_as_steps_per_generation(tmp_path, load_script):
    plan = load_script("plan")
    common = "per_device_train_batch_size: 8\nnum_generations: 8\n"
    by_steps = write(tmp_path, common + "steps_per_generation: 16\n", "steps.yaml")
    by_batch = write(tmp_path, common + "generation_batch_size: 256\n", "batch.yaml")  # 8 x 2 GPUs x 16
    a = plan.main(["--config", by_steps, "--gpus", "2"])
    b = plan.main(["--config", by_batch, "--gpus", "2"])
    assert a == b
    s = settings_from_config({"per_device_train_batch_size": 8, "generation_batch_size": 256}, gpus=2)
    assert s.steps_per_generation == 16  # 128 rollout rows per process
    one_step = plan.main(["--config", write(tmp_path, common, "one.yaml"), "--gpus", "2"])
    assert b["rollout_activations"] == pytest.approx(16 * one_step["rollout_activations"])


@pytest.mark.parametrize(
    "text, field",
    [
        ("use_peft: true\nlora_r: -4\n", "lora_r"),
        ("use_peft: 'no'\n", "use_peft"),
        ("per_device_train_batch_size: 0\n", "per_device_train_batch_size"),
        ("per_device_train_batch_size: -8\n", "per_device_train_batch_size"),
        ("per_device_train_batch_size: '8'\n", "per_device_train_batch_size"),
        ("max_completion_length: -5\n", "max_completion_length"),
        ("learning_rate: .nan\n", "learning_rate"),
        ("mc_samples: 0\n", "mc_samples"),
        ("estimator_chunk_size: 0\n", "estimator_chunk_size"),
        ("gradient_checkpointing: 'yes'\n", "gradient_checkpointing"),
        ("generation_batch_size: 12\nper_device_train_batch_size: 8\n", "generation_batch_size"),
        ("likelihood_estimator: banana\n", "likelihood_estimator"),
        ("num_iterations: .inf\n", "num_iterations"),
    ],
)
def test_values_training_refuses_are_refused_naming_the_field(tmp_path, load_script, capsys, text, field):
    plan = load_script("plan")
    status, err = run_plan(plan, capsys, ["--config", write(tmp_path, text)])
    assert status == 2 and field in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "config_json, words",
    [
        (None, "without a config.json"),
        ("{not json", "cannot be read as JSON"),
        ('["a list"]', "not a JSON object"),
        ('{"model_type": "llama", "hidden_size": 64}', "lacks 'num_hidden_layers'"),
        (
            '{"model_type": "llama", "hidden_size": 0, "num_hidden_layers": 2, "num_attention_heads": 2, '
            '"intermediate_size": 8, "vocab_size": 10}',
            "hidden=0",
        ),
    ],
)
def test_bad_model_folders_are_one_clear_error(tmp_path, load_script, capsys, config_json, words):
    plan = load_script("plan")
    folder = tmp_path / "model"
    folder.mkdir()
    if config_json is not None:
        (folder / "config.json").write_text(config_json)
    config = tmp_path / "run.yaml"
    config.write_text(f"model_name_or_path: {folder}\n")
    status, err = run_plan(plan, capsys, ["--config", str(config)])
    assert status == 2 and words in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no such file"),
        ("- a\n- list\n", "not a mapping"),
        ("a: [unclosed\n", "not a readable YAML file"),
        ("dtype: bfloat16\ndtype: float32\n", "dtype"),
    ],
)
def test_bad_config_files_are_one_clear_error(tmp_path, load_script, capsys, content, words):
    plan = load_script("plan")
    path = tmp_path / "run.yaml"
    if content is not None:
        path.write_text(content)
    status, err = run_plan(plan, capsys, ["--config", str(path), "--model", TINY])
    assert status == 2 and words in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, words", [(["--gpus", "0"], "--gpus 0"), (["--gpu-memory", "nan"], "--gpu-memory"),
                                         (["--gpu-memory", "inf"], "--gpu-memory")])  # fmt: skip
def test_bad_flags_are_one_clear_error(tmp_path, load_script, capsys, argv, words):
    plan = load_script("plan")
    status, err = run_plan(plan, capsys, ["--config", write(tmp_path, ""), *argv])
    assert status == 2 and words in err, err


@pytest.mark.parametrize(
    "block",
    [
        "BEGIN\n# old plan\n",  # begin without end
        "# old plan\nEND\n",  # end without begin
        "END\nlearning_rate: 0.1\nBEGIN\n",  # end before begin: the old code kept the key twice
        "BEGIN\n# a\nEND\nBEGIN\n# b\nEND\n",  # two blocks
        "BEGIN\nlearning_rate: 0.1\nEND\n",  # a setting inside the block would be deleted
    ],
)
def test_write_comment_with_broken_markers_refuses_and_leaves_the_file(tmp_path, load_script, capsys, block):
    import yaml

    from stabledrl_trl.memory_plan import COMMENT_BEGIN, COMMENT_END

    plan = load_script("plan")
    path = write(tmp_path, "per_device_train_batch_size: 4\nnum_generations: 4\n" +
                 block.replace("BEGIN", COMMENT_BEGIN).replace("END", COMMENT_END))  # fmt: skip
    before = open(path).read()
    status, err = run_plan(plan, capsys, ["--config", path, "--write-comment"])
    assert status == 2 and "not writing" in err, err
    assert open(path).read() == before
    yaml.safe_load(before)  # the file was valid YAML and still is


def test_write_comment_round_trips(tmp_path, load_script, capsys):
    import yaml

    plan = load_script("plan")
    path = write(tmp_path, "per_device_train_batch_size: 4\nnum_generations: 4\n")
    settings = yaml.safe_load(open(path))
    assert run_plan(plan, capsys, ["--config", path, "--write-comment"])[0] == 0
    assert run_plan(plan, capsys, ["--config", path, "--write-comment"])[0] == 0
    assert yaml.safe_load(open(path)) == settings
    assert json.dumps(settings)  # plain settings only
