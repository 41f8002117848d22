"""Drop-in: seven typical TRL GRPO scripts run with only the two class names swapped.

Each script below is written as TRL's own documentation writes a GRPO script (https://huggingface.co/docs/trl,
quickstart and GRPO Trainer pages: a dataset with a `prompt` column, reward functions taking `completions` and
the dataset's other columns as keyword arguments, `GRPOConfig(...)` and `GRPOTrainer(model=..., reward_funcs=...,
args=..., train_dataset=...)`), with a tiny local model path instead of a hub name and CPU-sized lengths. The test
swaps `GRPOConfig`/`GRPOTrainer` (and their import) for `StableDRLConfig`/`StableDRLTrainer`, changes nothing else,
runs the script and checks what it should have done.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

# The CPU settings every script shares: plain TrainingArguments / GRPOConfig fields a CPU user sets.
CPU_ARGS = """
    use_cpu=True,
    bf16=False,
    report_to="none",
    per_device_train_batch_size=4,
    num_generations=4,
    max_completion_length=8,
    learning_rate=1e-3,
    logging_steps=1,
    seed=3,
"""

PLAIN = f"""
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{{"prompt": f"Count to {{i}}:"}} for i in range(8)])

# Reward completions that are close to 5 characters long
def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]

training_args = GRPOConfig(output_dir=OUTPUT_DIR, max_steps=2, save_strategy="no", {CPU_ARGS})
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
trainer.train()
"""

CONVERSATIONAL = f"""
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list(
    [{{"prompt": [{{"role": "user", "content": f"What is {{i}} + {{i}}?"}}]}} for i in range(8)]
)

def digits_reward(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c[0]["content"])) for c in completions]

training_args = GRPOConfig(output_dir=OUTPUT_DIR, max_steps=2, save_strategy="no", {CPU_ARGS})
trainer = GRPOTrainer(model=MODEL, reward_funcs=digits_reward, args=training_args, train_dataset=dataset)
trainer.train()
"""

REWARD_KWARGS = f"""
import asyncio

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{{"prompt": f"{{i}}+1=", "ground_truth": str(i + 1)}} for i in range(8)])
SEEN = {{}}

def accuracy(completions, ground_truth, **kwargs):
    SEEN["ground_truth"] = list(ground_truth)
    return [1.0 if gt in c else 0.0 for c, gt in zip(completions, ground_truth)]

def length_penalty(completions, trainer_state, **kwargs):
    SEEN["step"] = trainer_state.global_step
    return [-len(c) / 8 for c in completions]

async def async_digits(completions, **kwargs):
    await asyncio.sleep(0)
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]

training_args = GRPOConfig(
    output_dir=OUTPUT_DIR, max_steps=2, save_strategy="no", reward_weights=[1.0, 0.5, 0.25], {CPU_ARGS}
)
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=[accuracy, length_penalty, async_digits],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
"""

EVAL_AND_CHECKPOINTS = f"""
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

train = Dataset.from_list([{{"prompt": f"Train {{i}}:"}} for i in range(8)])
test = Dataset.from_list([{{"prompt": f"Test {{i}}:"}} for i in range(4)])

def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]

training_args = GRPOConfig(
    output_dir=OUTPUT_DIR,
    max_steps=2,
    eval_strategy="steps",
    eval_steps=2,
    per_device_eval_batch_size=4,
    save_strategy="steps",
    save_steps=1,
    {CPU_ARGS}
)
trainer = GRPOTrainer(
    model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=train, eval_dataset=test
)
trainer.train()
trainer.save_model(OUTPUT_DIR)
"""

LORA = f"""
from datasets import Dataset
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer

dataset = Dataset.from_list([{{"prompt": f"Count to {{i}}:"}} for i in range(8)])

def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]

