"""The model card `StableDRLTrainer` writes next to a saved model: what trained it, how to load and decode it."""

from __future__ import annotations

import os
from importlib.metadata import version

from huggingface_hub import ModelCard, ModelCardData

from .diffusion.sampler_settings import SamplerSettings
from .objectives import OBJECTIVES

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "model_card.md")


def describe_objective(args) -> tuple[str, str]:
    """(short name, one paragraph) of the objective a config trains with."""
    loss = args.loss_type
    estimator = f"sequence likelihoods estimated with the `{args.likelihood_estimator}` estimator"
    objective = OBJECTIVES.get(loss)
    if objective is not None and objective.describe is not None:
        short, detail = objective.describe(args)  # the objective's own words (`register_objective(describe=...)`)
    elif objective is not None:
        short = f"the `{loss}` objective (registered with `register_objective`), with StableDRLTrainer"
        detail = f"Objective: `{loss}` (`loss_type='{loss}'`, {objective.level} level)"
    else:
        short = f"TRL's `{loss}` objective (a GRPO-family baseline), with StableDRLTrainer"
        detail = f"Objective: TRL's `{loss}` loss (beta={args.beta:g})"
    detail += (
        f"; {estimator} ({args.num_mc_samples} Monte-Carlo mask sample{'s' if args.num_mc_samples != 1 else ''}), "
        "advantages scaled with "
        f"scale_rewards='{args.scale_rewards}', num_iterations={args.num_iterations}, "
        f"learning_rate={args.learning_rate:g}."
    )
    return short, detail


def _family_import(family) -> str:
    """The import line a card needs for a family defined outside this package (its module registers the family and,
    usually, the model's architecture); "" for the built-in families."""
    module = type(family).__module__
    if module.split(".")[0] == "stabledrl_trl":
        return ""
    if module == "__main__":  # defined in the training script itself
        return f"# import the module that defines {type(family).__name__} (it registers the family and its model classes)"
    return f"import {module}  # registers the {family.name!r} family (and its model classes)"


def build_model_card(trainer, model_name=None, dataset_name=None, tags=None) -> ModelCard:
    from trl.trainer.utils import get_config_model_id

    from .diffusion.adapter import unwrap_model
    from .version import __version__

    args = trainer.args
    inner = unwrap_model(trainer.model)
    config = inner.config
    base = get_config_model_id(config)
    base_model = base if base and not os.path.isdir(base) else None
    model_id = trainer.hub_model_id or args.output_dir
    tags = {tags} if isinstance(tags, str) else set(tags or [])
    tags.update(trainer._tag_names)
    short, detail = describe_objective(args)
    sampler = SamplerSettings.from_config(args)
    if trainer.is_diffusion:
        snippet = trainer._diffusion_family.card_snippet(sampler)  # the family's sampler, as its rollouts decoded
        generate_import, generate_call, rollouts = snippet
    else:
        generate_import, generate_call = "", ""
        detail = detail.split("; sequence likelihoods")[0] + "; exact autoregressive log-probabilities."
        rollouts = "TRL's autoregressive generation."
    card_data = ModelCardData(
        base_model=base_model,
        datasets=dataset_name,
        library_name="transformers",
        model_name=model_name or os.path.basename(os.path.normpath(args.output_dir)),
        tags=["generated_from_trainer", *sorted(tags)],
    )
    return ModelCard.from_template(
        card_data,
        template_path=TEMPLATE,
        model_name=model_name or os.path.basename(os.path.normpath(args.output_dir)),
        base_model=base_model,
        dataset_name=dataset_name,
        model_id=model_id,
        objective=short,
        objective_details=detail,
        rollouts=rollouts,
        is_diffusion=trainer.is_diffusion,
        family=getattr(trainer, "_family_name", None),
        family_module=_family_import(trainer._diffusion_family) if trainer.is_diffusion else "",
        model_type=getattr(config, "model_type", ""),
        gen_length=sampler.max_completion_length,
        block_length=sampler.block_length,
        steps=sampler.diffusion_steps,
        remasking=sampler.remasking,
        generate_import=generate_import,
        generate_call=generate_call,
        stabledrl_version=__version__,
        trl_version=version("trl"),
        transformers_version=version("transformers"),
        pytorch_version=version("torch"),
    )
