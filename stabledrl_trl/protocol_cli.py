"""`scripts/evaluate.py --protocol <name> --task <task>`: evaluate with a preset and write its protocol card.

    python scripts/evaluate.py --model_name_or_path outputs/llada-gsm8k --protocol stabledrl --task gsm8k
    python scripts/evaluate.py --model_name_or_path GSAI-ML/LLaDA-8B-Instruct --protocol d1 --task countdown \
        --protocol_length 512 --data_files countdown_cd3_test.jsonl
    accelerate launch --num_processes 8 scripts/evaluate.py --model_name_or_path ... --protocol d1 --task gsm8k

What the flags do under a protocol:
- the sampler flags (--gen_length, --steps, --block_length, --temperature, ...), --batch_size, --seed, --dtype,
  --split, --limit (the first N rows of the preset's order), --dataset_path / --data_files (a local copy of a hub
  set): anything that differs from the preset is a deviation, listed on the card; --protocol_length (d1 / spg: one
  of their reported lengths) picks a variant of the preset and is not a deviation;
- --prompt_style, --reward_style, --system_prompt, --training_config, --num_samples and --dataset_seed are refused:
  the protocol fixes the prompt, the grading and the rows (use --limit for a quick look);
- data parallel: under `accelerate launch` / torchrun each process decodes rows rank, rank + world, ... into its own
  shard of --results_file; the main process merges them and writes the card (equal to one process at temperature 0).
- resumable: rerun the same command after an interruption; finished rows are read back from --results_file.
- code benchmarks (humaneval, mbpp): the code sandbox is started and checked before the model loads; the card's
  runtime.sandbox records its backend, mode, time limit and workers.
"""

from __future__ import annotations

import os

from .protocol_code import CODE_TASKS

REFUSED_UNDER_PROTOCOL = ("prompt_style", "reward_style", "system_prompt", "training_config", "num_samples")
PROTOCOL_ONLY = ("protocol_length", "draws", "limit", "results_file", "card_file")


def refuse_protocol_only_flags(args) -> None:
    """Without --protocol, the protocol flags have nothing to act on: refused, not ignored."""
    given = [flag for flag in PROTOCOL_ONLY if getattr(args, flag, None) is not None]
    if getattr(args, "update_model_card", False):
        given.append("update_model_card")
    if given:
        raise ValueError(
            f"{', '.join('--' + f for f in given)} apply only with --protocol; add --protocol stabledrl|d1|spg or "
            "drop "
            "them."
        )


def sampler_overrides(args) -> dict:
    """{SamplerSettings field: value} of the sampler flags given on the command line (renamed flags mapped)."""
    from .diffusion.sampler_settings import SamplerSettings

    renamed = {"max_completion_length": "gen_length", "diffusion_steps": "steps", "diffusion_sampler": "sampler"}
    out = {}
    for name in SamplerSettings.field_names():
        value = getattr(args, renamed.get(name, name), None)
        if value is not None:
            out[name] = value
    return out


def _default_card_path(args, protocol) -> str:
    name = f"{protocol.name}-{protocol.task}" + (f"-{protocol.gen_length}" if protocol.gen_length else "") + ".json"
    folder = args.model_name_or_path if args.model_name_or_path and os.path.isdir(args.model_name_or_path) else "."
    return os.path.join(folder, "eval_cards", name)


