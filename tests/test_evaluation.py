"""Tests for evaluate_model: exact accuracy with a model of known answers, batching and seed invariances."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stabledrl_trl.diffusion.adapter import DiffusionAdapter
from stabledrl_trl.diffusion.family import get_family
from stabledrl_trl.diffusion.sampler_settings import SamplerSettings
from stabledrl_trl.evaluation import evaluate_draws, evaluate_model, left_pad
from stabledrl_trl.tasks.digit_sort import digit_sort_correctness_reward, format_example

EOS, MASK, EOT = 0, 1, 2
GEN = 8


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


class FixedAnswerModel(torch.nn.Module):
    """Predicts the token sequence `answer_ids` on the last GEN positions, whatever the prompt (logit +50)."""

    def __init__(self, answer_ids: list[int], vocab_size: int = 101, gen: int = GEN):
        super().__init__()
        self.vocab_size = vocab_size
        self.gen = gen
        self.answer_ids = answer_ids + [EOS] * (gen - len(answer_ids))
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the module a device
        self.calls = []

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        self.calls.append(tuple(input_ids.shape))
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.vocab_size)  # (B, L, V)
        for j, token in enumerate(self.answer_ids):
            logits[:, length - self.gen + j, token] = 50.0
        return SimpleNamespace(logits=logits)


def _rows(digit_strings):
    return [format_example({"digits": d}) for d in digit_strings]


def _fixed_adapter(tokenizer, answer: str) -> DiffusionAdapter:
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [EOT]
    return DiffusionAdapter(FixedAnswerModel(answer_ids), get_family("llada"), MASK, (EOS, EOT), EOS)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_known_answers_give_exact_accuracy(tiny_tokenizer, temperature):
    # The model always answers "1234": right for the two rows whose digits sort to 1234, wrong for the other three.
    rows = _rows(["4321", "9999", "2143", "1235", "0123"])
    adapter = _fixed_adapter(tiny_tokenizer, "1234")
    result = evaluate_model(
        adapter,
        tiny_tokenizer,
        rows,
        digit_sort_correctness_reward,
        settings=SamplerSettings.from_fields(
            max_completion_length=GEN, block_length=4, diffusion_steps=8, temperature=temperature
        ),
        batch_size=2,
        seed=0,
        progress=False,
    )
    assert result["accuracy"] == pytest.approx(2 / 5)
    assert result["n"] == 5 and result["num_rows"] == 5
    assert [r["completion"] for r in result["records"]] == ["1234"] * 5
    assert [r["reward"] for r in result["records"]] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert [r["answer"] for r in result["records"]] == ["1234", "9999", "1234", "1235", "0123"]
    assert result["records"][0]["prompt"] == "<|user|>sort 4321<|eot_id|><|assistant|>"
    # batches of 2, 2 and 1 rows, 8 steps each; length = prompt (<|user|> sort 4321 <|eot_id|><|assistant|>: 12) + GEN
    assert adapter.model.calls == [(2, 20)] * 8 + [(2, 20)] * 8 + [(1, 20)] * 8


def test_task_name_and_taskspec_are_accepted(tiny_tokenizer):
    from stabledrl_trl.tasks import get_task

    rows = _rows(["4321", "9999"])
    for reward in ("digit_sort", get_task("digit_sort")):
        result = evaluate_model(
            _fixed_adapter(tiny_tokenizer, "9999"),
            tiny_tokenizer,
            rows,
            reward,
            settings=_settings(GEN, GEN, 4),
            progress=False,
        )
        assert result["accuracy"] == 0.5


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def _tiny_eval(model, tokenizer, rows, batch_size=4, seed=0, **fields):
    """evaluate_model on digit_sort; fields: SamplerSettings fields over gen 8, blocks of 4, 4 steps, greedy."""
    sampler = dict(max_completion_length=GEN, block_length=4, diffusion_steps=4, temperature=0.0)
    sampler.update(fields)
    settings = SamplerSettings.from_fields(**sampler)
    return evaluate_model(model, tokenizer, rows, "digit_sort", settings=settings, batch_size=batch_size, seed=seed,
                          progress=False)  # fmt: skip


def _settings(length, block_length, steps, temperature=0.0, **fields) -> SamplerSettings:
    return SamplerSettings.from_fields(
        max_completion_length=length, block_length=block_length, diffusion_steps=steps, temperature=temperature,
        **fields,
    )  # fmt: skip


def _varied_rows():
    # prompts of different lengths (system prompts of different sizes), so batches are left-padded
    rows = _rows(["4131", "0000", "9876", "5501", "1212", "3333", "7081"])
    for i, row in enumerate(rows):
        row["prompt"] = [{"role": "user", "content": "x" * i + row["prompt"][0]["content"]}]
    return rows


def test_batching_does_not_change_greedy_results(tiny_tokenizer, tiny_llada):
    rows = _varied_rows()
    one = _tiny_eval(tiny_llada, tiny_tokenizer, rows, batch_size=1)
    four = _tiny_eval(tiny_llada, tiny_tokenizer, rows, batch_size=4)
    assert one["records"] == four["records"]
    assert one["accuracy"] == four["accuracy"]


def test_sampling_is_seeded(tiny_tokenizer, tiny_llada):
    rows = _varied_rows()
    state = torch.random.get_rng_state()
    a = _tiny_eval(tiny_llada, tiny_tokenizer, rows, temperature=1.0, seed=3)
    b = _tiny_eval(tiny_llada, tiny_tokenizer, rows, temperature=1.0, seed=3)
    c = _tiny_eval(tiny_llada, tiny_tokenizer, rows, temperature=1.0, seed=4)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is never used
    assert a["records"] == b["records"]
    assert [r["completion"] for r in a["records"]] != [r["completion"] for r in c["records"]]


def test_restores_training_mode(tiny_tokenizer, tiny_llada):
    tiny_llada.train()
    _tiny_eval(tiny_llada, tiny_tokenizer, _rows(["1234"]))
    assert tiny_llada.training


def test_bad_arguments(tiny_tokenizer, tiny_llada):
    rows = _rows(["1234"])
    with pytest.raises(ValueError, match="batch_size"):
        _tiny_eval(tiny_llada, tiny_tokenizer, rows, batch_size=0)
    with pytest.raises(ValueError, match="block_length"):
        _tiny_eval(tiny_llada, tiny_tokenizer, rows, block_length=3)
    with pytest.raises(ValueError, match="empty"):
        _tiny_eval(tiny_llada, tiny_tokenizer, [])
    with pytest.raises(ValueError, match="unknown task"):
        evaluate_model(tiny_llada, tiny_tokenizer, rows, "no_such_task", settings=_settings(8, 8, 8))
    with pytest.raises(TypeError, match="settings must be a SamplerSettings"):
        evaluate_model(tiny_llada, tiny_tokenizer, rows, "digit_sort", settings={"max_completion_length": 8})


def test_block_diffusion_model_uses_the_block_sampler(tiny_tokenizer):
    """An SDAR model is evaluated with its cached block sampler: the records equal block_generate's completions."""
    from stabledrl_trl.diffusion.block_sampler import block_generate
    from stabledrl_trl.diffusion.family import as_diffusion_lm
    from stabledrl_trl.evaluation import render_prompt
    from stabledrl_trl.sft import build_tiny_model

    model = build_tiny_model(tiny_tokenizer, seed=1, architecture="sdar").eval()
    rows = _rows(["4131", "9876", "5501"])
    settings = _settings(GEN, None, None, temperature=0.0, block_remasking="low_confidence_static")
    result = evaluate_model(model, tiny_tokenizer, rows, digit_sort_correctness_reward, settings=settings, batch_size=2,
                            progress=False)  # fmt: skip
    adapter = as_diffusion_lm(model, tiny_tokenizer)
    for row, record in zip(rows, result["records"]):
        ids = torch.tensor([tiny_tokenizer(render_prompt(tiny_tokenizer, row["prompt"]), add_special_tokens=False)[
            "input_ids"]])  # fmt: skip
        out = block_generate(model, ids, torch.ones_like(ids), mask_token_id=MASK, eos_token_ids=adapter.eos_token_ids,
                             pad_token_id=EOS, block_size=4, gen_length=GEN, temperature=0.0,
                             remasking="low_confidence_static")  # fmt: skip
        text = tiny_tokenizer.decode(out.completion_ids[0][out.completion_mask[0].bool()], skip_special_tokens=True)
        assert record["completion"] == text
    with pytest.raises(ValueError, match="denoising_steps=8 exceeds"):
        evaluate_model(model, tiny_tokenizer, rows, digit_sort_correctness_reward,
                       settings=_settings(GEN, None, None, block_denoising_steps=8), progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="block_length.*diffusion_steps.*which sdar models do not use"):
        evaluate_model(model, tiny_tokenizer, rows, digit_sort_correctness_reward,
                       settings=_settings(GEN, 4, 2), progress=False)  # LLaDA's layout: not this sampler's  # fmt: skip


