"""An lm-evaluation-harness model class decoding with this package's diffusion samplers (every family).

    pip install -e ".[eval]"
    python -m stabledrl_trl.lm_eval_model --model stabledrl \
        --model_args pretrained=GSAI-ML/LLaDA-8B-Instruct,gen_length=256,steps=128,block_length=32,dtype=bfloat16 \
        --tasks gsm8k --batch_size 8
    accelerate launch --num_processes 8 -m stabledrl_trl.lm_eval_model --model stabledrl --model_args ... --tasks gsm8k

`import stabledrl_trl.lm_eval_model` registers the class with lm_eval as "stabledrl" (and "stabledrl_diffusion"), as
LLaDA's `eval_llada.py` registers its own; `python -m stabledrl_trl.lm_eval_model` is lm_eval's command line with
the class registered (the plain `lm_eval` command does not import this package).

- generate_until: the model's family decodes (LLaDA's sampler for LLaDA / masked LMs, Dream's, the block samplers
  with their KV cache for SDAR / TraDo / LLaDA2) with a `SamplerSettings` built from the model_args, which take
  every sampler setting by its `StableDRLConfig` name (max_completion_length, diffusion_steps, block_length,
  temperature, remasking, diffusion_sampler, block_denoising_steps, rollout_cache, ...; `gen_length` and `steps`
  are LLaDA's names for the first two) and are validated by training's own checks. Prompts are batched
  (`batch_size`, left-padded, padding hidden from attention). Each request's gen_kwargs are honoured or refused:
  `until` cuts the decoded text at the first stop string; `max_gen_toks` keeps at most that many completion tokens
  (the diffusion canvas is `gen_length` positions whatever the request asks); `do_sample: false` or `temperature`
  set the sampler's temperature; any other key is an error naming it.
- loglikelihood (multiple-choice tasks) is refused unless asked for with `likelihood_samples=N`: a masked
  diffusion LM's sequence likelihood can only be estimated; with N > 0 it is `likelihood_estimator` (default
  mc_elbo_inv_t, LLaDA's 1/t Monte-Carlo ELBO) over N masked passes, and each request's Monte-Carlo standard error
  is kept (`likelihood_standard_errors`). loglikelihood_rolling (perplexity) is refused.
- data parallel: under `accelerate launch` / torchrun each process takes its share of the requests (lm_eval splits
  them by `rank` / `world_size`) and the class gathers with torch.distributed (gloo on a CPU-only machine); the
  results equal one process's (tests/test_lm_eval_model.py).
- all randomness comes from one torch.Generator per batch, seeded with (`seed`, the batch's position).
"""

from __future__ import annotations

import os

import torch

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "stabledrl_trl.lm_eval_model needs lm-evaluation-harness: pip install -e '.[eval]' (or pip install lm-eval)."
    ) from error

RENAMED = {"gen_length": "max_completion_length", "steps": "diffusion_steps", "sampler": "diffusion_sampler"}
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature")


