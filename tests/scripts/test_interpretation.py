"""Every sentence of interpretation in the results blocks rests on a number of the JSON it is rendered from.

`scripts/bench_stability.py` renders its readings (the verdict, the estimator-noise line, the paired comparisons, the
headline and the other-estimator sentence) from the committed docs/bench_stability*_summary.json,
`scripts/bench_noise_dose.py` its per-cell readings from docs/bench_noise_dose.json, and `scripts/which_objective.py`
the "Which objective when" section from all of them; each sentence must carry a figure and every figure must be a
value of the JSON it is read from (`stabledrl_trl.claims`). The prose around the blocks
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


def test_noise_dose_reading_is_backed_by_its_json(load_script):
    bench = load_script("bench_noise_dose")
    found = bench.interpretation_sentences(str(DOCS))
    problems = [p for sentence, sources in found for p in claims.check_sentence(sentence, sources, (bench.ALPHA,))]
    assert not problems, "\n".join(problems)
    blocks = bench.readme_blocks(str(DOCS))
    for name, block in bench.OUTPUTS.values():  # the main study and the long one, each in its own block
        if not (DOCS / name).is_file():
            continue
        data = results.read_json(str(DOCS / name))
        mine = [sentence for sentence, sources in found if sources[0] == data]
        assert len(mine) >= len(data["cells"]) + len(data["breaking_point"])  # a reading per cell and per lr
        assert all(sentence in blocks[block] for sentence in mine)  # the block carries these sentences


def test_length_train_reading_is_backed_by_its_json(load_script):
    bench = load_script("bench_length_train")
    found = bench.interpretation_sentences(str(DOCS))
    assert len(found) >= 3, "docs/bench_length_train.json renders its noise, comparison and curve readings"
    problems = [p for sentence, sources in found for p in claims.check_sentence(sentence, sources, (bench.ALPHA,))]
    assert not problems, "\n".join(problems)


def test_which_objective_sentences_are_backed_by_their_jsons(load_script):
    script = load_script("which_objective")
    found = script.interpretation_sentences(str(DOCS))
    assert len(found) >= 6
    problems = [p for sentence, sources in found for p in claims.check_sentence(sentence, sources, (script.ALPHA,))]
    assert not problems, "\n".join(problems)
    buckets = {b for b, _, _ in script.readings(script.load(str(DOCS)))}
    assert buckets == {"helps", "not", "when"}  # where it helps, where it does not, which objective when
    block = script.readme_blocks(str(DOCS))[script.BLOCK]
    assert all(sentence in block for sentence, _ in found)


def test_which_objective_reading_follows_the_numbers(load_script):
    script = load_script("which_objective")
    src = copy.deepcopy(script.load(str(DOCS)))
    main_test = src["main"]["comparisons"]["stable_drl"]["t_test"]
    forms = claims.printed_forms([v for d in src.values() for v in claims.numeric_leaves(d)])
    value = next(v / 1000 for v in range(150, 400) if f"{v / 1000:.3f}" not in forms)  # a value no JSON holds

    def bucket_of(sources, start):
        return [(b, x) for b, x, _ in script.study_readings(sources) if x.startswith(start)][0]

    assert bucket_of(src, "With block_random (")[0] == ("helps" if main_test["mean"] > 0 and main_test["p"] < 0.05
                                                        else "not")  # fmt: skip
    main_test.update(mean=-value, p=0.001)  # StableDRL significantly behind: the reading moves and says so
    bucket, sentence = bucket_of(src, "With block_random (")
    assert bucket == "not" and f"behind sequence-level GRPO by {value:.3f}" in sentence
    assert any(f"{value:.3f}" in p for p in claims.check_sentence(sentence, [script.load(str(DOCS))["main"]]))
    main_test.update(mean=value, p=0.2)  # not significant: no lead is claimed
    bucket, sentence = bucket_of(src, "With block_random (")
    assert bucket == "not" and "no significant difference" in sentence
    # the dose study: without a breaking point the recommendation says there is no threshold
    for lr in src["dose"]["breaking_point"]:
        src["dose"]["breaking_point"][lr] = None
    when = [x for b, x, _ in script.recommendations(src) if "dose study" in x]
    assert when and all("no noise level where GRPO collapses and StableDRL does not" in x for x in when)
    assert all("the runs that collapsed: GRPO" in x for x in when)  # and says what collapsed at the largest dose
    # a significant lead between two objectives that both collapsed is not filed under "helps"
    cell = max(src["dose"]["cells"], key=lambda c: c["noise_sd"])
    steps = src["dose"]["settings"]["max_steps"]  # (a 480-step study may read the same dose too)
    objectives = cell["summary"]["objectives"]
    objectives["stable_drl"]["final_vs_grpo_seq"] = {"mean": value, "p": 0.001, "t": 5.0, "df": 4}
    for name in ("grpo_seq", "stable_drl"):
        objectives[name].update(collapsed=5, seeds=5)
    (bucket, sentence), = [(b, x) for b, x, _ in script.dose_readings(src) if f"sd {cell['noise_sd']:.3f}; lr "
                           f"{cell['learning_rate']:g}, {steps} steps" in x]  # fmt: skip
    assert bucket == "not" and sentence.endswith("both collapsed in most runs, so the difference is in how far they fell.")
    objectives["stable_drl"].update(collapsed=0)  # GRPO breaks and StableDRL holds: where it helps
    (bucket, sentence), = [(b, x) for b, x, _ in script.dose_readings(src) if f"sd {cell['noise_sd']:.3f}; lr "
                           f"{cell['learning_rate']:g}, {steps} steps" in x]  # fmt: skip
    assert bucket == "helps" and "both collapsed" not in sentence


def _prose_outside_blocks(text: str) -> str:
    return re.sub(r"<!-- (\w+):start -->.*?<!-- \1:end -->", "", text, flags=re.S)


def test_stability_prose_states_no_comparison_without_a_figure():
    pages = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for heading in ("## Stability study", "## Which objective when"):  # the section, up to the next heading
            if heading in text:
                section = text.split(heading, 1)[1]
                pages.append((page.name, section.split("\n## ", 1)[0]))
        if page.name.startswith("stability") and "## Stability study" not in text:
            pages.append((page.name, text))
    assert pages, "no stability study text found"
    for name, text in pages:
        for sentence in re.split(r"(?<=[.:])\s+", _prose_outside_blocks(text)):
            lowered = sentence.lower()
            hits = [w for w in COMPARATIVES if w in lowered]
            assert not hits, f"{name}: {hits} stated outside a rendered block (render it from the JSON): {sentence!r}"


def test_which_objective_long_task_reading_follows_the_numbers(load_script):
    script = load_script("which_objective")
    t = {"mean": 0.12, "p": 0.01, "t": 4.0, "df": 2}
    data = {
        "settings": {"max_steps": 120},
        "noise": {"objectives": {"grpo_seq": {"scored_tokens_mean": 21.5, "log_ratio_sd": 1.148, "weight_max": 506.0}}},
        "summary": {"objectives": {
            "grpo_seq": {"collapsed": 2, "seeds": 3, "weight_max_in_training": 810.0},
            "stable_drl": {"collapsed": 0, "seeds": 3, "weight_max_in_training": 95.0, "final_vs_grpo_seq": t},
        }},
    }  # fmt: skip
    ((bucket, sentence, sources),) = script.length_train_reading({"length_train": data})
    assert bucket == "helps" and sources == [data]
    assert "ends ahead of sequence-level GRPO by 0.120" in sentence and "GRPO 2 of 3, StableDRL 0 of 3" in sentence
    assert "GRPO 810, StableDRL 95" in sentence and claims.check_sentence(sentence, [data], (script.ALPHA,)) == []
    t.update(mean=-0.05, p=0.4)  # no significant difference, and GRPO holds: not where StableDRL helps
    data["summary"]["objectives"]["grpo_seq"]["collapsed"] = 0
    ((bucket, sentence, _),) = script.length_train_reading({"length_train": data})
    assert bucket == "not" and "no significant difference (-0.050" in sentence
    assert script.length_train_reading({}) == []


def _dose_cell(sd, added, objectives, lr=5e-5):
    return {"mc_samples": 2, "added_noise_std": added, "learning_rate": lr, "noise_sd": sd,
            "summary": {"objectives": objectives}}  # fmt: skip


def test_which_objective_long_all_over_several_doses_is_one_sentence(load_script):
    script = load_script("which_objective")

    def o(collapsed, final):
        return {"collapsed": collapsed, "seeds": 5, "final": final}

    cells = [_dose_cell(1.069, 1.0, {"grpo_seq": o(5, 0.0), "stable_drl": o(0, 0.401), "dgpo": o(2, 0.3125)}),
             _dose_cell(0.599, 0.5, {"grpo_seq": o(4, 0.012), "stable_drl": o(1, 0.425), "dgpo": o(1, 0.438)})]
    data = {"settings": {"max_steps": 480}, "cells": cells}
    (line,) = [x for b, x, _ in script.recommendations({"long_all": data}) if x.startswith("Over 480")]
    assert line == (
        "Over 480 steps at sd 0.599, 1.069 (K = 2, added sd 0.5, 1, lr 5e-05, 5 seeds), at each sd in turn, the runs "
        "that collapsed (of 5): GRPO 4, 5; StableDRL 1, 0; DGPO 1, 2; mean final accuracy: GRPO 0.012, 0.000; "
        "StableDRL 0.425, 0.401; DGPO 0.438, 0.312."
    )
    assert claims.check_sentence(line, [data]) == []
    data["cells"] = cells[1:]  # one cell: the per-cell form
    (line,) = [x for b, x, _ in script.recommendations({"long_all": data}) if x.startswith("Over 480")]
    assert "the runs that collapsed: GRPO 4 of 5, StableDRL 1 of 5, DGPO 1 of 5" in line


def test_which_objective_says_when_stable_drl_collapses_were_dips_it_recovered_from(load_script):
    script = load_script("which_objective")

    def o(collapsed, below):
        return {"collapsed": collapsed, "collapsed_ended_below_start": below, "seeds": 5}

    dose = {"settings": {"collapse": {"margin": 0.02}}, "breaking_point": {"5e-05": 0.599},
            "cells": [_dose_cell(0.312, 0.0, {"grpo_seq": o(0, 0), "stable_drl": o(0, 0)}),
                      _dose_cell(0.599, 0.5, {"grpo_seq": o(5, 5), "stable_drl": o(1, 0)}),
                      _dose_cell(1.069, 1.0, {"grpo_seq": o(5, 5), "stable_drl": o(2, 1)})]}  # fmt: skip

    def use_line():
        (line,) = [x for _, x, _ in script.recommendations({"dose": dose}) if x.startswith("Use StableDRL")]
        assert claims.check_sentence(line, [dose]) == []
        return line

    assert "and StableDRL in 1, 2 of 5, of which 0, 1 ended below the start - 0.02 (the others recovered);" in use_line()
    dose["cells"][2]["summary"]["objectives"]["stable_drl"] = o(0, 0)
    assert "StableDRL in 1, 0 of 5, of which 0, 0 ended below the start - 0.02 (the others recovered);" in use_line()
    dose["cells"][1]["summary"]["objectives"]["stable_drl"] = o(1, 1)  # stayed down: no clause
    assert "StableDRL in 1, 0 of 5; at sd 0.312" in use_line()
    del dose["cells"][1]["summary"]["objectives"]["stable_drl"]["collapsed_ended_below_start"]  # an older JSON
    assert "recovered" not in use_line()


def test_which_objective_low_noise_reading_names_the_dose_studies_at_the_same_sd(load_script):
    script = load_script("which_objective")

    def study(steps, cells):
        return {"settings": {"max_steps": steps}, "cells": cells}

    def cell(sd, added, mean, p):
        test = {"mean": mean, "p": p, "t": 1.0, "df": 4}
        return _dose_cell(sd, added, {"grpo_seq": {}, "stable_drl": {"final_vs_grpo_seq": test}})

    dose = study(120, [cell(0.3121, 0.0, 0.017, 0.72), cell(0.599, 0.5, 0.2, 0.002), cell(0.116, 0.0, -0.03, 0.35)])
    long = study(480, [cell(0.3118, 0.0, -0.049, 0.578)])
    parts, sources = script.same_noise_dose_tests({"dose": dose, "long": long}, 0.312)
    assert parts == ["+0.017 (p = 0.720) over 120 steps", "-0.049 (p = 0.578) over 480 steps"]
    assert sources == [dose, long]
    assert script.same_noise_dose_tests({"dose": dose}, 0.472) == ([], [])  # no cell at that sd: nothing said


def test_which_objective_low_lr_reading_follows_grpo_collapses_at_both_rates(load_script):
    script = load_script("which_objective")

    def o(collapsed, final, moved):
        return {"collapsed": collapsed, "seeds": 5, "final": final, "param_distance": moved}

    def cell(sd, added, lr, grpo, sdrl):
        return _dose_cell(sd, added, {"grpo_seq": grpo, "stable_drl": sdrl}, lr=lr)

    low = {"settings": {"max_steps": 480}, "cells": [
        cell(1.069, 1.0, 1.5e-5, o(4, 0.011, 0.61), o(0, 0.352, 0.83)),
        cell(0.599, 0.5, 1.5e-5, o(3, 0.125, 0.64), o(0, 0.371, 0.85))]}  # fmt: skip
    long = {"settings": {"max_steps": 480}, "cells": [
        cell(0.312, 0.0, 5e-5, o(0, 0.37, 1.3), o(1, 0.32, 1.35)),
        cell(0.599, 0.5, 5e-5, o(5, 0.0, 1.05), o(0, 0.416, 1.3)),
        cell(1.069, 1.0, 5e-5, o(5, 0.0, 0.848), o(0, 0.382, 1.23))]}  # fmt: skip
    line = script.low_lr_sentence(low, long)
    assert line == (
        "With a smaller learning rate (lr 1.5e-05; 480 steps, 5 seeds) at sd 0.599, 1.069: GRPO collapsed in 3, 4 of 5 "
        "(5, 5 of 5 at lr 5e-05) and ended at 0.125, 0.011; StableDRL collapsed in 0, 0 of 5 and ended at 0.371, "
        "0.352; weights moved (L2) GRPO 0.64, 0.61, StableDRL 0.85, 0.83; the smaller learning rate did not keep GRPO "
        "from collapsing."
    )
    assert claims.check_sentence(line, [low, long]) == []
    (found,) = [(b, x, srcs) for b, x, srcs in script.recommendations({"long_low_lr": low, "long": long})
                if x.startswith("With a smaller")]  # fmt: skip
    assert found == ("when", line, [low, long])
    for c in low["cells"]:  # GRPO holds at the smaller rate: the reading turns
        c["summary"]["objectives"]["grpo_seq"]["collapsed"] = 1
    assert script.low_lr_sentence(low, long).endswith("at the smaller learning rate GRPO collapsed in most runs at "
                                                      "none of these doses.")  # fmt: skip
    low["cells"][0]["summary"]["objectives"]["grpo_seq"]["collapsed"] = 5  # mixed: numbers only
    assert script.low_lr_sentence(low, long).endswith("StableDRL 0.85, 0.83.")
    assert "at lr 5e-05" not in script.low_lr_sentence(low, None)  # nothing to compare with: no comparison


def test_which_objective_dose_readings_read_a_retrained_cell_once(load_script):
    script = load_script("which_objective")
    test = {"mean": 0.4, "p": 0.001, "t": 9.0, "df": 4}

    def cell(sd, added):
        return _dose_cell(sd, added, {"grpo_seq": {"collapsed": 5, "seeds": 5},
                                      "stable_drl": {"collapsed": 0, "seeds": 5, "final_vs_grpo_seq": test}})  # fmt: skip

    long = {"settings": {"max_steps": 480}, "cells": [cell(0.599, 0.5)]}
    long_all = {"settings": {"max_steps": 480}, "cells": [cell(0.599, 0.5), cell(2.069, 2.0)]}
    found = script.dose_readings({"long": long, "long_all": long_all})
    assert [srcs for _, _, srcs in found] == [[long], [long_all]]  # 0.599 from the long study, 2.069 from long-all
    assert "added sd 2: pure-noise sd 2.069; lr 5e-05, 480 steps" in found[1][1] and found[1][0] == "helps"


def test_which_objective_leaves_the_largest_dose_to_the_longer_study_of_every_objective(load_script):
    script = load_script("which_objective")

    def objectives():
        return {n: {"collapsed": c, "collapsed_ended_below_start": c, "seeds": 5, "final": 0.1}
                for n, c in (("grpo_seq", 5), ("stable_drl", 0), ("dgpo", 5))}  # fmt: skip

    dose = {"settings": {"collapse": {"margin": 0.02}}, "breaking_point": {"5e-05": 2.069},
            "cells": [_dose_cell(2.069, 2.0, objectives())]}  # fmt: skip
    long_all = {"settings": {"max_steps": 480}, "cells": [_dose_cell(2.069, 2.0, objectives())]}
    assert any(x.startswith("At the largest dose run") for _, x, _ in script.recommendations({"dose": dose}))
    found = [x for _, x, _ in script.recommendations({"dose": dose, "long_all": long_all})]
    assert not any(x.startswith("At the largest dose run") for x in found)
    assert any(x.startswith("Over 480 steps at sd 2.069") for x in found)  # the same dose, every objective, 480 steps
