"""Write a tiny randomly initialised diffusion LM with its tokenizer to a folder, to try a TRL script in seconds.

    python scripts/make_tiny_model.py --output_dir tiny-llada                        # LLaDA architecture
    python scripts/make_tiny_model.py --output_dir tiny-sdar --architecture sdar     # block diffusion (SDAR)

The folder holds what `from_pretrained` needs: config.json, model.safetensors (d_model 128, 4 layers: the embedded
default's architecture, 0.7 M parameters) and the character-level tokenizer (tokenizer.json, with its mask,
EOS and pad tokens and a chat template). Pass the folder wherever a TRL script takes a model id, e.g.
`StableDRLTrainer(model="tiny-llada", ...)` after `import stabledrl_trl` (which registers the architecture). The
weights are random: a run trains, it does not solve a task (configs/tiny.yaml warms the same model up by SFT first).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/make_tiny_model.py",
        description=__doc__.strip().split("\n\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--output_dir", required=True, help="folder to write the model and tokenizer into")
    parser.add_argument("--architecture", default="llada", choices=["llada", "sdar", "llada2"],
                        help="llada: full attention; sdar: block diffusion; llada2: MoE block diffusion")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the random initialisation")
    return parser


def main(argv=None) -> str:
    args = make_parser().parse_args(argv)
    if os.path.exists(args.output_dir) and os.listdir(args.output_dir):
        raise SystemExit(f"--output_dir {args.output_dir} exists and is not empty: choose a new folder.")
    from stabledrl_trl.sft import TINY_BASE_MODELS, build_tiny_model
    from stabledrl_trl.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=args.seed, architecture=args.architecture,
                             **TINY_BASE_MODELS[args.architecture])  # fmt: skip
    model.save_pretrained(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"wrote a tiny {args.architecture} model ({parameters / 1e6:.1f} M parameters, random weights) and its "
        f"tokenizer to {args.output_dir}; load it after `import stabledrl_trl`, e.g. "
        f"StableDRLTrainer(model={args.output_dir!r}, ...)",
        flush=True,
    )
    return args.output_dir


if __name__ == "__main__":
    main()
