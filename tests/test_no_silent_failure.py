"""Drop-in and no silent failure in the trainer: TRL's random stream and layouts, the changed defaults said at
start-up, a resume with changed run settings, two runs in one output_dir, and a model with weights missing."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from datasets import Dataset

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def reward_len(completions, **kwargs):
    return [-abs(5 - len(c)) for c in completions]


def dataset(n=8):
    return Dataset.from_list([{"prompt": f"Count to {i}:"} for i in range(n)])


CPU = dict(use_cpu=True, bf16=False, report_to="none", logging_steps=1, learning_rate=1e-2, seed=3)


def llama(seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

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
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def llada(seed=0):
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_llada_config_dict()))


def llada_args(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        block_length=4,
        diffusion_steps=4,
        max_steps=2,
        save_strategy="no",
        **CPU,
    )
    base.update(kw)
    return StableDRLConfig(**base)


# ------------------------------------------------------------------------------------------- drop-in


def test_swapped_script_with_trls_loss_reproduces_trls_run_over_several_steps(tmp_path):
    """An autoregressive model, TRL's loss and advantage settings written out: the swapped classes train the same
    weights as TRL's for 3 steps of 2 accumulated micro-batches each (TRL's row shuffle draws from the global random
    stream, so the generation of step 2 onward depends on it)."""
    from trl import GRPOConfig, GRPOTrainer

    settings = dict(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=6,
        max_steps=3,
        save_strategy="no",
        loss_type="dapo",
        scale_rewards="group",
        **CPU,
    )
    tok = build_tiny_tokenizer()
    results = []
    for config_cls, trainer_cls, name in ((GRPOConfig, GRPOTrainer, "trl"), (StableDRLConfig, StableDRLTrainer, "s")):
        torch.manual_seed(0)  # the same global state before each run, as two fresh scripts
        args = config_cls(output_dir=str(tmp_path / name), **settings)
        trainer = trainer_cls(
            model=llama(), reward_funcs=reward_len, args=args, train_dataset=dataset(), processing_class=tok
        )
        trainer.train()
        results.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
    trl, ours = results
    initial = dict(llama().named_parameters())
    assert any(not torch.equal(trl[n], initial[n]) for n in trl), "the runs must train"
    for n in trl:
        torch.testing.assert_close(ours[n], trl[n], atol=1e-6, rtol=1e-5, msg=n)


def test_group_split_over_processes_follows_trls_rows_for_a_trl_loss(tmp_path):
    """Per-device batch 2 with num_generations 4 over 2 processes (TRL supports it): each process's generation batch
    holds half a group. The trainer must take TRL's row shuffle for TRL's losses instead of failing mid-training.
    Here a 2-row local generation batch is handed to `_prepare_inputs` as process 0 of such a run sees it."""
    args = llada_args(tmp_path, loss_type="grpo", per_device_train_batch_size=4, max_steps=1)
    trainer = StableDRLTrainer(
        model=llada(),
        reward_funcs=reward_len,
        args=args,
        train_dataset=dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    half_group = {
        "prompt_ids": torch.tensor([[5, 6], [7, 8]]),
        "completion_ids": torch.tensor([[9, 10], [11, 12]]),
        "advantages": torch.tensor([0.5, -0.5]),
    }
    trainer._generate_and_score_completions = lambda inputs: dict(half_group)
    trainer.model.train()
    torch.manual_seed(1)
    out = trainer._prepare_inputs([{"prompt": "a"}, {"prompt": "b"}])
    torch.manual_seed(1)
    order = torch.randperm(2)  # TRL's shuffle_sequence_dict draws exactly this
    assert torch.equal(out["advantages"], half_group["advantages"][order])
    assert torch.equal(out["completion_ids"], half_group["completion_ids"][order])


def test_group_normalised_loss_refuses_a_split_group_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=2 is not a multiple of\s+num_generations=4"):
        llada_args(tmp_path, loss_type="stable_drl", per_device_train_batch_size=2, gradient_accumulation_steps=2)


def test_changed_defaults_are_said_once_at_start_up_with_the_fix(tmp_path, caplog):
    tok = build_tiny_tokenizer()
    with caplog.at_level(logging.WARNING, logger="stabledrl_trl.changed_defaults"):
        StableDRLTrainer(
            model=llada(),
            reward_funcs=reward_len,
            args=StableDRLConfig(
                output_dir=str(tmp_path / "a"), per_device_train_batch_size=4, num_generations=4, **CPU
            ),
            train_dataset=dataset(),
            processing_class=tok,
        )
    notes = [r.getMessage() for r in caplog.records if "differ from TRL's GRPOConfig" in r.getMessage()]
    assert len(notes) == 1
    for text in ("loss_type='stable_drl' (GRPOConfig: 'dapo'", "scale_rewards='none' (GRPOConfig: 'group'",
                 "temperature=0.9 (GRPOConfig: 1.0", "max_completion_length=256 (GRPOConfig: 512",
                 "set loss_type='dapo', scale_rewards='group', temperature=1.0, max_completion_length=512"):  # fmt: skip
        assert text in notes[0], notes[0]

    caplog.clear()  # an autoregressive model keeps TRL's rollout defaults: only the objective's are named
    import warnings

    with caplog.at_level(logging.WARNING, logger="stabledrl_trl.changed_defaults"), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nor is a diffusion setting the script never set reported
        StableDRLTrainer(
            model=llama(),
            reward_funcs=reward_len,
            args=StableDRLConfig(
                output_dir=str(tmp_path / "b"), per_device_train_batch_size=4, num_generations=4, **CPU
            ),
            train_dataset=dataset(),
            processing_class=tok,
        )
    notes = [r.getMessage() for r in caplog.records if "differ from TRL's GRPOConfig" in r.getMessage()]
    assert len(notes) == 1 and "set loss_type='dapo', scale_rewards='group' in" in notes[0], notes

    caplog.clear()  # TRL's values written out: nothing to say
    with caplog.at_level(logging.WARNING, logger="stabledrl_trl.changed_defaults"):
        StableDRLTrainer(
            model=llama(),
            reward_funcs=reward_len,
            args=StableDRLConfig(
                output_dir=str(tmp_path / "c"),
                per_device_train_batch_size=4,
                num_generations=4,
                loss_type="dapo",
                scale_rewards="group",
                **CPU,
            ),
            train_dataset=dataset(),
            processing_class=tok,
        )
    assert not [r for r in caplog.records if "differ from TRL's GRPOConfig" in r.getMessage()]


# ------------------------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def two_step_checkpoint(tmp_path_factory):
    """A LLaDA run saved at steps 1 and 2 (loss_type stable_drl, 4 generations, mc_elbo)."""
    out = tmp_path_factory.mktemp("resume") / "out"
    args = llada_args(out.parent, save_strategy="steps", save_steps=1, likelihood_estimator="mc_elbo", mc_samples=1)
    trainer = StableDRLTrainer(
        model=llada(),
        reward_funcs=reward_len,
        args=args,
        train_dataset=dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train()
    return out


def resume(out, tmp_path, **changes):
    import shutil

    folder = tmp_path / "out"
    shutil.copytree(out, folder)
    kw = dict(save_strategy="no", likelihood_estimator="mc_elbo", mc_samples=1, max_steps=3)
    kw.update(changes)
    args = llada_args(tmp_path, **kw)
    trainer = StableDRLTrainer(
        model=llada(),
        reward_funcs=reward_len,
        args=args,
        train_dataset=dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    trainer.train(resume_from_checkpoint=True)
    return trainer


def test_checkpoints_record_the_settings_of_their_run(two_step_checkpoint):
    import json

    from stabledrl_trl.run_identity import RUN_FILE

    for step in (1, 2):
        saved = json.loads((two_step_checkpoint / f"checkpoint-{step}" / RUN_FILE).read_text())["settings"]
        assert saved["loss_type"] == "stable_drl" and saved["num_generations"] == 4
        assert saved["likelihood_estimator"] == "mc_elbo" and saved["learning_rate"] == 1e-2


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"loss_type": "stable_drl_ratio"}, "loss_type"),
        ({"num_generations": 2, "per_device_train_batch_size": 4}, "num_generations"),
        ({"likelihood_estimator": "mc_elbo_inv_t"}, "likelihood_estimator"),
        ({"learning_rate": 5e-3}, "learning_rate"),
    ],
)
def test_resume_with_a_changed_run_is_refused_naming_the_field(two_step_checkpoint, tmp_path, changes, field):
    from stabledrl_trl.run_identity import ChangedRunError

    with pytest.raises(
        ChangedRunError, match=rf"checkpoint-2: .*{field}: checkpoint .*resume_allow_changes=\[.*'{field}'"
    ):
        resume(two_step_checkpoint, tmp_path, **changes)


def test_resume_with_an_allowed_change_or_a_longer_run_goes_on(two_step_checkpoint, tmp_path, caplog):
    trainer = resume(two_step_checkpoint, tmp_path / "a")  # max_steps 2 -> 3 is not a change of run
    assert trainer.state.global_step == 3
    with caplog.at_level(logging.WARNING, logger="stabledrl_trl.run_identity"):
        trainer = resume(
            two_step_checkpoint, tmp_path / "b", learning_rate=5e-3, resume_allow_changes=["learning_rate"]
        )
    assert trainer.state.global_step == 3
    assert any("learning_rate: 0.01 -> 0.005" in r.getMessage() for r in caplog.records)


def test_resume_allow_changes_names_only_run_defining_fields(tmp_path):
    with pytest.raises(ValueError, match="resume_allow_changes holds 'logging_steps'"):
        llada_args(tmp_path, resume_allow_changes=["logging_steps"])
    with pytest.raises(TypeError, match="must be a list of field names"):
        llada_args(tmp_path, resume_allow_changes="loss_type")


def test_checkpoint_without_run_record_resumes_with_a_warning(two_step_checkpoint, tmp_path, caplog):
    import shutil

    from stabledrl_trl.run_identity import RUN_FILE, check_resume_settings

    folder = tmp_path / "ckpt"
    shutil.copytree(two_step_checkpoint / "checkpoint-2", folder)
    (folder / RUN_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="stabledrl_trl.run_identity"):
        assert check_resume_settings(str(folder), llada_args(tmp_path)) == {}
    assert any("does not record the settings" in r.getMessage() for r in caplog.records)


# ------------------------------------------------------------------------------------------- output_dir lock


def test_output_dir_lock_refuses_a_second_holder(tmp_path):
    from stabledrl_trl.output_lock import OutputDirInUseError, OutputDirLock

    first = OutputDirLock(str(tmp_path / "out")).acquire()
    with pytest.raises(OutputDirInUseError, match=rf"in use by another training run \(pid {os.getpid()} on"):
        OutputDirLock(str(tmp_path / "out")).acquire()
    first.release()
    with OutputDirLock(str(tmp_path / "out")) as again:  # released: free again
        assert again.held


def test_a_second_run_into_a_locked_output_dir_is_refused(tmp_path):
    """Another process holds the lock (it prints once it does, so there is no timing race): train() is refused
    before writing anything, and runs once that process has ended."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from stabledrl_trl.output_lock import OutputDirLock; "
         f"lock = OutputDirLock({str(out)!r}).acquire(); print('locked', flush=True); sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT},
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        from stabledrl_trl.output_lock import OutputDirInUseError

        args = llada_args(tmp_path, max_steps=1, save_strategy="steps", save_steps=1)
        trainer = StableDRLTrainer(
            model=llada(),
            reward_funcs=reward_len,
            args=args,
            train_dataset=dataset(),
            processing_class=build_tiny_tokenizer(),
        )
        with pytest.raises(OutputDirInUseError, match=rf"pid {holder.pid} on .*choose another output_dir"):
            trainer.train()
        assert not any(p.name.startswith("checkpoint-") for p in out.iterdir())
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=60)
    trainer.train()
    assert (out / "checkpoint-1").is_dir()


