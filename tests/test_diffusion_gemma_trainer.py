"""StableDRLTrainer on a tiny DiffusionGemma: the family's sampler and uniform-noise estimator are used, the
package's objectives and sequence-level GRPO train it, LoRA trains adapters only, settings it cannot use are
refused when the trainer is built."""

import pytest
import torch
from tiny_run import digit_reward, make_dataset, params_copy, tiny_args

from stabledrl_trl import StableDRLTrainer
from stabledrl_trl.diffusion.families import diffusion_gemma as family_module
from stabledrl_trl.diffusion.family import detect_family, detect_family_from_config, get_family
from stabledrl_trl.tiny import build_tiny_tokenizer, tiny_diffusion_gemma_config


def make_gemma(seed=0):
    from transformers import DiffusionGemmaForBlockDiffusion

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return DiffusionGemmaForBlockDiffusion(tiny_diffusion_gemma_config())


def make_args(tmp_path, **kw):
    base = dict(gradient_accumulation_steps=1, max_completion_length=8, block_denoising_steps=3, max_steps=1, learning_rate=1e-3, logging_steps=1,
                save_strategy="no", seed=7, temperature=1.0, gradient_checkpointing=False)  # fmt: skip
    return tiny_args(tmp_path, **{**base, **kw})


def test_detected_from_model_and_from_config_before_loading(tmp_path):
    from transformers import AutoConfig

    model = make_gemma()
    assert detect_family(model) == "diffusion_gemma"
    model.config.save_pretrained(tmp_path)
    assert detect_family_from_config(AutoConfig.from_pretrained(tmp_path)) == "diffusion_gemma"
    assert detect_family_from_config(model.config.text_config) is None  # the text sub-config alone is not the model


RUNS = [
    ("stable_drl", "fresh", {"likelihood_estimator": "block_random"}),
    ("stable_drl_ratio", "fresh", {"likelihood_estimator": "block_random_coupled"}),
    ("dgpo", "shared", {}),
    ("grpo", "fresh", {"importance_sampling_level": "sequence"}),
]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, mask_seed_mode, extra", RUNS)
def test_gemma_trains_with_each_objective(tmp_path, count_calls, loss_type, mask_seed_mode, extra):
    calls = count_calls(family_module, "gemma_generate", "uniform_noise_estimate")
    args = make_args(tmp_path, loss_type=loss_type, mask_seed_mode=mask_seed_mode, **extra)
    trainer = StableDRLTrainer(model=make_gemma(), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                               processing_class=build_tiny_tokenizer())  # fmt: skip
    assert trainer._diffusion_family.name == "diffusion_gemma"
    before = params_copy(trainer.model)
    trainer.train()
    assert calls["gemma_generate"] >= 1 and calls["uniform_noise_estimate"] >= 1, calls
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    # the decoder's attention and the routed experts (shared with the encoder) move; the vision tower does not
    assert any("self_attn.q_proj" in n for n in changed) and any("experts" in n for n in changed)
    assert not any("vision" in n for n in changed)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 1 and torch.isfinite(torch.tensor(logs[0]["loss"]))
    assert logs[0]["stabledrl/estimator_passes"] == 2
    assert 0.0 < logs[0]["moe/expert_load_entropy_min"] <= logs[0]["moe/expert_load_entropy"] <= 1.0


@pytest.mark.slow
def test_gemma_lora_on_attention_mlp_and_experts(tmp_path):
    """LoRA on TRL's SFT targets (attention and dense-MLP linears of encoder and decoder) plus the routed experts'
    fused weights (peft target_parameters): only adapters change, the expert adapters among them."""
    from peft import LoraConfig

    model = make_gemma(seed=1)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=family_module.LORA_TARGET_MODULES,
                      target_parameters=list(family_module.LORA_EXPERT_PARAMETERS))  # fmt: skip
    args = make_args(tmp_path, loss_type="stable_drl", mask_seed_mode="shared", learning_rate=1e-2)
    trainer = StableDRLTrainer(model=model, reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                               processing_class=build_tiny_tokenizer(), peft_config=lora)  # fmt: skip
    before = params_copy(trainer.model)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(after[n], before[n]) for n in before if "lora_" not in n)
    changed = [n for n in before if "lora_" in n and not torch.equal(after[n], before[n])]
    assert any("self_attn" in n for n in changed) and any("experts" in n for n in changed), changed


REFUSED = [
    ({"sandwich": True}, "EUBO"),
    ({"likelihood_estimator": "mc_elbo"}, "uniform-random-token corruption"),
    ({"max_completion_length": 12}, "multiple of 8"),
    ({"top_k": 5}, "top_k=5"),
    ({"block_remasking": "low_confidence_static"}, "block_remasking"),
    ({"reward_text": "canvas"}, "reward_text='canvas'"),
    ({"p_mask_prompt": 0.15}, "p_mask_prompt"),
    ({"diffusion_sampler": "llada"}, "diffusion_sampler"),
    ({"remasking": "random"}, "remasking"),
    ({"estimator_chunk_size": 2}, "estimator_chunk_size"),
    ({"mask_token_id": 1}, "no mask token"),
]


