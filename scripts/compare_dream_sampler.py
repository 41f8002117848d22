"""Dream's sampler and LLaDA's sampler against Dream's original `diffusion_generate` on the dream-tiny fixture.

For every setting recorded in tests/fixtures/dream-tiny (written by Dream's own hub code, temperature 0) and each
prompt alone, prints how many of the 16 generated tokens each sampler reproduces, and whether the left-padded batches
match. LLaDA's sampler runs with one block of 16 and the same number of steps.

    python scripts/compare_dream_sampler.py
"""

from __future__ import annotations

import json
import os

import torch


def main(fixture: str | None = None) -> list[dict]:
    import transformers
    from safetensors import safe_open
    from safetensors.torch import load_file

    import stabledrl_trl  # noqa: F401  (registers Dream)
    from stabledrl_trl.diffusion import dream_sampler, sampler
    from stabledrl_trl.diffusion.adapter import as_diffusion_lm

    fixture = fixture or os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "dream-tiny")
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
                llada = sampler.generate(
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
