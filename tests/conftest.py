"""Shared pytest fixtures: the tiny tokenizer, tiny random models (LLaDA, Llama, SDAR, LLaDA2), call counting, the
LLaDA checkpoint fixture and a loader for the scripts in scripts/. Plain helpers of the trainer tests (a reward, a
dataset, a tiny run's config) are in `tiny_run.py`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures"
SCRIPTS = Path(__file__).parent.parent / "scripts"


@pytest.fixture(scope="session")
def load_script():
    """`load_script("train")` imports scripts/train.py as a module (once per session): scripts are not a package."""
    loaded = {}

    def load(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(f"scripts_{name}", SCRIPTS / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
            spec.loader.exec_module(module)
            loaded[name] = module
        return loaded[name]

    return load


@pytest.fixture
def clean_env() -> dict:
    """The environment a fresh shell gives a launched script: no launcher, torch.distributed or accelerate state that
    an earlier test (or the shell running pytest) left behind; one thread per process; this checkout importable."""
    drop = (
        "ACCELERATE_",
        "MASTER_",
        "TORCHELASTIC_",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    return env


@pytest.fixture
def tiny_tokenizer():
    """The char-level tokenizer of `stabledrl_trl.tiny` (EOS/pad 0, mask 1, <|eot_id|> 2, left padding)."""
    from stabledrl_trl.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture
def tiny_llada():
    """A float32 `LLaDAModelLM` from `tiny_llada_config_dict()`, in eval mode, same weights on every call.

    The weights come from seed 0 inside `fork_rng`, so the global RNG state is left as it was.
    """
    from stabledrl_trl.models.llada import LLaDAConfig, LLaDAModelLM
    from stabledrl_trl.tiny import tiny_llada_config_dict

    config = LLaDAConfig(**tiny_llada_config_dict())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LLaDAModelLM(config)
    return model.float().eval()


@pytest.fixture
def tiny_llama(tiny_tokenizer):
    """A tiny random autoregressive `LlamaForCausalLM` on the tiny tokenizer's ids (seed 0, global RNG untouched)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tiny_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        eos_token_id=tiny_tokenizer.eos_token_id,
        pad_token_id=tiny_tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config)


def _scaled_random(build_model, seed: int):
    """`build_model()` under seed `seed`, every weight but the norms redrawn N(0, 0.3^2) (large enough for confident,
    varied logits), in eval mode; the global RNG is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.endswith("norm.weight"):
                    p.copy_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="session")
def tiny_sdar():
    """`tiny_sdar(seed=0, **config_overrides)` builds a float32 `SDARForCausalLM` from `tiny_sdar_config_dict` in
    eval mode, every weight but the norms drawn N(0, 0.3^2) from `seed` (large enough for confident, varied
    logits); the global RNG is left as it was."""
    from stabledrl_trl.models.sdar import SDARConfig, SDARForCausalLM
    from stabledrl_trl.tiny import tiny_sdar_config_dict

    def build(seed: int = 0, **overrides):
        return _scaled_random(lambda: SDARForCausalLM(SDARConfig(**tiny_sdar_config_dict(**overrides))), seed)

    return build


@pytest.fixture(scope="session")
def tiny_llada2():
    """`tiny_llada2(seed=0, **config_overrides)` builds a float32 `LLaDA2MoeModelLM` (MoE block diffusion) from
    `tiny_llada2_config_dict` in eval mode, weights but the norms drawn N(0, 0.3^2) from `seed`, as `tiny_sdar`."""
    from stabledrl_trl.models.llada2 import LLaDA2MoeConfig, LLaDA2MoeModelLM
    from stabledrl_trl.tiny import tiny_llada2_config_dict

    def build(seed: int = 0, **overrides):
        return _scaled_random(lambda: LLaDA2MoeModelLM(LLaDA2MoeConfig(**tiny_llada2_config_dict(**overrides))), seed)

    return build


@pytest.fixture
def one_thread():
    """One intra-op thread during the test, restored after: tiny tensors gain nothing from intra-op threads, and
    spinning threads slow down badly on a busy machine. A module turns it on for all its tests with
    `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def count_calls(monkeypatch):
    """`count_calls(module, "f", "g")` replaces those functions of `module` by wrappers counting their calls (undone
    after the test) and returns the live counts {"f": 0, "g": 0}: which code path a run took."""

    def count(module, *names: str) -> dict[str, int]:
        calls = dict.fromkeys(names, 0)
        for name in names:
            original = getattr(module, name)

            def counted(*a, _name=name, _orig=original, **k):
                calls[_name] += 1
                return _orig(*a, **k)

            monkeypatch.setattr(module, name, counted)
        return calls

    return count


@pytest.fixture
def sandbox_batches(monkeypatch):
    """`batches = sandbox_batches()` (after `configure_code_sandbox`) records the size of every batch the shared code
    sandbox then runs (`run_many` calls, undone after the test): how many programs each reward call sent to it."""

    def record() -> list[int]:
        from stabledrl_trl.tasks import code as code_tasks

        batches = []
        box = code_tasks.code_sandbox()
        original = box.run_many
        monkeypatch.setattr(box, "run_many", lambda jobs: batches.append(len(jobs)) or original(jobs))
        return batches

    return record


@pytest.fixture(scope="session")
def llada_fixture_dir() -> Path:
    """tests/fixtures/llada-tiny: a LLaDA checkpoint written by LLaDA's own code, with reference logits."""
    return FIXTURES / "llada-tiny"
