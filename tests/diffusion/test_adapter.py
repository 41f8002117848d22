"""DiffusionAdapter: family detection, special ids, logit alignment and exact left padding for all families."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForMaskedLM,
    BertModel,
    LlamaConfig,
    LlamaForCausalLM,
    ModernBertConfig,
    ModernBertForMaskedLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    RobertaConfig,
    RobertaForMaskedLM,
)

from stabledrl_trl.diffusion.adapter import DiffusionAdapter
from stabledrl_trl.diffusion.family import as_diffusion_lm, detect_family, is_diffusion_model
from stabledrl_trl.models.dream import DreamConfig, DreamModel

V = 101  # every tiny model below uses the tiny tokenizer's vocabulary size


def seeded(build, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def tiny_dream():
    config = DreamConfig(
        vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, mask_token_id=1, eos_token_id=0, pad_token_id=0,
    )  # fmt: skip
    return seeded(lambda: DreamModel(config))


def tiny_bert():
    config = BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    return seeded(lambda: BertForMaskedLM(config))


def tiny_modernbert():
    config = ModernBertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0, eos_token_id=0, bos_token_id=3, cls_token_id=3, sep_token_id=0,
        global_attn_every_n_layers=3, local_attention=8,
    )  # fmt: skip
    return seeded(lambda: ModernBertForMaskedLM(config))


def tiny_roberta():
    config = RobertaConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip
    return seeded(lambda: RobertaForMaskedLM(config))


MODELS = {"dream": tiny_dream, "bert": tiny_bert, "modernbert": tiny_modernbert, "roberta": tiny_roberta}
FAMILY = {"llada": "llada", "dream": "dream", "bert": "masked_lm", "modernbert": "masked_lm", "roberta": "masked_lm"}


@pytest.fixture(params=["llada", "dream", "bert", "modernbert", "roberta"])
def any_model(request):
    if request.param == "llada":
        return request.param, request.getfixturevalue("tiny_llada")
    return request.param, MODELS[request.param]()


def left_padded_batch(seed: int, lengths=(12, 8, 5), pad_id: int = 0):
    """Rows of random real tokens (ids 5..100) left padded with `pad_id`, and their attention mask."""
    g = torch.Generator().manual_seed(seed)
    L = max(lengths)
    rows = [torch.randint(5, V, (n,), generator=g) for n in lengths]
    ids = torch.stack([F.pad(r, (L - len(r), 0), value=pad_id) for r in rows])  # (B, L)
    mask = (torch.arange(L)[None] >= (L - torch.tensor(lengths))[:, None]).long()  # (B, L)
    return rows, ids, mask


def test_family_detection(any_model, tiny_tokenizer):
    name, model = any_model
    assert detect_family(model) == FAMILY[name] and is_diffusion_model(model)
    adapter = as_diffusion_lm(model, tiny_tokenizer, mask_token_id=None if name in ("llada", "dream") else 1)
    assert adapter.family == FAMILY[name] and adapter.model is model


@pytest.mark.parametrize(
    "build",
    [
        lambda: LlamaForCausalLM(
            LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
        ),
        lambda: Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=V,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=4,
                num_key_value_heads=4,
                intermediate_size=64,
            )
        ),
        lambda: BertModel(
            BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
        ),
        lambda: BartForConditionalGeneration(
            BartConfig(
                vocab_size=V,
                d_model=32,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
            )
        ),
    ],
    ids=["llama", "qwen2", "bert_no_head", "bart"],
)
def test_autoregressive_and_headless_models_are_not_diffusion(build, tiny_tokenizer):
    model = seeded(build)
    assert detect_family(model) is None and not is_diffusion_model(model)
    with pytest.raises(ValueError, match="not a masked diffusion LM"):
        as_diffusion_lm(model, tiny_tokenizer)


def test_left_padded_rows_equal_rows_alone(any_model, tiny_tokenizer):
    name, model = any_model
    adapter = as_diffusion_lm(model, tiny_tokenizer, mask_token_id=1)
    rows, ids, mask = left_padded_batch(seed=len(name))
    L = ids.shape[1]
    with torch.no_grad():
        batch = adapter(ids, mask)
        assert batch.shape == (3, L, V) and batch.dtype == torch.float32
        for i, row in enumerate(rows):
            alone = adapter(row[None])[0]  # no padding, no mask
            assert (batch[i, L - len(row) :] - alone).abs().max() <= 1e-5, (name, i)
        # Without the mask the padded rows do change: the test would notice padding being attended.
        unmasked = adapter(ids)
    assert (unmasked[2, L - len(rows[2]) :] - batch[2, L - len(rows[2]) :]).abs().max() > 1e-4


def test_alignment_per_family(any_model, tiny_tokenizer):
    name, model = any_model
    adapter = as_diffusion_lm(model, tiny_tokenizer, mask_token_id=1)
    ids = torch.randint(5, V, (2, 9), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        raw = model(input_ids=ids).logits
        aligned = adapter(ids)
    if name == "dream":
        # Dream's output i-1 predicts token i; position 0 repeats output 0 (it is never a predicted position).
        assert torch.equal(aligned[:, 1:], raw[:, :-1])
        assert torch.equal(aligned[:, 0], raw[:, 0])
    else:
        assert torch.equal(aligned, raw)


def test_roberta_positions_start_after_padding_idx(tiny_tokenizer):
    # RoBERTa numbers positions from padding_idx + 1; without padding the adapter's positions must equal the model's.
    model = tiny_roberta()
    adapter = as_diffusion_lm(model, tiny_tokenizer, mask_token_id=1)
    assert adapter.position_offset == 1
    ids = torch.randint(5, V, (1, 7), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        assert torch.allclose(adapter(ids, torch.ones_like(ids)), model(input_ids=ids).logits, atol=1e-6)


def test_special_ids_from_config_and_tokenizer(tiny_llada, tiny_tokenizer):
    with_tokenizer = as_diffusion_lm(tiny_llada, tiny_tokenizer)
    assert (with_tokenizer.mask_token_id, with_tokenizer.pad_token_id) == (1, 0)
    assert with_tokenizer.eos_token_ids == (0, 2)  # <|endoftext|> and <|eot_id|>
    config_only = as_diffusion_lm(tiny_llada)
    assert (config_only.mask_token_id, config_only.eos_token_ids, config_only.pad_token_id) == (1, (0,), 0)
    # Nothing is hard-coded: other ids in the config are followed.
    tiny_llada.config.mask_token_id, tiny_llada.config.eos_token_id = 7, [8, 9]
    tiny_llada.generation_config.eos_token_id = 9  # the generation config's EOS ids are merged in too
    moved = as_diffusion_lm(tiny_llada)
    assert (moved.mask_token_id, moved.eos_token_ids) == (7, (8, 9))
    assert as_diffusion_lm(tiny_llada, mask_token_id=5).mask_token_id == 5


def test_im_end_counts_as_end_of_turn(tiny_tokenizer):
    tiny_tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    adapter = as_diffusion_lm(tiny_bert(), tiny_tokenizer, mask_token_id=1)
    assert adapter.eos_token_ids == (0, 2, tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"))


def test_diffucoder_dlm_pad_ends_a_completion(tiny_tokenizer):
    # DiffuCoder cuts its output at the first <|dlm_pad|>: it is an end id like EOS.
    tiny_tokenizer.add_special_tokens({"additional_special_tokens": ["<|dlm_pad|>"]})
    dlm_pad = tiny_tokenizer.convert_tokens_to_ids("<|dlm_pad|>")
    adapter = as_diffusion_lm(tiny_bert(), tiny_tokenizer, mask_token_id=1)
    assert adapter.eos_token_ids == (0, 2, dlm_pad)


def test_bad_special_ids_raise(tiny_llada, tiny_tokenizer):
    bert = tiny_bert()
    with pytest.raises(ValueError, match="mask_token_id"):
        as_diffusion_lm(bert, eos_token_ids=[0])  # neither config nor tokenizer has a mask token
    with pytest.raises(ValueError, match="eos_token_ids"):
        as_diffusion_lm(bert, mask_token_id=1)  # BERT's config has no EOS and there is no tokenizer
    with pytest.raises(ValueError, match=r"tokenizer.pad_token = tokenizer.eos_token"):
        as_diffusion_lm(tiny_llada, tiny_tokenizer, pad_token_id=1)
    with pytest.raises(ValueError, match=r"mask_token_id=0 is the pad token id.*Give the model's mask token id"):
        as_diffusion_lm(tiny_llada, tiny_tokenizer, mask_token_id=0)  # the user's mask id is wrong, not the pad
    tiny_tokenizer.pad_token = "<|mdm_mask|>"
    with pytest.raises(ValueError, match="pad_token_id == mask_token_id"):
        as_diffusion_lm(tiny_llada, tiny_tokenizer)
    tiny_llada.config.mask_token_id = 3
    tiny_tokenizer.pad_token = "<|endoftext|>"
    with pytest.raises(ValueError, match="differs from the tokenizer"):
        as_diffusion_lm(tiny_llada, tiny_tokenizer)
    with pytest.raises(ValueError, match="family"):
        as_diffusion_lm(tiny_llada, family="ar")
    adapter = as_diffusion_lm(tiny_llada, mask_token_id=1)
    with pytest.raises(ValueError, match="attention_mask shape"):
        adapter(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 5))
    with pytest.raises(ValueError, match="input_ids"):
        adapter(torch.zeros(4, dtype=torch.long))


def test_explicit_family_override(tiny_tokenizer):
    # A causal model is wrapped only on explicit request.
    llama = seeded(
        lambda: LlamaForCausalLM(
            LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
        )
    )
    adapter = as_diffusion_lm(llama, tiny_tokenizer, family="llada")
    assert adapter.family == "llada" and adapter.mask_token_id == 1


class Wrapper(nn.Module):
    """Stands in for DDP / FSDP(1): the model sits in `.module`, calls go through the wrapper."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.module(*args, **kwargs)


