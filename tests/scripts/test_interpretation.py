"""Every sentence of interpretation in the stability blocks rests on a number of the JSON it is rendered from.

`scripts/bench_stability.py` renders its readings (the verdict, the estimator-noise line, the paired comparisons, the
headline and the other-estimator sentence) from the committed docs/bench_stability*_summary.json; each sentence must
carry a figure and every figure must be a value of that JSON (`stabledrl_trl.claims`). The prose around the blocks
may not state a comparison ("less noise", "more stable", "faster", ...): only rendered text, with its figures, does.
"""

import copy
import re
from pathlib import Path

import pytest

from stabledrl_trl import claims, results

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
COMPARATIVES = ("less noise", "less noisy", "noisier", "quieter", "low-variance", "lower variance", "more stable",
                "less stable", "faster", "slower")  # fmt: skip


def _constants(bench):
    return (bench.CLAIM_GAIN, bench.CLAIM_P)


def test_checker_flags_missing_and_unbacked_numbers():
    source = {"noise": {"sd": 0.47219, "pairs": 512}, "runs": [{"grad_norm": [0.999]}]}
    assert claims.check_sentence("sd 0.472 over 512 pairs", [source]) == []
    assert claims.check_sentence("sd +0.472 and -0.472", [source]) == []  # a printed sign of either value
    assert claims.check_sentence("the pair is noisier", [source])  # a comparison with no figure
    assert claims.unbacked_numbers("sd 0.473", [source]) == ["0.473"]  # not the value at its printed precision
    assert claims.unbacked_numbers("norm 0.999", [source]) == ["0.999"]  # per-step curves back nothing
    assert claims.unbacked_numbers("C = 1e+06 in bench_stability_controls2", [{"c": 1e6}]) == []
    assert claims.numbers_in("x1.64, K = 2, 8-token, block_random2") == ["2", "8"]


@pytest.fixture(scope="module")
def sentences(load_script):
    bench = load_script("bench_stability")
    return bench, bench.interpretation_sentences(str(DOCS))


def test_every_interpretation_sentence_is_backed_by_its_json(sentences):
    bench, found = sentences
    assert len(found) >= 8, "the committed studies render their readings"
    problems = [p for sentence, sources in found for p in claims.check_sentence(sentence, sources, _constants(bench))]
    assert not problems, "\n".join(problems)


def test_the_committed_studies_record_their_own_estimator_noise(sentences):
    bench, _ = sentences
    for path in sorted(DOCS.glob("bench_stability*_summary.json")):
        summary = results.read_json(str(path))
        record = summary.get("estimator_noise")
        assert record is not None, f"{path.name} has no estimator_noise: run bench_stability.py --measure-noise"
        assert set(record["objectives"]) == set(summary["settings"]["objectives"])
        for name, n in record["objectives"].items():
            settings = bench.objective_settings(summary["settings"]["study"], summary["settings"]["objectives"][name],
                                                name)  # fmt: skip
            assert n["likelihood_estimator"] == settings["likelihood_estimator"]  # measured in the study's setting
            assert n["mask_seed_mode"] == settings["mask_seed_mode"] and n["pairs"] == record["pairs"] >= 512
            if n["mask_seed_mode"] == "shared":  # the same masks for old and current: exactly no noise
                assert n["log_ratio_sd"] == 0.0 and n["weight_max"] == 1.0
            else:
                assert n["log_ratio_sd"] > 0.05 and n["weight_max"] > 1.0


def test_a_sentence_rendered_from_a_changed_json_is_caught(sentences):
    bench, _ = sentences
    main = results.read_json(str(DOCS / "bench_stability_summary.json"))
    coupled = results.read_json(str(DOCS / "bench_stability_coupled_summary.json"))
    tampered = copy.deepcopy(coupled)
    forms = claims.printed_forms(claims.numeric_leaves(main) + claims.numeric_leaves(coupled))
    value = next(v / 1000 for v in range(150, 300) if f"{v / 1000:.3f}" not in forms)  # a value neither JSON holds
    tampered["estimator_noise"]["objectives"]["stable_drl"]["log_ratio_sd"] = value
    sentence = bench.other_estimator_sentence(main, tampered)
    assert f"{value:.3f}" in sentence and "less noisy" in sentence  # the reading follows the measured figure
    problems = [p for s in bench.split_sentences(sentence) for p in claims.check_sentence(s, [main, coupled])]
    assert any(f"{value:.3f}" in p for p in problems)
    # and without a noise record there is no reading to render
    del tampered["estimator_noise"]
    assert bench.other_estimator_sentence(main, tampered) == ""


def test_reading_follows_the_measured_noise_and_the_paired_lead(sentences):
    bench, _ = sentences
    main = results.read_json(str(DOCS / "bench_stability_summary.json"))
    other = copy.deepcopy(main)
    sd_main = main["estimator_noise"]["objectives"]["stable_drl"]["log_ratio_sd"]
    other["estimator_noise"]["objectives"]["stable_drl"]["log_ratio_sd"] = sd_main * 2
    other["comparisons"]["stable_drl"]["t_test"]["mean"] = main["comparisons"]["stable_drl"]["t_test"]["mean"] + 0.05
    assert "in the direction of a noise-driven gain" in bench.other_estimator_sentence(main, other)
    other["comparisons"]["stable_drl"]["t_test"]["mean"] -= 0.1
    assert "do not show that StableDRL's gain grows" in bench.other_estimator_sentence(main, other)


def _prose_outside_blocks(text: str) -> str:
    return re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)


def test_stability_prose_states_no_comparison_without_a_figure():
    pages = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        if "## Stability study" in text:  # the section, up to the next heading of its level
            section = text.split("## Stability study", 1)[1]
            pages.append((page.name, section.split("\n## ", 1)[0]))
        elif page.name.startswith("stability"):
            pages.append((page.name, text))
    assert pages, "no stability study text found"
    for name, text in pages:
        for sentence in re.split(r"(?<=[.:])\s+", _prose_outside_blocks(text)):
            lowered = sentence.lower()
            hits = [w for w in COMPARATIVES if w in lowered]
            assert not hits, f"{name}: {hits} stated outside a rendered block (render it from the JSON): {sentence!r}"