# ---- grading: the tasks' tagged correctness reward or the official StableDRL grading


def _evaluate_fixed(tokenizer, answer, rows, task, grading):
    gen = 32
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [EOT]
    adapter = DiffusionAdapter(FixedAnswerModel(answer_ids, gen=gen), get_family("llada"), MASK, (EOS, EOT), EOS)
    return evaluate_model(adapter, tokenizer, rows, task, settings=_settings(gen, gen, gen), progress=False,
                          grading=grading)  # fmt: skip


def test_official_grading_counts_completions_with_the_full_official_score(tiny_tokenizer):
    from stabledrl_trl.tasks import countdown

    # Every row gets the completion "<answer>3*4</answer>" (= 12). Official scores: 1 (exact), 1 (a subset of the
    # numbers is accepted), 0.1 (tagged but wrong), 0.1 (a number not in the list); tagged correctness: 1, 0, 0, 0.
    cases = [([3, 4], 12), ([3, 4, 5], 12), ([3, 4], 13), ([2, 6], 12)]
    rows = [countdown.format_example_official({"nums": n, "target": t}) for n, t in cases]
    official = _evaluate_fixed(tiny_tokenizer, "<answer>3*4</answer>", rows, "countdown", "official")
    assert [r["completion"] for r in official["records"]] == ["<answer>3*4</answer>"] * 4
    assert [r["reward"] for r in official["records"]] == pytest.approx([1.0, 1.0, 0.1, 0.1])
    assert [r["correct"] for r in official["records"]] == [True, True, False, False]
    assert official["accuracy"] == 0.5  # the fraction at full score, not the mean score (0.55)
    assert (official["grading"], official["full_score"], official["n"]) == ("official", 1.0, 4)
    tagged = _evaluate_fixed(tiny_tokenizer, "<answer>3*4</answer>", rows, "countdown", None)
    assert [r["reward"] for r in tagged["records"]] == [1.0, 0.0, 0.0, 0.0]
    assert (tagged["accuracy"], tagged["grading"], tagged["full_score"]) == (0.25, "tagged", None)
    assert "correct" not in tagged["records"][0]