def test_wrapped_model_is_called_through_the_wrapper(tiny_llada, tiny_tokenizer):
    wrapper = Wrapper(tiny_llada)
    adapter = as_diffusion_lm(wrapper, tiny_tokenizer)
    assert adapter.family == "llada" and adapter.config is tiny_llada.config
    ids = torch.randint(5, V, (1, 6), generator=torch.Generator().manual_seed(13))
    with torch.no_grad():
        assert torch.equal(adapter(ids), tiny_llada(ids).logits)
    assert wrapper.calls == 1


PEFT_TARGETS = {
    "llada": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "dream": ["q_proj", "v_proj", "down_proj"],
    "bert": ["query", "value"],
    "modernbert": ["Wqkv", "Wo"],
    "roberta": ["query", "value"],
}


def test_peft_model(any_model, tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    name, model = any_model
    rows, ids, mask = left_padded_batch(seed=14, lengths=(8, 5))
    with torch.no_grad():
        base = as_diffusion_lm(model, tiny_tokenizer, mask_token_id=1)(ids, mask)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=PEFT_TARGETS[name]))
    adapter = as_diffusion_lm(peft_model, tiny_tokenizer, mask_token_id=1)
    assert adapter.family == FAMILY[name] and adapter.model is peft_model
    with torch.no_grad():
        assert torch.allclose(adapter(ids, mask), base, atol=1e-6)  # LoRA starts as the identity
        for pname, param in peft_model.named_parameters():
            if "lora_B" in pname:
                param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(len(pname)))
        tuned = adapter(ids, mask)
        assert not tuned.requires_grad
    assert (tuned - base).abs().max() > 1e-3  # the LoRA weights are used: the wrapper is what runs
    # Padding invariance holds through PEFT too, and gradients reach the LoRA weights.
    with torch.no_grad():
        alone = adapter(rows[1][None])[0]
    assert (tuned[1, -len(rows[1]) :] - alone).abs().max() <= 1e-5
    logits = adapter(ids, mask)
    assert logits.requires_grad
    logits[mask.bool()].logsumexp(-1).sum().backward()
    lora_grads = [p.grad for n, p in peft_model.named_parameters() if "lora_A" in n]
    assert lora_grads and all(g is not None and g.abs().sum() > 0 for g in lora_grads)