training_args = GRPOConfig(output_dir=OUTPUT_DIR, max_steps=2, save_strategy="no", {CPU_ARGS})
trainer = GRPOTrainer(
    model=MODEL,
    reward_funcs=reward_len,
    args=training_args,
    train_dataset=dataset,
    peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
)
trainer.train()
"""

SCRIPTS = {
    "plain": PLAIN,
    "conversational": CONVERSATIONAL,
    "reward_kwargs": REWARD_KWARGS,
    "eval_and_checkpoints": EVAL_AND_CHECKPOINTS,
    "lora": LORA,
}


def swap_class_names(source: str) -> str:
    """The only change a user makes: the two class names (and the module they are imported from)."""
    swapped = source.replace(
        "from trl import GRPOConfig, GRPOTrainer", "from stabledrl_trl import StableDRLConfig, StableDRLTrainer"
    )
    swapped = swapped.replace("GRPOConfig(", "StableDRLConfig(").replace("GRPOTrainer(", "StableDRLTrainer(")
    assert swapped.count("StableDRL") == 4, "every script imports and uses both classes exactly once"
    return swapped


def run_script(source: str, model: str, output_dir: str) -> dict:
    namespace = {"__name__": "__main__", "MODEL": model, "OUTPUT_DIR": output_dir}
    exec(compile(swap_class_names(source), "<script>", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def tiny_llada_path(tmp_path_factory):
    """A tiny random LLaDA checkpoint with the tiny tokenizer, saved like a hub model directory."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import stabledrl_trl  # noqa: F401  (registers LLaDA with the Auto classes)
    from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

    path = tmp_path_factory.mktemp("models") / "tiny-llada"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))
    model.save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_llama_path(tmp_path_factory):
    """A tiny random autoregressive Llama with the same tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from stabledrl_trl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    path = tmp_path_factory.mktemp("models") / "tiny-llama"
    with torch.random.fork_rng():
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def weights(path):
    """The parameters of the model saved at `path`, by module name, loaded as a user would load them."""
    from transformers import AutoModelForCausalLM

    import stabledrl_trl  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True)
    return {n: p.detach() for n, p in model.named_parameters()}


def changed_tensors(before: dict, trainer) -> list[str]:
    after = {n: p.detach() for n, p in trainer.model.named_parameters()}
    assert after.keys() == before.keys()
    return [n for n in after if not torch.equal(after[n], before[n])]


def test_plain_prompts(tmp_path, tiny_llada_path):
    ns = run_script(PLAIN, tiny_llada_path, str(tmp_path / "out"))
    trainer = ns["trainer"]
    assert trainer.is_diffusion and trainer.state.global_step == 2
    assert changed_tensors(weights(tiny_llada_path), trainer), "training must change the model"
    # Length-derived sampler defaults: one block of 8 positions, 2 tokens per step.
    assert (trainer.args.block_length, trainer.args.diffusion_steps) == (8, 4)
    assert all("reward" in h for h in trainer.state.log_history if "loss" in h)


def test_conversational_prompts(tmp_path, tiny_llada_path):
    ns = run_script(CONVERSATIONAL, tiny_llada_path, str(tmp_path / "out"))
    trainer = ns["trainer"]
    assert trainer.state.global_step == 2
    assert changed_tensors(weights(tiny_llada_path), trainer)


def test_reward_kwargs_weights_and_async_reward(tmp_path, tiny_llada_path):
    ns = run_script(REWARD_KWARGS, tiny_llada_path, str(tmp_path / "out"))
    trainer, seen = ns["trainer"], ns["SEEN"]
    assert trainer.state.global_step == 2
    assert set(seen["ground_truth"]) <= {str(i + 1) for i in range(8)} and len(seen["ground_truth"]) == 4
    logs = [h for h in trainer.state.log_history if "loss" in h]
    for h in logs:
        # The logged reward is the weighted sum of the three functions' means.
        expected = (
            1.0 * h["rewards/accuracy/mean"]
            + 0.5 * h["rewards/length_penalty/mean"]
            + 0.25 * h["rewards/async_digits/mean"]
        )
        assert h["reward"] == pytest.approx(expected, abs=1e-5)


def test_eval_and_checkpoints(tmp_path, tiny_llada_path):
    out = tmp_path / "out"
    ns = run_script(EVAL_AND_CHECKPOINTS, tiny_llada_path, str(out))
    trainer = ns["trainer"]
    evals = [h for h in trainer.state.log_history if "eval_reward" in h]
    assert len(evals) == 1 and evals[0]["step"] == 2
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-1",
        "checkpoint-2",
    ]
    saved = weights(str(out))
    assert saved.keys() == dict(trainer.model.named_parameters()).keys()
    for name, p in trainer.model.named_parameters():
        assert torch.equal(saved[name], p.detach()), name


def test_lora(tmp_path, tiny_llada_path):
    ns = run_script(LORA, tiny_llada_path, str(tmp_path / "out"))
    trainer = ns["trainer"]
    named = dict(trainer.model.named_parameters())
    lora_b = [n for n in named if "lora_B" in n]
    assert lora_b and all(float(named[n].detach().abs().max()) > 0 for n in lora_b), (
        "LoRA B starts at 0 and must train"
    )
    base = weights(tiny_llada_path)
    for n, p in named.items():
        if "lora_" not in n:
            key = n.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p.detach(), base[key]), n


def test_autoregressive_llama_with_trl_and_with_stabledrl(tmp_path, tiny_llama_path):
    # The same script runs with TRL's classes (the control) and with the swapped ones.
    from trl import GRPOConfig, GRPOTrainer  # noqa: F401

    namespace = {"__name__": "__main__", "MODEL": tiny_llama_path, "OUTPUT_DIR": str(tmp_path / "trl")}
    exec(compile(PLAIN, "<script>", "exec"), namespace)
    control = namespace["trainer"]
    ns = run_script(PLAIN, tiny_llama_path, str(tmp_path / "stabledrl"))
    trainer = ns["trainer"]
    assert not trainer.is_diffusion and trainer.state.global_step == control.state.global_step == 2
    assert changed_tensors(weights(tiny_llama_path), trainer)


# --------------------------------------------------------------------------- two processes and resume (slow)

TWO_PROCESS_SCRIPT = f"""
import json, os, sys
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