@pytest.mark.parametrize("fields, message", REFUSED)
def test_settings_gemma_cannot_use_are_refused(tmp_path, fields, message):
    model = make_gemma()
    with pytest.raises(ValueError, match=message):
        get_family("diffusion_gemma").check(make_args(tmp_path, **fields), model)


def test_refused_when_the_trainer_is_built(tmp_path):
    with pytest.raises(ValueError, match="EUBO"):
        StableDRLTrainer(model=make_gemma(), reward_funcs=digit_reward, args=make_args(tmp_path, sandwich=True),
                         train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip


def test_short_completions_are_padded_to_whole_canvases(tmp_path):
    """TRL pads completions to the longest in the batch (here 5 < canvas 8): the estimate pads to whole canvases
    and returns the caller's width, equal to scoring the canvas-padded completion."""
    model = make_gemma().eval()
    fam = get_family("diffusion_gemma")
    from stabledrl_trl.diffusion.adapter import as_diffusion_lm

    lm = as_diffusion_lm(model, tokenizer=build_tiny_tokenizer(), family="diffusion_gemma")
    args = make_args(tmp_path)
    prompt = torch.tensor([[5, 6, 7]])
    comp = torch.tensor([[20, 21, 22, 23, 0]])
    cmask = torch.ones(1, 5, dtype=torch.long)
    with torch.no_grad():
        short = fam.estimate(lm, prompt, torch.ones_like(prompt), comp, cmask, args, seeds=torch.tensor([3]),
                             fill_token_id=0)  # fmt: skip
        full = fam.estimate(lm, prompt, torch.ones_like(prompt), torch.cat([comp, torch.zeros(1, 3, dtype=torch.long)], 1),
                            torch.cat([cmask, torch.zeros(1, 3, dtype=torch.long)], 1), args, seeds=torch.tensor([3]),
                            fill_token_id=0)  # fmt: skip
    assert short.token_logps.shape == (1, 5)
    torch.testing.assert_close(short.token_logps, full.token_logps[:, :5])
    assert float(short.seq_logps) < 0


def test_expert_load_counts_every_routed_token():
    """track_expert_load: each router's counts sum to tokens x top_k per forward through it, the trainer's entropy
    reads them (1 = uniform, by hand) and resets them."""
    from stabledrl_trl.stabledrl_trainer import expert_load_entropy

    model = make_gemma().eval()
    family_module.track_expert_load(model)
    family_module.track_expert_load(model)  # idempotent: one hook per router
    routers = [m for m in model.modules() if hasattr(m, "expert_load")]
    assert len(routers) == 4  # 2 encoder + 2 decoder layers
    from transformers import DynamicCache

    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        model(
            input_ids=ids,
            decoder_input_ids=torch.tensor([[8] * 8]),
            cache=DynamicCache(config=model.config.text_config),
        )
    k = model.config.text_config.top_k_experts
    sums = sorted(float(r.expert_load.sum()) for r in routers)
    assert sums == [3 * k, 3 * k, 8 * k, 8 * k]  # encoder routers saw 3 tokens, decoder routers 8
    for r in routers:
        r.expert_load.copy_(torch.tensor([1.0, 1, 1, 1]))
    out = expert_load_entropy(model)
    assert out["moe/expert_load_entropy"] == pytest.approx(1.0) and out[
        "moe/expert_load_entropy_min"
    ] == pytest.approx(1.0)
    assert all(float(r.expert_load.sum()) == 0 for r in routers)


def test_no_mask_token_needed(tmp_path):
    """DiffusionGemma corrupts with uniform-random tokens: a tokenizer without a mask token is fine, the adapter's
    mask id is the no-token sentinel (so no prompt token is refused as a mask), and an explicit mask id is refused."""
    from stabledrl_trl.diffusion.adapter import NO_MASK_TOKEN, as_diffusion_lm

    tok = build_tiny_tokenizer()
    tok.mask_token = None
    assert tok.mask_token_id is None
    lm = as_diffusion_lm(make_gemma(), tokenizer=tok, family="diffusion_gemma")
    assert lm.mask_token_id == NO_MASK_TOKEN == -1
    with pytest.raises(ValueError, match="no mask token"):
        as_diffusion_lm(make_gemma(), tokenizer=tok, family="diffusion_gemma", mask_token_id=1)
    trainer = StableDRLTrainer(model=make_gemma(), reward_funcs=digit_reward, args=make_args(tmp_path),
                               train_dataset=make_dataset(), processing_class=tok)  # fmt: skip
    assert trainer._model_adapter.mask_token_id == -1


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_step(tmp_path):
    """The decoder layers checkpoint with the encoder cache (they only read it): the loss and the updated weights
    equal the run without checkpointing."""
    results = []
    for checkpointing in (False, True):
        args = make_args(tmp_path / str(checkpointing), loss_type="stable_drl", mask_seed_mode="shared",
                         gradient_checkpointing=checkpointing, learning_rate=1e-2)  # fmt: skip
        trainer = StableDRLTrainer(model=make_gemma(seed=2), reward_funcs=digit_reward, args=args,
                                   train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip
        trainer.train()
        loss = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        weights = params_copy(trainer.model)
        results.append((loss, weights))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-4, abs=1e-6)
    for name, w in results[0][1].items():
        torch.testing.assert_close(w, results[1][1][name], atol=1e-5, rtol=1e-4)


def test_evaluation_decodes_with_the_family_sampler_and_the_card_snippet_runs():
    """evaluate_model runs DiffusionGemma's sampler from SamplerSettings (as training's rollouts), the same seed gives
    the same completions, and the model card's decoding snippet runs as written."""
    from stabledrl_trl.diffusion.adapter import as_diffusion_lm
    from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
    from stabledrl_trl.evaluation import evaluate_model

    model = make_gemma().eval()
    tok = build_tiny_tokenizer()
    settings = SamplerSettings.from_fields(max_completion_length=8, block_denoising_steps=2, temperature=1.0)
    rows = [{"prompt": [{"role": "user", "content": f"{i}{i}"}], "answer": str(i)} for i in range(3)]
    runs = [
        evaluate_model(model, tok, rows, digit_reward, settings=settings, batch_size=3, seed=5, progress=False)
        for _ in range(2)
    ]
    assert runs[0]["n"] == 3 and [r["completion"] for r in runs[0]["records"]] == [
        r["completion"] for r in runs[1]["records"]
    ]
    snippet = get_family("diffusion_gemma").card_snippet(settings)
    lm = as_diffusion_lm(model, tokenizer=tok, family="diffusion_gemma")
    inputs = tok(["12"], return_tensors="pt")
    scope = {"model": model, "lm": lm, "inputs": inputs}
    exec(snippet.imports + "\n" + snippet.call, scope)  # the package's own snippet text, not model output
    assert scope["out"].completion_ids.shape == (1, 8)


def test_trainer_loads_a_saved_model_by_path(tmp_path):
    """A DiffusionGemma folder given by path: detected before loading, loaded by TRL as
    DiffusionGemmaForBlockDiffusion (its config's architecture), and set up with the family."""
    folder = tmp_path / "gemma"
    make_gemma().save_pretrained(folder)
    build_tiny_tokenizer().save_pretrained(folder)
    from stabledrl_trl.validation import is_diffusion_before_loading

    args = make_args(tmp_path)
    assert is_diffusion_before_loading(str(folder), args) is True
    # the tiny folder has no image processor, so the tokenizer is passed (the hub model ships its processor)
    trainer = StableDRLTrainer(model=str(folder), reward_funcs=digit_reward, args=args, train_dataset=make_dataset(),
                               processing_class=build_tiny_tokenizer())  # fmt: skip
    assert type(trainer.model).__name__ == "DiffusionGemmaForBlockDiffusion"
    assert trainer._diffusion_family.name == "diffusion_gemma" and trainer._model_adapter.mask_token_id == -1


@pytest.mark.slow
def test_gemma_resumed_run_replays_exactly(tmp_path):
    """Train 4 steps saving at 2; a trainer resumed from checkpoint-2 logs the same steps 3-4: the rollout seeds, the
    uniform corruption and t come from the trainer's generators (seed and step), and the checkpoint restores the
    weights, the optimiser and the config."""
    import json

    def trainer_for(out):
        args = make_args(tmp_path, output_dir=str(out), max_steps=4, save_strategy="steps", save_steps=2,
                         loss_type="stable_drl", mask_seed_mode="fresh", num_iterations=2,
                         likelihood_estimator="block_random")  # fmt: skip
        return StableDRLTrainer(model=make_gemma(seed=3), reward_funcs=digit_reward, args=args,
                                train_dataset=make_dataset(), processing_class=build_tiny_tokenizer())  # fmt: skip

    full = trainer_for(tmp_path / "full")
    full.train()
    saved = json.loads((tmp_path / "full" / "checkpoint-2" / "config.json").read_text())
    assert saved["model_type"] == "diffusion_gemma"
    resumed = trainer_for(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))

    def logs(trainer):
        return {h["step"]: h for h in trainer.state.log_history if "loss" in h}

    expected, got = logs(full), logs(resumed)
    assert set(expected) == {1, 2, 3, 4} and {3, 4} <= set(got)  # the checkpoint carries steps 1-2's logs
    assert "stabledrl/weight_mean" in expected[4]
    # with 2 iterations the second pass scores against a moved model: weights other than 1 show the replay is real
    assert any(abs(expected[s]["stabledrl/weight_mean"] - 1.0) > 1e-6 for s in (3, 4))
    assert "reward" in expected[3]  # step 3 generates (2 iterations: a rollout every other step)
    for step in (3, 4):
        keys = [k for k in ("loss", "reward", "stabledrl/weight_mean", "grad_norm") if k in expected[step]]
        assert set(keys) <= set(got[step])
        for key in keys:
            assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    final_full = dict(full.model.named_parameters())
    for name, p in resumed.model.named_parameters():
        torch.testing.assert_close(p, final_full[name], rtol=1e-5, atol=1e-6)
