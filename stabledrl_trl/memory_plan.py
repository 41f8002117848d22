"""Peak GPU memory of a StableDRL run, estimated from the model's shape and the training config, before renting a GPU.

The estimate is a sum of components (bytes per GPU), each a closed formula of the shape and the settings:

    peak = runtime overhead + weights + gradients + optimizer states (+ LoRA state)    persistent
         + max(training transient, rollout transient)                                  the larger of the two phases

The runtime overhead (CUDA context, the caching allocator's slack, libraries) is a setting: 1 GiB by default on a
GPU; the CPU validation measures it (a tiny model through the same training run) and passes it in.

Persistent state, P trainable parameters, b bytes per weight (2 for bf16, 4 for float32), n GPUs:

| sharding | weights | gradients | optimizer (AdamW, two moments) |
|---|---|---|---|
| ddp (and one GPU) | P b | P b | 2 P b (torch keeps the moments in the weights' dtype) |
| zero2 | P b | 4 P / n (fp32 partition) | (8 + 4 [fp32 master when b < 4]) P / n |
| zero3 | P b / n | 4 P / n | (8 + 4 [fp32 master when b < 4]) P / n |
| fsdp (FSDP2, accelerate) | 4 P / n (accelerate keeps the sharded weights in fp32 under mixed precision) | 4 P / n | 8 P / n |

With LoRA the base weights are frozen (b bytes each, sharded by zero3 / fsdp, no gradient or optimizer state), and
the adapter's parameters (r (d_in + d_out) per targeted matrix) cost 4 + 4 + 8 bytes each (PEFT keeps adapters in
float32). zero3 / fsdp gather one layer's weights at a time in training and all of them for the rollouts (TRL's
`ds3_gather_for_generation` / FSDP's full-parameter context).

Training transient (one estimator chunk: rows r = min(estimator_chunk_size, B K), B the micro-batch, K the
Monte-Carlo samples; tokens T = r L, L = prompt + completion, doubled for the staircase layout of block diffusion):
- activations: with gradient checkpointing, every layer's input (n_layers T d b) plus one layer's internals
  recomputed in backward (T a b); without it, n_layers T a b. a = 10 d + 4 I + attention, I the MLP width (dense
  or the active experts'), attention = n_heads L when the attention probabilities are materialised (eager or
  SDPA's math path; 0 for flash / memory-efficient SDPA, the default on a GPU).
- logits: r C V bytes_logits, C the completion length (only completion positions go through the head), with
  bytes_logits = b + 4 [float32 copy when b < 4] + 12: the logits, their float32 copy, the softmax, its entropy
  term and the logits' gradient (float32 each).

Rollout transient (no gradients; R = generation_batch_size / n rows of prompt + completion per process, derived as
TRL's GRPOConfig does: generation_batch_size given, or per_device_train_batch_size x steps_per_generation x n, with
steps_per_generation defaulting to gradient_accumulation_steps; `rollout_rows`):
- one layer's forward activations: R L (4 d + 2 I) b;
- the sampler's logits: R x block x V x (b + 4 [float32 copy when b < 4] + 4): the block's logits, their float32
  copy and the softmax of the candidate draw (the exact sampler scores the current block only);
- the KV cache: 2 n_layers n_kv_heads head_dim R L b with `rollout_cache` prefix / dual or a block-diffusion model
  (SDAR's cached block sampler), else none.

Validated against measured peaks on the CPU at small scale (`scripts/bench_plan.py`, docs/benchmarks.md: Memory planning);
nothing here has been compared with a GPU's allocator yet. Sources of the model shapes: `KNOWN_MODELS`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, fields
from typing import ClassVar

GIB = 2**30
SHARDINGS = ("ddp", "zero2", "zero3", "fsdp")


def _check_int(name: str, value, minimum: int, where: str = "") -> None:
    """An integer (not a bool, not a float) >= minimum, or a ValueError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r}{where} must be an integer >= {minimum}.")


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers that decide memory. MoE: n_experts > 0 (routed experts of width moe_intermediate, of
    which active_experts per token, plus shared_experts of the same width), the first `dense_layers` dense."""

    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate: int
    vocab: int
    head_dim: int | None = None
    tied_embeddings: bool = False
    qk_norm: bool = False
    block_diffusion: bool = False  # staircase likelihood layout (2 L) and a cached block sampler
    n_experts: int = 0
    active_experts: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0
    dense_layers: int = 0
    source: str = ""
    # whether the family's estimator can split its rows (estimator_chunk_size); DiffusionGemma's cannot
    chunkable_estimator: ClassVar[bool] = True

    def __post_init__(self):
        where = f" ({self.source})" if self.source else ""
        for name in ("hidden", "n_layers", "n_heads", "n_kv_heads", "intermediate", "vocab"):
            _check_int(name, getattr(self, name), 1, where)
        for name in ("n_experts", "active_experts", "shared_experts", "moe_intermediate", "dense_layers"):
            _check_int(name, getattr(self, name), 0, where)
        if self.head_dim is not None:
            _check_int("head_dim", self.head_dim, 1, where)
        if self.n_experts and (self.active_experts < 1 or self.moe_intermediate < 1):
            raise ValueError(
                f"model shape{where}: {self.n_experts} experts need active_experts >= 1 and moe_intermediate >= 1 "
                f"(got {self.active_experts} and {self.moe_intermediate})."
            )

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    def attention_params(self) -> int:
        d, q, kv = self.hidden, self.n_heads * self.hd, self.n_kv_heads * self.hd
        return d * q + 2 * d * kv + q * d + (2 * self.hd if self.qk_norm else 0)

    def mlp_params(self, layer: int) -> int:
        if self.n_experts and layer >= self.dense_layers:
            experts = (self.n_experts + self.shared_experts) * 3 * self.hidden * self.moe_intermediate
            return experts + self.n_experts * self.hidden  # + router
        return 3 * self.hidden * self.intermediate

    def num_parameters(self) -> int:
        layers = sum(self.attention_params() + self.mlp_params(i) + 2 * self.hidden for i in range(self.n_layers))
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return layers + embeddings + self.hidden

    def layer_parameters(self) -> int:
        """The largest layer's parameters (what zero3 / fsdp gather at once in training)."""
        return max(self.attention_params() + self.mlp_params(i) for i in range(self.n_layers))

    def active_intermediate(self) -> int:
        """MLP width a token goes through (dense width, or the active + shared experts' widths)."""
        if self.n_experts:
            return max(self.intermediate, (self.active_experts + self.shared_experts) * self.moe_intermediate)
        return self.intermediate

    def lora_parameters(self, r: int, targets) -> int:
        """r (d_in + d_out) per targeted matrix of every layer (Llama / Qwen names; MoE experts not counted)."""
        d, q, kv, inter = self.hidden, self.n_heads * self.hd, self.n_kv_heads * self.hd, self.intermediate
        dims = {"q_proj": (d, q), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (q, d), "gate_proj": (d, inter),
                "up_proj": (d, inter), "down_proj": (inter, d)}  # fmt: skip
        if targets in ("all-linear", None):
            targets = list(dims)
        elif isinstance(targets, str):  # PEFT's regex form: the names it fully matches in a Llama-style layer
            pattern = re.compile(targets)
            block = {t: "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp" for t in dims}
            targets = [t for t in dims if pattern.fullmatch(f"model.layers.0.{block[t]}.{t}")]
        per_layer = sum(r * sum(dims[t]) for t in targets if t in dims)
        return per_layer * self.n_layers


