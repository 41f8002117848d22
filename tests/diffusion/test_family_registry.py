"""Adding a model family is one module and one registration: a family defined and registered here, and nowhere
else, is detected, wrapped, sampled, trained and described in the model card with no other edit to the package."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from stabledrl_trl import StableDRLConfig, StableDRLTrainer
from stabledrl_trl.diffusion.adapter import realign_shifted_logits
from stabledrl_trl.diffusion.family import (
    FAMILIES,
    DiffusionFamily,
    MaskedDiffusionFamily,
    as_diffusion_lm,
    detect_family,
    detect_family_from_config,
    family_labels,
    get_family,
    register_family,
)
from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_llada_config_dict


class ToyConfig(LLaDAConfig):
    model_type = "toy_dlm"


class ToyModel(LLaDAModelLM):
    config_class = ToyConfig


class ToyFamily(MaskedDiffusionFamily):
    """A full-attention family whose outputs are shifted by one (as Dream's), without the canvas cache."""

    name = "toy"
    label = "Toy"
    model_types = ("toy_dlm",)
    shifted_logits = True
    supports_canvas_cache = False


@pytest.fixture
def toy_family():
    family = register_family(ToyFamily())
    yield family
    FAMILIES.pop("toy")


def _toy_model(seed=0) -> ToyModel:
    config = ToyConfig(**{k: v for k, v in tiny_llada_config_dict().items() if k != "model_type"})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ToyModel(config).float()


def test_a_registered_family_is_detected_from_the_model_and_from_its_config(toy_family):
    model = _toy_model()
    assert model.config.model_type == "toy_dlm"
    assert detect_family(model) == "toy" and get_family("toy") is toy_family
    assert detect_family_from_config(SimpleNamespace(model_type="TOY_DLM")) == "toy"  # case-insensitive
    assert "Toy" in family_labels()
    FAMILIES.pop("toy")
    try:
        assert detect_family(model) is None  # unregistered: nothing else in the package knows the model type
    finally:
        register_family(toy_family)


def test_the_adapter_reads_the_familys_logit_alignment_and_cache_support(toy_family):
    model = _toy_model().eval()
    tokenizer = build_tiny_tokenizer()
    adapter = as_diffusion_lm(model, tokenizer)
    assert adapter.family == "toy" and not adapter.supports_canvas_cache
    ids = torch.tensor([[0, 0, 5, 6, 7, 1], [4, 5, 6, 7, 1, 1]])  # (B, L), row 0 left-padded
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        raw = adapter.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
        aligned = adapter(ids, mask)
        kept = adapter(ids, mask, logits_to_keep=torch.tensor([2, 5]))
    expected = realign_shifted_logits(raw.float(), mask)  # output i-1 at position i; a row's first token its own
    torch.testing.assert_close(aligned, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(kept, expected[:, [2, 5]], rtol=0, atol=1e-6)
    assert not torch.allclose(aligned[:, 3:], raw[:, 3:].float())  # the shift did happen


def test_a_registered_family_trains_and_writes_its_model_card(toy_family, tmp_path):
    def digit_reward(completions, **kwargs):
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    args = StableDRLConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
        num_generations=4, max_completion_length=8, block_length=4, diffusion_steps=4, max_steps=2,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", temperature=0.9,
    )  # fmt: skip
    model = _toy_model()
    trainer = StableDRLTrainer(
        model=model,
        reward_funcs=digit_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": f"{i}+{i + 1}="} for i in range(8)]),
        processing_class=build_tiny_tokenizer(),
    )
    assert trainer.is_diffusion and trainer._family_name == "toy" and trainer._diffusion_family is toy_family
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)
    trainer.create_model_card()
    card = (tmp_path / "out" / "README.md").read_text()
    assert "from stabledrl_trl.diffusion.llada_sampler import generate" in card  # the family's sampler (LLaDA's)
    assert "block_length=4" in card and "LLaDA's masked-diffusion sampler, 8 positions in blocks of 4" in card
    # the card tells its reader to import the module that registers the family (here, this test module)
    assert f"import {__name__}  # registers the 'toy' family" in card and "is not part of stabledrl_trl" in card


def test_a_family_without_a_way_to_be_detected_or_with_a_taken_name_is_refused(toy_family):
    class Nameless(MaskedDiffusionFamily):
        name = "nameless"
        model_types = ()

    class Unnamed(DiffusionFamily):
        model_types = ("x",)

    with pytest.raises(ValueError, match="no model_types and no `matches`"):
        register_family(Nameless())
    with pytest.raises(ValueError, match="needs a `name` of its own"):
        register_family(Unnamed())
    with pytest.raises(ValueError, match="'toy' is already registered"):
        register_family(ToyFamily())
    with pytest.raises(TypeError, match="DiffusionFamily instance"):
        register_family(ToyFamily)

    class Bare(DiffusionFamily):  # the interface alone: nothing to decode or score with
        name = "bare"
        model_types = ("bare_dlm",)

    with pytest.raises(TypeError, match=r"Bare does not implement estimate .*; generate .*; card_snippet"):
        register_family(Bare())
    assert "bare" not in FAMILIES
    assert register_family(ToyFamily(), replace=True) is FAMILIES["toy"]