def test_bf16_model_gives_float32_logits(tiny_llada, tiny_tokenizer):
    adapter = as_diffusion_lm(tiny_llada.to(torch.bfloat16), tiny_tokenizer)
    with torch.no_grad():
        logits = adapter(torch.randint(5, V, (1, 6), generator=torch.Generator().manual_seed(15)))
    assert logits.dtype == torch.float32


def test_adapter_of_adapter_keeps_the_model(tiny_llada, tiny_tokenizer):
    adapter = as_diffusion_lm(tiny_llada, tiny_tokenizer)
    again = as_diffusion_lm(adapter, tiny_tokenizer)
    assert isinstance(again, DiffusionAdapter) and again.model is tiny_llada


def test_realign_shifted_logits_by_hand():
    from stabledrl_trl.diffusion.adapter import realign_shifted_logits

    logits = torch.tensor([[10.0, 11.0, 12.0, 13.0], [20.0, 21.0, 22.0, 23.0]])[..., None]  # (2, 4, 1)
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    # Row 0: its first real token (position 1) keeps its own output; later positions take the previous output.
    expected = torch.tensor([[10.0, 11.0, 11.0, 12.0], [20.0, 20.0, 21.0, 22.0]])[..., None]
    assert torch.equal(realign_shifted_logits(logits, mask), expected)
    assert torch.equal(
        realign_shifted_logits(logits), torch.tensor([[10.0, 10.0, 11.0, 12.0], [20.0, 20.0, 21.0, 22.0]])[..., None]
    )


