"""SamplerSettings: the config's sampler fields, validated by the config's checks, decoding as training rollouts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from datasets import Dataset

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
from stabledrl_trl.evaluation import evaluate_model, render_prompt
from stabledrl_trl.tasks.digit_sort import format_example

SEED = 11


def _config(tmp_path, **fields) -> StableDRLConfig:
    base = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_steps=1, save_strategy="no", gradient_checkpointing=False, seed=7,
        mask_seed_mode="fresh", max_completion_length=8,
    )  # fmt: skip
    base.update(fields)
    return StableDRLConfig(**base)


def test_fields_are_the_configs_and_are_copied(tmp_path):
    config = _config(tmp_path, block_length=4, diffusion_steps=8, temperature=0.7, top_k=5, top_p=0.8,
                     rollout_cache="dual", parallel_threshold=0.6, max_tokens_per_step=2, reward_text="canvas")  # fmt: skip
    config_fields = {f.name for f in dataclasses.fields(StableDRLConfig)}
    assert set(SamplerSettings.field_names()) <= config_fields
    settings = SamplerSettings.from_config(config)
    for name in SamplerSettings.field_names():
        assert getattr(settings, name) == getattr(config, name), name
    assert (settings.rollout_cache, settings.parallel_threshold, settings.max_tokens_per_step) == ("dual", 0.6, 2)
    assert type(settings.temperature) is float and type(settings.max_completion_length) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.temperature = 0.0
    # an override changes that field only
    greedy = SamplerSettings.from_config(config, temperature=0.0)
    assert greedy == dataclasses.replace(settings, temperature=0.0)
    with pytest.raises(TypeError, match="'learning_rate'.*not sampler settings"):
        SamplerSettings.from_config(config, learning_rate=1.0)
    # from_fields fills the config's defaults, length-derived block_length / diffusion_steps included
    assert SamplerSettings.from_fields(max_completion_length=64) == SamplerSettings.from_config(
        _config(tmp_path, max_completion_length=64)
    )


@pytest.mark.parametrize(
    "field, value",
    [("top_p", 2.0), ("temperature", -1.0), ("remasking", "sideways"), ("diffusion_sampler", "fast"),
     ("block_length", 3), ("dream_eps", 1.5)],
)  # fmt: skip
def test_a_bad_setting_is_refused_with_trainings_message(tmp_path, field, value):
    with pytest.raises((ValueError, TypeError)) as training:
        _config(tmp_path, **{field: value})
    config = _config(tmp_path)
    with pytest.raises(type(training.value)) as evaluation:
        SamplerSettings.from_config(config, **{field: value})
    assert str(evaluation.value) == str(training.value)
    with pytest.raises(type(training.value)) as evaluation:
        SamplerSettings.from_fields(max_completion_length=8, **{field: value})
    assert str(evaluation.value) == str(training.value)


def _rows():
    return [format_example({"digits": d}) for d in ("4131", "0000", "9876", "5501")]


def _trainer_rollouts(trainer, tokenizer, rows, monkeypatch) -> list[str]:
    """The completions the trainer's rollout hook samples for `rows` with the generator seeded SEED, decoded as
    evaluation decodes them."""
    monkeypatch.setattr(trainer, "_generator", lambda *args: torch.Generator().manual_seed(SEED))
    texts = [render_prompt(tokenizer, r["prompt"]) for r in rows]
    prompt_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    completions, _ = trainer._generate_single_turn(prompt_ids, None, None, 1)
    return [tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]


def _check_evaluation_decodes_as_rollouts(tmp_path, model, tokenizer, monkeypatch, **fields):
    rows = _rows()
    trainer = StableDRLTrainer(
        model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=_config(tmp_path, **fields), train_dataset=Dataset.from_list(rows * 2), processing_class=tokenizer,
    )  # fmt: skip
    trainer.model.eval()
    rollouts = _trainer_rollouts(trainer, tokenizer, rows, monkeypatch)
    settings = SamplerSettings.from_config(trainer.args)
    result = evaluate_model(trainer.model, tokenizer, rows, "digit_sort", settings=settings, seed=SEED,
                            batch_size=len(rows), progress=False)  # fmt: skip
    assert [r["completion"] for r in result["records"]] == rollouts
    assert len(set(rollouts)) > 1  # sampled, varied completions: the comparison is not between empty strings
    return rollouts


def test_evaluation_decodes_as_llada_training_rollouts(tmp_path, tiny_llada, tiny_tokenizer, monkeypatch):
    """LLaDA with an approximate rollout mode (dual cache + parallel threshold) and top-k, sampled at 0.9."""
    from stabledrl_trl.diffusion import family_base as family_module  # where the samplers are called

    seen = []
    llada_generate = family_module.llada_generate

    def spy(*args, **kwargs):
        seen.append((kwargs["cache"], kwargs["threshold"], kwargs["top_k"]))
        return llada_generate(*args, **kwargs)

    monkeypatch.setattr(family_module, "llada_generate", spy)
    _check_evaluation_decodes_as_rollouts(
        tmp_path, tiny_llada, tiny_tokenizer, monkeypatch, block_length=4, diffusion_steps=8, temperature=0.9,
        top_k=20, rollout_cache="dual", parallel_threshold=0.5,
    )  # fmt: skip
    assert seen == [("dual", 0.5, 20)] * 2  # training's rollout, then evaluation's: the same approximate mode


def test_evaluation_decodes_as_sdar_training_rollouts(tmp_path, tiny_sdar, tiny_tokenizer, monkeypatch):
    _check_evaluation_decodes_as_rollouts(
        tmp_path, tiny_sdar(seed=0), tiny_tokenizer, monkeypatch, temperature=0.9, top_p=0.9,
        block_remasking="low_confidence_static", block_denoising_steps=2,
    )  # fmt: skip
