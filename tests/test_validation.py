"""The validation layers of `stabledrl_trl/validation.py`, one function each: every one refuses a representative bad
input with a message naming the field, and passes (returning what it resolved) for a good one.

The layers are called directly, without building a trainer; tests/test_reliability*.py, test_trl_fields.py and
test_stabledrl_trainer.py check the same errors through `StableDRLTrainer`."""

from __future__ import annotations

import re

import pytest
import torch
from datasets import Dataset
from test_reliability import make_args, make_dataset, make_llada

from stabledrl_trl import validation
from stabledrl_trl.diffusion.adapter import DiffusionAdapter
from stabledrl_trl.safety import check_fresh_output_dir
from stabledrl_trl.tiny import build_tiny_tokenizer

CPU = torch.device("cpu")


def model_setup(args, model, tokenizer, family="llada", is_diffusion=True, router_aux_loss_coef=None):
    return validation.check_model_setup(
        args,
        model,
        tokenizer,
        family=family,
        is_diffusion=is_diffusion,
        router_aux_loss_coef=router_aux_loss_coef,
        device=CPU,
    )


def data_setup(args, model, tokenizer, train_dataset, eval_dataset=None, is_diffusion=True):
    validation.check_data_setup(
        args,
        model,
        tokenizer,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        mask_token_id=1 if is_diffusion else None,  # the tiny tokenizer's mask id
        is_diffusion=is_diffusion,
        num_processes=1,
    )


# --------------------------------------------------------------------------- the docstring names every layer


def test_docstring_names_each_layers_function_and_they_exist():
    doc = validation.__doc__
    layers = re.findall(r"^(\d)\. (\w[\w ]*): `?([\w.]+)", doc, flags=re.MULTILINE)
    assert [(n, name) for n, name, _ in layers] == [
        ("1", "config"), ("2", "inputs before loading"), ("3", "model"), ("4", "data"), ("5", "launch"), ("6", "run"),
    ]  # fmt: skip
    functions = [f for _, _, f in layers]
    assert functions[0] == "StableDRLConfig.__post_init__"
    assert functions[1:5] == [
        "check_inputs_before_loading", "check_model_setup", "check_data_setup", "check_launch_setup",
    ]  # fmt: skip
    assert all(callable(getattr(validation, name)) for name in functions[1:5])
    assert functions[5] == "safety.py"


# --------------------------------------------------------------------------- 1. config


def test_config_layer_refuses_an_out_of_range_field_and_accepts_the_default(tmp_path):
    with pytest.raises(ValueError, match=r"clip_c=0\.5 is out of range.*\(1, inf\)"):
        make_args(tmp_path, clip_c=0.5)
    assert make_args(tmp_path, clip_c=5.0).clip_c == 5.0


# --------------------------------------------------------------------------- 2. inputs before loading


def test_inputs_layer_refuses_an_empty_dataset_a_file_and_use_vllm(tmp_path):
    args = make_args(tmp_path)
    with pytest.raises(ValueError, match=r"^eval_dataset\['b'\] has no rows"):
        validation.check_inputs_before_loading(
            make_llada(), args, {"train_dataset": make_dataset(2), "eval_dataset": {"a": make_dataset(1), "b": []}}
        )
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=rf"^model={str(file)!r} is a file"):
        validation.check_inputs_before_loading(str(file), args, {"train_dataset": make_dataset(2)})
    with pytest.raises(ValueError, match=r"^use_vllm=True cannot apply"):
        validation.check_inputs_before_loading(make_llada(), make_args(tmp_path, use_vllm=True), {})


def test_inputs_layer_returns_whether_the_model_is_a_diffusion_lm(tmp_path, tiny_llama):
    args = make_args(tmp_path)
    inputs = {"train_dataset": make_dataset(2)}
    assert validation.check_inputs_before_loading(make_llada(), args, inputs) is True
    assert validation.check_inputs_before_loading(tiny_llama, args, inputs) is False
    folder = tmp_path / "llada"
    make_llada().save_pretrained(folder)  # a local folder: told from its config.json before loading
    build_tiny_tokenizer().save_pretrained(folder)  # TRL loads the tokenizer from it (checked before loading)
    assert validation.check_inputs_before_loading(str(folder), args, inputs) is True
    assert args.model_init_kwargs is None  # the check sets nothing (the trainer adds use_safetensors)


