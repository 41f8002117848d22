"""A tiny character-level tokenizer and tiny LLaDA-, SDAR- and LLaDA2-architecture configs, built locally.

Everything here runs without a model hub: tests, the embedded CPU default (`configs/tiny.yaml`) and the benchmarks
build their tokenizer and model from these functions. The tokenizer follows LLaDA's conventions (a dedicated mask
token, `<|endoftext|>` as both EOS and padding, `<|eot_id|>` closing a chat turn) and ships a chat template, so the
task code can call `apply_chat_template` exactly as it does for LLaDA-8B-Instruct.
"""

from __future__ import annotations

import string

SPECIAL_TOKENS = ["<|endoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|user|>", "<|assistant|>"]
CHARACTERS = list(string.digits + string.ascii_letters + string.punctuation + " \n")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{% elif message['role'] == 'assistant' %}<|assistant|>"
    "{% else %}<|user|>{% endif %}{{ message['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tiny_tokenizer():
    """Return a `PreTrainedTokenizerFast` with one token per character plus LLaDA-style special tokens.

    Ids: `<|endoftext|>` 0 (EOS and pad, as in LLaDA), `<|mdm_mask|>` 1 (mask), `<|eot_id|>` 2, `<|user|>` 3,
    `<|assistant|>` 4, then the characters. Vocabulary size 5 + 96 = 101.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    # One token per character: split every character into its own piece.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIAL_TOKENS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        mask_token="<|mdm_mask|>",
        additional_special_tokens=["<|eot_id|>", "<|user|>", "<|assistant|>"],
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llada_config_dict(vocab_size: int = 101, **overrides) -> dict:
    """A LLaDA-format `config.json` dictionary (LLaDA's own key names) for a tiny model.

    Defaults match the tiny tokenizer above (mask 1, EOS/pad 0). Pass overrides such as `n_kv_heads=2` (grouped-query
    attention) or `weight_tying=True`.
    """
    config = {
        "model_type": "llada",
        "architectures": ["LLaDAModelLM"],
        "d_model": 64,
        "n_heads": 4,
        "n_kv_heads": 4,
        "n_layers": 2,
        "mlp_hidden_size": 128,
        "vocab_size": vocab_size,
        "embedding_size": vocab_size,
        "max_sequence_length": 512,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "weight_tying": False,
        "block_type": "llama",
        "layer_norm_type": "rms",
        "activation_type": "silu",
        "include_bias": False,
        "mask_token_id": 1,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }
    config.update(overrides)
    return config


def tiny_sdar_config_dict(vocab_size: int = 101, **overrides) -> dict:
    """An SDAR-format `config.json` dictionary (SDAR's hub keys, model_type "sdar") for a tiny block-diffusion model.

    Defaults match the tiny tokenizer above (mask 1, EOS/pad 0) with block size 4 like the released SDAR checkpoints.
    Pass overrides such as `num_key_value_heads=2` (grouped-query attention) or `tie_word_embeddings=True`.
    """
    config = {
        "model_type": "sdar",
        "architectures": ["SDARForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "block_size": 4,
        "mask_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }
    config.update(overrides)
    return config


def tiny_llada2_config_dict(vocab_size: int = 101, **overrides) -> dict:
    """A LLaDA2-format `config.json` dictionary (the hub's keys, model_type "llada2_moe") for a tiny MoE model.

    Defaults match the tiny tokenizer above (mask 1, EOS/pad 0): block size 4, 3 layers (the first dense, then MoE
    layers of 8 routed SwiGLU experts in 2 groups, 2 experts per token from 1 group, one shared expert), GQA with
    partial RoPE and q/k RMSNorm as in LLaDA2.0-mini.
    """
    config = {
        "model_type": "llada2_moe",
        "architectures": ["LLaDA2MoeModelLM"],
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "partial_rotary_factor": 0.5,
        "num_experts": 8,
        "num_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 2.5,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "use_qk_norm": True,
        "tie_word_embeddings": False,
        "block_size": 4,
        "mask_token_id": 1,
        "eos_token_id": 0,
        "pad_token_id": 0,
    }
    config.update(overrides)
    return config


def tiny_diffusion_gemma_config(vocab_size: int = 104, canvas_length: int = 8, **text_overrides):
    """A tiny random `DiffusionGemmaConfig` (transformers' own class, model_type "diffusion_gemma").

    Text model as REFERENCE.md §15 sizes it (hidden 32, 2 layers: one sliding and the last full attention, 2 heads,
    1 KV head, head dim 16, MoE with 4 experts of width 32, 2 per token), the vision tower shrunk to one 16-wide layer
    (left at its defaults it holds most of the parameters), EOS / pad 0 as the tiny tokenizer above. The vocabulary
    is the tiny tokenizer's 101 tokens plus the three image ids transformers needs (begin, end, placeholder: 101-103,
    which the tokenizer never produces and skips when decoding). `sliding_window` 512 keeps every tiny prompt + completion inside the window.
    """
    from transformers import DiffusionGemmaConfig

    text = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "global_head_dim": 16,
        "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 32,
        "max_position_embeddings": 1024,
        "pad_token_id": 0,
        "eos_token_id": 0,
        "bos_token_id": None,
    }
    text.update(text_overrides)
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "position_embedding_size": 16,
        "patch_size": 4,
    }
    return DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        boi_token_id=vocab_size - 3,
        eoi_token_id=vocab_size - 2,
        image_token_id=vocab_size - 1,
    )
