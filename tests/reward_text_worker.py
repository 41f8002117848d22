"""One training step with `reward_text="canvas"` under `accelerate launch` (two CPU processes, gloo).

Rollouts come from a stand-in sampler whose canvas for a row is  <digit of its prompt> EOS "p<rank>n<k>"  (k counts
the rows this process generated), so a reward function can check that each row it grades is its own canvas from
its own process. Writes {"rows": [...]} (every graded row, all processes) as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(out_path: str) -> None:
    from accelerate.utils import gather_object
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.diffusion.llada_sampler import SamplerOutput
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    tok = build_tiny_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}*{i}="}]} for i in range(8)])
    graded = []

    def reward(prompts, completions, completion_ids, **kw):
        for prompt, completion, ids in zip(prompts, completions, completion_ids):
            graded.append(
                {
                    "rank": trainer.accelerator.process_index,
                    "prompt_digit": prompt[-1]["content"][0],
                    "text": completion[-1]["content"],
                    "cut": tok.decode(ids, skip_special_tokens=True),
                }
            )
        return [float(len(graded) % 3) for _ in completions]

    args = StableDRLConfig(
        output_dir=os.path.join(os.path.dirname(out_path), "trainer_out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        block_length=4,
        diffusion_steps=4,
        max_steps=1,
        save_strategy="no",
        seed=3,
        reward_text="canvas",
    )
    trainer = StableDRLTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tok
    )
    made = []

    def generate(adapter, prompt_ids, prompt_mask, cfg, *, eos_token_ids, generator):
        rows, masks = [], []
        for ids in prompt_ids.tolist():
            digit = next(ch for ch in tok.decode(ids, skip_special_tokens=True) if ch.isdigit())
            head = tok(digit, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            tail = tok(f"p{trainer.accelerator.process_index}n{len(made)}", add_special_tokens=False)["input_ids"]
            made.append(1)
            canvas = (head + tail + [tok.eos_token_id] * cfg.max_completion_length)[: cfg.max_completion_length]
            rows.append(canvas)
            masks.append([1] * len(head) + [0] * (len(canvas) - len(head)))
        return SamplerOutput(torch.tensor(rows), torch.tensor(masks))

    trainer._diffusion_family.generate = generate
    trainer.train()
    rows = [row for part in gather_object([graded]) for row in part]
    if trainer.accelerator.is_main_process:
        with open(out_path, "w") as f:
            json.dump({"num_processes": trainer.accelerator.num_processes, "rows": rows}, f)
    # Every process leaves together (a rank exiting while its peer still holds the gloo group can abort the peer).
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    main(parser.parse_args().out)
