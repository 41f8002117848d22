"""Say, once at start-up, which of `StableDRLConfig`'s defaults that differ from TRL's `GRPOConfig` are in effect.

A TRL script with only the class names swapped trains with `loss_type="stable_drl"` and `scale_rewards="none"`
(and, for a diffusion LM, the official rollout temperature and length) instead of GRPOConfig's values; the trainer
logs which of those the run uses and the arguments that give TRL's values back (`stabledrl_config.CHANGED_GRPO_DEFAULTS`
lists them with the reasons).
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# The rollout defaults that an autoregressive model does not use (it keeps GRPOConfig's: `autoregressive_defaults`).
_DIFFUSION_ONLY = ("temperature", "max_completion_length")


def changed_defaults_in_effect(args, is_diffusion: bool) -> dict:
    """{field: (GRPOConfig default, value in effect, reason)} for each field of `CHANGED_GRPO_DEFAULTS` whose value
    in `args` is StableDRLConfig's default and not GRPOConfig's (an explicit setting to StableDRL's value is listed
    too: the values, not the intent, are compared)."""
    from .stabledrl_config import CHANGED_GRPO_DEFAULTS

    found = {}
    for name, (trl_default, own_default, reason) in CHANGED_GRPO_DEFAULTS.items():
        if name in _DIFFUSION_ONLY and not is_diffusion:
            continue
        value = getattr(args, name, None)
        if value == own_default and value != trl_default:
            found[name] = (trl_default, value, reason)
    return found


def changed_defaults_message(found: dict) -> str:
    """The start-up note for `changed_defaults_in_effect`'s result ('' when nothing differs)."""
    if not found:
        return ""
    items = "; ".join(f"{k}={v!r} (GRPOConfig: {trl!r}; {why})" for k, (trl, v, why) in found.items())
    fix = ", ".join(f"{k}={trl!r}" for k, (trl, _, _) in found.items())
    return (
        f"StableDRLConfig defaults that differ from TRL's GRPOConfig are in effect: {items}. For TRL's behaviour "
        f"set {fix} in StableDRLConfig(...)."
    )


def announce_changed_defaults(args, is_diffusion: bool) -> str:
    """Log the note once (the trainer calls it at construction, on the main process); returns it."""
    message = changed_defaults_message(changed_defaults_in_effect(args, is_diffusion))
    if message:
        logger.warning(message)
    return message
