"""Protocol cards of the evaluations TRL runs during training: one card per evaluation, as `scripts/evaluate.py
--protocol` writes them (`protocol_card`).

    args = StableDRLConfig(..., eval_strategy="steps", eval_steps=100)
    trainer = StableDRLTrainer(model, reward_funcs, args=args, train_dataset=train, eval_dataset=test)
    trainer.train()     # output_dir/eval_cards/during_training/eval-step0000100.json, -step0000200.json, ...

When an `eval_dataset` is given and `eval_strategy` is not "no", `StableDRLTrainer` installs `EvalCardsCallback`.
During an evaluation the trainer hands it every completion's total reward (the weighted sum over the reward
functions that TRL logs as `eval_reward`, gathered from every process; `_calculate_rewards`); TRL's `on_evaluate`
then makes the main process write one card with:

- the step and epoch, and the metrics TRL logged for this evaluation (`logged_metrics`);
- the score: when every reward is 1 or 0, the accuracy (right completions over completions, equal to the logged
  `eval_reward`), with the prompt as the unit of its 95 % interval (the ratio estimator over prompts: the
  `num_generations_eval` completions of one prompt are not independent; Wilson's interval when there is one per
  prompt); otherwise the mean reward with a Student t interval over the prompts' mean rewards;
- the protocol: the run's sampler settings (the settings the evaluation decoded with), the reward functions and
  weights (the grader), which text they read (`reward_text`), the seed, the eval batch size, the number of
  processes, the dtype; and the provenance (commit, versions) of every card.

The cards go to `output_dir/eval_cards/during_training/<prefix>-step<step>.json` (prefix: TRL's metric prefix,
"eval", or "eval_<name>" for a dict of eval datasets), a folder of its own so the model card's results section
(rendered from `output_dir/eval_cards/*.json`) is not flooded with one row per evaluation. Completions whose
every reward function returned None are left out of the score and counted (`unscored`).
"""

from __future__ import annotations

import math
import os
import sys

import torch
from transformers import TrainerCallback

CARDS_FOLDER = os.path.join("eval_cards", "during_training")
PROTOCOL_NAME = "training_eval"


def install(trainer) -> EvalCardsCallback | None:
    """Add the callback to `trainer` when it evaluates periodically (eval_strategy steps / epoch, an eval_dataset)."""
    strategy = str(getattr(trainer.args.eval_strategy, "value", trainer.args.eval_strategy))
    if strategy == "no" or trainer.eval_dataset is None:
        return None
    callback = EvalCardsCallback(trainer)
    trainer.add_callback(callback)
    return callback


class EvalCardsCallback(TrainerCallback):
    """Collects the rewards of the running evaluation and writes its protocol card when TRL reports it."""

    def __init__(self, trainer):
        self._trainer = trainer
        self._totals: list[torch.Tensor] = []  # (N_batch,) per eval batch, every process's completions
        self._group_size = 1

    def add(self, totals: torch.Tensor, group_size: int) -> None:
        """One eval batch's total rewards (N_global,), NaN where no reward function scored the completion;
        consecutive runs of `group_size` rows are the completions of one prompt."""
        self._totals.append(totals.detach().float().cpu())
        self._group_size = int(group_size)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        totals, self._totals = self._totals, []
        if not totals or not state.is_world_process_zero:
            return
        prefix = _metric_prefix(metrics or {})
        card = eval_card(self._trainer, torch.cat(totals), self._group_size, state, metrics or {}, prefix)
        from .protocol_card import write_card

        name = f"{prefix}-step{state.global_step:07d}.json"
        write_card(os.path.join(args.output_dir, CARDS_FOLDER, name), card)


def _metric_prefix(metrics: dict) -> str:
    """TRL's metric_key_prefix of this evaluation ("eval", "eval_<dataset name>"), read from its `_runtime` key."""
    for key in metrics:
        if key.endswith("_runtime"):
            return key[: -len("_runtime")]
    return "eval"


