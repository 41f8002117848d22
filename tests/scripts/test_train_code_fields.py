"""scripts/train.py's code-task fields, the start-up check before the model, and the bench's docs table."""

from __future__ import annotations

import os

import pytest

from stabledrl_trl import results


def test_code_fields_build_the_sandbox_settings(load_script):
    train = load_script("train")
    args = train.TrainScriptArguments(task="kodcode", prompt_style="official", code_timeout=2.5, code_workers=3,
                                      code_memory_mb=512)  # fmt: skip
    settings = args.sandbox_settings()
    assert (settings.backend, settings.timeout, settings.num_workers, settings.memory_mb) == ("bwrap", 2.5, 3, 512)
    assert settings.run_mode == "zygote" and settings.verdict_cache_mb == 64  # the verdict cache is on in training
    off = train.TrainScriptArguments(task="kodcode", prompt_style="official", code_verdict_cache_mb=0)
    assert off.sandbox_settings().verdict_cache_mb == 0
    per_program = train.TrainScriptArguments(task="kodcode", prompt_style="official", code_sandbox_mode="per_program")
    assert per_program.sandbox_settings().run_mode == "per_program"
    assert args.anti_short_boxed is False
    assert [f.__name__ for f in args.reward_funcs()] == ["kodcode_reward"]
    args = train.TrainScriptArguments(task="mbpp", prompt_style="official", code_reward="fraction")
    assert [f.__name__ for f in args.reward_funcs()] == ["mbpp_fraction_reward"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"task": "gsm8k", "code_sandbox": "unsafe_local"}, "code_sandbox: set to 'unsafe_local', but it applies to the code tasks"),
        ({"task": "kodcode", "prompt_style": "official", "code_timeout": 0.0}, "code_timeout: expected a positive number"),
        ({"task": "kodcode", "prompt_style": "official", "code_workers": 0}, "code_workers: expected a positive integer"),
        ({"task": "kodcode", "prompt_style": "official", "code_memory_mb": 64}, "code_memory_mb: 64 MiB is too little"),
        ({"task": "kodcode", "prompt_style": "official", "code_sandbox": "docker"}, "code_sandbox: expected one of bwrap, unsafe_local"),
        ({"task": "kodcode", "prompt_style": "official", "code_sandbox_mode": "fork"}, "code_sandbox_mode: expected one of zygote, per_program"),
        ({"task": "gsm8k", "code_sandbox_mode": "per_program"}, "code_sandbox_mode: set to 'per_program', but it applies to the code tasks"),
        ({"task": "humaneval", "prompt_style": "official", "code_reward": "fraction"}, "code_reward: 'fraction' exists for kodcode, mbpp"),
        ({"task": "kodcode", "prompt_style": "official", "code_reward": "partial"}, "code_reward: expected 'official' or 'fraction'"),
        ({"task": "kodcode", "prompt_style": "official", "code_verdict_cache_mb": -1}, "code_verdict_cache_mb: expected an integer >= 0"),
        ({"task": "gsm8k", "code_verdict_cache_mb": 0}, "code_verdict_cache_mb: set to 0, but it applies to the code tasks"),
        ({"task": "kodcode"}, "prompt_style: task 'kodcode' has the styles official only; set prompt_style: official"),
    ],
)  # fmt: skip
def test_code_fields_refuse_bad_values(load_script, kwargs, message):
    train = load_script("train")
    with pytest.raises(ValueError) as error:
        train.TrainScriptArguments(**kwargs)
    assert message in str(error.value)


def test_sandbox_starts_before_the_model_and_unsafe_is_noted(load_script, tmp_path):
    train = load_script("train")
    from stabledrl_trl.tasks import get_task

    args = train.TrainScriptArguments(task="mbpp", prompt_style="official", code_timeout=2.0)
    box = train._start_code_sandbox(args, get_task("mbpp"))
    assert box.settings.timeout == 2.0 and box.settings.backend == "bwrap"
    assert train._start_code_sandbox(args, get_task("gsm8k")) is None
    unsafe = train.TrainScriptArguments(task="mbpp", prompt_style="official", code_sandbox="unsafe_local")
    with pytest.warns(UserWarning, match="WITHOUT isolation"):
        train._start_code_sandbox(unsafe, get_task("mbpp"))
    (tmp_path / "README.md").write_text("# card\n")
    train._warn_in_model_card(str(tmp_path))
    assert "code rewards ran without isolation" in (tmp_path / "README.md").read_text()


def test_code_docs_tables_equal_their_rendering(load_script):
    bench = load_script("bench_code_reward")
    blocks = bench.readme_blocks(results.DOCS)
    with open(os.path.join(results.DOCS, "code.md")) as f:
        page = results.marked_blocks(f.read())
    assert set(blocks) == {"code-bench"}
    assert page["code-bench"] == blocks["code-bench"]
