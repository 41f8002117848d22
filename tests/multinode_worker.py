"""Start-up of a multi-node run: the SFT warm-up cache under torch.distributed; used by tests/test_multinode.py.

    torchrun ... tests/multinode_worker.py --cache_dir DIR --out result-{rank}.json

Every rank calls `prepare_sft_model(DIR, ...)` (a few SFT steps) and writes {"rank", "path", "files"} or
{"rank", "error"} as JSON to --out (with {rank} replaced). With --trainer_output_dir OUT it builds a StableDRLTrainer
writing to OUT instead and writes {"rank", "built"} or {"rank", "error"}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache_dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--trainer_output_dir", default=None, help="build a StableDRLTrainer writing here instead")
    parser.add_argument("--save_on_each_node", action="store_true")
    a = parser.parse_args(argv)
    if a.trainer_output_dir is not None:
        return build_trainer(a)

    import torch.distributed as dist

    from stabledrl_trl.sft import prepare_sft_model

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        path = prepare_sft_model(a.cache_dir, seed=0, num_samples=64, max_steps=2, batch_size=8, progress=False)
        result = {"rank": rank, "path": os.path.abspath(path), "files": sorted(os.listdir(path))}
    except RuntimeError as err:
        result = {"rank": rank, "error": str(err)}
    with open(a.out.replace("{rank}", str(rank)), "w") as f:
        json.dump(result, f)
    dist.barrier()  # every process leaves the process group together (gloo aborts a rank whose peer left first)
    dist.destroy_process_group()


def build_trainer(a):
    """Construct a StableDRLTrainer with output_dir=--trainer_output_dir; write {"rank", "built"} or the error."""
    from datasets import Dataset
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl import StableDRLConfig, StableDRLTrainer
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    args = StableDRLConfig(output_dir=a.trainer_output_dir, use_cpu=True, bf16=False, report_to="none",
                           per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
                           block_length=4, diffusion_steps=2, max_steps=1,
                           save_on_each_node=a.save_on_each_node)  # fmt: skip
    rank = args.process_index  # sets up the process group (gloo)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))
    try:
        StableDRLTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                         train_dataset=Dataset.from_list([{"prompt": "1+1="}] * 4),
                         processing_class=build_tiny_tokenizer())  # fmt: skip
        result = {"rank": rank, "built": True}
    except RuntimeError as err:
        result = {"rank": rank, "error": str(err)}
    with open(a.out.replace("{rank}", str(rank)), "w") as f:
        json.dump(result, f)
    import torch  # every process leaves the process group together (gloo aborts a rank whose peer left first)

    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
