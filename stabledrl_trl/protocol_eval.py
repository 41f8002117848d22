"""Run a `protocols.Protocol`: batched decoding, the protocol's grader, a resumable results file, data parallel.

    rows, data = load_protocol_rows(protocol, data_file)
    run = run_protocol(model, tokenizer, protocol, rows, results_file="eval/gsm8k.jsonl")
    card = build_card(protocol, run["records"], ...)          # stabledrl_trl.protocol_card

- Batching: prompts are rendered as the official code renders them, tokenized with its `add_special_tokens`,
  left-padded (padding hidden from attention: at temperature 0 a row's completion does not depend on its batch),
  and decoded `protocol.batch_size` at a time with the model family's sampler under `protocol.sampler`.
- Grading: `GRADERS[protocol.grader]` reads the text `protocol.decode` names and the row; it returns
  {"correct": bool} (accuracy) or {"right_cells", "empty_cells"} (Sudoku's cell accuracy). The code benchmarks
  (`BATCH_GRADERS`) grade a batch at once: its programs run in parallel in the code sandbox.
- Resumable: every finished batch is appended to the results file (JSON lines, the first line the protocol's hash);
  a rerun with the same protocol and seed skips the rows already there. A file written under another protocol is
  refused, never mixed in.
- Data parallel: process `rank` of `world_size` takes rows rank, rank + world_size, ... (the official samplers'
  interleaving) and writes its own shard `<results_file>.rank<r>-of-<w>`; `collect_records` merges the shards in
  row order. At temperature 0 the merged records equal one process's (tested); when the protocol samples, each
  batch draws from a generator seeded by (seed, the batch's first row), so draws depend on the batch layout, which
  the card records.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import torch

from .protocols import Protocol, question_fields, render_prompt

# ----------------------------------------------------------------------------------------------------------------
# graders: (text, row, protocol) -> {"correct": bool} or {"right_cells": int, "empty_cells": int}


def _math_verify(text: str, gold: str) -> dict:
    from .tasks.math import official_math_score

    return {"correct": official_math_score(text, gold) >= 1.0}


def _grade_math_verify_gsm8k(text, row, protocol):
    from .tasks.gsm8k import gsm8k_gold

    return _math_verify(text, gsm8k_gold(str(row["answer"])))


def _grade_math_verify_solution(text, row, protocol):
    return _math_verify(text, str(row["solution"]))


def _grade_d1_gsm8k(text, row, protocol, spg=False):
    from .protocol_grading import d1_gsm8k_answer, d1_gsm8k_gold

    gold = d1_gsm8k_gold(str(row["answer"]))
    answer = d1_gsm8k_answer(text, spg_fallback=spg)
    return {"correct": answer is not None and answer == gold, "answer": answer, "gold": gold}


def _grade_d1_math(text, row, protocol):
    from .protocol_grading import d1_math_answer, hendrycks_is_equiv

    answer = d1_math_answer(text)
    return {"correct": answer is not None and hendrycks_is_equiv(answer, str(row["answer"])), "answer": answer}


def _grade_d1_countdown(text, row, protocol):
    from .protocol_grading import d1_countdown_correct

    fields = question_fields("countdown", row)
    return {"correct": d1_countdown_correct(text, fields["numbers"], fields["target"])}


def _grade_code(task):
    def grader(text, row, protocol):
        from .protocol_code import grade_code_batch

        return grade_code_batch(task, [text], [row])[0]

    return grader


def _grade_d1_sudoku(text, row, protocol):
    from .protocol_grading import d1_sudoku_cells

    puzzle = str(row.get("puzzle", row.get("Puzzle")))
    solution = str(row.get("solution", row.get("Solution")))
    right, empty = d1_sudoku_cells(text, puzzle, solution)
    return {"right_cells": right, "empty_cells": empty}


GRADERS = {
    "math_verify_gsm8k": _grade_math_verify_gsm8k,
    "math_verify_solution": _grade_math_verify_solution,
    "d1_gsm8k": _grade_d1_gsm8k,
    "spg_gsm8k": lambda text, row, protocol: _grade_d1_gsm8k(text, row, protocol, spg=True),
    "d1_math": _grade_d1_math,
    "d1_countdown": _grade_d1_countdown,
    "d1_sudoku": _grade_d1_sudoku,
    "stabledrl_humaneval": _grade_code("humaneval"),
    "stabledrl_mbpp": _grade_code("mbpp"),
}
# graders that grade a whole batch at once (the code benchmarks: every program of a batch runs in parallel)
BATCH_GRADERS = {"stabledrl_humaneval": "humaneval", "stabledrl_mbpp": "mbpp"}


def grade(protocol: Protocol, text: str, row: dict) -> dict:
    """The protocol's grade of one graded text."""
    return GRADERS[protocol.grader](text, row, protocol)


