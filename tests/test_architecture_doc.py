"""docs/architecture.md against the code: the paths, hooks and registry functions it names, the recipes' files and
the layout list, so the page cannot drift from the package."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()


def section(title: str) -> str:
    """The text of the '## title' section (up to the next '## ' heading)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", DOC, flags=re.S | re.M)
    assert match, f"docs/architecture.md has no section '## {title}'"
    return match.group(1)


def package_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in (ROOT / "stabledrl_trl").rglob("*.py")}


def test_every_path_named_exists():
    paths = set(re.findall(r"`((?:stabledrl_trl|tests|scripts|docs)/[^`<>]*?)`", DOC))
    assert len(paths) > 20
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_layout_lists_every_module_once():
    listed = re.findall(r"^- `(stabledrl_trl/[^`]+\.py)`:", section("Layout"), flags=re.M)
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert set(listed) == package_modules(), (
        f"missing from the layout: {sorted(package_modules() - set(listed))}; "
        f"listed but absent: {sorted(set(listed) - package_modules())}"
    )


def test_recipes_name_one_or_two_files_each():
    recipes = re.findall(r"^### Recipe: (.+?)\n\nFiles: (.+?)\n\n", section("Recipes"), flags=re.M | re.S)
    assert [name for name, _ in recipes] == [
        "a new model family",
        "a new objective",
        "a new likelihood estimator",
        "a new task",
    ]
    for name, files in recipes:
        named = re.findall(r"`([^`]+\.py)`", files)
        assert 1 <= len(named) <= 2, (name, named)
        for path in named:
            folder = ROOT / path.split("<name>")[0] if "<name>" in path else ROOT / path
            assert folder.exists(), (name, path)


@pytest.mark.parametrize(
    "module, names",
    [
        ("stabledrl_trl.diffusion.family_base", ["register_family", "DiffusionFamily", "detect_family"]),
        ("stabledrl_trl.objectives", ["register_objective", "PolicyLossInputs", "aggregate_loss"]),
        ("stabledrl_trl.diffusion.estimators", ["register_estimator", "SHARED_KEYWORDS", "shared_keywords",
                                             "EstimatorInputs", "estimate_likelihood"]),  # fmt: skip
        ("stabledrl_trl.diffusion.block_estimators", ["staircase_estimate"]),
        ("stabledrl_trl.diffusion.family", ["as_diffusion_lm", "MaskedDiffusionFamily", "BlockDiffusionFamily"]),
        ("stabledrl_trl.tasks", ["TASKS", "TaskSpec", "register_task"]),
        ("stabledrl_trl.diffusion.llada_sampler", ["CACHE_MODES", "sampling_step"]),
        ("stabledrl_trl.validation", ["check_inputs_before_loading", "check_model_setup", "check_data_setup",
                                      "check_launch_setup"]),  # fmt: skip
    ],
)
def test_named_functions_are_defined_where_the_page_says(module, names):
    mod = importlib.import_module(module)
    for name in names:
        assert f"`{name}" in DOC, f"{name} is not named on the page"
        assert hasattr(mod, name), f"{module} has no {name}"


def test_the_hooks_named_are_the_overridden_ones():
    from stabledrl_trl import StableDRLTrainer

    hooks = re.findall(r"`(_[a-z_]+|training_step)`", section("One training step"))
    overridden = {"_generate_single_turn", "_get_per_token_logps_and_entropies", "_generate_and_score_completions",
                  "_calculate_rewards", "_prepare_inputs", "_compute_loss", "training_step"}  # fmt: skip
    assert overridden <= set(hooks)
    for hook in set(hooks):
        assert hook in StableDRLTrainer.__dict__, f"the page names {hook}, which StableDRLTrainer does not override"
