"""The estimators' one shared signature (`estimators.shared_keywords` and `EstimatorInputs`): every estimator takes
the same inputs and keywords, declares only its own options, and a new one written on `EstimatorInputs` is called
with exactly what its caller passed."""

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
import torch

from stabledrl_trl.diffusion import estimators
from stabledrl_trl.diffusion.estimators import SHARED_KEYWORDS, EstimatorInputs, shared_keywords

POSITIONAL = ["logits_fn", "prompt_ids", "prompt_mask", "completion_ids", "completion_mask"]
# (num_samples, p_mask_prompt) defaults and own options of each built-in estimator, as the papers' code has them
BUILT_IN = {
    "mean_field": (1, 0.15, {}),
    "mc_elbo": (2, 0.0, {"t_sampling": "uniform", "eps": 1e-3}),
    "mc_elbo_inv_t": (2, 0.0, {"t_sampling": "uniform", "eps": 1e-3}),
    "block_random": (2, 0.15, {"block_size": 32}),
    "block_random_coupled": (2, 0.15, {"block_size": 32}),
    "coupled": (2, 0.0, {}),
    "sdmc": (None, 0.0, {"nodes": 3}),
    "sdmc_coupled": (None, 0.0, {"nodes": 3}),
}


@pytest.mark.parametrize("name", sorted(BUILT_IN))
def test_every_built_in_estimator_has_the_shared_signature_and_its_own_options(name):
    num_samples, p_mask_prompt, own = BUILT_IN[name]
    params = inspect.signature(estimators.ESTIMATORS[name]).parameters
    assert list(params) == [*POSITIONAL, *SHARED_KEYWORDS, *own]
    assert all(params[p].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in POSITIONAL)
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY for k in [*SHARED_KEYWORDS, *own])
    defaults = {k: params[k].default for k in params if params[k].default is not inspect.Parameter.empty}
    assert defaults == {
        "num_samples": num_samples,
        "p_mask_prompt": p_mask_prompt,
        "chunk_size": None,
        "eubo_beta": None,
        "context_mask": None,
        "mask_context": False,
        **own,
    }
    assert list(inspect.signature(estimators.ESTIMATORS[name].on_inputs).parameters) == ["x", *own]


def test_shared_keywords_are_the_fields_of_the_inputs_after_the_tensors():
    names = [f.name for f in dataclasses.fields(EstimatorInputs)]
    assert names == [*POSITIONAL, *SHARED_KEYWORDS]
    assert SHARED_KEYWORDS == (
        "mask_token_id", "seed", "num_samples", "p_mask_prompt", "chunk_size", "eubo_beta", "context_mask",
        "mask_context",
    )  # fmt: skip