def _distributed():
    """(rank, world size, device or None, wait function): accelerate's state when launched with several processes."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, None, lambda: None
    import torch
    from accelerate import PartialState

    state = PartialState(cpu=not torch.cuda.is_available())  # gloo on a CPU-only machine
    if state.num_processes != world:
        raise RuntimeError(
            f"WORLD_SIZE={world} but accelerate runs {state.num_processes} process(es): each would evaluate every row "
            "on its own; launch with accelerate launch or torchrun."
        )
    return state.process_index, state.num_processes, str(state.device), state.wait_for_everyone


def run_protocol_cli(args, argv=None, *, load_model, check_arguments) -> dict:
    """Run `args.protocol` on `args.task` with `args`' model; returns {"card", "card_file", "results_files"}."""
    from .protocol_card import build_card, update_model_card, write_card
    from .protocol_eval import collect_records, run_protocol
    from .protocols import get_protocol, load_protocol_rows

    refused = [flag for flag in REFUSED_UNDER_PROTOCOL if getattr(args, flag, None) is not None]
    if refused:
        raise ValueError(
            f"--protocol {args.protocol} fixes the prompt, the grading and the rows; drop "
            f"{', '.join('--' + f for f in refused)} (use --limit N for a quick look, or evaluate without --protocol)."
        )
    if args.limit is not None and (not isinstance(args.limit, int) or isinstance(args.limit, bool) or args.limit < 1):
        raise ValueError(f"--limit={args.limit!r} must be a positive integer (rows evaluated).")
    overrides = dict(sampler_overrides(args))
    if args.batch_size is not None:
        overrides["batch_size"] = args.batch_size
    if args.seed is not None:
        overrides["seeds"] = [args.seed]
    if args.dtype is not None:
        overrides["dtype"] = args.dtype
    if args.split != "test":
        overrides["split"] = args.split
    if args.limit is not None:
        overrides["count"] = args.limit
    protocol = get_protocol(args.protocol, args.task, gen_length=args.protocol_length, overrides=overrides)
    protocol = _with_draws(protocol, args.draws)
    args.dtype = protocol.dtype
    args.batch_size = protocol.batch_size
    check_arguments(args)  # dtype, device, threads, data paths: before anything loads
    if args.num_threads is not None:
        import torch

        torch.set_num_threads(args.num_threads)
    card_file = args.card_file or _default_card_path(args, protocol)
    results_file = args.results_file or os.path.splitext(card_file)[0] + ".records.jsonl"
    data_file = args.data_files or args.dataset_path
    rows, data = load_protocol_rows(protocol, data_file)  # a --limit beyond the rows is refused here
    sandbox = None
    if protocol.task in CODE_TASKS:  # the code sandbox starts (and is checked) before the model loads
        from .protocol_code import start_sandbox

        sandbox = start_sandbox()
        print(f"code grading: {sandbox['record']['description']}", flush=True)
    rank, world, device, wait = _distributed()
    if device is not None:
        args.device = device
    model, tokenizer, _ = load_model(args)
    records_by_seed, seconds, decoded, files = {}, 0.0, 0, []
    for seed in protocol.seeds:
        path = results_file if len(protocol.seeds) == 1 else f"{os.path.splitext(results_file)[0]}.seed{seed}.jsonl"
        run = run_protocol(
            model,
            tokenizer,
            protocol,
            rows,
            seed=seed,
            results_file=path,
            rank=rank,
            world_size=world,
            progress=args.progress,
        )
        seconds += run["seconds"]
        decoded += run["new_rows"]
        files.append(path)
        wait()
        if rank == 0:
            records_by_seed[seed] = collect_records(path, protocol, seed, len(rows), world)
    if rank != 0:
        return {"card": None, "card_file": None, "results_files": files}
    runtime = {
        "dtype": protocol.dtype,
        "device": str(next(model.parameters()).device),
        "num_processes": world,
        "batch_size": protocol.batch_size,
        "seconds_this_run": seconds,
        "problems_decoded_this_run": decoded,  # by this process (rank 0); rows read back from the results are not
        "problems_per_second": (decoded / seconds) if seconds > 0 and decoded else None,
    }
    if sandbox is not None:
        runtime["sandbox"] = sandbox["record"]
    card = build_card(
        protocol,
        records_by_seed,
        model=args.model_name_or_path,
        runtime=runtime,
        data=data["record"],
        deviations=data["deviations"] + (sandbox["deviations"] if sandbox else []),
        script="scripts/evaluate.py",
        argv=argv,
    )
    card["results_files"] = files
    write_card(card_file, card)
    score = card["score"]
    print(
        f"{protocol.name} {protocol.task}: {score['metric']} {score['value']:.4f} (95% interval "
        f"{score['interval'][0]:.4f}-{score['interval'][1]:.4f}, n={score.get('n', len(rows))}, seeds "
        f"{', '.join(score['seeds'])}); card: {card_file}"
        + (f"; {len(card['deviations'])} deviation(s)" if card["deviations"] else ""),
        flush=True,
    )
    if args.update_model_card:
        if not os.path.isdir(args.model_name_or_path):
            raise ValueError("--update_model_card needs a local model folder (--model_name_or_path).")
        update_model_card(args.model_name_or_path, os.path.dirname(os.path.abspath(card_file)))
    return {"card": card, "card_file": card_file, "results_files": files}


def _with_draws(protocol, draws):
    """A sampling protocol scores `draws` seeds (default 3: first seed, +1, +2), recorded as the seeds; a greedy one
    scores one (several seeds would give the same completions: refused)."""
    from .protocols import apply_overrides

    if draws is not None and (not isinstance(draws, int) or isinstance(draws, bool) or draws < 1):
        raise ValueError(f"--draws={draws!r} must be a positive integer (seeds scored).")
    if not protocol.samples:
        if draws not in (None, 1):
            raise ValueError(
                f"--draws={draws}: protocol {protocol.name!r} decodes greedily (temperature 0), so every seed gives "
                "the same completions; set --temperature > 0 to sample, or drop --draws."
            )
        return protocol
    count = 3 if draws is None else draws
    first = protocol.seeds[0]
    if len(protocol.seeds) == count:
        return protocol
    return apply_overrides(protocol, {"seeds": [first + d for d in range(count)]})
