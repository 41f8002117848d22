"""scripts/bench_dream_sampler_agreement.py runs on the fixture and reports Dream's sampler exact everywhere."""


def test_compare_script_reports_exact_dream_sampler(load_script, capsys):
    rows = load_script("bench_dream_sampler_agreement").main([])
    assert len(rows) == 15 and all(row["dream"] == 16 for row in rows)
    assert any(row["llada"] < 16 for row in rows)  # the schedules differ: LLaDA's sampler is not Dream's
    assert "DIFFERENT" not in capsys.readouterr().out
