"""Token agreement of Dream's sampler and LLaDA's sampler with Dream's original `diffusion_generate` (dream-tiny).

For every setting recorded in tests/fixtures/dream-tiny (written by Dream's own hub code, temperature 0) and each
prompt alone, prints how many of the 16 generated tokens each sampler reproduces, and whether the left-padded batches
match. LLaDA's sampler runs with one block of 16 and the same number of steps.

    python scripts/bench_dream_sampler_agreement.py [--fixture tests/fixtures/dream-tiny]
"""

from __future__ import annotations

import argparse
import json
import os

import torch

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "dream-tiny")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--fixture", default=FIXTURE, help="folder with Dream's recorded generations (reference.safetensors)"
    )
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    fixture = make_parser().parse_args(argv).fixture
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file

    import stabledrl_trl  # noqa: F401  (registers Dream)
    from stabledrl_trl.diffusion import dream_sampler, llada_sampler
    from stabledrl_trl.diffusion.family import as_diffusion_lm

    ref = load_file(os.path.join(fixture, "reference.safetensors"))
    with safe_open(os.path.join(fixture, "reference.safetensors"), "pt") as f:
        meta = f.metadata()
    settings, mask, gen = json.loads(meta["generation_settings"]), int(meta["mask_token_id"]), 16
    adapter = as_diffusion_lm(transformers.AutoModel.from_pretrained(fixture).eval())
    rows = []
    print(f"{'setting':<18} {'prompt':>6} {'Dream sampler':>14} {'LLaDA sampler':>14}")
    with torch.no_grad():
        for name, s in settings.items():
            for b in range(3):
                prompt = ref[f"prompt{b}_ids"][None]
                expected = ref[f"gen_{name}_prompt{b}_sequences"][-gen:]
                dream = dream_sampler.generate(
                    adapter, prompt, mask_token_id=mask, gen_length=gen, steps=s["steps"], alg=s["alg"], eps=s["eps"]
                ).completion_ids[0]
                llada = llada_sampler.generate(
                    adapter, prompt, mask_token_id=mask, gen_length=gen, block_length=gen, steps=s["steps"]
                ).completion_ids[0]
                row = {"setting": name, "prompt": b, "dream": int((dream == expected).sum()),
                       "llada": int((llada == expected).sum())}  # fmt: skip
                rows.append(row)
                print(f"{name:<18} {b:>6} {row['dream']:>11}/16 {row['llada']:>11}/16")
        for name in ("entropy_s8", "maskgit_plus_s4"):
            key = f"batchgen_{name}_sequences"
            if key in ref:
                s = settings[name]
                out = dream_sampler.generate(
                    adapter, ref["batch_prompt_ids"], ref["batch_prompt_mask"], mask_token_id=mask, gen_length=gen,
                    steps=s["steps"], alg=s["alg"], eps=s["eps"],
                )  # fmt: skip
                same = torch.equal(out.completion_ids, ref[key][:, -gen:])
                print(f"left-padded batch {name}: Dream sampler {'identical' if same else 'DIFFERENT'}")
    return rows


if __name__ == "__main__":
    main()
