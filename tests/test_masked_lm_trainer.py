"""Any transformers masked LM trains as a masked-diffusion LM: a tiny BERT built locally, by path and as an object.

transformers 5 gives `BertForMaskedLM` no `generation_config` (it cannot generate); TRL writes the pad id into one
when the trainer is built, so the trainer gives such a model one first.
"""

from __future__ import annotations

import pytest
import torch
from test_reliability import digit_reward, make_args, make_dataset

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.tiny import build_tiny_tokenizer


def tiny_bert():
    from transformers import BertConfig, BertForMaskedLM

    tok = build_tiny_tokenizer()
    config = BertConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, max_position_embeddings=64, pad_token_id=tok.pad_token_id)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return BertForMaskedLM(config)


@pytest.mark.parametrize("as_path", [False, True])
def test_bert_for_masked_lm_trains_two_steps(tmp_path, as_path):
    model = tiny_bert()
    assert getattr(model, "generation_config", None) is None  # what used to fail inside TRL
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    if as_path:
        model.save_pretrained(tmp_path / "bert")
        build_tiny_tokenizer().save_pretrained(tmp_path / "bert")
        model = str(tmp_path / "bert")
    trainer = StableDRLTrainer(model=model, reward_funcs=digit_reward, args=make_args(tmp_path, max_steps=2),
                               train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip
    assert type(trainer.model).__name__ == "BertForMaskedLM"
    assert trainer.is_diffusion and trainer._family_name == "masked_lm"
    trainer.train()
    assert trainer.state.global_step == 2
    after = dict(trainer.model.named_parameters())
    changed = [n for n in before if not torch.equal(before[n], after[n].detach())]
    assert changed and all(torch.isfinite(p).all() for p in after.values())
    # rollouts came from the masked-diffusion sampler: every completion fits the fixed canvas
    lengths = [h["completions/max_length"] for h in trainer.state.log_history if "completions/max_length" in h]
    assert lengths and max(lengths) <= 8
    # saved and reloaded as the masked LM it is, with the trained weights
    from transformers import AutoModelForMaskedLM

    trainer.save_model(str(tmp_path / "saved"))
    reloaded = dict(AutoModelForMaskedLM.from_pretrained(tmp_path / "saved").named_parameters())
    assert all(torch.equal(reloaded[n], after[n].detach()) for n in changed)