# Architecture numbers of the supported hub checkpoints, from each checkpoint's config.json on the Hugging Face hub.
KNOWN_MODELS: dict[str, ModelShape] = {
    "GSAI-ML/LLaDA-8B-Instruct": ModelShape(
        4096, 32, 32, 32, 12288, 126464, source="GSAI-ML/LLaDA-8B-Instruct config.json (d_model, n_layers, n_heads, "
        "n_kv_heads, mlp_hidden_size, vocab_size; weight_tying false)"),
    "Dream-org/Dream-v0-Instruct-7B": ModelShape(
        3584, 28, 28, 4, 18944, 152064, source="Dream-org/Dream-v0-Instruct-7B config.json (Qwen2.5-7B shape)"),
    "JetLM/SDAR-4B-Chat": ModelShape(
        2560, 36, 32, 8, 9728, 151936, head_dim=128, qk_norm=True, block_diffusion=True,
        source="JetLM/SDAR-4B-Chat config.json (Qwen3-4B shape, untied head)"),
    "JetLM/SDAR-8B-Chat": ModelShape(
        4096, 36, 32, 8, 12288, 151936, head_dim=128, qk_norm=True, block_diffusion=True,
        source="JetLM/SDAR-8B-Chat config.json (Qwen3-8B shape, untied head)"),
    "inclusionAI/LLaDA2.0-mini": ModelShape(
        2048, 20, 16, 4, 5120, 157184, head_dim=128, qk_norm=True, block_diffusion=True, n_experts=256,
        active_experts=8, shared_experts=1, moe_intermediate=512, dense_layers=1,
        source="inclusionAI/LLaDA2.0-mini config.json (llada2_moe: 256 experts, 8 active, 1 shared, first layer "
        "dense)"),
}  # fmt: skip
for _alias, _name in {"GSAI-ML/LLaDA-8B-Base": "GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-1.5":
                      "GSAI-ML/LLaDA-8B-Instruct", "Gen-Verse/TraDo-4B-Instruct": "JetLM/SDAR-4B-Chat",
                      "Gen-Verse/TraDo-8B-Instruct": "JetLM/SDAR-8B-Chat"}.items():  # fmt: skip
    KNOWN_MODELS[_alias] = KNOWN_MODELS[_name]