def test_an_estimator_on_inputs_receives_exactly_what_its_caller_passed():
    seen = []

    @shared_keywords(num_samples=4, p_mask_prompt=0.25)
    def probe(x: EstimatorInputs, *, width: int = 7):
        seen.append((x, width))
        return "result"

    fn, pid, pm, cid, cm = (object() for _ in range(5))
    assert probe(fn, pid, pm, cid, cm, mask_token_id=3, seed=11) == "result"
    x, width = seen[-1]
    assert (x.logits_fn, x.prompt_ids, x.prompt_mask, x.completion_ids, x.completion_mask) == (fn, pid, pm, cid, cm)
    assert (x.mask_token_id, x.seed, x.num_samples, x.p_mask_prompt, width) == (3, 11, 4, 0.25, 7)
    assert (x.chunk_size, x.eubo_beta, x.context_mask, x.mask_context) == (None, None, None, False)
    ctx = torch.zeros(1, 2)
    probe(fn, pid, pm, cid, cm, mask_token_id=0, seed=1, num_samples=6, p_mask_prompt=0.0, chunk_size=2,
          eubo_beta=1.5, context_mask=ctx, mask_context=True, width=9)  # fmt: skip
    x, width = seen[-1]
    assert (x.num_samples, x.p_mask_prompt, x.chunk_size, x.eubo_beta, x.mask_context) == (6, 0.0, 2, 1.5, True)
    assert width == 9
    assert x.context_mask is ctx
    with pytest.raises(TypeError, match="unexpected keyword argument 'block_size'"):
        probe(fn, pid, pm, cid, cm, mask_token_id=0, seed=1, block_size=3)
    with pytest.raises(TypeError, match="mask_token_id"):
        probe(fn, pid, pm, cid, cm, seed=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.seed = 2  # frozen: an estimator cannot change what the next one sees


def test_own_options_must_be_keyword_only_and_not_shared_names():
    with pytest.raises(TypeError, match=r"probe: its own options \['width'\] must be keyword-only"):

        @shared_keywords(num_samples=2, p_mask_prompt=0.0)
        def probe(x, width=3):
            return x

    with pytest.raises(TypeError, match=r"\['num_samples'\] must be keyword-only .* not one of the shared"):

        @shared_keywords(num_samples=2, p_mask_prompt=0.0)
        def probe2(x, *, num_samples=3):
            return x


def test_an_estimator_built_on_another_one_gives_its_estimate_and_registers_its_own_option():
    torch.manual_seed(0)
    V = 9
    W = torch.randn(V, V)

    def logits_fn(ids, attn):  # (N, L) -> (N, L, V)
        return torch.nn.functional.one_hot(ids, V).float() @ W

    pid, pm = torch.randint(2, V, (2, 3)), torch.ones(2, 3, dtype=torch.long)
    cid, cm = torch.randint(2, V, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    cm[1, 6:] = 0

    @shared_keywords(num_samples=None, p_mask_prompt=0.0)
    def halves(x: EstimatorInputs, *, block_size: int = 4):
        return estimators.block_random.on_inputs(x, block_size=block_size)

    kw = dict(mask_token_id=1, seed=torch.tensor([5, 6]), num_samples=2)
    ours = halves(logits_fn, pid, pm, cid, cm, **kw)
    theirs = estimators.block_random(logits_fn, pid, pm, cid, cm, p_mask_prompt=0.0, block_size=4, **kw)
    assert torch.equal(ours.token_logps, theirs.token_logps) and torch.equal(ours.seq_logps, theirs.seq_logps)
    try:
        estimators.register_estimator("toy_halves", default_samples=2, options={"block_size": "estimator_block_size"})(
            halves
        )
        spec = estimators.get_estimator_spec("toy_halves")
        assert spec.option_values(SimpleNamespace(estimator_block_size=None)) == {"block_size": 4}  # its default
        assert spec.option_values(SimpleNamespace(estimator_block_size=2)) == {"block_size": 2}
        via_name = estimators.estimate_likelihood("toy_halves", logits_fn, pid, pm, cid, cm, **kw)
        assert torch.equal(via_name.seq_logps, ours.seq_logps)
    finally:
        estimators.ESTIMATOR_SPECS.pop("toy_halves", None)


def test_staircase_estimates_pass_the_block_option_to_any_estimator_declaring_it(tiny_sdar):
    """`staircase_estimate(estimator_block_size=...)` reaches every registered estimator whose options declare
    `block_size` (the registry says which), and is refused for one that does not."""
    from stabledrl_trl.diffusion.block_estimators import staircase_estimate

    model = tiny_sdar(seed=1)
    pid = torch.tensor([[5, 6, 7], [0, 8, 9]])
    pm = (pid != 0).long()
    cid = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 0], [17, 18, 19, 20, 0, 0, 0, 0]])
    cm = (cid != 0).long()

    @shared_keywords(num_samples=2, p_mask_prompt=0.0)
    def same_blocks(x: EstimatorInputs, *, block_size: int = 32):
        return estimators.block_random.on_inputs(x, block_size=block_size)

    kw = dict(block_size=4, mask_token_id=1, seed=torch.tensor([3, 4]), num_samples=2, p_mask_prompt=0.0)
    try:
        estimators.register_estimator("toy_same_blocks", options={"block_size": "estimator_block_size"})(same_blocks)
        with torch.no_grad():
            ours = staircase_estimate("toy_same_blocks", model, pid, pm, cid, cm, estimator_block_size=2, **kw)
            theirs = staircase_estimate("block_random", model, pid, pm, cid, cm, estimator_block_size=2, **kw)
            wider = staircase_estimate("block_random", model, pid, pm, cid, cm, estimator_block_size=8, **kw)
        assert torch.equal(ours.seq_logps, theirs.seq_logps)
        assert not torch.equal(ours.seq_logps, wider.seq_logps)  # the option reached the masks
    finally:
        estimators.ESTIMATOR_SPECS.pop("toy_same_blocks", None)
    with pytest.raises(
        ValueError, match="estimator_block_size is an option of 'block_random' masks, not of 'mc_elbo'"
    ):
        staircase_estimate("mc_elbo", model, pid, pm, cid, cm, estimator_block_size=2, **kw)
