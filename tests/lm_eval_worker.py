"""lm-eval with the stabledrl model class on a tiny LLaDA, run by tests/test_lm_eval_model.py in one process and
under torchrun with two gloo processes; rank 0 writes the responses and the metric to --out."""

import argparse
import json

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks_dir", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager
    from tokenizers import Regex, pre_tokenizers

    from stabledrl_trl.lm_eval_model import DiffusionLMEval
    from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    tokenizer = build_tiny_tokenizer()
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    torch.manual_seed(0)
    model = LLaDAModelLM(LLaDAConfig(**tiny_llada_config_dict())).float().eval()
    lm = DiffusionLMEval(model=model, tokenizer=tokenizer, batch_size=2, gen_length=8, steps=4, block_length=8)
    results = simple_evaluate(
        model=lm, tasks=["tiny_sum"], task_manager=TaskManager(include_path=args.tasks_dir, include_defaults=False),
        log_samples=True,
    )  # fmt: skip
    if lm.rank == 0:
        samples = sorted(results["samples"]["tiny_sum"], key=lambda s: s["doc_id"])
        with open(args.out, "w") as f:
            json.dump({"world_size": lm.world_size, "responses": [s["resps"][0][0] for s in samples],
                       "exact_match": results["results"]["tiny_sum"]["exact_match,none"]}, f)  # fmt: skip
    lm.barrier()
    if lm.world_size > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