# ------------------------------------------------------------------------------------------- missing weights


def test_model_path_with_weights_missing_from_its_checkpoint_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from stabledrl_trl.stabledrl_trainer import CheckpointError

    path = tmp_path / "model"
    llama().save_pretrained(path)
    build_tiny_tokenizer().save_pretrained(path)
    weights = load_file(path / "model.safetensors")
    dropped = "model.layers.0.mlp.down_proj.weight"
    del weights[dropped]
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    args = StableDRLConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, **CPU)
    with pytest.raises(CheckpointError, match=rf"1 weight\(s\) missing from the checkpoint \(e.g. \['{dropped}'\]\)"):
        StableDRLTrainer(model=str(path), reward_funcs=reward_len, args=args, train_dataset=dataset())


# ------------------------------------------------------------------------------------------- tokenizer files


def test_model_folder_without_tokenizer_files_is_reported_as_such(tmp_path, load_script):
    """Not transformers' "missing sentencepiece" (train.py) or "unrecognized processing class" (the trainer)."""
    folder = tmp_path / "model"
    llada().save_pretrained(folder)
    args = llada_args(tmp_path)
    with pytest.raises(ValueError, match=r"model='.*model' has no tokenizer files .*processing_class=tokenizer"):
        StableDRLTrainer(model=str(folder), reward_funcs=reward_len, args=args, train_dataset=dataset())
    # with the tokenizer passed, the folder needs none
    trainer = StableDRLTrainer(
        model=str(folder),
        reward_funcs=reward_len,
        args=args,
        train_dataset=dataset(),
        processing_class=build_tiny_tokenizer(),
    )
    assert trainer.is_diffusion
    train = load_script("train")
    config = tmp_path / "run.yaml"
    config.write_text(f"model_name_or_path: {folder}\nuse_cpu: true\nbf16: false\nreport_to: none\n"
                      f"output_dir: {tmp_path / 'out'}\nper_device_train_batch_size: 4\nnum_generations: 4\n")  # fmt: skip
    with pytest.raises(ValueError, match=r"model_name_or_path='.*model' has no tokenizer files"):
        train.main(argv=["--config", str(config)])


