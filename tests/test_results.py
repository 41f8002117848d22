"""stabledrl_trl.results: README blocks between markers, provenance, and the studies' statistics by hand."""

from __future__ import annotations

import json
import math
import os
import platform
from importlib import metadata

import pytest
import torch

from stabledrl_trl import results


def test_replace_block_rewrites_only_the_marked_text():
    text = "intro\n<!-- t:start -->\nold | 1\n<!-- t:end -->\noutro\n<!-- u:start -->\nkeep\n<!-- u:end -->\n"
    new = results.replace_block(text, "t", "new | 2")
    assert new == "intro\n<!-- t:start -->\nnew | 2\n<!-- t:end -->\noutro\n<!-- u:start -->\nkeep\n<!-- u:end -->\n"
    assert results.marked_blocks(new) == {"t": "new | 2\n", "u": "keep\n"}
    assert results.replace_block(new, "t", "new | 2\n") == new  # idempotent


def test_missing_duplicated_or_unclosed_markers_are_errors():
    with pytest.raises(ValueError, match="expected one '<!-- t:start -->'"):
        results.replace_block("no markers", "t", "x")
    twice = "<!-- t:start -->\n<!-- t:end -->\n<!-- t:start -->\n<!-- t:end -->\n"
    with pytest.raises(ValueError, match="expected one"):
        results.replace_block(twice, "t", "x")
    with pytest.raises(ValueError, match="marked twice"):
        results.marked_blocks(twice)
    with pytest.raises(ValueError, match="without a matching end"):
        results.marked_blocks("<!-- t:start -->\nx\n")
    with pytest.raises(ValueError, match="block name"):
        results.replace_block("", "bad name", "x")