def test_official_grading_of_plus_minus_one_rewards(tiny_tokenizer):
    from stabledrl_trl.tasks import get_task

    # GSM8K's official reward is +1 / -1: accuracy is the fraction at +1 (1/2), not the mean reward (0).
    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": a} for a in ("12", "13")]
    result = _evaluate_fixed(tiny_tokenizer, "so \\boxed{12}", rows, get_task("gsm8k"), "official")
    assert [r["reward"] for r in result["records"]] == [1.0, -1.0]
    assert result["accuracy"] == 0.5


def test_grading_errors(tiny_tokenizer):
    rows = _rows(["4321"])
    with pytest.raises(ValueError, match="grading='official': task 'digit_sort' has no official"):
        _evaluate_fixed(tiny_tokenizer, "1234", rows, "digit_sort", "official")
    with pytest.raises(ValueError, match="grading='exact'; choose one of tagged, official"):
        _evaluate_fixed(tiny_tokenizer, "1234", rows, "digit_sort", "exact")
    with pytest.raises(ValueError, match="pass the task"):
        _evaluate_fixed(tiny_tokenizer, "1234", rows, digit_sort_correctness_reward, "official")
    custom = _evaluate_fixed(tiny_tokenizer, "1234", rows, digit_sort_correctness_reward, None)
    assert (custom["grading"], custom["accuracy"]) == ("custom", 1.0)


def _tiny_dream():
    from stabledrl_trl.models.dream import DreamConfig, DreamModel

    config = DreamConfig(vocab_size=101, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, mask_token_id=MASK, eos_token_id=EOS,
                         pad_token_id=EOS, bos_token_id=EOS)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return DreamModel(config).eval()