# ------------------------------------------------------------------------------------------- two processes (slow)

SPLIT_GROUP_SCRIPT = """
import json, os, sys
from datasets import Dataset
from stabledrl_trl import StableDRLConfig, StableDRLTrainer

MODEL, OUTPUT_DIR = sys.argv[1], sys.argv[2]
dataset = Dataset.from_list([{"prompt": f"Count to {i}:"} for i in range(16)])

def reward_len(completions, **kwargs):
    return [-abs(5 - len(c)) for c in completions]

# TRL's layout: 2 rows per process, a group of 4 spans both processes
args = StableDRLConfig(output_dir=OUTPUT_DIR, max_steps=2, save_strategy="no", use_cpu=True, bf16=False,
                       report_to="none", per_device_train_batch_size=2, num_generations=4, max_completion_length=8,
                       loss_type="grpo", learning_rate=1e-2, seed=3)
trainer = StableDRLTrainer(model=MODEL, reward_funcs=reward_len, args=args, train_dataset=dataset)
trainer.train()
if trainer.accelerator.is_main_process:
    with open(os.path.join(OUTPUT_DIR, "result.json"), "w") as f:
        json.dump({"num_processes": trainer.accelerator.num_processes, "step": trainer.state.global_step}, f)
"""


@pytest.mark.slow
def test_a_group_split_over_two_processes_trains(tmp_path, clean_env):
    folder = tmp_path / "model"
    llada().save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    script = tmp_path / "split.py"
    script.write_text(SPLIT_GROUP_SCRIPT)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*cmd, str(script), str(folder), str(out)], env=clean_env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import json

    assert json.loads((out / "result.json").read_text()) == {"num_processes": 2, "step": 2}