def test_model_source_names_the_field_it_is_given(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"\0")
    with pytest.raises(ValueError, match=rf"^model_name_or_path at {str(folder)!r} has only pickle weights"):
        validation.check_model_source(str(folder), field="model_name_or_path")
    validation.check_model_source(str(folder), field="model_name_or_path", allow_pickle=True)
    missing = tmp_path / "no" / "model"
    with pytest.raises(FileNotFoundError, match=rf"^base_model_name_or_path={str(missing)!r} looks like a local"):
        validation.check_model_source(str(missing), field="base_model_name_or_path")


# --------------------------------------------------------------------------- 3. model


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"max_completion_length": None}, "max_completion_length=None: a diffusion LM decodes a fixed canvas"),
        ({"mask_token_id": 3}, "mask_token_id=3 (a StableDRLConfig field) disagrees with the model"),
        ({"dream_alg": "origin"}, "{'dream_alg': 'origin'} only apply to Dream's sampler"),
    ],
)
def test_model_layer_refuses_a_setting_the_model_cannot_run(tmp_path, tiny_tokenizer, fields, words):
    with pytest.raises(ValueError) as info:
        model_setup(make_args(tmp_path, **fields), make_llada(), tiny_tokenizer)
    assert words in str(info.value), str(info.value)


def test_model_layer_refuses_a_forced_diffusion_and_an_ignored_router_loss(tmp_path, tiny_tokenizer, tiny_llama):
    with pytest.raises(ValueError, match=r"^diffusion=True, but LlamaForCausalLM \(model_type='llama'\)"):
        model_setup(make_args(tmp_path, diffusion=True), tiny_llama, tiny_tokenizer, family=None)
    with pytest.raises(ValueError, match=r"^router_aux_loss_coef=0\.01: LlamaForCausalLM.*loss_type='stable_drl'"):
        model_setup(make_args(tmp_path), tiny_llama, tiny_tokenizer, None, False, router_aux_loss_coef=0.01)


def test_model_layer_returns_the_resolved_special_ids(tmp_path, tiny_tokenizer, tiny_llama):
    adapter = model_setup(make_args(tmp_path), make_llada(), tiny_tokenizer)
    assert isinstance(adapter, DiffusionAdapter) and adapter.family == "llada"
    assert adapter.mask_token_id == 1 and adapter.pad_token_id == tiny_tokenizer.pad_token_id == 0
    assert set(adapter.eos_token_ids) == {0, 2}  # <|endoftext|> and <|eot_id|> of the tiny tokenizer
    assert model_setup(make_args(tmp_path), tiny_llama, tiny_tokenizer, None, False) is None  # autoregressive


def test_vocabulary_smaller_than_the_tokenizer_names_both_sizes(tiny_tokenizer):
    model = make_llada(vocab_size=50)
    with pytest.raises(ValueError, match=rf"tokenizer has {len(tiny_tokenizer)} tokens but .* only 50 rows"):
        validation.check_vocabulary(model, tiny_tokenizer)
    validation.check_vocabulary(make_llada(), tiny_tokenizer)


# --------------------------------------------------------------------------- 4. data


def test_data_layer_refuses_too_few_prompts_for_a_generation_batch(tmp_path, tiny_tokenizer):
    args = make_args(tmp_path, per_device_train_batch_size=4, num_generations=2)  # 4 rows: 2 distinct prompts
    with pytest.raises(ValueError) as info:
        data_setup(args, make_llada(), tiny_tokenizer, make_dataset(1))
    message = str(info.value)
    assert message.startswith("train_dataset has 1 prompt(s), fewer than the 2 one generation batch needs"), message
    assert "generation_batch_size=4" in message and "num_generations=2" in message
    data_setup(args, make_llada(), tiny_tokenizer, make_dataset(2))  # exactly enough