@register_model("stabledrl", "stabledrl_diffusion")
class DiffusionLMEval(LM):
    """lm_eval model: `pretrained` (folder or hub id, or a LoRA adapter folder), `dtype`, `device`, `batch_size`,
    `seed`, `trust_remote_code` (off), `allow_pickle_checkpoints` (off), and any sampler setting (module docstring)."""

    def __init__(
        self,
        pretrained: str | None = None,
        dtype: str = "float32",
        device: str | None = None,
        batch_size: int | str = 8,
        seed: int = 0,
        model=None,
        tokenizer=None,
        allow_pickle_checkpoints: bool = False,
        max_batch_size: int | None = None,
        likelihood_samples: int = 0,
        likelihood_estimator: str = "mc_elbo_inv_t",
        **sampler_fields,
    ):
        super().__init__()
        if max_batch_size is not None:
            raise ValueError(
                f"max_batch_size={max_batch_size!r} bounds lm-eval's automatic batch size, which this class does not "
                "have; give --batch_size N and drop --max_batch_size."
            )
        from .diffusion.adapter import as_diffusion_lm
        from .diffusion.family import get_family
        from .diffusion.sampler_settings import SamplerSettings

        fields = {RENAMED.get(k, k): v for k, v in sampler_fields.items()}
        unknown = sorted(set(fields) - set(SamplerSettings.field_names()))
        if unknown:
            raise ValueError(
                f"model_args: unknown {', '.join(unknown)}; the sampler settings are "
                f"{', '.join(SamplerSettings.field_names())} (gen_length and steps are accepted for the first two)."
            )
        self.settings = SamplerSettings.from_fields(**fields)
        if isinstance(batch_size, str) and batch_size.startswith("auto"):
            raise ValueError("batch_size=auto: give a number (a diffusion canvas has no automatic batch finder).")
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be a positive integer.")
        self.seed = int(seed)
        from .diffusion.estimators import ESTIMATORS

        self.likelihood_samples = int(likelihood_samples)
        if self.likelihood_samples < 0:
            raise ValueError(
                f"likelihood_samples={likelihood_samples!r} must be >= 0 (0 refuses likelihood requests)."
            )
        if likelihood_estimator not in ESTIMATORS:
            raise ValueError(
                f"likelihood_estimator={likelihood_estimator!r}; choose one of {', '.join(ESTIMATORS)} "
                "(mc_elbo_inv_t, LLaDA's 1/t-weighted Monte-Carlo ELBO, is the one that bounds log p)."
            )
        self.likelihood_estimator = likelihood_estimator
        self.likelihood_standard_errors: list[float] = []  # one per scored request, in nats
        self._state = None
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from accelerate import PartialState

            self._state = PartialState(cpu=not torch.cuda.is_available())  # gloo on a CPU-only machine
            self._rank, self._world_size = self._state.process_index, self._state.num_processes
            device = str(self._state.device)
        if model is None:
            model, tokenizer = _load(pretrained, dtype, device, allow_pickle_checkpoints)
        elif tokenizer is None:
            raise ValueError("model given as an object: pass its tokenizer too.")
        self.model, self.tokenizer = model, tokenizer
        self.pretrained = pretrained or type(model).__name__
        self.adapter = as_diffusion_lm(model, tokenizer)
        self.family = get_family(self.adapter.family)
        self.family.check_rollout_settings(self.settings, self.adapter)

    # ---- distributed -------------------------------------------------------------------------------------------
    @property
    def device(self):
        try:
            return next(self.adapter.model.parameters()).device
        except (AttributeError, StopIteration):
            return torch.device("cpu")

    def all_gather(self, tensor):
        if self._state is None:
            return tensor
        from accelerate.utils import gather

        return gather(tensor.reshape(1) if tensor.dim() == 0 else tensor)

    def gather_object(self, obj, dst=0):
        if self._state is None:
            return [obj]
        import torch.distributed as dist

        out = [None] * self._world_size if self._rank == dst else None
        dist.gather_object(obj, out, dst=dst)
        return out

    def barrier(self) -> None:
        if self._state is not None:
            self._state.wait_for_everyone()

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "tokenizer")).replace("/", "__")

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    # ---- requests ----------------------------------------------------------------------------------------------
    @torch.no_grad()
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        """(log p(continuation | context) estimate, is_greedy) per request; refused unless `likelihood_samples` > 0.

        The estimate is `likelihood_estimator` (default mc_elbo_inv_t: LLaDA's Monte-Carlo ELBO with t ~ U(0, 1] and
        the 1/t weight, a lower bound of log p in expectation) with `likelihood_samples` masked passes, times the
        number of continuation tokens (the estimators are length-normalised). Its Monte-Carlo standard error (nats,
        from the spread of the passes) is kept per request in `likelihood_standard_errors`. is_greedy: the family's
        greedy sampler, given the context and a canvas of the continuation's length (one block, one token per step),
        writes exactly the continuation.
        """
        import dataclasses

        from .diffusion.estimators import estimate_likelihood, estimator_standard_error
        from .evaluation import left_pad

        if self.likelihood_samples == 0:
            raise NotImplementedError(_REFUSAL.format(kind="loglikelihood (multiple-choice)"))
        if self.family.block_causal:
            raise NotImplementedError(
                f"loglikelihood: the {self.family.name} family's block-causal likelihood is not wired into the lm-eval "
                "class; use a full-attention model (LLaDA, Dream, a masked LM) or a generative task."
            )
        out = []
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            contexts = [self.tokenizer(r.args[0], add_special_tokens=False)["input_ids"] for r in batch]
            continuations = [self.tokenizer(r.args[1], add_special_tokens=False)["input_ids"] for r in batch]
            if any(not c for c in continuations):
                raise ValueError("loglikelihood: an empty continuation has no tokens to score.")
            prompt_ids, prompt_mask = left_pad(contexts, self.adapter.pad_token_id)  # (B, P), (B, P)
            width = max(len(c) for c in continuations)
            completion_ids = torch.full((len(batch), width), self.adapter.pad_token_id, dtype=torch.long)  # (B, C)
            completion_mask = torch.zeros(len(batch), width, dtype=torch.long)  # (B, C)
            for row, tokens in enumerate(continuations):
                completion_ids[row, : len(tokens)] = torch.tensor(tokens)
                completion_mask[row, : len(tokens)] = 1
            device = self.device
            estimate = estimate_likelihood(
                self.likelihood_estimator, self.adapter, prompt_ids.to(device), prompt_mask.to(device),
                completion_ids.to(device), completion_mask.to(device), mask_token_id=self.adapter.mask_token_id,
                seed=self.seed * 1_000_003 + start, num_samples=self.likelihood_samples, p_mask_prompt=0.0,
            )  # fmt: skip
            lengths = completion_mask.sum(1).to(estimate.seq_logps)  # (B,)
            totals = (estimate.seq_logps * lengths).tolist()
            errors = (estimator_standard_error(estimate.sample_seq_logps) * lengths).tolist()
            self.likelihood_standard_errors.extend(errors)
            for row, (request, tokens) in enumerate(zip(batch, continuations)):
                n = len(tokens)
                greedy = dataclasses.replace(
                    self.settings, max_completion_length=n, block_length=n, diffusion_steps=n, temperature=0.0,
                    reward_text="canvas", rollout_cache="none", parallel_threshold=None, max_tokens_per_step=None,
                )  # fmt: skip
                decoded = self.family.generate(
                    self.adapter, prompt_ids[row : row + 1, prompt_mask[row].bool()].to(device),
                    torch.ones(1, len(contexts[row]), dtype=torch.long, device=device), greedy,
                    eos_token_ids=self.adapter.eos_token_ids, generator=torch.Generator(device=device).manual_seed(0),
                )  # fmt: skip
                out.append((float(totals[row]), decoded.completion_ids[0, :n].tolist() == tokens))
                self.cache_hook.add_partial("loglikelihood", request.args, out[-1])
        return out

    def loglikelihood_rolling(self, requests):
        raise NotImplementedError(_REFUSAL.format(kind="loglikelihood_rolling (perplexity)"))

    def _settings_for(self, gen_kwargs: dict):
        import dataclasses

        unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
        if unknown:
            raise ValueError(
                f"generation_kwargs {', '.join(unknown)} have no counterpart in the diffusion sampler; the class "
                f"honours {', '.join(GEN_KWARGS)}. Set sampler settings through --model_args instead."
            )
        settings = self.settings
        if gen_kwargs.get("do_sample") is False:
            settings = dataclasses.replace(settings, temperature=0.0)
        if gen_kwargs.get("temperature") is not None:
            settings = dataclasses.replace(settings, temperature=float(gen_kwargs["temperature"]))
        return settings

    @torch.no_grad()
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode every request's context with the family's sampler; cut at `until` and `max_gen_toks`."""
        from tqdm.auto import tqdm

        from .evaluation import left_pad

        outputs: list[str | None] = [None] * len(requests)
        # requests with equal gen_kwargs are batched together, in their order
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            context, gen_kwargs = request.args
            groups.setdefault(repr(sorted(gen_kwargs.items(), key=lambda kv: kv[0])), []).append(index)
        module = self.adapter.model if isinstance(self.adapter.model, torch.nn.Module) else None
        if module is not None:
            module.eval()
        bar = tqdm(total=len(requests), desc="generate_until", unit="request",
                   disable=disable_tqdm or self.rank != 0)  # fmt: skip
        position = 0
        for indices in groups.values():
            gen_kwargs = dict(requests[indices[0]].args[1])
            settings = self._settings_for(gen_kwargs)
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_tokens = gen_kwargs.get("max_gen_toks")
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                ids = [self.tokenizer(requests[i].args[0], add_special_tokens=False)["input_ids"] for i in batch]
                prompt_ids, prompt_mask = left_pad(ids, self.adapter.pad_token_id)  # (B, P), (B, P)
                generator = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + position)
                position += 1
                out = self.family.generate(
                    self.adapter, prompt_ids.to(self.device), prompt_mask.to(self.device), settings,
                    eos_token_ids=self.adapter.eos_token_ids, generator=generator,
                )  # fmt: skip
                for i, row_ids, row_mask in zip(batch, out.completion_ids.cpu(), out.completion_mask.cpu()):
                    tokens = row_ids[row_mask.bool()].tolist()  # up to and including the first EOS
                    if max_tokens is not None:
                        tokens = tokens[: int(max_tokens)]
                    text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                    outputs[i] = cut_at_stop(text, until)
                    self.cache_hook.add_partial("generate_until", requests[i].args, outputs[i])
                bar.update(len(batch))
        bar.close()
        return outputs


_REFUSAL = (
    "{kind} requests are refused by the stabledrl model class by default: a masked diffusion LM's sequence "
    "likelihood can only be estimated with random masks (an ELBO), and the estimate's noise can decide close "
    "multiple-choice comparisons. Run generative tasks (output_type: generate_until), or opt in with model_args "
    "likelihood_samples=N (LLaDA's evaluation uses 128) and likelihood_estimator=mc_elbo_inv_t (the default)."
)


def cut_at_stop(text: str, until: list[str]) -> str:
    """`text` up to the earliest occurrence of any stop string (the whole text when none occurs)."""
    cut = len(text)
    for stop in until:
        if stop:
            found = text.find(stop)
            if found != -1:
                cut = min(cut, found)
    return text[:cut]


def _load(pretrained, dtype, device, allow_pickle):
    """(model, tokenizer): a full model, or a LoRA adapter on its base model (not merged), safetensors only unless
    `allow_pickle_checkpoints`; the paths go through training's model-source check."""
    import json

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .validation import check_model_source

    if pretrained is None:
        raise ValueError("model_args: pretrained=<model folder, hub id or LoRA adapter folder> is required.")
    torch_dtype = dtype if dtype == "auto" else getattr(torch, str(dtype), None)
    if torch_dtype is None or (torch_dtype != "auto" and not isinstance(torch_dtype, torch.dtype)):
        raise ValueError(f"model_args: dtype={dtype!r} is not a torch dtype; use float32, bfloat16, float16 or auto.")
    allow_pickle = str(allow_pickle).lower() in ("1", "true", "yes")
    kwargs = {} if allow_pickle else {"use_safetensors": True}
    check_model_source(pretrained, field="pretrained", allow_pickle=allow_pickle)
    adapter_config = os.path.join(pretrained, "adapter_config.json")
    tokenizer_path = pretrained
    if os.path.isfile(adapter_config):
        from peft import PeftModel

        with open(adapter_config) as f:
            base_path = json.load(f).get("base_model_name_or_path")
        if not base_path:
            raise ValueError(f"{adapter_config} names no base model (base_model_name_or_path).")
        check_model_source(base_path, field="base_model_name_or_path", allow_pickle=allow_pickle)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype, **kwargs),
                                          pretrained)  # fmt: skip
        if not os.path.isfile(os.path.join(pretrained, "tokenizer_config.json")):
            tokenizer_path = base_path
    else:
        model = AutoModelForCausalLM.from_pretrained(pretrained, dtype=torch_dtype, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def main() -> None:
    """lm_eval's command line with this model class registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
