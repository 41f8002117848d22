"""How fast the code sandbox grades programs: throughput per worker count, and its cost per program.

    python scripts/bench_code_reward.py --write-readme          # writes docs/bench_code_reward.json, docs/code.md

Programs: `--programs` small fixed MBPP-style programs written here (a function and three asserts, all passing),
graded as `mbpp_reward` grades (program, then one check per assert).
- Throughput: programs graded per second by `CodeSandbox.run_many` with 1, 2 and all (os.cpu_count()) workers,
  in both sandbox modes (`zygote`, the default: a long-lived sandbox per worker forking a child per program;
  `per_program`: a new sandbox per program); the median of `--repeats` runs.
- Cost per program, one at a time (median over `--programs` programs, the ways below taking turns on each
  program): the bwrap sandbox in both modes (the zygote started beforehand, by the start-up check, as in
  training); the unsafe local runner (the
  same harness and limits, no isolation); and two ways peers run programs without a sandbox: a bare
  `python -I -S -c PROGRAM` subprocess and `python3 -c PROGRAM` with `site` (Block-R1's `subprocess.run`). The
  sandbox's cost is its time minus the bare subprocess's.
- The reward's share of a training step: `--step-share-steps` RL steps of configs/tiny_code.yaml (its SFT warm-up
  cached first, not counted) with the reward function timed, against TRL's train_runtime; in zygote mode with the
  training script's default verdict cache (`code_verdict_cache_mb`) and without it, and in per_program mode.
The numbers depend on the machine's load: the JSON records the CPU count and the load average at the start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stabledrl_trl import results  # noqa: E402

JSON_NAME = "bench_code_reward.json"
MODES = ("zygote", "per_program")  # SandboxSettings.mode


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=48, help="programs per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="throughput runs per worker count (median)")
    parser.add_argument("--out", default=os.path.join(results.DOCS, JSON_NAME))
    parser.add_argument("--write-readme", action="store_true", help="render the tables into docs/code.md")
    parser.add_argument(
        "--readme-only", action="store_true", help="measure nothing: re-render the tables from the JSON"
    )
    parser.add_argument("--docs-dir", default=results.DOCS, help="folder of the committed JSON (--readme-only)")
    parser.add_argument("--step-share-steps", type=int, default=50,
                        help="RL steps of configs/tiny_code.yaml timed for the reward's share (0: skip)")  # fmt: skip
    parser.add_argument("--step-share-dir", default=os.path.join("outputs", "bench-code-step-share"))
    return parser


def programs(n: int) -> list[tuple[str, list[str]]]:
    """n (program, asserts) pairs, each a different small function with three passing asserts."""
    out = []
    for i in range(n):
        program = f"def scale_{i}(xs, k={i % 7 + 1}):\n    return [x * k + {i} for x in xs]\n"
        k = i % 7 + 1
        asserts = [f"assert scale_{i}([{a}]) == [{a * k + i}]" for a in (0, 1, 5)]
        out.append((program, asserts))
    return out


def measure(n_programs: int, repeats: int) -> dict:
    from stabledrl_trl.sandbox import CodeJob, CodeSandbox, SandboxSettings

    pairs = programs(n_programs)
    jobs = [CodeJob(program=p, checks=tuple(a)) for p, a in pairs]
    cpus = os.cpu_count() or 1
    throughput = []
    for mode in MODES:
        for workers in sorted({1, 2, cpus}):
            with CodeSandbox(SandboxSettings(num_workers=workers, mode=mode)) as box:
                rates = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    verdicts = box.run_many(jobs)
                    rates.append(len(jobs) / (time.perf_counter() - start))
                    if not all(v.passed for v in verdicts):
                        raise RuntimeError("a benchmark program failed in the sandbox: the measurement is not valid")
            throughput.append({"mode": mode, "workers": workers, "programs_per_s": statistics.median(rates),
                               "runs": rates})  # fmt: skip

    # One program at a time, the ways of running it taking turns on each program (a change of the machine's load
    # then reaches every way alike).
    sources = [p + "\n" + "\n".join(a) + "\n" for p, a in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        boxes = {f"bwrap_{mode}": CodeSandbox(SandboxSettings(num_workers=1, mode=mode)) for mode in MODES}
        boxes["unsafe_local"] = CodeSandbox(SandboxSettings(num_workers=1, backend="unsafe_local"))
    ways = {name: (lambda i, box=box: box.run(jobs[i])) for name, box in boxes.items()}
    ways["bare_subprocess"] = lambda i: subprocess.run([sys.executable, "-I", "-S", "-c", sources[i]], check=True,
                                                       capture_output=True)  # fmt: skip
    ways["bare_subprocess_with_site"] = lambda i: subprocess.run([sys.executable, "-c", sources[i]], check=True,
                                                                 capture_output=True)  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(len(jobs)):
        for name, way in ways.items():
            start = time.perf_counter()
            result = way(i)
            times[name].append(time.perf_counter() - start)
            if name in boxes and not result.passed:
                raise RuntimeError("a benchmark program failed in the sandbox: the measurement is not valid")
    for box in boxes.values():
        box.close()
    per_program = {name: statistics.median(values) for name, values in times.items()}
    return {
        "programs": n_programs,
        "repeats": repeats,
        "cpu_count": cpus,
        "throughput": throughput,
        "per_program_s": per_program,
        "sandbox_overhead_s": {mode: per_program[f"bwrap_{mode}"] - per_program["bare_subprocess"] for mode in MODES},
    }


def step_share(steps: int, output_dir: str, mode: str, cache_mb: int) -> dict:
    """Train configs/tiny_code.yaml for `steps` RL steps (no evaluation) with the reward timed, the sandbox in
    `mode` and a verdict cache of `cache_mb` MiB (0: off): its share of the training time. The SFT warm-up (cached)
    is not counted."""
    import dataclasses
    import functools

    from stabledrl_trl import tasks

    spend = {"seconds": 0.0, "calls": 0, "completions": 0}
    spec = tasks.TASKS["tiny_code"]
    inner = spec.reward_funcs[0]

    @functools.wraps(inner)
    def timed(prompts, completions, **kwargs):
        start = time.perf_counter()
        try:
            return inner(prompts, completions, **kwargs)
        finally:
            spend["seconds"] += time.perf_counter() - start
            spend["calls"] += 1
            spend["completions"] += len(completions)

    tasks.TASKS["tiny_code"] = dataclasses.replace(spec, reward_funcs=(timed,))
    try:
        train = _train_script()
        config = os.path.join(results.REPO_ROOT, "configs", "tiny_code.yaml")
        argv = ["--config", config, "--max_steps", str(steps), "--evaluate_before_after", "false",
                "--output_dir", output_dir, "--logging_steps", str(steps), "--code_sandbox_mode", mode,
                "--code_verdict_cache_mb", str(cache_mb)]  # fmt: skip
        from stabledrl_trl.tasks.code import code_sandbox

        trainer, _ = train.main(argv=argv)
        train_seconds = trainer.state.log_history[-1]["train_runtime"]
        cache = code_sandbox().cache
        hits, lookups = (cache.hits, cache.hits + cache.misses) if cache is not None else (0, 0)
    finally:
        tasks.TASKS["tiny_code"] = spec
    return {"mode": mode, "verdict_cache_mb": cache_mb, "steps": steps, "train_seconds": train_seconds,
            "reward_seconds": spend["seconds"], "reward_calls": spend["calls"], "completions": spend["completions"],
            "cache_hits": hits, "cache_lookups": lookups, "share": spend["seconds"] / train_seconds}  # fmt: skip


def _train_script():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train

    return train


def readme_blocks(docs_dir: str) -> dict[str, str]:
    """The docs/code.md tables, rendered from the committed JSON alone."""
    path = os.path.join(docs_dir, JSON_NAME)
    if not os.path.exists(path):
        return {}
    data = results.read_json(path)
    mode_names = {"zygote": "zygote (default)", "per_program": "per_program"}
    rows = [[mode_names[t["mode"]], t["workers"], f"{t['programs_per_s']:.1f}"] for t in data["throughput"]]
    table = results.markdown_table(["sandbox mode", "workers", "programs graded / s"], rows)
    names = {
        "bwrap_zygote": "bwrap sandbox, zygote mode (the default): a forked child per program",
        "bwrap_per_program": "bwrap sandbox, per_program mode: a new sandbox per program",
        "unsafe_local": "unsafe_local (same harness and limits, no isolation)",
        "bare_subprocess": "bare `python -I -S -c` subprocess, no sandbox",
        "bare_subprocess_with_site": "bare `python3 -c` subprocess (Block-R1's way)",
    }
    cost_rows = [[names[k], f"{v * 1000:.1f}"] for k, v in data["per_program_s"].items()]
    cost = results.markdown_table(["how the program runs", "ms per program (median, one at a time)"], cost_rows)
    m = data["machine"]
    overhead = data["sandbox_overhead_s"]
    text = (
        f"{data['programs']} small programs (a function and three asserts), graded as `mbpp_reward` grades them, "
        f"on {data['cpu_count']} CPUs (load average {m['load_average']:.1f} at the start: shared with other jobs).\n\n"
        + table
        + "\n"
        + cost
        + f"\nOver a bare subprocess, the sandbox adds {overhead['zygote'] * 1000:.1f} ms per program in zygote mode "
        f"(a forked child costs less than a new interpreter, so this can be negative) and "
        f"{overhead['per_program'] * 1000:.1f} ms in per_program mode.\n"
    )
    for share in data.get("step_share") or []:
        cache = share.get("verdict_cache_mb", 0)
        if cache:
            lookups = share["cache_lookups"]
            rate = f", {100 * share['cache_hits'] / lookups:.0f}% of the lookups hits" if lookups else ""
            cache_text = f"verdict cache {cache} MiB (the training default){rate}"
        else:
            cache_text = "no verdict cache (`code_verdict_cache_mb: 0`)"
        text += (
            f"On `configs/tiny_code.yaml` ({share['steps']} RL steps, {share['completions'] // share['reward_calls']} "
            f"completions a step), {share['mode']} mode, {cache_text}: grading took {share['reward_seconds']:.1f} s "
            f"of {share['train_seconds']:.1f} s of training, {100 * share['share']:.0f}% of a step.\n"
        )
    # the goal is judged on the training default: zygote mode with the verdict cache on
    shares = {share["mode"]: share["share"] for share in data.get("step_share") or []
              if share.get("verdict_cache_mb", 0) == (data.get("default_verdict_cache_mb") or 0)}  # fmt: skip
    verdict = {True: "met", False: "not met"}
    text += (
        f"Speed goals, in this run: the sandbox adds under 50 ms per program: "
        f"{verdict[overhead['zygote'] < 0.05]} in zygote mode, {verdict[overhead['per_program'] < 0.05]} in "
        "per_program mode"
    )
    if "zygote" in shares:
        text += f"; grading under 10% of a tiny_code step: {verdict[shares['zygote'] < 0.10]} in zygote mode"
    text += ".\n"
    text += results.provenance_line(data)
    return {"code-bench": text}


def main(argv=None):
    args = make_parser().parse_args(argv)
    if args.readme_only:
        blocks = readme_blocks(args.docs_dir)
        results.rewrite_readme_only(blocks, args.docs_dir, JSON_NAME)
        return blocks
    load = os.getloadavg()[0]
    data = measure(args.programs, args.repeats)
    data["machine"] = {"load_average": load, "platform": sys.platform}
    if args.step_share_steps > 0:
        train = _train_script()
        default_cache = train.TrainScriptArguments.__dataclass_fields__["code_verdict_cache_mb"].default
        data["default_verdict_cache_mb"] = default_cache
        runs = [("zygote", default_cache), ("zygote", 0), ("per_program", default_cache)]
        data["step_share"] = [step_share(args.step_share_steps, args.step_share_dir, mode, cache)
                              for mode, cache in runs]  # fmt: skip
    data["provenance"] = results.provenance("scripts/bench_code_reward.py", argv if argv is not None else sys.argv[1:])
    results.write_json(args.out, data)
    print(readme_blocks(os.path.dirname(os.path.abspath(args.out))).get("code-bench", ""))
    if args.write_readme:
        results.write_readme_blocks(readme_blocks(os.path.dirname(os.path.abspath(args.out))))


if __name__ == "__main__":
    main()
