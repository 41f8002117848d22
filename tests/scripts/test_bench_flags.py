"""The benchmark scripts' number flags end in one usage error (exit status 2), never a traceback or a run with a
nonsensical value; a failed measuring worker's own reason is shown; a README block cannot receive marker text."""

import sys

import pytest

CASES = [
    ("bench_rollout", ["--batch-size", "-1"], "--batch-size -1: must be an integer >= 1"),
    ("bench_rollout", ["--temperature", "nan"], "--temperature nan: must be a finite number >= 0"),
    ("bench_block_rollout", ["--block-size", "0"], "--block-size 0: must be an integer >= 1"),
    ("bench_block_cache_exactness", ["--gen-length", "-8"], "--gen-length -8: must be an integer >= 1"),
    ("bench_eos_tail", ["--rows", "0"], "--rows 0: must be an integer >= 1"),
    ("bench_estimators", ["--repeats", "-2"], "--repeats -2: must be an integer >= 1"),
    ("bench_memory", ["--n-layers", "0"], "--n-layers 0: must be an integer >= 1"),
    ("bench_step", ["--steps", "0"], "--steps 0: must be an integer >= 1"),
    ("bench_step", ["--temperature", "-1"], "--temperature -1.0: must be a finite number >= 0"),
    ("bench_stability", ["--learning-rate", "0"], "--learning-rate 0.0: must be a finite number > 0"),
    ("bench_embedded", ["--eval-draws", "0"], "--eval-draws 0: must be an integer >= 1"),
    ("bench_plan", ["--worker", "x"], "--worker 'x': invalid choice"),
    ("bench_plan", ["--cases", "nope"], "--cases: unknown ['nope']"),
]


@pytest.mark.parametrize("script, argv, words", CASES, ids=[f"{c[0]}{c[1][0]}" for c in CASES])
def test_bad_number_flags_are_one_usage_error(load_script, capsys, script, argv, words):
    module = load_script(script)
    with pytest.raises(SystemExit) as info:
        module.main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and words in err, err


def test_zero_is_accepted_where_it_has_a_meaning(load_script):
    from stabledrl_trl.cli_checks import check_number_flags

    bench_memory = load_script("bench_memory")
    parser = bench_memory.make_parser()
    args = parser.parse_args(["--chunk-size", "0", "--repeats", "0", "--seed", "0"])
    check_number_flags(parser, args, zero_ok=("chunk_size", "repeats"))  # 0 = all rows at once; only the warm-up


def test_a_failed_worker_shows_its_own_reason():
    from stabledrl_trl.worker_process import WorkerError, run_worker

    with pytest.raises(WorkerError, match=r"(?s)measuring K=3 exited with status 1:\n.*ValueError: the real reason"):
        run_worker([sys.executable, "-c", "raise ValueError('the real reason')"], {}, "K=3")
    assert run_worker([sys.executable, "-c", "print('42')"], {}, "x").strip() == "42"


def test_a_readme_block_refuses_content_holding_marker_text():
    from stabledrl_trl import results

    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    for content in ("x <!-- t:end --> y", "<!-- other:start -->\n"):
        with pytest.raises(ValueError, match="holds the marker text"):
            results.replace_block(text, "t", content)
    new = results.replace_block(text, "t", "| fine | 1 |")
    assert results.replace_block(new, "t", "| fine | 2 |") == text.replace("old", "| fine | 2 |")