def test_write_readme_blocks_and_json_round_trip(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# T\n<!-- a:start -->\n<!-- a:end -->\n")
    results.write_readme_blocks({"a": "| x |\n|---|\n| 1 |\n"}, readme=str(readme))
    assert readme.read_text() == "# T\n<!-- a:start -->\n| x |\n|---|\n| 1 |\n<!-- a:end -->\n"
    path = tmp_path / "d" / "s.json"
    results.write_json(str(path), {"a": [1, 0.5]})
    assert results.read_json(str(path)) == {"a": [1, 0.5]}
    results.write_json(str(path), {"a": float("inf")})  # a diverged run's grad norm survives the round trip
    assert results.read_json(str(path)) == {"a": float("inf")}


def test_provenance_records_commit_command_and_versions():
    p = results.provenance(results.REPO_ROOT + "/scripts/bench_embedded.py", ["--seeds", "0", "1"])
    assert p["command"] == "python scripts/bench_embedded.py --seeds 0 1"
    assert set(p["versions"]) == {"python", "torch", "transformers", "trl"}
    assert p["versions"]["trl"] == "1.16.0"
    assert set(p["libraries"]) == set(results.LIBRARIES) and "python" not in p["libraries"]
    assert p["libraries"]["accelerate"] == metadata.version("accelerate")
    m = p["machine"]  # what cross-machine differences in a seeded run come from
    assert m["cores"] == os.cpu_count() and m["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert m["platform"] == platform.platform() and (m["cpu"] is None or m["cpu"].strip() == m["cpu"] != "")
    if p["commit"] is not None:  # a git checkout
        assert len(p["commit"]) == 40 and isinstance(p["dirty"], bool)
    json.dumps(p)
    line = results.provenance_line({"provenance": {**p, "commit": "a" * 40, "dirty": True}})
    assert "aaaaaaaaaa (uncommitted changes)" in line and "`python scripts/bench_embedded.py --seeds 0 1`" in line


def test_markdown_table():
    assert results.markdown_table(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |\n"


def test_mean_std_by_hand():
    assert results.mean_std([0.2, 0.4, 0.6]) == (pytest.approx(0.4), pytest.approx(0.2))
    assert results.mean_std([0.3]) == (0.3, 0.0)
    with pytest.raises(ValueError):
        results.mean_std([])


@pytest.mark.parametrize(
    "t, df, p",
    [
        (1.0, 1, 0.5),  # Cauchy: 1 - 2 atan(1) / pi
        (math.sqrt(2), 2, 1 - math.sqrt(2) / 2),  # df 2: P(|T| < t) = t / sqrt(2 + t^2)
        (math.sqrt(3), 3, 0.5 - 1 / math.pi),  # df 3, theta = pi/4: 1 - (2/pi)(pi/4 + 1/2)
        (0.0, 7, 1.0),
        (-math.sqrt(2), 2, 1 - math.sqrt(2) / 2),  # two-sided: symmetric in t
    ],
)
def test_student_t_p_values_by_hand(t, df, p):
    assert results.student_t_two_sided_p(t, df) == pytest.approx(p, abs=1e-12)


@pytest.mark.parametrize("t, df", [(12.7062, 1), (4.3027, 2), (2.7764, 4), (2.5706, 5), (2.2281, 10), (2.0860, 20)])
def test_student_t_critical_values_of_the_tables_give_five_percent(t, df):
    assert results.student_t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-5)


def test_paired_t_test_by_hand():
    r = results.paired_t_test([1.0, 2.0, 3.0])  # mean 2, std 1, t = 2 sqrt(3)
    assert (r["n"], r["df"]) == (3, 2)
    assert r["mean"] == pytest.approx(2.0) and r["std"] == pytest.approx(1.0)
    assert r["t"] == pytest.approx(2 * math.sqrt(3))
    assert r["p"] == pytest.approx(1 - math.sqrt(12) / math.sqrt(14), abs=1e-12)
    assert results.paired_t_test([0.1, 0.1])["p"] == 0.0 and results.paired_t_test([0.0, 0.0])["p"] == 1.0
    with pytest.raises(ValueError, match="at least 2"):
        results.paired_t_test([1.0])


def test_sign_test_by_hand():
    assert results.sign_test([0.1] * 5) == {"positive": 5, "negative": 0, "zero": 0, "p": 2 / 32}
    assert results.sign_test([0.1, 0.2, 0.3, 0.4, -0.1])["p"] == pytest.approx(2 * 6 / 32)
    assert results.sign_test([0.1, -0.1, 0.0]) == {"positive": 1, "negative": 1, "zero": 1, "p": 1.0}
    assert results.sign_test([0.0])["p"] == 1.0
    assert results.sign_test([1.0] * 10)["p"] == pytest.approx(2 / 1024)


@pytest.mark.parametrize("t, df", [(12.7062, 1), (2.7764, 4), (2.2281, 10)])
def test_student_t_quantile_inverts_the_p_value(t, df):
    assert results.student_t_quantile(0.05, df) == pytest.approx(t, abs=1e-4)


def test_mean_interval_by_hand():
    low, high = results.mean_interval([1.0, 2.0, 3.0])  # mean 2, std 1, t_{2, 0.975} = 4.3027
    assert (low, high) == (
        pytest.approx(2 - 4.302653 / 3**0.5, abs=1e-5),
        pytest.approx(2 + 4.302653 / 3**0.5, abs=1e-5),
    )
    assert results.mean_interval([1.0]) is None


def test_missing_readme_markers_stop_a_run_before_it_starts(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("<!-- a:start -->\n<!-- a:end -->\n")
    results.check_readme_blocks(["a"], readme=str(readme))
    with pytest.raises(SystemExit, match="'<!-- b:start -->' line and one '<!-- b:end -->' line"):
        results.check_readme_blocks(["a", "b"], readme=str(readme))


def test_readme_only_rewrites_the_blocks_or_names_the_missing_json(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- a:start -->\nold\n<!-- a:end -->\nend\n")
    with pytest.raises(SystemExit, match=r"--readme-only: no bench_x\.json in docs; run with --write-readme first"):
        results.rewrite_readme_only({}, "docs", "bench_x.json", readme=str(readme))
    assert "old" in readme.read_text()  # nothing written
    results.rewrite_readme_only({"a": "new\n"}, "docs", "bench_x.json", readme=str(readme))
    assert readme.read_text() == "intro\n<!-- a:start -->\nnew\n<!-- a:end -->\nend\n"
    assert f"rewrote blocks a in {readme} from docs" in capsys.readouterr().out


def test_content_holding_marker_text_is_refused_before_it_breaks_the_page():
    """Rendered text holding `<!-- x:end -->` would close the block early, so the next rewrite cut the page wrongly."""
    text = "a\n<!-- t:start -->\nold\n<!-- t:end -->\nb\n"
    for bad in ("see <!-- t:end --> here", "<!-- u:start -->\nx\n<!-- u:end -->", "x <!-- other.v-1:start -->"):
        with pytest.raises(ValueError, match="holds the marker text"):
            results.replace_block(text, "t", bad)
    # the same text already in a page is reported by marked_blocks (what tests/test_readme_results.py reads)
    with pytest.raises(ValueError, match="holds the marker text '<!-- u:start -->'"):
        results.marked_blocks("<!-- t:start -->\n<!-- u:start -->\n<!-- t:end -->\n")
    # a comment that is not a marker stays allowed
    assert results.marked_blocks(results.replace_block(text, "t", "<!-- note -->")) == {"t": "<!-- note -->\n"}


def test_blocks_are_written_into_the_page_holding_their_markers(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text("# front\n<!-- h:start -->\nold h\n<!-- h:end -->\n")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "results.md"
    page.write_text("# results\n<!-- a:start -->\nold a\n<!-- a:end -->\n<!-- b:start -->\n<!-- b:end -->\n")
    other = tmp_path / "docs" / "other.md"
    other.write_text("# other\n")
    pages = results.documentation_pages(str(readme))
    assert pages == [str(readme), str(other), str(page)]
    assert results.block_page("a", pages) == str(page) and results.block_page("h", pages) == str(readme)
    written = results.write_readme_blocks({"a": "new a", "h": "new h"}, pages=pages)
    assert sorted(written) == sorted([str(page), str(readme)])
    assert page.read_text() == "# results\n<!-- a:start -->\nnew a\n<!-- a:end -->\n<!-- b:start -->\n<!-- b:end -->\n"
    assert readme.read_text() == "# front\n<!-- h:start -->\nnew h\n<!-- h:end -->\n"
    assert other.read_text() == "# other\n"
    results.check_readme_blocks(["a", "b", "h"], pages=pages)
    with pytest.raises(SystemExit, match=r"block 'zz': its '<!-- zz:start -->' marker is in no page"):
        results.check_readme_blocks(["a", "zz"], pages=pages)
    other.write_text("<!-- a:start -->\n<!-- a:end -->\n")  # the same block in two pages
    with pytest.raises(SystemExit, match="other.md, .*results.md; it must be in exactly one"):
        results.write_readme_blocks({"h": "newer h", "a": "x"}, pages=pages)
    assert "new h" in readme.read_text()  # a refused block writes no page
    # without `pages`: the README (results.README, which script tests point at a temporary one) and its docs/*.md
    other.write_text("# other\n")
    monkeypatch.setattr(results, "README", str(readme))
    assert results.write_readme_blocks({"b": "new b"}) == [str(page)]
    assert results.marked_blocks(page.read_text()) == {"a": "new a\n", "b": "new b\n"}


def test_cpu_model_reads_the_first_model_name(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example CPU 9000\nprocessor\t: 1\nmodel name\t: Other\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(info if path == "/proc/cpuinfo" else path,
                                                                         *a, **k))  # fmt: skip
    assert results.cpu_model() == "Example CPU 9000"