def score_records(totals: torch.Tensor, group_size: int) -> tuple[str, list[dict], int]:
    """(metric, per-prompt records, unscored completions) of an evaluation's total rewards (N,).

    Every finite reward 1 or 0: "accuracy" (one completion per prompt: {"correct"}) or "accuracy_by_prompt"
    ({"right", "samples"} per prompt); otherwise "mean_reward" ({"reward": the prompt's mean}). NaN rewards (no
    function scored the completion) are left out; a prompt none of whose completions was scored is left out."""
    values = totals.tolist()
    if len(values) % group_size:
        group_size = 1  # a layout that does not split into groups (never with TRL's eval sampler): one per prompt
    groups = [values[i : i + group_size] for i in range(0, len(values), group_size)]
    scored = [[v for v in g if not math.isnan(v)] for g in groups]
    scored = [g for g in scored if g]
    unscored = sum(math.isnan(v) for v in values)
    binary = all(v in (0.0, 1.0) for g in scored for v in g)
    if binary and group_size == 1:
        return "accuracy", [{"correct": g[0] == 1.0} for g in scored], unscored
    if binary:
        return "accuracy_by_prompt", [{"right": int(sum(g)), "samples": len(g)} for g in scored], unscored
    return "mean_reward", [{"reward": sum(g) / len(g)} for g in scored], unscored


def eval_card(trainer, totals: torch.Tensor, group_size: int, state, metrics: dict, prefix: str) -> dict:
    """The protocol card of one evaluation during training (see the module docstring)."""
    from .diffusion.sampler_settings import SamplerSettings
    from .protocol_card import build_card
    from .protocols import DataSpec, PromptSpec, Protocol

    args = trainer.args
    metric, records, unscored = score_records(totals, group_size)
    try:
        sampler = SamplerSettings.from_config(args).to_dict()
    except (TypeError, ValueError):  # an autoregressive model: TRL's generation settings
        sampler = {"max_completion_length": args.max_completion_length, "temperature": args.temperature}
    weights = [float(w) for w in trainer.reward_weights.tolist()]
    names = list(trainer.reward_func_names)
    dataset = trainer.eval_dataset
    if isinstance(dataset, dict):
        dataset = dataset.get(prefix[len("eval_") :], dataset)
    count = len(dataset) if hasattr(dataset, "__len__") and not isinstance(dataset, dict) else None
    world = trainer.accelerator.num_processes
    try:
        dtype = str(next(trainer.model.parameters()).dtype).replace("torch.", "")
    except StopIteration:
        dtype = "unknown"
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy))
    protocol = Protocol(
        name=PROTOCOL_NAME,
        task=prefix,
        source=f"StableDRLTrainer evaluation during training (TRL eval_strategy={strategy}, eval_steps="
        f"{args.eval_steps}); reward = sum of {', '.join(f'{w:g} x {n}' for n, w in zip(names, weights))}",
        data=DataSpec(path="eval_dataset" if prefix == "eval" else prefix, split="eval", count=count),
        prompt=PromptSpec(question_template="{prompt}", chat_template=True, add_special_tokens=False),
        sampler=sampler,
        grader=" + ".join(names),
        metric=metric,
        decode=getattr(args, "reward_text", "completion"),
        seeds=(int(args.seed),),
        batch_size=int(args.per_device_eval_batch_size),
        num_processes=world,
        dtype=dtype,
        notes=(
            f"{group_size} completion(s) per prompt (num_generations_eval); the score's interval takes the prompt "
            "as the unit",
            "the prompt is the eval dataset's prompt column as TRL renders it (the chat template for conversational "
            "rows)",
        ),
    )
    device = str(trainer.accelerator.device)
    runtime = {"dtype": dtype, "device": device, "num_processes": world,
               "batch_size": int(args.per_device_eval_batch_size)}  # fmt: skip
    # the command: the training script this process runs (its path and arguments)
    card = build_card(protocol, {int(args.seed): records}, model=args.output_dir, runtime=runtime,
                      data={"path": protocol.data.path, "count": count}, script=sys.argv[0] or "python")  # fmt: skip
    card.update(
        step=int(state.global_step),
        epoch=state.epoch,
        completions=int(totals.numel()),
        unscored=int(unscored),
        reward_functions={n: w for n, w in zip(names, weights)},
        logged_metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
    )
    return card
