"""One optimiser step of StableDRLTrainer, compared with the same update computed on the whole batch at once.

Run in-process by tests/test_group_exact.py (gradient accumulation) and under `accelerate launch` with two CPU
processes (gloo). Writes {"max_abs_diff", "max_abs_update", ...} as JSON to the path given by --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(
    out_path: str,
    loss_type: str = "stable_drl",
    grad_accum: int = 2,
    steps_per_generation: int | None = None,
    rollout_cache: str = "none",
    parallel_threshold: float | None = None,
    architecture: str = "llada",
):
    from accelerate.utils import gather_object
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_diffusion_gemma_config, tiny_llada_config_dict

    tok = build_tiny_tokenizer()
    gemma = architecture == "diffusion_gemma"

    def build():
        with torch.random.fork_rng():
            torch.manual_seed(0)
            if gemma:  # transformers' DiffusionGemma: its own sampler, the uniform-noise estimator
                from transformers import DiffusionGemmaForBlockDiffusion

                return DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config())
            return AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))

    model = build()
    # A second copy for the reference computation (a deepcopy of a prepared model would share its patched forward).
    initial = build()
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}*{i}="}]} for i in range(16)])

    def reward(prompts, completions, **kw):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [sum(ch.isdigit() for ch in t) / max(len(t), 1) + 0.1 * len(t) for t in texts]

    g = 4
    args = StableDRLConfig(
        output_dir=os.path.join(os.path.dirname(out_path), "trainer_out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        loss_type=loss_type,
        per_device_train_batch_size=g,
        num_generations=g,
        gradient_accumulation_steps=grad_accum,
        steps_per_generation=steps_per_generation,
        max_completion_length=8,
        **({"block_denoising_steps": 3} if gemma else {"block_length": 4, "diffusion_steps": 4}),
        temperature=1.0,
        max_steps=1,
        learning_rate=0.5,
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: the update is exactly -lr * gradient
        save_strategy="no",
        gradient_checkpointing=False,
        seed=11,
        likelihood_estimator="block_random",
        **({} if gemma else {"estimator_block_size": 4}),
        mc_samples=2,
        rollout_cache=rollout_cache,
        parallel_threshold=parallel_threshold,
        mask_seed_mode="fresh",  # the reference below scores the fresh-mask stream against the stored old scores
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.learning_rate)
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        optimizers=(optimizer, None),
    )
    captured = []
    original = trainer._generate_and_score_completions

    def capture(inputs):
        out = original(inputs)
        captured.append({k: (v.detach().cpu() if isinstance(v, torch.Tensor) else v) for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    final = trainer.accelerator.unwrap_model(trainer.model)

    # Whole-batch reference: every row of every process and micro-batch, one loss, mean over groups.
    rows = []
    for batch in captured:
        n = batch["advantages"].shape[0]
        for i in range(n):
            rows.append(
                {
                    k: batch[k][i]
                    for k in (
                        "prompt_ids",
                        "prompt_mask",
                        "completion_ids",
                        "completion_mask",
                        "advantages",
                        "old_per_token_logps",
                        "mask_row_key",
                    )
                }
            )
    rows = gather_object(rows)  # process order = global group order
    result = (
        _reference(trainer, initial, final, rows, loss_type, g, args, out_path)
        if trainer.accelerator.is_main_process
        else None
    )
    # Every process leaves together: a rank that exits while another still holds the process group can be aborted
    # by gloo when the peer's sockets close under it.
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return result


def _reference(trainer, initial, final, rows, loss_type, g, args, out_path):
    from trl.trainer.utils import pad

    from stabledrl_trl.objectives import stable_drl_loss, stable_drl_ratio_loss

    def stack(key, side):
        return pad([r[key] for r in rows], padding_value=0, padding_side=side)

    prompt_ids, prompt_mask = stack("prompt_ids", "left"), stack("prompt_mask", "left")
    completion_ids, completion_mask = stack("completion_ids", "right"), stack("completion_mask", "right")
    old = stack("old_per_token_logps", "right")
    adv = torch.stack([r["advantages"] for r in rows])
    ids = torch.cat([prompt_ids, completion_ids], 1)
    am = torch.cat([prompt_mask, completion_mask], 1)
    trainer._scoring.mask_stream = (3, 0, 0)  # the fresh-mask stream of optimiser step 0, inner iteration 0
    trainer._scoring.mask_rows = torch.stack([r["mask_row_key"] for r in rows])  # each row's own masks (as in training)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(initial, ids, am, completion_ids.size(1))
    n_tok = completion_mask.sum(-1).clamp(min=1)
    if loss_type == "stable_drl":
        seq = (logps * completion_mask).sum(-1) / n_tok
        out = stable_drl_loss(seq, (old * completion_mask).sum(-1) / n_tok, adv, g, clip_c=args.clip_c)
    else:
        # stable_drl_ratio_form "mean": the length-normalised sequence log-ratio L_theta - L_old
        out = stable_drl_ratio_loss(((logps - old) * completion_mask).sum(-1) / n_tok, adv, g, epsilon=args.epsilon)
    loss = out.unit_loss.mean()  # mean over all groups of the optimiser step
    loss.backward()
    diffs, updates = [], []
    for p0, p1 in zip(initial.parameters(), final.parameters(), strict=True):
        # a parameter without a gradient (a routed expert no token chose) must not move
        expected = -args.learning_rate * (p0.grad if p0.grad is not None else torch.zeros_like(p0))
        actual = p1.detach() - p0.detach()
        diffs.append((actual - expected).abs().max().item())
        updates.append(actual.abs().max().item())
    result = {
        "max_abs_diff": max(diffs),
        "max_abs_update": max(updates),
        "num_groups": adv.shape[0] // g,
        "num_processes": trainer.accelerator.num_processes,
        "loss": loss.item(),
        "weights_min": out.stats["weights"].min().item(),
        "rollout_forward_passes": [h["stabledrl/rollout_forward_passes"] for h in trainer.state.log_history
                                   if "stabledrl/rollout_forward_passes" in h],
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--loss_type", default="stable_drl")
    parser.add_argument("--grad_accum", type=int, default=1)
    parser.add_argument("--rollout_cache", default="none")
    parser.add_argument("--parallel_threshold", type=float, default=None)
    parser.add_argument("--architecture", default="llada", choices=["llada", "diffusion_gemma"])
    parsed = parser.parse_args()
    run(
        parsed.out,
        parsed.loss_type,
        parsed.grad_accum,
        rollout_cache=parsed.rollout_cache,
        parallel_threshold=parsed.parallel_threshold,
        architecture=parsed.architecture,
    )