def shape_from_config_json(config: dict, source: str = "") -> ModelShape:
    """A ModelShape from a model folder's config.json (LLaDA's names or transformers' Llama / Qwen / MoE names)."""
    if not isinstance(config, dict):
        raise ValueError(f"{source or 'config.json'} holds {type(config).__name__}, not a JSON object of settings.")
    try:
        return _shape_from_config_json(config, source)
    except KeyError as error:
        raise ValueError(
            f"{source or 'config.json'} lacks {error.args[0]!r}, which the planner needs for the model's shape (LLaDA "
            "configs: d_model, n_layers, n_heads, mlp_hidden_size, vocab_size; transformers configs: hidden_size, "
            "num_hidden_layers, num_attention_heads, intermediate_size, vocab_size)."
        ) from None


def _shape_from_config_json(config: dict, source: str) -> ModelShape:
    if config.get("model_type") == "diffusion_gemma":  # its own layout: memory_plan_gemma.shape_from_gemma_config
        from .memory_plan_gemma import shape_from_gemma_config

        return shape_from_gemma_config(config, source=source)
    if "d_model" in config:  # LLaDA's original config
        return ModelShape(
            config["d_model"], config["n_layers"], config["n_heads"], config.get("n_kv_heads") or config["n_heads"],
            config["mlp_hidden_size"], config.get("embedding_size") or config["vocab_size"],
            tied_embeddings=bool(config.get("weight_tying", False)), source=source,
        )  # fmt: skip
    from types import SimpleNamespace

    from .diffusion.family import detect_family_from_config, get_family

    model_type = str(config.get("model_type", ""))
    family = detect_family_from_config(SimpleNamespace(**config))
    return ModelShape(
        hidden=config["hidden_size"], n_layers=config["num_hidden_layers"], n_heads=config["num_attention_heads"],
        n_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        intermediate=config["intermediate_size"], vocab=config["vocab_size"], head_dim=config.get("head_dim"),
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        qk_norm=model_type in ("sdar", "qwen3", "llada2_moe"),
        block_diffusion=family is not None and get_family(family).block_causal,
        n_experts=config.get("num_experts") or 0, active_experts=config.get("num_experts_per_tok") or 0,
        shared_experts=config.get("num_shared_experts") or 0, moe_intermediate=config.get("moe_intermediate_size") or 0,
        dense_layers=config.get("first_k_dense_replace") or 0, source=source,
    )  # fmt: skip


