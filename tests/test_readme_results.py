"""Every marked results block of README.md equals its rendering from the committed JSON in docs/.

A block `<!-- name:start -->` ... `<!-- name:end -->` is rendered by a results script (scripts/*.py defining
`readme_blocks(docs_dir)`) from its JSON alone; regenerate with that script's `--write-readme`.
"""

from pathlib import Path

import pytest

from stabledrl_trl import results

ROOT = Path(__file__).resolve().parent.parent
RENDERING_SCRIPTS = sorted(p.stem for p in (ROOT / "scripts").glob("*.py") if "def readme_blocks(" in p.read_text())


@pytest.fixture(scope="module")
def rendered(load_script):
    blocks = {}
    for name in RENDERING_SCRIPTS:
        for block, text in load_script(name).readme_blocks(str(ROOT / "docs")).items():
            assert block not in blocks, f"README block {block!r} is rendered by two scripts"
            blocks[block] = (name, text)
    return blocks


def test_rendering_scripts_are_found():
    expected = {"bench_embedded", "bench_stability", "bench_estimators", "bench_memory", "bench_block_rollout",
                "bench_eos_tail", "bench_step", "bench_rollout", "bench_plan"}  # fmt: skip
    assert expected <= set(RENDERING_SCRIPTS)


def test_every_marked_readme_block_equals_the_rendering_of_its_json(rendered):
    in_readme = results.marked_blocks((ROOT / "README.md").read_text())
    assert in_readme, "README.md has no marked results blocks"
    for block, text in in_readme.items():
        assert block in rendered, (
            f"README block {block!r} has no committed JSON in docs/ that a results script renders; run the script "
            "that writes it with --write-readme"
        )
        script, expected = rendered[block]
        assert text == expected, (
            f"README block {block!r} differs from the rendering of its JSON: run "
            f"`python scripts/{script}.py ... --write-readme` (the command is in the JSON's provenance)"
        )


def test_committed_results_record_commit_command_and_versions(rendered):
    for path in sorted((ROOT / "docs").glob("*.json")):
        data = results.read_json(str(path))
        if "provenance" not in data:
            continue
        p = data["provenance"]
        assert p["command"].startswith("python scripts/") and set(p["versions"]) >= {"torch", "transformers", "trl"}
        assert "commit" in p and "dirty" in p
