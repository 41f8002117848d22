"""Which objective when: where StableDRL helps at this scale, where it does not, and which objective to use when,
rendered from the committed study JSONs (no run of its own).

    python scripts/which_objective.py --write-readme     # rewrite its blocks (docs/results.md, README.md)
    python scripts/which_objective.py                    # print it

Sources (each read from `--docs-dir`, default docs/; a reading whose JSON is missing is left out):
- `bench_stability_summary.json`: GRPO against StableDRL at the stability study's setting (block_random in blocks
  of 2, K = 2), with the estimator noise measured in that setting;
- `bench_stability_coupled_summary.json`: the same study with `block_random_coupled`;
- `bench_stability_controls_summary.json` / `bench_stability_controls2_summary.json`: StableDRL without its clip,
  and d1's diffu-GRPO, against the same GRPO runs;
- `bench_noise_dose.json`: GRPO against StableDRL at added log-ratio noise of known size, with collapse defined;
- `bench_noise_dose_long.json`: the same for GRPO and StableDRL over 480 steps (four times as long);
- `bench_noise_dose_long_all.json`: every objective over 480 steps at the added noise 0.5, 1 and 2 (K = 2);
- `bench_length_noise.json`: the weights' size on 32-64-token answers, per-token mean against sum;
- `bench_length_train.json`: GRPO against StableDRL trained on those long answers.

Every sentence carries the figures and the comparison it rests on (`interpretation_sentences` gives each with the
JSONs it is read from; tests/scripts/test_interpretation.py checks every number against them). Which bucket a
reading falls in ("helps", "does not") follows the numbers: a significant paired lead at `ALPHA`, or GRPO collapsing
in most seeds while StableDRL collapses in none.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

BLOCK = "which_objective"
ALPHA = 0.05  # significance level of the paired t-tests (bench_stability.CLAIM_P, bench_noise_dose.ALPHA)
SOURCES = {
    "main": "bench_stability_summary.json",
    "coupled": "bench_stability_coupled_summary.json",
    "controls": "bench_stability_controls_summary.json",
    "controls2": "bench_stability_controls2_summary.json",
    "dose": "bench_noise_dose.json",
    "long": "bench_noise_dose_long.json",
    "long_all": "bench_noise_dose_long_all.json",
    "long_low_lr": "bench_noise_dose_long_low_lr.json",
    "length": "bench_length_noise.json",
    "length_train": "bench_length_train.json",
}
REFERENCE = "grpo_seq"
# How the sentences name the study objectives.
OBJECTIVE_NAMES = {REFERENCE: "GRPO", "stable_drl": "StableDRL", "stable_drl_no_clip": "StableDRL without its clip",
                   "dgpo": "DGPO", "diffu_grpo": "diffu-GRPO"}  # fmt: skip


def load(docs_dir: str) -> dict[str, dict]:
    """{source name: JSON} for the `SOURCES` present in docs_dir with provenance."""
    out = {}
    for name, file in SOURCES.items():
        path = os.path.join(docs_dir, file)
        if os.path.isfile(path):
            data = results.read_json(path)
            if "provenance" in data:
                out[name] = data
    return out


def _noise_sd(summary: dict, name: str) -> float | None:
    record = (summary.get("estimator_noise") or {}).get("objectives", {}).get(name)
    return None if record is None else record["log_ratio_sd"]


def _lead(test: dict, name: str, ref: str = "sequence-level GRPO") -> tuple[str, str]:
    """(bucket, phrase) of a paired t-test of name - ref: "helps" when significantly ahead, else "not"."""
    if test["p"] >= ALPHA:
        return "not", (
            f"{name} and {ref} end with no significant difference ({test['mean']:+.3f}, paired t-test p = "
            f"{test['p']:.3f})"
        )
    if test["mean"] > 0:
        return "helps", f"{name} ends ahead of {ref} by {test['mean']:.3f} (paired t-test p = {test['p']:.3f})"
    return "not", f"{name} ends behind {ref} by {-test['mean']:.3f} (paired t-test p = {test['p']:.3f})"


def _setting(summary: dict, joint: str = ", ") -> str:
    """The estimator setting, e.g. `block_random, blocks of 2, K = 2` (`joint` after the estimator's name)."""
    study = summary["settings"]["study"]
    blocks = study.get("estimator_block_size")
    return f"{study['likelihood_estimator']}{joint}blocks of {blocks}, K = {study['mc_samples']}"


def _same_reference_runs(a: dict, b: dict) -> bool:
    """Whether two studies' grpo_seq runs are the same runs (equal final accuracy for every seed)."""

    def finals(s):
        return {r["seed"]: r["accuracy_after"] for r in s["runs"] if r["objective"] == REFERENCE}

    return finals(a) == finals(b) and bool(finals(a))


def study_readings(src: dict) -> list[tuple[str, str, list[dict]]]:
    """(bucket, sentence, sources) from the stability studies: StableDRL against GRPO per estimator setting."""
    out = []
    for key in ("main", "coupled"):
        s = src.get(key)
        if s is None or "stable_drl" not in s["comparisons"]:
            continue
        bucket, phrase = _lead(s["comparisons"]["stable_drl"]["t_test"], "StableDRL")
        sd = _noise_sd(s, "stable_drl")
        noise = "" if sd is None else f"; pure-noise log-ratio sd {sd:.3f} at the start"
        out.append((bucket, (
            f"With {_setting(s, ' (')}{noise}), {phrase} after {s['settings']['max_steps']} steps over "
            f"{len(s['settings']['seeds'])} seeds."
        ), [s]))  # fmt: skip
    main, controls = src.get("main"), src.get("controls")
    if main and controls and "stable_drl_no_clip" in controls["comparisons"] and "stable_drl" in main["comparisons"]:
        t = controls["comparisons"]["stable_drl_no_clip"]["t_test"]
        clip = controls["settings"]["objectives"]["stable_drl_no_clip"]["clip_c"]
        bucket, phrase = _lead(t, f"StableDRL without its clip (C = {clip:g}: the group self-normalisation alone)")
        same = ", the same GRPO runs" if _same_reference_runs(main, controls) else ""
        out.append((bucket, (
            f"In the same setting{same}, {phrase}, against {main['comparisons']['stable_drl']['t_test']['mean']:+.3f} "
            f"with the clip at C = {main['settings']['objectives']['stable_drl']['clip_c']:g}."
        ), [main, controls]))  # fmt: skip
    return out


DOSE_STUDIES = ("dose", "long", "long_low_lr", "long_all")  # read in this order; a cell already read is skipped


def dose_readings(src: dict) -> list[tuple[str, str, list[dict]]]:
    """(bucket, sentence, sources) from the noise-dose studies (`DOSE_STUDIES`), one per cell with both objectives;
    a cell (K, added noise, lr, steps) another study already gave (long-all trains the long study's cells again) is
    read once, from the first."""
    out, seen = [], set()
    for dose, c in [(d, c) for d in (src.get(k) for k in DOSE_STUDIES) if d is not None
                    for c in sorted(d["cells"], key=lambda c: (c["learning_rate"], c["noise_sd"]))]:  # fmt: skip
        key = (c["mc_samples"], c["added_noise_std"], c["learning_rate"], dose["settings"]["max_steps"])
        if key in seen:
            continue
        seen.add(key)
        o = c["summary"]["objectives"]
        if REFERENCE not in o or "stable_drl" not in o or not o["stable_drl"].get(f"final_vs_{REFERENCE}"):
            continue
        ref, sd = o[REFERENCE], o["stable_drl"]
        bucket, phrase = _lead(sd[f"final_vs_{REFERENCE}"], "StableDRL")
        breaks = ref["collapsed"] * 2 > ref["seeds"] and sd["collapsed"] == 0
        both_collapse = ref["collapsed"] * 2 > ref["seeds"] and sd["collapsed"] * 2 > sd["seeds"]
        if breaks:
            bucket = "helps"
        if both_collapse:  # a lead between two collapsed objectives is in how far they fell, not in stability
            bucket = "not"
        dose_text = (f"With noise added to the log-ratio (K = {c['mc_samples']}, added sd {c['added_noise_std']:g}"
                     if c["added_noise_std"] else
                     f"With the estimator's own noise only (K = {c['mc_samples']}, nothing added")  # fmt: skip
        out.append((bucket, (
            f"{dose_text}: pure-noise "
            f"sd {c['noise_sd']:.3f}; lr {c['learning_rate']:g}, {dose['settings']['max_steps']} steps), {phrase}; "
            f"collapsed runs GRPO {ref['collapsed']} of {ref['seeds']}, StableDRL {sd['collapsed']} of {sd['seeds']}"
            + ("; both collapsed in most runs, so the difference is in how far they fell" if both_collapse else "")
            + "."
        ), [dose]))  # fmt: skip
    return out


def length_reading(src: dict) -> list[tuple[str, str, list[dict]]]:
    """(bucket, sentence, sources): the size of the mean-form weights on the longest answers measured."""
    length = src.get("length")
    if length is None:
        return []
    rows = [r for r in length["rows"] if r["task"] == "digit_sort_long"]
    if not rows:
        return []
    longest = max(r["scored_tokens_mean"] for r in rows)
    row = max((r for r in rows if r["scored_tokens_mean"] == longest), key=lambda r: r["mean_form"]["weight_max"])
    m, s = row["mean_form"], row["sum_form"]
    return [("not", (
        f"On gold answers of {row['scored_tokens_mean']:.1f} scored tokens (digit_sort_long, {row['setting']}, "
        f"scored by a {length['settings']['long_sft']['max_steps']}-step warm-up, before any RL), "
        f"the per-token mean ratio that this trainer and the official code use gives at most {m['weight_max']:.3g} of "
        f"{row['pairs']} pure-noise weights, {m['frac_above_clip_c']:.3f} of them above C = "
        f"{length['settings']['clip_c']:g}, where a sum over tokens of the same pairs reaches {s['weight_max']:.3g}: "
        f"for these pairs the clip has little to cut."
    ), [length])]  # fmt: skip


def length_train_reading(src: dict) -> list[tuple[str, str, list[dict]]]:
    """(bucket, sentence, sources): StableDRL against GRPO trained on the long task (`bench_length_train.json`)."""
    data = src.get("length_train")
    if data is None:
        return []
    o = data["summary"]["objectives"]
    if REFERENCE not in o or "stable_drl" not in o or not o["stable_drl"].get(f"final_vs_{REFERENCE}"):
        return []
    ref, sd = o[REFERENCE], o["stable_drl"]
    bucket, phrase = _lead(sd[f"final_vs_{REFERENCE}"], "StableDRL")
    if ref["collapsed"] * 2 > ref["seeds"] and sd["collapsed"] == 0:
        bucket = "helps"
    noise = data["noise"]["objectives"][REFERENCE]
    return [(bucket, (
        f"Trained on digit_sort_long (the model's own rollouts {noise['scored_tokens_mean']:.1f} scored tokens long "
        f"on average at the start, pure-noise log-ratio sd {noise['log_ratio_sd']:.3f}, largest weight "
        f"{noise['weight_max']:.3g}; {data['settings']['max_steps']} steps, {sd['seeds']} seeds, held-out partial "
        f"reward), {phrase}; collapsed runs GRPO {ref['collapsed']} of {ref['seeds']}, StableDRL {sd['collapsed']} "
        f"of {sd['seeds']}"
        + (f" (ended below the start - {data['settings']['collapse']['margin']:g}: GRPO "
           f"{ref['collapsed_ended_below_start']}, StableDRL "
           f"{sd['collapsed_ended_below_start']})" if "collapsed_ended_below_start" in sd else "")
        + f"; the largest weight a training step logged: GRPO {ref['weight_max_in_training']:.3g}, "
        f"StableDRL {sd['weight_max_in_training']:.3g}."
    ), [data])]  # fmt: skip


def _collapsed_runs(cell: dict, seeds: int) -> str:
    """"GRPO 5 of 5, StableDRL 0 of 5, ...": every objective's collapsed runs in one dose cell."""
    return ", ".join(f"{OBJECTIVE_NAMES.get(n, n)} {o['collapsed']} of {seeds}"
                     for n, o in cell["summary"]["objectives"].items())  # fmt: skip


def same_noise_dose_tests(src: dict, sd: float) -> tuple[list[str], list[dict]]:
    """The dose studies' paired final differences of StableDRL against GRPO, "+0.017 (p = 0.720) over 120 steps",
    in their cells without added noise whose measured pure-noise sd prints as `sd` (the stability study's estimator
    setting, trained again with the dose studies' steps and evaluation), with the JSONs they come from."""
    parts, sources = [], []
    for key in ("dose", "long"):
        data = src.get(key)
        for c in (data or {}).get("cells", []):
            test = c["summary"]["objectives"].get("stable_drl", {}).get(f"final_vs_{REFERENCE}")
            if test and c["added_noise_std"] == 0 and f"{c['noise_sd']:.3f}" == f"{sd:.3f}":
                parts.append(f"{test['mean']:+.3f} (p = {test['p']:.3f}) over {data['settings']['max_steps']} steps")
                sources.append(data)
    return parts, list({id(d): d for d in sources}.values())


def low_lr_sentence(low: dict, long: dict | None) -> str:
    """Does a smaller learning rate save GRPO: per dose of the low-lr study, GRPO's and StableDRL's collapsed runs,
    mean final accuracy and distance moved, beside GRPO's collapsed runs at the long study's learning rate over as
    many steps where that study has the same dose; the verdict follows GRPO's collapses at both rates."""
    cells = sorted(low["cells"], key=lambda c: c["noise_sd"])
    lr, steps = cells[0]["learning_rate"], low["settings"]["max_steps"]
    seeds = cells[0]["summary"]["objectives"][REFERENCE]["seeds"]

    def o(c, name):
        return c["summary"]["objectives"][name]

    def joined(name, key, fmt):
        return ", ".join(fmt.format(o(c, name)[key]) for c in cells)

    same = {}  # (K, added noise): the long study's cell of that dose, at its learning rate and as many steps
    if long is not None and long["settings"]["max_steps"] == steps:
        same = {(b["mc_samples"], b["added_noise_std"]): b for b in long["cells"]
                if REFERENCE in b["summary"]["objectives"]}  # fmt: skip
    base = [same.get((c["mc_samples"], c["added_noise_std"])) for c in cells]
    compare = ""
    if None not in base and len({b["learning_rate"] for b in base}) == 1:
        compare = (f" ({', '.join(str(o(b, REFERENCE)['collapsed']) for b in base)} of {seeds} at lr "
                   f"{base[0]['learning_rate']:g})")  # fmt: skip
    sds = ", ".join(f"{c['noise_sd']:.3f}" for c in cells)
    text = (
        f"With a smaller learning rate (lr {lr:g}; {steps} steps, {seeds} seeds) at sd {sds}: GRPO collapsed in "
        f"{joined(REFERENCE, 'collapsed', '{}')} of {seeds}{compare} and ended at {joined(REFERENCE, 'final', '{:.3f}')}; "
        f"StableDRL collapsed in {joined('stable_drl', 'collapsed', '{}')} of {seeds} and ended at "
        f"{joined('stable_drl', 'final', '{:.3f}')}; weights moved (L2) GRPO {joined(REFERENCE, 'param_distance', '{:.3g}')}, "
        f"StableDRL {joined('stable_drl', 'param_distance', '{:.3g}')}"
    )
    broke = [o(c, REFERENCE)["collapsed"] * 2 > seeds for c in cells]
    if all(broke):
        text += "; the smaller learning rate did not keep GRPO from collapsing"
    elif not any(broke) and compare:
        text += "; at the smaller learning rate GRPO collapsed in most runs at none of these doses"
    return text + "."


def long_all_sentence(data: dict) -> str:
    """One sentence for a 480-step study of several doses at one K and learning rate: per objective, the collapsed
    runs and the mean final accuracy at each dose in turn."""
    cells = sorted(data["cells"], key=lambda c: c["noise_sd"])
    names = list(cells[0]["summary"]["objectives"])
    seeds = cells[0]["summary"]["objectives"][REFERENCE]["seeds"]

    def per_dose(key, fmt):
        return "; ".join(f"{OBJECTIVE_NAMES.get(n, n)} " + ", ".join(fmt.format(c["summary"]["objectives"][n][key])
                                                                      for c in cells) for n in names)  # fmt: skip

    sds = ", ".join(f"{c['noise_sd']:.3f}" for c in cells)
    added = ", ".join(f"{c['added_noise_std']:g}" for c in cells)
    return (
        f"Over {data['settings']['max_steps']} steps at sd {sds} (K = {cells[0]['mc_samples']}, added sd {added}, lr "
        f"{cells[0]['learning_rate']:g}, {seeds} seeds), at each sd in turn, the runs that collapsed (of {seeds}): "
        f"{per_dose('collapsed', '{}')}; mean final accuracy: {per_dose('final', '{:.3f}')}."
    )


def recommendations(src: dict) -> list[tuple[str, str, list[dict]]]:
    """(bucket "when", sentence, sources): which objective to use when, each with the figures it rests on."""
    out = []
    dose = src.get("dose")
    if dose is not None:
        for lr, sd in dose["breaking_point"].items():
            cells = sorted((c for c in dose["cells"] if f"{c['learning_rate']:g}" == lr), key=lambda c: c["noise_sd"])
            seeds = cells[0]["summary"]["objectives"][REFERENCE]["seeds"]
            top = cells[-1]  # the largest dose run at this learning rate
            if sd is None:
                sds = ", ".join(f"{c['noise_sd']:.3f}" for c in cells)
                out.append(("when", (
                    f"At lr {lr} the dose study has no noise level where GRPO collapses and StableDRL does not "
                    f"(pure-noise sds {sds}), so it gives no noise threshold for choosing StableDRL; at sd "
                    f"{top['noise_sd']:.3f} the runs that collapsed: {_collapsed_runs(top, seeds)}."
                ), [dose]))  # fmt: skip
                continue

            def count(c, name):
                return c["summary"]["objectives"][name]["collapsed"]

            # GRPO's break: the lowest level where it collapsed in most seeds (the breaking point is one such level)
            broken = [c for c in cells if count(c, REFERENCE) * 2 > seeds]
            held = [c for c in cells if c["noise_sd"] < broken[0]["noise_sd"]]
            sds = ", ".join(f"{c['noise_sd']:.3f}" for c in broken)
            safe = (
                f"; at sd {held[-1]['noise_sd']:.3f} GRPO collapsed in {count(held[-1], REFERENCE)} of {seeds}, so "
                f"the level where it starts to break lies between {held[-1]['noise_sd']:.3f} and "
                f"{broken[0]['noise_sd']:.3f}, where no level was run"
                if held
                else ""
            )
            mine = [c["summary"]["objectives"]["stable_drl"] for c in broken]
            fell, stayed = sum(e["collapsed"] for e in mine), [e.get("collapsed_ended_below_start") for e in mine]
            recovered = (  # StableDRL's collapses there that were dips it recovered from (per dose, not summed)
                f", of which {', '.join(map(str, stayed))} ended below the start - "
                f"{dose['settings']['collapse']['margin']:g} (the others recovered)"
                if fell and None not in stayed and sum(stayed) < fell
                else ""
            )
            out.append(("when", (
                f"Use StableDRL when the pure-noise log-ratio sd is {broken[0]['noise_sd']:.3f} or more (lr {lr}): at "
                f"sd {sds} GRPO collapsed in {', '.join(str(count(c, REFERENCE)) for c in broken)} of {seeds} runs "
                f"and StableDRL in {', '.join(str(count(c, 'stable_drl')) for c in broken)} of {seeds}{recovered}"
                f"{safe}."
            ), [dose]))  # fmt: skip
            longer = {(c["mc_samples"], c["added_noise_std"], c["learning_rate"])
                      for c in (src.get("long_all") or {}).get("cells", [])}  # fmt: skip
            if any(n not in (REFERENCE, "stable_drl") for n in top["summary"]["objectives"]) and (
                (top["mc_samples"], top["added_noise_std"], top["learning_rate"]) not in longer
            ):  # the other objectives at the largest dose, unless the 480-step study of every objective has it
                out.append(("when", (  # the other objectives of the study at its largest dose
                    f"At the largest dose run (sd {top['noise_sd']:.3f}, lr {lr}, {seeds} seeds) the runs that "
                    f"collapsed: {_collapsed_runs(top, seeds)}."
                ), [dose]))  # fmt: skip
    leads = []  # (noise sd, paired test, summary) of StableDRL against GRPO in the stability studies
    for key in ("main", "coupled"):
        s = src.get(key)
        if s and "stable_drl" in s["comparisons"] and _noise_sd(s, "stable_drl") is not None:
            leads.append((_noise_sd(s, "stable_drl"), s["comparisons"]["stable_drl"]["t_test"], s))
    ahead = [x for x in leads if x[1]["p"] < ALPHA and x[1]["mean"] > 0]
    behind = [x for x in leads if x[1]["p"] < ALPHA and x[1]["mean"] < 0]
    if ahead and behind:
        a, b = ahead[0], behind[0]
        again, dose_sources = same_noise_dose_tests(src, a[0])
        again = (f"; the dose studies, at the same sd {a[0]:.3f}, measured StableDRL - GRPO {' and '.join(again)}"
                 if again else "")  # fmt: skip
        out.append(("when", (
            f"At the low noise of the estimators themselves no objective wins everywhere: StableDRL led GRPO by "
            f"{a[1]['mean']:.3f} at sd {a[0]:.3f} ({_setting(a[2])}) and trailed it by {-b[1]['mean']:.3f} at sd "
            f"{b[0]:.3f} ({_setting(b[2])}){again}, so compare both on held-out accuracy for your estimator."
        ), [x[2] for x in leads] + dose_sources))  # fmt: skip
    elif leads and len(ahead) == len(leads):
        out.append(("when", (
            "At the low noise of the estimators themselves StableDRL led GRPO in every setting measured ("
            + "; ".join(f"{t['mean']:+.3f} at sd {sd:.3f}" for sd, t, _ in leads) + ")."
        ), [x[2] for x in leads]))  # fmt: skip
    long_all = src.get("long_all")
    doses_in_one_line = long_all is not None and len(long_all["cells"]) > 1 and (
        len({(c["mc_samples"], c["learning_rate"]) for c in long_all["cells"]}) == 1
    )  # several doses at one K and learning rate
    if doses_in_one_line:
        out.append(("when", long_all_sentence(long_all), [long_all]))
    elif long_all is not None:
        for c in long_all["cells"]:
            objectives = c["summary"]["objectives"]
            seeds = objectives[REFERENCE]["seeds"] if REFERENCE in objectives else len(long_all["settings"]["seeds"])
            finals = ", ".join(f"{OBJECTIVE_NAMES.get(n, n)} {x['final']:.3f}" for n, x in objectives.items())
            out.append(("when", (
                f"Over {long_all['settings']['max_steps']} steps at sd {c['noise_sd']:.3f} (K = {c['mc_samples']}, "
                f"added sd {c['added_noise_std']:g}, lr {c['learning_rate']:g}, {seeds} seeds) the runs that "
                f"collapsed: {_collapsed_runs(c, seeds)}; mean final accuracy {finals}."
            ), [long_all]))  # fmt: skip
    low = src.get("long_low_lr")
    if low is not None and low["cells"]:
        out.append(("when", low_lr_sentence(low, src.get("long")), [low] + ([src["long"]] if src.get("long") else [])))
    main, controls2 = src.get("main"), src.get("controls2")
    if main and controls2 and "diffu_grpo" in controls2["comparisons"] and "stable_drl" in main["comparisons"]:
        t = controls2["comparisons"]["diffu_grpo"]["t_test"]
        sd = _noise_sd(controls2, "diffu_grpo")
        mine = main["comparisons"]["stable_drl"]["t_test"]
        if t["p"] < ALPHA and t["mean"] > mine["mean"] and sd is not None and _same_reference_runs(main, controls2):
            out.append(("when", (
                f"Where the ratio can be made noise-free, prefer that: d1's diffu-GRPO (one-step mean-field estimate, "
                f"shared masks: pure-noise sd {sd:.3f}) led the same GRPO runs by {t['mean']:.3f} (p = {t['p']:.3f}), "
                f"more than StableDRL's {mine['mean']:.3f} (the two were not tested against each other)."
            ), [main, controls2]))  # fmt: skip
    return out


def readings(src: dict) -> list[tuple[str, str, list[dict]]]:
    return (study_readings(src) + dose_readings(src) + length_reading(src) + length_train_reading(src)
            + recommendations(src))  # fmt: skip


HEADINGS = {
    "helps": "Where StableDRL helps at this scale",
    "not": "Where it does not",
    "when": "Which objective when",
}


def render(src: dict) -> str:
    """The block: the readings grouped by bucket, then the source JSONs with their commits."""
    found = readings(src)
    text = ""
    for bucket, heading in HEADINGS.items():
        lines = [f"- {sentence}" for b, sentence, _ in found if b == bucket]
        if lines:
            text += f"**{heading}.**\n\n" + "\n".join(lines) + "\n\n"
    sources = ", ".join(
        f"`docs/{SOURCES[k]}` (commit {str(src[k]['provenance'].get('commit'))[:10]})" for k in SOURCES if k in src
    )
    return text + f"Rendered by `python scripts/which_objective.py --write-readme` from {sources}.\n"


BRIEF_BLOCK = "which_objective_brief"


def render_brief(src: dict) -> str:
    """The README's short form: the "which objective when" readings alone, with the sources' commits."""
    lines = [f"- {sentence}" for b, sentence, _ in readings(src) if b == "when"]
    commits = ", ".join(f"`{SOURCES[k]}` ({str(src[k]['provenance'].get('commit'))[:10]})" for k in SOURCES if k in src)
    return "\n".join(lines) + f"\n\nRendered by `python scripts/which_objective.py --write-readme` from docs/ {commits}.\n"


def interpretation_sentences(docs_dir: str = results.DOCS) -> list[tuple[str, list[dict]]]:
    """(sentence, [the JSONs it is read from]) for every sentence of the block."""
    return [(sentence, sources) for _, sentence, sources in readings(load(docs_dir))]


def readme_blocks(docs_dir: str = results.DOCS) -> dict[str, str]:
    """{"which_objective": the full reading (docs/results.md), "which_objective_brief": its "which objective when"
    part (README.md)}, rendered from the JSONs in docs_dir ({} when none of them is there)."""
    src = load(docs_dir)
    return {BLOCK: render(src), BRIEF_BLOCK: render_brief(src)} if src else {}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs-dir", default=results.DOCS, help="folder of the study JSONs (default docs/)")
    p.add_argument("--write-readme", action="store_true", help="rewrite the which_objective block")
    p.add_argument("--readme-only", action="store_true", help="the same as --write-readme (nothing is run here)")
    p.add_argument("--page", default=None, help="page to write (default: the page holding the markers)")
    return p


def main(argv=None) -> dict[str, str]:
    args = make_parser().parse_args(argv)
    blocks = readme_blocks(args.docs_dir)
    if args.write_readme or args.readme_only:
        results.rewrite_readme_only(blocks, args.docs_dir, ", ".join(SOURCES.values()), readme=args.page)
    else:
        if not blocks:
            raise SystemExit(f"no study JSON ({', '.join(SOURCES.values())}) in {args.docs_dir}")
        print(blocks[BLOCK])
    return blocks


if __name__ == "__main__":
    main()