def resolve_shape(model: str) -> ModelShape:
    """The shape of a known hub id (`KNOWN_MODELS`) or of a local folder with a config.json; a clear error else."""
    if model in KNOWN_MODELS:
        return KNOWN_MODELS[model]
    from .memory_plan_gemma import KNOWN_GEMMA_MODELS, known_gemma_shape

    if model in KNOWN_GEMMA_MODELS:  # its shape needs transformers' DiffusionGemmaConfig: built when asked for
        return known_gemma_shape(model)
    path = os.path.join(model, "config.json")
    if os.path.isfile(path):
        try:
            with open(path) as f:
                config = json.load(f)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise ValueError(f"model {model!r}: {path} cannot be read as JSON ({error}).") from None
        return shape_from_config_json(config, source=path)
    try:  # a hub id whose config.json is in the local Hugging Face cache (no download)
        from huggingface_hub import hf_hub_download

        cached = hf_hub_download(model, "config.json", local_files_only=True)
    except Exception:
        cached = None
    if cached is not None:
        with open(cached) as f:
            return shape_from_config_json(json.load(f), source=f"{model} config.json (local Hugging Face cache)")
    if os.path.isdir(model):
        raise ValueError(
            f"model {model!r} is a folder without a config.json: the planner reads the model's shape from it. Give "
            "the folder of a saved model (config.json next to its weights)."
        )
    raise ValueError(
        f"model {model!r}: not a known hub id ({', '.join(sorted([*KNOWN_MODELS, *KNOWN_GEMMA_MODELS]))}), not in the local Hugging Face "
        "cache and no local folder with a config.json. Download its config.json (`huggingface-cli download "
        f"{model} config.json --local-dir <folder>`) and pass --model <folder>, or add the architecture numbers to "
        "memory_plan.KNOWN_MODELS."
    )


@dataclass
class PlanSettings:
    """The training settings that decide memory (YAML keys of the training configs where they exist)."""

    gpus: int = 1
    sharding: str = "ddp"
    bf16: bool = True  # weights in bfloat16 (dtype: bfloat16); False: float32
    use_peft: bool = False
    lora_r: int = 16
    lora_target_modules: list | str | None = None
    lora_target_parameters: list | None = None  # peft's target_parameters (DiffusionGemma's experts)
    gradient_checkpointing: bool = False
    per_device_train_batch_size: int = 8
    steps_per_generation: int = 1
    mc_samples: int = 1
    estimator_chunk_size: int | None = None
    max_prompt_length: int = 512
    max_completion_length: int = 256
    block_length: int = 32
    rollout_cache: str = "none"
    likelihood_estimator: str = "block_random"
    attention_matrix: bool = False  # attention probabilities materialised (eager / SDPA math path)
    overhead_bytes: float = 1.0 * GIB  # the runtime's own memory (CUDA context, allocator cache, libraries)

    def __post_init__(self):
        """Every setting checked as training checks it: the field's name, its value and the valid range."""
        if self.sharding not in SHARDINGS:
            raise ValueError(f"sharding={self.sharding!r}: choose one of {SHARDINGS}.")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _PLAN_BOOLS and not isinstance(value, bool):
                raise TypeError(f"{f.name}={value!r} ({type(value).__name__}) must be true or false.")
            if f.name in _PLAN_INTS and not (value is None and f.name in _PLAN_OPTIONAL):
                _check_int(f.name, value, _PLAN_INTS[f.name])
        if (
            isinstance(self.overhead_bytes, bool)
            or not isinstance(self.overhead_bytes, (int, float))
            or not (math.isfinite(self.overhead_bytes) and self.overhead_bytes >= 0)
        ):
            raise ValueError(f"overhead_bytes={self.overhead_bytes!r} must be a finite number >= 0.")
        from .diffusion.llada_sampler import CACHE_MODES  # torch: imported only when a plan is made

        if self.rollout_cache not in CACHE_MODES:
            raise ValueError(f"rollout_cache={self.rollout_cache!r}; choose 'none', 'prefix' or 'dual'.")
        targets = self.lora_target_modules
        if not (
            targets is None
            or isinstance(targets, str)  # 'all-linear', or a regex PEFT matches against full module names
            or (isinstance(targets, list) and all(isinstance(t, str) for t in targets))
        ):
            raise TypeError(
                f"lora_target_modules={targets!r} must be a list of module names, 'all-linear' or a regex string."
            )


_PLAN_BOOLS = ("bf16", "use_peft", "gradient_checkpointing", "attention_matrix")
# minimum of each integer setting (lora_r >= 1 as train.py's check; a 0 prompt length is allowed: no prompt)
_PLAN_INTS = {"gpus": 1, "lora_r": 1, "per_device_train_batch_size": 1, "steps_per_generation": 1, "mc_samples": 1,
              "estimator_chunk_size": 1, "max_prompt_length": 0, "max_completion_length": 1, "block_length": 1}  # fmt: skip
_PLAN_OPTIONAL = ("estimator_chunk_size",)