def test_each_family_is_evaluated_with_its_training_sampler(tiny_tokenizer, tiny_llada, monkeypatch):
    from stabledrl_trl.diffusion import family as family_module
    from stabledrl_trl.diffusion.dream_sampler import generate as dream_generate

    calls = []
    for name, sampler in dict(family_module.SAMPLERS).items():

        def spy(*args, _name=name, _run=sampler.run):
            calls.append(_name)
            return _run(*args)

        monkeypatch.setitem(family_module.SAMPLERS, name, sampler._replace(run=spy))
    rows = _rows(["4131", "0000"])
    dream = _tiny_dream()
    result = _tiny_eval(dream, tiny_tokenizer, rows, temperature=0.0, dream_alg="maskgit_plus", batch_size=2,
                        block_length=None)
    assert calls == ["dream"]
    # the completions are Dream's sampler's, run directly on the same left-padded prompts
    from stabledrl_trl.diffusion.family import as_diffusion_lm
    from stabledrl_trl.evaluation import render_prompt

    ids = [
        tiny_tokenizer(render_prompt(tiny_tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows
    ]
    prompt, mask = left_pad(ids, EOS)
    out = dream_generate(as_diffusion_lm(dream, tiny_tokenizer), prompt, mask, mask_token_id=MASK, gen_length=GEN,
                         steps=4, alg="maskgit_plus", eos_token_ids=(EOS, EOT))  # fmt: skip
    expected = [tiny_tokenizer.decode(c[m.bool()].tolist(), skip_special_tokens=True)
                for c, m in zip(out.completion_ids, out.completion_mask)]  # fmt: skip
    assert [r["completion"] for r in result["records"]] == expected
    _tiny_eval(dream, tiny_tokenizer, rows, diffusion_sampler="llada")
    _tiny_eval(tiny_llada, tiny_tokenizer, rows)
    assert calls == ["dream", "llada", "llada"]
    with pytest.raises(ValueError, match="dream_alg"):  # a Dream-sampler setting LLaDA's sampler would ignore
        _tiny_eval(tiny_llada, tiny_tokenizer, rows, dream_alg="origin")
    with pytest.raises(ValueError, match="sampler="):
        _tiny_eval(tiny_llada, tiny_tokenizer, rows, diffusion_sampler="fast")


def test_block_diffusion_model_is_evaluated_with_its_block_sampler(tiny_tokenizer, monkeypatch):
    from transformers import AutoConfig, AutoModelForCausalLM

    from stabledrl_trl.tiny import tiny_sdar_config_dict

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        sdar = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny_sdar_config_dict())).eval()
    calls = []
    from stabledrl_trl.diffusion.families import block_causal as sdar_family  # where the block families call it

    block_generate = sdar_family.block_generate

    def counted(*args, **kwargs):
        calls.append(kwargs["block_size"])
        return block_generate(*args, **kwargs)

    monkeypatch.setattr(sdar_family, "block_generate", counted)
    result = _tiny_eval(sdar, tiny_tokenizer, _rows(["4131", "0000"]), block_length=None, diffusion_steps=None)
    assert calls and result["num_rows"] == 2
    with pytest.raises(ValueError, match="diffusion_sampler='dream'"):
        _tiny_eval(sdar, tiny_tokenizer, _rows(["4131"]), diffusion_sampler="dream", block_length=None)
    with pytest.raises(ValueError, match="dream_alg"):  # a setting its sampler would ignore
        _tiny_eval(sdar, tiny_tokenizer, _rows(["4131"]), dream_alg="origin", block_length=None)


def _distinct_characters(prompts, completions, **kwargs):
    """A graded reward (distinct characters / 8), so sampled draws of a random model differ in accuracy."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [len(set(t)) / 8 for t in texts]


def test_evaluation_draws_differ_are_seeded_and_summarised(tiny_tokenizer, tiny_llada):
    rows = _varied_rows()
    settings = dict(batch_size=4, progress=False)
    sampled = _settings(GEN, 4, 4, temperature=1.0)
    result = evaluate_draws(
        tiny_llada, tiny_tokenizer, rows, _distinct_characters, draws=4, seed=10, settings=sampled, **settings
    )
    assert result["seeds"] == [10, 11, 12, 13] and result["n"] == len(rows) and result["temperature"] == 1.0
    assert len(set(result["draws"])) > 1  # each draw has its own generator stream
    # draw d is evaluate_model with seed 10 + d; greedy is evaluate_model at temperature 0
    for d, accuracy in enumerate(result["draws"]):
        alone = evaluate_model(tiny_llada, tiny_tokenizer, rows, _distinct_characters, settings=sampled, seed=10 + d,
                               **settings)  # fmt: skip
        assert accuracy == alone["accuracy"]
    greedy = evaluate_model(tiny_llada, tiny_tokenizer, rows, _distinct_characters,
                            settings=_settings(GEN, 4, 4, temperature=0.0), **settings)  # fmt: skip
    assert result["greedy"] == greedy["accuracy"]
    # mean and sample std (n - 1) of the draws
    values = result["draws"]
    mean = sum(values) / 4
    assert result["mean"] == pytest.approx(mean, abs=1e-12)
    assert result["std"] == pytest.approx((sum((v - mean) ** 2 for v in values) / 3) ** 0.5, abs=1e-12)
    again = evaluate_draws(
        tiny_llada, tiny_tokenizer, rows, _distinct_characters, draws=4, seed=10, settings=sampled, greedy=False,
        **settings,
    )  # fmt: skip
    assert again["draws"] == result["draws"] and again["greedy"] is None


def test_evaluation_draws_refuse_a_non_positive_count(tiny_tokenizer, tiny_llada):
    with pytest.raises(ValueError, match="draws must be a positive integer"):
        evaluate_draws(tiny_llada, tiny_tokenizer, _rows(["1234"]), "digit_sort", draws=0,
                       settings=_settings(GEN, 4, 4, temperature=0.9))  # fmt: skip