def test_data_layer_refuses_a_split_eval_group_and_a_canvas_without_diffusion(tmp_path, tiny_tokenizer, tiny_llama):
    args = make_args(tmp_path, num_generations_eval=4, per_device_eval_batch_size=6)
    with pytest.raises(ValueError, match=r"^per_device_eval_batch_size=6 is not a multiple of the eval group size 4"):
        data_setup(args, make_llada(), tiny_tokenizer, make_dataset(), eval_dataset=make_dataset(4))
    data_setup(make_args(tmp_path, num_generations_eval=4, per_device_eval_batch_size=8), make_llada(),
               tiny_tokenizer, make_dataset(), eval_dataset=make_dataset(4))  # fmt: skip
    with pytest.raises(ValueError, match=r"^reward_text='canvas' grades the whole generation canvas"):
        data_setup(make_args(tmp_path, reward_text="canvas"), tiny_llama, tiny_tokenizer, make_dataset(),
                   is_diffusion=False)  # fmt: skip


def test_data_layer_refuses_a_prompt_holding_the_mask_token(tmp_path, tiny_tokenizer):
    mask = tiny_tokenizer.convert_ids_to_tokens(1)
    dataset = Dataset.from_list([{"prompt": "1+2="}, {"prompt": f"3+{mask}="}] * 2)
    with pytest.raises(
        ValueError, match=rf"^train_dataset row 1: the prompt contains the mask token {mask!r} \(id 1\)"
    ):
        data_setup(make_args(tmp_path), make_llada(), tiny_tokenizer, dataset)


# --------------------------------------------------------------------------- 5. run


def test_run_layer_refuses_an_output_dir_holding_another_runs_checkpoints(tmp_path):
    out = tmp_path / "out"
    check_fresh_output_dir(str(out), overwrite=False)  # absent: a fresh run
    (out / "checkpoint-3").mkdir(parents=True)
    with pytest.raises(ValueError, match=rf"^output_dir={str(out)!r} already holds checkpoints.*checkpoint-3"):
        check_fresh_output_dir(str(out), overwrite=False)


@pytest.mark.parametrize("fixture", ["tiny_sdar", "tiny_llada2", "tiny_llama"])
def test_every_family_is_told_from_a_saved_folder_before_loading(tmp_path, fixture, request):
    """Before loading, the registered families decide from config.json (LLaDA2's `llada2_moe` included), so an
    LLaDA2 folder gets the diffusion defaults and checks, and an autoregressive one keeps TRL's."""
    from stabledrl_trl.diffusion.family import detect_family

    model = request.getfixturevalue(fixture)
    model = model() if callable(model) and not isinstance(model, torch.nn.Module) else model  # builder fixtures
    folder = tmp_path / fixture
    model.save_pretrained(folder)
    args = make_args(tmp_path)
    expected = detect_family(model) is not None
    assert expected == (fixture != "tiny_llama")
    assert validation.is_diffusion_before_loading(str(folder), args) is expected


def test_launch_layer_refuses_processes_accelerate_runs_as_one(tmp_path, monkeypatch):
    args = make_args(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match=r"2 processes were launched \(WORLD_SIZE=2\).*use_cpu=True"):
        validation.check_launch_setup(args, 1, "NO")
    monkeypatch.setenv("WORLD_SIZE", "1")
    validation.check_launch_setup(args, 1, "NO")  # one process, one node: nothing to check


def test_model_layer_warns_of_diffusion_settings_an_autoregressive_model_ignores(tmp_path, tiny_tokenizer, tiny_llama):
    import warnings

    args = make_args(tmp_path, rollout_cache="prefix", likelihood_estimator="mc_elbo", mc_samples=3)
    with pytest.warns(UserWarning, match="autoregressive model does not use") as caught:
        model_setup(args, tiny_llama, tiny_tokenizer, family=None, is_diffusion=False)
    text = str(caught[0].message)
    assert all(f in text for f in ("'rollout_cache': 'prefix'", "'likelihood_estimator': 'mc_elbo'", "'mc_samples': 3"))
    plain = make_args(tmp_path, block_length=None, diffusion_steps=None)  # the length-derived layout reads as unset
    assert validation.unused_diffusion_fields(plain) == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model_setup(plain, tiny_llama, tiny_tokenizer, family=None, is_diffusion=False)
