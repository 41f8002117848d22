"""The protocol card: one JSON per evaluation with the score, its uncertainty and the full protocol.

    card = build_card(protocol, {112: records}, model="outputs/llada-gsm8k", runtime={...}, data=data_record)
    write_card("outputs/llada-gsm8k/eval_cards/stabledrl-gsm8k.json", card)
    update_model_card("outputs/llada-gsm8k")       # the README's results section, rendered from eval_cards/*.json

Score and uncertainty (`score_block`):
- accuracy (k right of n problems): the Wilson score interval at 95 % (`wilson_interval`), which stays inside
  [0, 1] and keeps its coverage near 0 and 1 where the normal interval does not;
- Sudoku's cell accuracy (right cells / empty cells, cells of one puzzle are not independent): the ratio estimator's
  interval with the puzzle as the unit (`ratio_interval`: delta-method standard error of sum(right) / sum(empty));
- several graded samples per prompt (evaluation during training, `eval_cards`): "accuracy_by_prompt" (records
  {"right", "samples"} per prompt: the ratio estimator's interval with the prompt as the unit) or, for a reward
  that is not 1 / 0, "mean_reward" (records {"reward"}: each prompt's mean; Student t interval over prompts);
- a protocol that samples is scored on every seed: the card holds each seed's score and interval, their mean, the
  standard deviation across seeds, and the interval of the mean over seeds (Student t).

The card also records the protocol (data id, revision, count, selection, a hash of the rows; the prompt template and
its sha256; the sampler settings; the grader; the seeds; the batch layout), the runtime (dtype, device, number of
processes, batch size actually used), package versions, the commit, the command, and every deviation from the preset.
Training's held-out evaluation writes the same card (`card_from_evaluation`).
"""

from __future__ import annotations

import glob
import math
import os

SCHEMA = "stabledrl_trl.protocol_card/1"
Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k / n:
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), p = k/n. (0, 1) for n = 0."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError(f"wilson_interval: k={k} must be in [0, n={n}].")
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def ratio_interval(numerators: list[float], denominators: list[float], z: float = Z95) -> tuple[float, float]:
    """Interval of R = sum(a) / sum(b) over n clusters (a_i right cells, b_i empty cells of puzzle i):
    R -+ z * sqrt(sum((a_i - R b_i)^2) / (n (n - 1))) / mean(b), clipped to [0, 1] (the delta method)."""
    n = len(numerators)
    total = sum(denominators)
    if n < 2 or total <= 0:
        return (0.0, 1.0)
    ratio = sum(numerators) / total
    residual = sum((a - ratio * b) ** 2 for a, b in zip(numerators, denominators))
    se = math.sqrt(residual / (n * (n - 1))) / (total / n)
    return (max(0.0, ratio - z * se), min(1.0, ratio + z * se))


def score_records(metric: str, records: list[dict]) -> dict:
    """{"value", "k", "n", "interval", "interval_method"} of one seed's records."""
    if metric == "cell_accuracy":
        right = [r["right_cells"] for r in records]
        empty = [r["empty_cells"] for r in records]
        total = sum(empty)
        return {
            "value": sum(right) / total if total else float("nan"),
            "k": sum(right),
            "n": total,
            "problems": len(records),
            "interval": list(ratio_interval(right, empty)),
            "interval_method": "ratio estimator over puzzles (delta method), 95%",
        }
    if metric == "accuracy_by_prompt":  # several graded samples per prompt: the prompt is the unit
        right = [r["right"] for r in records]
        samples = [r["samples"] for r in records]
        total = sum(samples)
        return {
            "value": sum(right) / total if total else float("nan"),
            "k": sum(right),
            "n": total,
            "problems": len(records),
            "interval": list(ratio_interval(right, samples)),
            "interval_method": "ratio estimator over prompts (delta method), 95%",
        }
    if metric == "mean_reward":  # a reward that is not 1 / 0: the mean over prompts of each prompt's mean
        from .results import mean_interval

        values = [float(r["reward"]) for r in records]
        return {
            "value": sum(values) / len(values) if values else float("nan"),
            "k": None,
            "n": len(values),
            "problems": len(values),
            "interval": list(mean_interval(values) or (float("nan"), float("nan"))),
            "interval_method": "Student t over prompts, 95%",
        }
    k = sum(bool(r["correct"]) for r in records)
    n = len(records)
    return {
        "value": k / n if n else float("nan"),
        "k": k,
        "n": n,
        "problems": n,
        "interval": list(wilson_interval(k, n)),
        "interval_method": "Wilson score, 95%",
    }


