"""scripts/bench_embedded.py: the conclusion sentence rendered under the code tasks' blocks, from the numbers alone."""

from __future__ import annotations

from stabledrl_trl import results


def _summary(gains):
    runs = [{"gain": g} for g in gains]
    return {"runs": runs, "gain_t_test": results.paired_t_test(gains) if len(gains) > 1 else None}


def test_conclusion_follows_the_t_test(load_script):
    bench = load_script("bench_embedded")
    # df 2: two-sided p = 1 - t / sqrt(t^2 + 2).
    # gains 0.10, 0.12, 0.11: mean 0.11, std 0.01, t = 0.11 / (0.01 / sqrt 3) = 19.05, p = 1 - 19.05 / 19.10 = 0.003
    text = bench.conclusion(_summary([0.10, 0.12, 0.11]))
    assert text.startswith("RL raised the held-out pass rate: the pass rate rose in 3 of 3 seeds")
    assert "significant (p = 0.003 < 0.05)" in text
    # 0.10, -0.05, 0.02: mean 0.0233, std 0.0751, t = 0.538, p = 1 - 0.538 / 1.513 = 0.644
    text = bench.conclusion(_summary([0.10, -0.05, 0.02]))
    assert text.startswith("A gain of RL on this task is not established: the pass rate rose in 2 of 3 seeds")
    assert "not significant (p = 0.644 >= 0.05)" in text
    text = bench.conclusion(_summary([-0.10, -0.12, -0.11]))
    assert text.startswith("RL lowered the held-out pass rate: the pass rate rose in 0 of 3 seeds")
    one = bench.conclusion(_summary([0.2]))
    assert one == "With one seed there is no test of the gain: the pass rate rose in 1 of 1 seeds."
    assert {"tiny_code", "tiny_code_sort"} <= set(bench.CONFIGS) and bench.CONCLUDED == ("tiny_code", "tiny_code_sort")