def grade_many(protocol: Protocol, texts: list[str], rows: list[dict]) -> list[dict]:
    """The protocol's grades of several graded texts (the code benchmarks run their programs in parallel)."""
    if protocol.grader in BATCH_GRADERS:
        from .protocol_code import grade_code_batch

        return grade_code_batch(BATCH_GRADERS[protocol.grader], texts, rows)
    return [grade(protocol, text, row) for text, row in zip(texts, rows)]


# ----------------------------------------------------------------------------------------------------------------
# results file


def protocol_key(protocol: Protocol, seed: int) -> str:
    """sha256 of the protocol (every field, deviations included) and the seed: what a results file belongs to."""
    payload = json.dumps({"protocol": protocol.to_dict(), "seed": seed}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def shard_path(results_file: str, rank: int, world_size: int) -> str:
    return results_file if world_size == 1 else f"{results_file}.rank{rank}-of-{world_size}"


def read_results(path: str, key: str) -> dict[int, dict]:
    """{row index: record} of a results file written for `key` ({} when it does not exist). A file of another
    protocol or seed is refused; a last line cut by an interruption is dropped."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if not lines or not lines[0].strip():
        return {}
    header = json.loads(lines[0])
    if header.get("protocol_key") != key:
        raise ValueError(
            f"results file {path!r} was written by another protocol or seed (key {header.get('protocol_key')!r:.20}, "
            f"this run {key!r:.20}); remove it or choose another --results_file."
        )
    records = {}
    for line in lines[1:]:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # the line being written when the run was interrupted
            continue
        records[int(record["index"])] = record
    return records


def _append(path: str, key: str, records: list[dict]) -> None:
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        if new:
            f.write(json.dumps({"protocol_key": key}) + "\n")
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def collect_records(results_file: str, protocol: Protocol, seed: int, num_rows: int, world_size: int = 1) -> list:
    """Every row's record, in row order, from the shards of `world_size` processes; an error names missing rows."""
    key = protocol_key(protocol, seed)
    merged = {}
    for rank in range(world_size):
        merged.update(read_results(shard_path(results_file, rank, world_size), key))
    missing = [i for i in range(num_rows) if i not in merged]
    if missing:
        raise ValueError(
            f"results of {len(missing)} row(s) are missing (first: {missing[:5]}); rerun the evaluation with the same "
            "--results_file to finish it."
        )
    return [merged[i] for i in range(num_rows)]


# ----------------------------------------------------------------------------------------------------------------
# decoding


def _decode(tokenizer, protocol: Protocol, prompt_ids: list[int], canvas: list[int]) -> str:
    if protocol.decode == "canvas":
        return tokenizer.decode(canvas, skip_special_tokens=True)
    if protocol.decode == "canvas_with_special_tokens":
        return tokenizer.decode(canvas, skip_special_tokens=False)
    if protocol.decode == "prompt_and_canvas":
        return tokenizer.decode(list(prompt_ids) + list(canvas), skip_special_tokens=True)
    raise ValueError(f"unknown decode {protocol.decode!r}")


def settings_of(protocol: Protocol):
    """The protocol's `SamplerSettings` (checked by training's own validation)."""
    from .diffusion.sampler_settings import SamplerSettings

    return SamplerSettings.from_fields(**protocol.sampler)


def refuse_own_sampler_family(protocol: Protocol, family) -> None:
    """The presets reproduce evaluations of LLaDA-8B-Instruct with LLaDA's sampler. A family that decodes with a
    sampler of its own (block diffusion: SDAR / TraDo, LLaDA2; DiffusionGemma) cannot use it, and no official code
    the presets follow (StableDRL, d1, SPG) evaluates such a model: refused, naming what scores it instead."""
    if family.default_sampler is not None or protocol.sampler.get("diffusion_sampler") != "llada":
        return
    raise ValueError(
        f"protocol {protocol.name!r} reproduces an evaluation of LLaDA-8B-Instruct decoded with LLaDA's sampler, "
        f"which {family.name} models cannot use (they decode with a sampler of their own). The official code the "
        "presets follow (StableDRL, d1, SPG) publishes no evaluation of block-diffusion or uniform-noise models "
        "(SDAR / TraDo, LLaDA2, DiffusionGemma), so no preset reproduces one. Score this model with "
        f"`scripts/evaluate.py --task {protocol.task}` without --protocol (its own sampler, the task's grading) or "
        "through lm-eval (docs/evaluation.md#lm-evaluation-harness)."
    )


@torch.no_grad()
def run_protocol(
    model,
    tokenizer,
    protocol: Protocol,
    rows: list[dict],
    *,
    seed: int | None = None,
    results_file: str | None = None,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
) -> dict:
    """Decode and grade this process's share of `rows`; returns {"records" (this process's, row order), "seconds",
    "new_rows" (decoded in this call), "resumed_rows" (read back from the results file)}.

    seed: the seed of this run (default: the protocol's first). results_file: the JSON-lines file (this process's
    shard when world_size > 1) appended after every batch and read back on a rerun.
    """
    from tqdm.auto import tqdm

    from .diffusion.adapter import DiffusionAdapter, as_diffusion_lm
    from .diffusion.family import get_family
    from .evaluation import left_pad

    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size}).")
    seed = protocol.seeds[0] if seed is None else int(seed)
    adapter = model if isinstance(model, DiffusionAdapter) else as_diffusion_lm(model, tokenizer)
    family = get_family(adapter.family)
    refuse_own_sampler_family(protocol, family)  # before the settings' checks: the reason, not a symptom
    settings = settings_of(protocol)
    family.check_rollout_settings(settings, adapter)
    key = protocol_key(protocol, seed)
    path = None if results_file is None else shard_path(results_file, rank, world_size)
    done = read_results(path, key) if path else {}
    mine = list(range(rank, len(rows), world_size))
    todo = [i for i in mine if i not in done]
    try:
        device = next(adapter.model.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")
    module = adapter.model if isinstance(adapter.model, torch.nn.Module) else None
    was_training = module.training if module is not None else False
    if module is not None:
        module.eval()
    start = time.perf_counter()
    bar = tqdm(
        total=len(mine),
        initial=len(mine) - len(todo),
        desc=f"{protocol.name}/{protocol.task}",
        unit="problem",
        disable=not progress or rank != 0,
        dynamic_ncols=True,
    )
    new = {}
    try:
        for offset in range(0, len(todo), protocol.batch_size):
            batch = todo[offset : offset + protocol.batch_size]
            texts = [render_prompt(protocol, rows[i], tokenizer) for i in batch]
            ids = [tokenizer(t, add_special_tokens=protocol.prompt.add_special_tokens)["input_ids"] for t in texts]
            prompt_ids, prompt_mask = left_pad(ids, adapter.pad_token_id)  # (B, P), (B, P)
            generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + batch[0])
            out = family.generate(
                adapter,
                prompt_ids.to(device),
                prompt_mask.to(device),
                settings,
                eos_token_ids=adapter.eos_token_ids,
                generator=generator,
            )
            canvases = out.completion_ids.cpu().tolist()  # (B, C): the whole canvas (reward_text "canvas")
            graded = [_decode(tokenizer, protocol, row_ids, canvas) for row_ids, canvas in zip(ids, canvases)]
            grades = grade_many(protocol, graded, [rows[i] for i in batch])
            records = []
            for index, prompt_text, text, row_grade in zip(batch, texts, graded, grades):
                record = {"index": index, "seed": seed, "prompt": prompt_text, "graded_text": text, **row_grade}
                records.append(record)
                new[index] = record
            if path:
                _append(path, key, records)
            bar.update(len(batch))
    finally:
        bar.close()
        if module is not None and was_training:
            module.train()
    merged = {**done, **new}
    return {
        "records": [merged[i] for i in mine],
        "seconds": time.perf_counter() - start,
        "new_rows": len(new),
        "resumed_rows": len(mine) - len(todo),
    }