def score_block(metric: str, records_by_seed: dict) -> dict:
    """The card's "score": one seed's score, or every seed's with their mean, spread and interval of the mean."""
    from .results import mean_interval, mean_std

    per_seed = {str(seed): score_records(metric, records) for seed, records in records_by_seed.items()}
    if len(per_seed) == 1:
        return {"metric": metric, **next(iter(per_seed.values())), "seeds": list(per_seed)}
    values = [s["value"] for s in per_seed.values()]
    mean, std = mean_std(values)
    return {
        "metric": metric,
        "value": mean,
        "std_over_seeds": std,
        "interval": list(mean_interval(values) or (float("nan"), float("nan"))),
        "interval_method": "Student t over seeds, 95%",
        "per_seed": per_seed,
        "seeds": list(per_seed),
    }


def build_card(
    protocol,
    records_by_seed: dict,
    *,
    model: str,
    runtime: dict,
    data: dict | None = None,
    deviations: list | None = None,
    script: str | None = None,
    argv: list | None = None,
) -> dict:
    """A protocol card (see the module docstring). records_by_seed: {seed: records of every row, row order}.
    runtime: {"dtype", "device", "num_processes", "batch_size", ...} as run; deviations: more deviations (data)."""
    from .results import provenance

    info = provenance(script or "scripts/evaluate.py", argv)
    protocol_dict = protocol.to_dict()
    all_deviations = list(protocol_dict.pop("deviations")) + list(deviations or [])
    for key, protocol_value in (("num_processes", protocol.num_processes), ("dtype", protocol.dtype)):
        used = runtime.get(key)
        if used is not None and used != protocol_value:
            all_deviations.append(
                {
                    "field": f"runtime.{key}",
                    "protocol": protocol_value,
                    "used": used,
                    "note": "batch layout only: results are unchanged at temperature 0"
                    if key == "num_processes"
                    else "",
                }
            )
    return {
        "schema": SCHEMA,
        "model": model,
        "protocol_name": protocol.name,
        "task": protocol.task,
        "score": score_block(protocol.metric, records_by_seed),
        "protocol": protocol_dict,
        "data": data or {},
        "runtime": runtime,
        "deviations": all_deviations,
        "commit": info["commit"],
        "dirty": info["dirty"],
        "command": info["command"],
        "versions": info["versions"],
    }


def write_card(path: str, card: dict) -> str:
    from .results import write_json

    write_json(path, card)
    return path


def read_cards(paths) -> list[dict]:
    """Cards from files (a folder: its *.json); files that are not protocol cards are refused, naming them."""
    from .results import read_json

    if isinstance(paths, str):
        paths = sorted(glob.glob(os.path.join(paths, "*.json"))) if os.path.isdir(paths) else [paths]
    cards = []
    for path in paths:
        card = read_json(path)
        if card.get("schema") != SCHEMA:
            raise ValueError(f"{path!r} is not a protocol card (schema {card.get('schema')!r}, expected {SCHEMA!r}).")
        cards.append(card)
    return cards


def _percent(value) -> str:
    return "n/a" if value is None or value != value else f"{100 * value:.1f}"


def results_table(cards: list[dict]) -> str:
    """A markdown table of cards: task, protocol, score with its interval, n, seeds, deviations, commit."""
    from .results import markdown_table

    rows = []
    for card in cards:
        score = card["score"]
        low, high = score["interval"]
        protocol = card["protocol"]
        length = protocol.get("gen_length") or protocol["sampler"].get("max_completion_length")
        deviations = card.get("deviations") or []
        rows.append(
            [
                card["task"],
                f"{card['protocol_name']} (length {length})",
                score["metric"].replace("_", " "),
                f"{score['value']:.4f} [{low:.4f}, {high:.4f}] (mean reward)"
                if score["metric"] == "mean_reward"
                else f"{_percent(score['value'])} [{_percent(low)}, {_percent(high)}]",
                score.get("n", sum(s["n"] for s in score.get("per_seed", {}).values())),
                ", ".join(score["seeds"]),
                "; ".join(f"{d['field']}: {d['protocol']} -> {d['used']}" for d in deviations) or "none",
                (card.get("commit") or "unknown")[:10] + (" (dirty)" if card.get("dirty") else ""),
            ]
        )
    header = ["task", "protocol", "metric", "score % [95% interval]", "n", "seeds", "deviations", "commit"]
    return markdown_table(header, rows)


RESULTS_MARKER = "protocol_results"


def render_results_section(cards: list[dict]) -> str:
    """The model card's results section: the table and one line per card naming its protocol's source."""
    lines = [results_table(cards), ""]
    for card in cards:
        protocol = card["protocol"]
        lines.append(
            f"- {card['task']} / {card['protocol_name']}: {protocol['source']}; prompt sha256 "
            f"{protocol['prompt']['sha256'][:12]}, data {card['data'].get('path', protocol['data']['path'])} "
            f"({card['score'].get('problems', card['score'].get('n'))} problems)."
        )
    lines.append("")
    lines.append("Rendered from the protocol cards in `eval_cards/` (`stabledrl_trl.protocol_card`), never typed.")
    return "\n".join(lines) + "\n"


