"""A small CPU StableDRL run that checkpoints every step; used by tests/test_resume.py.

    python tests/resume_worker.py --output_dir DIR [--resume_from_checkpoint DIR/checkpoint-N] [--sleep S]

--sleep pauses after each saved checkpoint, so that the test can SIGKILL the process mid-training.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--resume_from_checkpoint", default=None)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--max_steps", type=int, default=6)
    a = parser.parse_args(argv)

    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM, TrainerCallback

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    tok = build_tiny_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}-{2 * i}="}]} for i in range(32)])

    def reward(prompts, completions, **kw):
        if os.environ.get("DEBUG_RESUME"):
            print("PROMPTS", [p[-1]["content"] for p in prompts], [c[-1]["content"] for c in completions], flush=True)
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]

    class SlowDown(TrainerCallback):
        def on_save(self, args, state, control, **kw):
            if a.sleep:
                print(f"SAVED {state.global_step}", flush=True)
                time.sleep(a.sleep)

    args = StableDRLConfig(
        output_dir=a.output_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=4,
        num_generations=4,
        gradient_accumulation_steps=2,
        max_completion_length=8,
        block_length=4,
        diffusion_steps=4,
        temperature=1.0,
        max_steps=a.max_steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps",
        save_steps=1,
        gradient_checkpointing=False,
        seed=5,
        mc_samples=2,
        estimator_block_size=4,
    )
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[SlowDown()],
    )
    trainer.train(resume_from_checkpoint=a.resume_from_checkpoint)
    # Every process leaves together: a rank that exits while another still holds the process group can be aborted
    # by gloo ("terminate called without an active exception") when the peer's sockets close under it.
    trainer.accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
