"""scripts/make_tiny_model.py: a tiny model folder with its tokenizer that loads through the Auto classes, and the
README's drop-in snippet trains on it as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("architecture", ["llada", "sdar"])
def test_writes_a_model_and_tokenizer_that_load_by_path(load_script, tmp_path, capsys, architecture):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stabledrl_trl.diffusion.family import detect_family

    out = tmp_path / "tiny"
    load_script("make_tiny_model").main(["--output_dir", str(out), "--architecture", architecture])
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert tokenizer.mask_token_id is not None and tokenizer.pad_token_id is not None
    assert model.config.mask_token_id == tokenizer.mask_token_id and model.config.vocab_size == len(tokenizer)
    assert detect_family(model) is not None  # a diffusion LM the trainer recognises
    ids = tokenizer("sort 4131")["input_ids"]
    assert tokenizer.decode(ids) == "sort 4131"
    assert f"to {out}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="exists and is not empty"):
        load_script("make_tiny_model").main(["--output_dir", str(out)])


@pytest.mark.slow
def test_readme_drop_in_snippet_trains_on_the_tiny_model(tmp_path, clean_env):
    text = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^python scripts/make_tiny_model\.py --output_dir (\S+)", text, flags=re.M)
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert f'model="{command}"' in snippet
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), "--output_dir", command],
                   cwd=tmp_path, env=clean_env, check=True, capture_output=True, timeout=300)  # fmt: skip
    (tmp_path / "snippet.py").write_text(snippet)
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=clean_env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    output_dir = re.search(r'output_dir="([^"]+)"', snippet).group(1)
    assert (tmp_path / output_dir / "checkpoint-2" / "model.safetensors").is_file()  # max_steps=2: saved at the end