def update_model_card(model_dir: str, cards_dir: str | None = None) -> str:
    """Write the results section of `model_dir/README.md` from the cards in `cards_dir` (default
    `model_dir/eval_cards`), between `<!-- protocol_results:start/end -->` markers (added under an
    "## Evaluation results" heading when absent). Returns the README path."""
    from .results import replace_block

    cards_dir = cards_dir or os.path.join(model_dir, "eval_cards")
    cards = read_cards(cards_dir)
    if not cards:
        raise ValueError(f"no protocol cards in {cards_dir!r}; evaluate with --protocol first.")
    readme = os.path.join(model_dir, "README.md")
    text = open(readme, encoding="utf-8").read() if os.path.exists(readme) else ""
    start, end = f"<!-- {RESULTS_MARKER}:start -->", f"<!-- {RESULTS_MARKER}:end -->"
    if start not in text:
        text = text.rstrip("\n") + f"\n\n## Evaluation results\n\n{start}\n{end}\n"
    text = replace_block(text, RESULTS_MARKER, render_results_section(cards))
    with open(readme, "w", encoding="utf-8") as f:
        f.write(text)
    return readme


def _heldout_records(result: dict) -> dict:
    """{seed: [{"correct": bool}, ...]} of a held-out result: per-row grades (`evaluate_model`), or per-draw counts
    (`evaluate_draws`: accuracy x n right of n, which must be whole numbers: 1 / 0 correctness rewards)."""
    if "records" in result:
        records = result["records"]
        if result.get("full_score") is not None:
            graded = [{"correct": bool(r["correct"])} for r in records if r.get("correct") is not None]
        else:
            rewards = [r["reward"] for r in records if r["reward"] is not None]
            if any(reward not in (0.0, 1.0) for reward in rewards):
                raise ValueError("a protocol card scores right / wrong answers; this reward is not 1 / 0.")
            graded = [{"correct": reward == 1.0} for reward in rewards]
        return {result.get("seed", 0): graded}
    out = {}
    for seed, accuracy in zip(result["seeds"], result["draws"]):
        right = accuracy * result["n"]
        if abs(right - round(right)) > 1e-6:
            raise ValueError("a protocol card scores right / wrong answers; this draw's accuracy is not k / n.")
        k = int(round(right))
        out[seed] = [{"correct": True}] * k + [{"correct": False}] * (result["n"] - k)
    return out


def card_from_evaluation(
    result: dict,
    *,
    model: str,
    task: str,
    settings,
    runtime: dict,
    label: str,
    data: dict | None = None,
    script: str | None = None,
    argv: list | None = None,
) -> dict:
    """The card of training's held-out evaluation (an `evaluation.evaluate_model` or `evaluate_draws` result, with
    "seed" set for the former): the same schema, protocol "training_heldout" (the task's own prompt and grading,
    the training run's sampler settings); several draws are several seeds."""
    from .protocols import DataSpec, PromptSpec, Protocol

    records_by_seed = _heldout_records(result)
    n = len(next(iter(records_by_seed.values())))
    protocol = Protocol(
        name="training_heldout",
        task=task,
        source=f"stabledrl_trl.evaluation ({label}), grading {result['grading']}: {result['grading_rule']}",
        data=DataSpec(path=(data or {}).get("path") or task, split=(data or {}).get("split") or "test", count=n),
        prompt=PromptSpec(question_template="{prompt}", chat_template=True, add_special_tokens=False),
        sampler=settings.to_dict() if hasattr(settings, "to_dict") else dict(settings),
        grader=result["grading"],
        metric="accuracy",
        decode="completion",
        seeds=tuple(records_by_seed),
        batch_size=int(runtime.get("batch_size") or 0),
        num_processes=int(runtime.get("num_processes") or 1),
        dtype=str(runtime.get("dtype", "float32")),
    )
    card = build_card(protocol, records_by_seed, model=model, runtime=runtime, data=data, script=script, argv=argv)
    card["label"] = label
    if result.get("greedy") is not None:
        card["score"]["greedy"] = result["greedy"]
    return card


def write_heldout_cards(
    output_dir: str, results: dict, *, task: str, settings, seed: int, runtime: dict, data: dict | None = None
) -> list[str]:
    """Training's held-out accuracy as protocol cards: `output_dir/eval_cards/training_heldout-<task>-<label>.json`
    per result ({"before": ..., "after": ...}), then the results section of `output_dir/README.md` (the model card)
    rendered from them. Returns the card paths."""
    paths = []
    for label, result in results.items():
        result = dict(result)
        result.setdefault("seed", seed)
        card = card_from_evaluation(
            result,
            model=output_dir,
            task=task,
            settings=settings,
            runtime=runtime,
            label=f"{label} RL",
            data=data,
            script="scripts/train.py",
        )
        paths.append(write_card(os.path.join(output_dir, "eval_cards", f"training_heldout-{task}-{label}.json"), card))
    if paths:
        update_model_card(output_dir)
    return paths