# ----------------------------------------------------------------------------------------------------------------
# logits_to_keep: logits at some positions only.


@pytest.mark.parametrize("padded", [False, True])
def test_logits_to_keep_equals_full_logits_at_those_positions(any_model, tiny_tokenizer, padded):
    name, model = any_model
    adapter = as_diffusion_lm(model, tiny_tokenizer, mask_token_id=None if name in ("llada", "dream") else 1)
    _, ids, mask = left_padded_batch(seed=31)
    mask = mask if padded else None
    full = adapter(ids, mask)  # (B, L, V)
    for keep in (torch.tensor([3, 4, 5, 11]), torch.tensor([0, 7]), torch.tensor([8])):
        kept = adapter(ids, mask, logits_to_keep=keep)
        assert kept.shape == (ids.shape[0], keep.numel(), V) and kept.dtype == torch.float32
        torch.testing.assert_close(kept, full[:, keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adapter(ids, mask, logits_to_keep=4), full[:, -4:], rtol=1e-5, atol=1e-5)


def test_logits_to_keep_runs_the_head_on_kept_positions_only(tiny_llada, tiny_tokenizer):
    adapter = as_diffusion_lm(tiny_llada, tiny_tokenizer)
    seen = []
    hook = tiny_llada.lm_head.register_forward_hook(lambda module, inp, out: seen.append(inp[0].shape))
    try:
        adapter(torch.randint(5, V, (2, 10), generator=torch.Generator().manual_seed(0)), logits_to_keep=3)
    finally:
        hook.remove()
    assert seen == [torch.Size([2, 3, 64])]


def test_adapter_is_handed_its_family_object_not_a_name(tiny_llada):
    """The adapter reads its facts from the family object it is handed (it never looks a name up in the registry)."""
    from stabledrl_trl.diffusion.family import get_family

    with pytest.raises(TypeError, match="DiffusionFamily object, got 'llada'"):
        DiffusionAdapter(tiny_llada, "llada", 1, (2,), 0)
    adapter = DiffusionAdapter(tiny_llada, get_family("dream"), 1, (2,), 0)
    assert adapter.family == "dream" and adapter.family_object is get_family("dream")
    assert not adapter.supports_canvas_cache and get_family("llada").supports_canvas_cache