def rollout_rows(
    per_device_train_batch_size: int,
    gpus: int,
    *,
    steps_per_generation: int | None = None,
    generation_batch_size: int | None = None,
    gradient_accumulation_steps: int = 1,
    num_generations: int | None = None,
) -> tuple[int, int]:
    """(rollout rows per process, steps_per_generation) as TRL's GRPOConfig derives them for `gpus` processes.

    generation_batch_size and steps_per_generation cannot both be set; generation_batch_size must be a multiple of
    the global batch per_device_train_batch_size x gpus (steps_per_generation = the quotient); unset, steps_per_generation
    is gradient_accumulation_steps. num_generations (when given) must divide the generation batch.
    """
    global_batch = per_device_train_batch_size * gpus
    if generation_batch_size is not None and steps_per_generation is not None:
        raise ValueError(
            f"generation_batch_size={generation_batch_size} and steps_per_generation={steps_per_generation} are both "
            "set; TRL takes one of them: remove one."
        )
    if generation_batch_size is not None:
        if generation_batch_size % global_batch != 0:
            raise ValueError(
                f"generation_batch_size={generation_batch_size} is not a multiple of the global batch "
                f"per_device_train_batch_size={per_device_train_batch_size} x {gpus} GPU(s) = {global_batch}, as "
                "TRL requires."
            )
        steps = generation_batch_size // global_batch
    else:
        steps = steps_per_generation or gradient_accumulation_steps
    if num_generations is not None and (global_batch * steps) % num_generations != 0:
        raise ValueError(
            f"the generation batch of {global_batch * steps} rows (per_device_train_batch_size x steps_per_generation "
            f"x GPUs) is not a multiple of num_generations={num_generations}, as TRL requires."
        )
    return per_device_train_batch_size * steps, steps


def estimate(shape: ModelShape, s: PlanSettings) -> dict[str, float]:
    """Peak bytes per GPU by component (see the module docstring); key "peak" is the total."""
    n, b = s.gpus, (2 if s.bf16 else 4)
    P = shape.num_parameters()
    sharded = s.sharding in ("zero3", "fsdp")
    c: dict[str, float] = {}
    if s.use_peft:
        c["weights"] = P * b / (n if sharded else 1)
        c["gradients"] = 0.0
        c["optimizer"] = 0.0
        c["lora"] = shape.lora_parameters(s.lora_r, s.lora_target_modules) * (4 + 4 + 8)
    else:
        master = 4 if b < 4 else 0
        if s.sharding == "ddp":
            c["weights"], c["gradients"], c["optimizer"] = P * b, P * b, 2 * P * b
        elif s.sharding == "zero2":
            c["weights"], c["gradients"], c["optimizer"] = P * b, 4 * P / n, (8 + master) * P / n
        elif s.sharding == "zero3":
            c["weights"], c["gradients"], c["optimizer"] = P * b / n, 4 * P / n, (8 + master) * P / n
        else:  # fsdp
            c["weights"], c["gradients"], c["optimizer"] = 4 * P / n, 4 * P / n, 8 * P / n
        c["lora"] = 0.0

    # training transient: one estimator chunk, forward + backward
    d, inter = shape.hidden, shape.active_intermediate()
    L = s.max_prompt_length + s.max_completion_length
    if shape.block_diffusion:
        L *= 2  # [noisy || clean] staircase layout
    rows_all = s.per_device_train_batch_size * max(1, s.mc_samples)
    r = rows_all if s.estimator_chunk_size is None else min(s.estimator_chunk_size, rows_all)
    T = r * L
    a = 10 * d + 4 * inter + (shape.n_heads * L if s.attention_matrix else 0)
    if s.gradient_checkpointing:
        act = shape.n_layers * T * d * b + T * a * b
    else:
        act = shape.n_layers * T * a * b
    copy = 4 if b < 4 else 0  # a float32 copy of bf16 logits
    logits = r * s.max_completion_length * shape.vocab * (b + copy + 12)
    gathered = shape.layer_parameters() * b * 2 if sharded else 0.0  # current + prefetched layer
    train = act + logits + gathered

    # rollout transient: the whole generation batch of this process, no gradients
    R = s.per_device_train_batch_size * max(1, s.steps_per_generation)
    Lr = s.max_prompt_length + s.max_completion_length
    r_act = R * Lr * (4 * d + 2 * inter) * b
    r_logits = R * s.block_length * shape.vocab * (b + copy + 4)
    cached = s.rollout_cache != "none" or shape.block_diffusion  # an approximate cache mode (checked above)
    kv = 2 * shape.n_layers * shape.n_kv_heads * shape.hd * R * Lr * b if cached else 0.0
    full_weights = P * b - c["weights"] if sharded else 0.0  # gathered for generation
    rollout = r_act + r_logits + kv + full_weights

    c["activations"] = act
    c["estimator_logits"] = logits
    c["gathered_layers"] = gathered
    c["rollout_activations"] = r_act
    c["rollout_logits"] = r_logits
    c["rollout_kv_cache"] = kv
    c["rollout_gathered_weights"] = full_weights
    c["runtime_overhead"] = float(s.overhead_bytes)
    persistent = c["weights"] + c["gradients"] + c["optimizer"] + c["lora"] + c["runtime_overhead"]
    c["phase"] = "training" if train >= rollout else "rollout"
    c["peak"] = persistent + max(train, rollout)
    if hasattr(shape, "refine"):  # a layout with its own transients (memory_plan_gemma.DiffusionGemmaShape)
        c = shape.refine(c, s)
    return c


