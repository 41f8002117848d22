"""The set-up the trainer tests share: a reward with varied values, a small prompt dataset, a tiny random LLaDA, the
CPU settings of a tiny run, and a parameter snapshot.

Plain functions (tests and the worker scripts they launch call them with their own arguments), importable from every
test folder: tests/ is on the path of each test module and of each worker run as `python tests/<worker>.py`.
"""

from __future__ import annotations

import torch
from datasets import Dataset

# The CPU settings every tiny run shares; each test module adds what it varies.
CPU_RUN = dict(use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4, num_generations=4)


def digit_reward(prompts, completions, **kwargs):
    """Fraction of characters that are digits: varied across samples, so advantages are non-zero."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(len(t), 1) for t in texts]


def make_dataset(n=8):
    """n conversational prompts "i+(i+1)="."""
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"{i}+{i + 1}="}]} for i in range(n)])


def make_llada(seed=0, **overrides):
    """A tiny random LLaDA (`tiny_llada_config_dict(**overrides)`) through the Auto classes, weights from `seed`; the
    global RNG is left as it was."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl.tiny import tiny_llada_config_dict

    config = AutoConfig.for_model(**tiny_llada_config_dict(**overrides))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config)


def tiny_args(tmp_path, **kw):
    """A `StableDRLConfig` writing to tmp_path/out with `CPU_RUN` and `kw` (kw wins)."""
    from stabledrl_trl import StableDRLConfig

    return StableDRLConfig(**{"output_dir": str(tmp_path / "out"), **CPU_RUN, **kw})


def params_copy(model):
    """{name: a detached copy} of every parameter, to compare after training."""
    return {n: p.detach().clone() for n, p in model.named_parameters()}
