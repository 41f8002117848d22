"""Presets on models that do not decode with LLaDA's sampler: refused before decoding, saying why (the official
evaluations the presets follow cover LLaDA only) and what scores the model instead."""

from __future__ import annotations

import pytest

from stabledrl_trl.protocol_eval import run_protocol
from stabledrl_trl.protocols import get_protocol
from stabledrl_trl.tiny import build_tiny_tokenizer


@pytest.mark.parametrize("name", ["stabledrl", "d1"])
def test_block_diffusion_models_are_refused_with_the_reason(tiny_sdar, tiny_llada2, name):
    protocol = get_protocol(name, "gsm8k")  # refused before its settings are checked against the tiny model
    rows = [{"question": "1+1?", "answer": "#### 2"}]
    for model, family in ((tiny_sdar(), "sdar"), (tiny_llada2(), "llada2")):
        with pytest.raises(ValueError, match=f"which {family} models cannot use.*publishes no evaluation of "
                           "block-diffusion.*scripts/evaluate.py --task gsm8k` without --protocol"):  # fmt: skip
            run_protocol(model, build_tiny_tokenizer(), protocol, rows, progress=False)
