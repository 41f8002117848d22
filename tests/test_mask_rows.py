"""Per-row estimator masks in the trainer: every row draws its own masks (identical completions of a group too, as
the official StableDRL code does), and a row keeps its masks under any layout of micro-batches and processes."""

from types import SimpleNamespace

import pytest
import torch
from tiny_run import digit_reward, make_dataset, make_llada, tiny_args

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.diffusion.seeding import rollout_row_keys
from stabledrl_trl.tiny import build_tiny_tokenizer


def make_trainer(tmp_path, **kw):
    base = dict(
        gradient_accumulation_steps=1, max_completion_length=8, block_length=4, diffusion_steps=4,
        max_steps=1, logging_steps=1, save_strategy="no", gradient_checkpointing=False, seed=7,
        likelihood_estimator="block_random", estimator_block_size=4, mc_samples=2, mask_seed_mode="fresh",
    )  # fmt: skip
    return StableDRLTrainer(
        model=make_llada(), reward_funcs=digit_reward, args=tiny_args(tmp_path, **{**base, **kw}),
        train_dataset=make_dataset(), processing_class=build_tiny_tokenizer(),
    )  # fmt: skip


@pytest.mark.filterwarnings("ignore:temperature=0")
def test_identical_completions_of_a_group_get_independent_masks(tmp_path):
    # Greedy rollouts: the 4 completions of each prompt are identical tokens. Misaligned generation
    # (steps_per_generation 2, one accumulation step) makes TRL score the old policy right after generation.
    trainer = make_trainer(tmp_path, temperature=0.0, steps_per_generation=2, mask_seed_mode="fresh")
    captured = []
    original = trainer._generate_and_score_completions

    def capture(inputs):
        out = original(inputs)
        captured.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in out.items()})
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    out = captured[0]
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], 1)  # (8, L): two groups of 4
    keys, old = out["mask_row_key"], out["old_per_token_logps"]
    assert keys.shape == (8,) and len(set(keys.tolist())) == 8
    mask = out["completion_mask"].bool()
    for g in range(2):
        rows = slice(4 * g, 4 * g + 4)
        assert (ids[rows] == ids[rows][:1]).all()  # identical rows ...
        seq = (old[rows] * mask[rows]).sum(-1) / mask[rows].sum(-1)
        assert len(set(seq.tolist())) == 4, seq  # ... with four different likelihood estimates (their own masks)

    # What separates them is the row key alone: the same rows under one shared key get one estimate.
    trainer._scoring.mask_stream, trainer._scoring.mask_rows = (1, 0), torch.zeros(8, dtype=torch.long)
    am = torch.cat([out["prompt_mask"], out["completion_mask"]], 1)
    with torch.no_grad():
        shared, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, mask.shape[1])
    assert torch.equal(shared[0], shared[1]) and torch.equal(shared[4], shared[7])


def test_a_row_keeps_its_masks_in_any_micro_batch(tmp_path):
    trainer = make_trainer(tmp_path)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (6, 12), generator=gen)  # (B, P + C), C = 6
    am = torch.ones_like(ids)
    am[1, :3] = 0  # left padding
    am[4, 9:] = 0  # completion ends early
    keys = rollout_row_keys(40, 6, 5, 0)
    trainer._scoring.mask_stream = (3, 2, 1)
    with torch.no_grad():
        trainer._scoring.mask_rows = keys
        whole, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 6)
        perm = torch.tensor([4, 1, 5])
        trainer._scoring.mask_rows = keys[perm]
        part, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids[perm], am[perm], 6)
    torch.testing.assert_close(part, whole[perm], rtol=0, atol=1e-6)
    trainer._scoring.mask_rows = keys[:3]
    with pytest.raises(RuntimeError, match="one key per row"):
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, 6)


def _keys(trainer, monkeypatch, *, step, micro, process, processes, rows):
    """The trainer's keys for `rows` local rows generated at (optimiser step, micro-step) on `process`."""
    monkeypatch.setattr(trainer, "accelerator", SimpleNamespace(
        num_processes=processes, process_index=process, device=torch.device("cpu")))  # fmt: skip
    trainer.state.global_step, trainer._step = step, micro
    return trainer._rollout_row_keys(rows)


def test_row_keys_are_the_same_under_every_layout(tmp_path, monkeypatch):
    """The rows of one optimiser step (16 rows: 4 prompts x 4 completions) in TRL's sampler order get the same keys
    with one process and 2 micro-batches, one process and 4 generations per step, or 4 processes."""
    one_gen = make_trainer(tmp_path / "a", gradient_accumulation_steps=2, steps_per_generation=2,
                           per_device_train_batch_size=8)  # fmt: skip
    a = _keys(one_gen, monkeypatch, step=3, micro=0, process=0, processes=1, rows=16)
    per_micro = make_trainer(tmp_path / "b", gradient_accumulation_steps=4, steps_per_generation=1)
    b = torch.cat([_keys(per_micro, monkeypatch, step=3, micro=m, process=0, processes=1, rows=4) for m in range(4)])
    processes = make_trainer(tmp_path / "c", gradient_accumulation_steps=1)
    c = torch.cat([_keys(processes, monkeypatch, step=3, micro=0, process=p, processes=4, rows=4) for p in range(4)])
    assert torch.equal(a, b) and torch.equal(a, c)
    assert len(set(a.tolist())) == 16
    # the next optimiser step draws new rows; evaluation rollouts form their own stream
    following = _keys(one_gen, monkeypatch, step=4, micro=0, process=0, processes=1, rows=16)
    assert not set(a.tolist()) & set(following.tolist())
    one_gen.model.eval()
    evaluation = _keys(one_gen, monkeypatch, step=3, micro=0, process=0, processes=1, rows=16)
    assert not set(a.tolist()) & set(evaluation.tolist())
