"""The float ranges of the config are checked once, by `checks.check_config_values` (`checks.FLOAT_RANGES`), before
anything else in `StableDRLConfig.__post_init__`: a value just outside each range, and a non-finite value, fail there
with the field, the value and the range, so no later range check on these fields could ever be reached."""

from __future__ import annotations

import math
import warnings

import pytest

from stabledrl_trl import StableDRLConfig
from stabledrl_trl.checks import FLOAT_RANGES

# The fields whose range checks in __post_init__ were removed as unreachable (their bounds are FLOAT_RANGES').
FIELDS = (
    "clip_c", "p_mask_prompt", "sandwich_beta", "sandwich_omega", "dgpo_n", "dgpo_m", "parallel_threshold",
    "cfg_scale", "temperature", "top_p", "block_confidence_threshold",
)  # fmt: skip


def outside_and_inside(name: str) -> list[tuple[float, bool]]:
    """(value, accepted) pairs at each finite bound of the field's range."""
    low, low_open, high, high_open, _ = FLOAT_RANGES[name]
    pairs = []
    for bound, is_open, direction in ((low, low_open, -1.0), (high, high_open, 1.0)):
        if bound is None:
            continue
        pairs.append((bound + direction * 1e-6, False))  # just outside
        pairs.append((bound, not is_open))  # on the bound: accepted iff the bound is closed
    return pairs


def build(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4,
                num_generations=4, mask_seed_mode="shared")  # fmt: skip
    return StableDRLConfig(**{**base, **kw})


@pytest.mark.parametrize("name", FIELDS)
def test_each_float_range_fails_in_the_value_check_first(tmp_path, name):
    extra = {"temperature": 0.5} if name != "temperature" else {}
    for value, accepted in [*outside_and_inside(name), (math.nan, False), (math.inf, False)]:
        if accepted:  # on a closed bound: the value check lets it through, and so does the rest of the config
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # temperature 0 with several generations: a warning, by design
                assert getattr(build(tmp_path, **{name: value}, **extra), name) == value
            continue
        with pytest.raises(ValueError) as info:
            build(tmp_path, **{name: value})
        message = str(info.value)
        assert message.startswith(f"{name}=") and ("is out of range" in message or "is not finite" in message), message