def _setting(cfg: dict, key: str, kind, default):
    """cfg[key] (default when absent or None), of `kind` (int: not a bool; bool: a real true / false), or an error
    naming the key: a config's `use_peft: "no"` must not read as true, nor `per_device_train_batch_size: "8"` pass."""
    value = cfg.get(key)
    if value is None:
        return default
    if kind is bool and not isinstance(value, bool):
        raise TypeError(f"{key}={value!r} ({type(value).__name__}) must be true or false (without quotes).")
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{key}={value!r} ({type(value).__name__}) must be an integer.")
    if kind is str and not isinstance(value, str):
        raise TypeError(f"{key}={value!r} ({type(value).__name__}) must be a string.")
    return value


def settings_from_config(cfg: dict, gpus: int, sharding: str | None = None) -> PlanSettings:
    """PlanSettings from a training config (YAML as a dict); sharding defaults to ddp on one GPU, fsdp on several.
    The rollout rows per process are TRL's (`rollout_rows`: generation_batch_size, or steps_per_generation, or
    gradient_accumulation_steps). Wrong types and out-of-range values are errors naming the key."""
    if not isinstance(cfg, dict):
        raise TypeError(f"a training config is a mapping of settings, not {type(cfg).__name__}.")
    dtype = str(_setting(cfg, "dtype", str, None) or _setting(cfg, "torch_dtype", str, "float32"))
    from .diffusion.estimators import default_num_samples

    estimator = _setting(cfg, "likelihood_estimator", str, "block_random")
    mc_samples = _setting(cfg, "mc_samples", int, None)  # None: the estimator's own count (num_mc_samples)
    if mc_samples is None:
        mc_samples = default_num_samples(estimator, _setting(cfg, "sdmc_nodes", int, 3))
    per_device = _setting(cfg, "per_device_train_batch_size", int, 8)
    _check_int("per_device_train_batch_size", per_device, 1)
    _check_int("gpus", gpus, 1)
    accum = _setting(cfg, "gradient_accumulation_steps", int, 1)
    _check_int("gradient_accumulation_steps", accum, 1)
    steps = _setting(cfg, "steps_per_generation", int, None)
    generation_batch = _setting(cfg, "generation_batch_size", int, None)
    num_generations = _setting(cfg, "num_generations", int, None)
    for name, value in (("steps_per_generation", steps), ("generation_batch_size", generation_batch),
                        ("num_generations", num_generations)):  # fmt: skip
        if value is not None:
            _check_int(name, value, 1)
    rows, steps = rollout_rows(
        per_device,
        gpus,
        steps_per_generation=steps,
        generation_batch_size=generation_batch,
        gradient_accumulation_steps=accum,
        num_generations=num_generations,
    )
    return PlanSettings(
        gpus=gpus,
        sharding=sharding or ("ddp" if gpus == 1 else "fsdp"),
        bf16=dtype in ("bfloat16", "bf16", "float16"),
        use_peft=_setting(cfg, "use_peft", bool, False),
        lora_r=_setting(cfg, "lora_r", int, 16),
        lora_target_modules=cfg.get("lora_target_modules"),
        lora_target_parameters=cfg.get("lora_target_parameters"),
        gradient_checkpointing=_setting(cfg, "gradient_checkpointing", bool, False),
        per_device_train_batch_size=per_device,
        steps_per_generation=steps,
        mc_samples=mc_samples,
        estimator_chunk_size=_setting(cfg, "estimator_chunk_size", int, None),
        max_prompt_length=_setting(cfg, "max_prompt_length", int, 512),
        max_completion_length=_setting(cfg, "max_completion_length", int, 256),
        block_length=_setting(cfg, "block_length", int, 32),
        rollout_cache=_setting(cfg, "rollout_cache", str, "none"),
        likelihood_estimator=estimator,
    )