MODEL, OUTPUT_DIR = sys.argv[1], sys.argv[2]
dataset = Dataset.from_list([{{"prompt": f"Count to {{i}}:"}} for i in range(16)])

def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]

training_args = GRPOConfig(output_dir=OUTPUT_DIR, max_steps=2, save_strategy="no", {CPU_ARGS})
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
trainer.train()
if trainer.accelerator.is_main_process:
    with open(os.path.join(OUTPUT_DIR, "result.json"), "w") as f:
        json.dump({{"num_processes": trainer.accelerator.num_processes, "step": trainer.state.global_step}}, f)
"""

RESUME_SCRIPT = f"""
import sys
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

MODEL, OUTPUT_DIR, RESUME = sys.argv[1], sys.argv[2], sys.argv[3] == "resume"
dataset = Dataset.from_list([{{"prompt": f"Count to {{i}}:"}} for i in range(16)])

def reward_len(completions, **kwargs):
    return [-abs(5 - len(completion)) for completion in completions]

training_args = GRPOConfig(output_dir=OUTPUT_DIR, max_steps=4, save_strategy="steps", save_steps=2, {CPU_ARGS})
trainer = GRPOTrainer(model=MODEL, reward_funcs=reward_len, args=training_args, train_dataset=dataset)
trainer.train(resume_from_checkpoint=True if RESUME else None)
"""


def write_script(tmp_path, source: str, name: str) -> str:
    path = tmp_path / name
    path.write_text(swap_class_names(source))
    return str(path)


@pytest.mark.slow
def test_two_processes(tmp_path, tiny_llada_path, clean_env):
    script = write_script(tmp_path, TWO_PROCESS_SCRIPT, "train_2proc.py")
    out = tmp_path / "out"
    # torchrun's standalone mode binds a free port itself (no fixed port, no check-then-bind race).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, script, tiny_llada_path, str(out)], env=clean_env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "result.json").read_text()) == {"num_processes": 2, "step": 2}


@pytest.mark.slow
def test_resume_matches_uninterrupted_run(tmp_path, tiny_llada_path, clean_env):
    import shutil

    script = write_script(tmp_path, RESUME_SCRIPT, "train_resume.py")
    full, resumed = tmp_path / "full", tmp_path / "resumed"

    def run(out, mode):
        proc = subprocess.run(
            [sys.executable, script, tiny_llada_path, str(out), mode],
            env=clean_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]

    run(full, "fresh")
    # The interrupted run: the same output folder as it stood after checkpoint-2.
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    run(resumed, "resume")
    expected, got = weights(str(full / "checkpoint-4")), weights(str(resumed / "checkpoint-4"))
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    initial = weights(tiny_llada_path)
    assert any(not torch.equal(expected[n], initial[n]) for n in expected), "the run must train"


@pytest.mark.slow
def test_two_processes_that_accelerate_would_run_alone_are_refused(tmp_path, tiny_llada_path, clean_env):
    # Without use_cpu=True on a machine without GPUs accelerate leaves each launched process undistributed.
    if torch.cuda.is_available():
        pytest.skip("on a machine with GPUs these processes are distributed: nothing to refuse")
    source = TWO_PROCESS_SCRIPT.replace("use_cpu=True,", "use_cpu=False,")
    script = write_script(tmp_path, source, "train_2proc_gpu_args.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, script, tiny_llada_path, str(tmp_path / "out")],
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert "each process would train its own copy" in proc.stderr and "use_cpu=True" in proc.stderr