def advice(shape: ModelShape, s: PlanSettings, c: dict, gpu_bytes: float) -> list[str]:
    """Settings to change when the peak exceeds the GPU (largest component first); empty when it fits."""
    if c["peak"] <= gpu_bytes:
        return []
    out = []
    parts = sorted(((k, v) for k, v in c.items() if k not in ("peak", "phase")), key=lambda kv: -kv[1])
    for name, _ in parts[:3]:
        if name in ("optimizer", "gradients", "weights") and s.sharding in ("ddp", "zero2"):
            out.append("shard the model: --sharding zero3 or fsdp (configs/accelerate/zero3.yaml, fsdp.yaml)")
        elif name in ("optimizer", "gradients") and not s.use_peft:
            out.append("train LoRA adapters instead of every parameter (use_peft: true) or use more GPUs")
        elif name == "activations" and not s.gradient_checkpointing:
            out.append("gradient_checkpointing: true")
        elif name in ("activations", "estimator_logits") and shape.chunkable_estimator:
            out.append("a smaller estimator_chunk_size (rows per estimator forward)")
        elif name in ("activations", "estimator_logits"):
            out.append(
                "fewer training rows per micro-batch: a smaller per_device_train_batch_size with more "
                "gradient_accumulation_steps (the same batch), or fewer mc_samples"
            )
        elif name in ("rollout_activations", "rollout_logits", "rollout_kv_cache"):
            out.append("fewer rollout rows per process: a smaller per_device_train_batch_size or steps_per_generation")
        elif name == "rollout_gathered_weights":
            out.append("LoRA (use_peft: true) or GPUs with more memory: rollouts gather the full weights")
    return list(dict.fromkeys(out))


def format_plan(name: str, shape: ModelShape, s: PlanSettings, c: dict, gpu_gib: float) -> str:
    """The plan as text: one line per component (GiB), the peak, whether it fits, and what to change if not."""
    gib = lambda x: f"{x / GIB:.1f}"  # noqa: E731
    lines = [
        f"{name}: {shape.num_parameters() / 1e9:.2f}B parameters; {s.gpus} GPU(s) x {gpu_gib:g} GiB, {s.sharding}, "
        f"{'LoRA r ' + str(s.lora_r) if s.use_peft else 'full'}, {'bf16' if s.bf16 else 'fp32'}, gradient "
        f"checkpointing {'on' if s.gradient_checkpointing else 'off'}",
    ]
    for k in ("runtime_overhead", "weights", "gradients", "optimizer", "lora", "activations", "estimator_logits", "gathered_layers",
              "rollout_activations", "rollout_logits", "rollout_kv_cache", "rollout_gathered_weights"):  # fmt: skip
        if c[k]:
            lines.append(f"  {k:<26} {gib(c[k]):>7} GiB")
    fits = c["peak"] <= gpu_gib * GIB
    lines.append(f"  {'peak (' + c['phase'] + ')':<26} {gib(c['peak']):>7} GiB per GPU: "
                 f"{'fits' if fits else 'does NOT fit'} in {gpu_gib:g} GiB")  # fmt: skip
    for tip in advice(shape, s, c, gpu_gib * GIB):
        lines.append(f"  change: {tip}")
    return "\n".join(lines)


def comment_block(text: str) -> list[str]:
    """The plan as YAML comment lines, between markers that `scripts/plan.py --write-comment` replaces."""
    return [COMMENT_BEGIN, *[("# " + line).rstrip() for line in text.splitlines()], COMMENT_END]


COMMENT_BEGIN = "# --- memory estimate (python scripts/plan.py --write-comment; not a measurement) ---"
COMMENT_END = "# --- end of memory estimate ---"
