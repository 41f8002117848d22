"""Every marked results block of README.md and of the docs/*.md pages equals its rendering from the committed JSON.

A block `<!-- name:start -->` ... `<!-- name:end -->` is rendered by a results script (scripts/*.py defining
`readme_blocks(docs_dir)`) from its JSON alone; regenerate with that script's `--write-readme` (or `--readme-only`),
which writes the block into whichever page holds its markers.
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


def test_every_marked_block_equals_the_rendering_of_its_json(rendered):
    found = {}
    for page in results.documentation_pages(str(ROOT / "README.md")):
        for block, text in results.marked_blocks(Path(page).read_text()).items():
            assert block not in found, f"block {block!r} is marked in {found[block][0]} and in {page}"
            found[block] = (page, text)
    assert "headline" in found and found["headline"][0].endswith("README.md")  # the front page keeps the headline
    assert len(found) >= 19 and any("docs" in page for page, _ in found.values())
    for block, (page, text) in found.items():
        assert block in rendered, (
            f"block {block!r} of {page} has no committed JSON in docs/ that a results script renders; run the "
            "script that writes it with --write-readme"
        )
        script, expected = rendered[block]
        assert text == expected, (
            f"block {block!r} of {page} differs from the rendering of its JSON: run "
            f"`python scripts/{script}.py ... --readme-only` (the command is in the JSON's provenance)"
        )
    missing = sorted(set(rendered) - set(found))
    assert not missing, f"rendered blocks no page marks: {missing}"


def test_readme_only_rewrites_every_page_unchanged(load_script, tmp_path, monkeypatch):
    """`--readme-only` of every rendering script, on a copy of the pages whose blocks were all made stale: each
    script writes its blocks into the page that holds them, and the pages come out as committed."""
    import shutil

    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy(page, tmp_path / "docs" / page.name)
    pages = [tmp_path / "README.md", *(tmp_path / "docs").glob("*.md")]
    before = {p.name: p.read_text() for p in pages}
    stale = 0
    for p in pages:
        text = p.read_text()
        for block in results.marked_blocks(text):
            text = results.replace_block(text, block, "stale")
            stale += 1
        p.write_text(text)
    assert stale >= 19
    monkeypatch.setattr(results, "README", str(tmp_path / "README.md"))
    for name in RENDERING_SCRIPTS:
        script = load_script(name)
        flag = "--readme-only" if "--readme-only" in script.make_parser().format_help() else None
        assert flag, f"scripts/{name}.py has no --readme-only"
        if name == "bench_stability":
            script.main(["--readme-only", "--output-dir", str(ROOT / "docs")])
        elif name == "bench_estimators":
            script.main(["--readme-only"])
        else:
            script.main(["--readme-only", "--docs-dir", str(ROOT / "docs")])
    after = {p.name: p.read_text() for p in [tmp_path / "README.md", *(tmp_path / "docs").glob("*.md")]}
    assert after == before
    for name, text in after.items():
        assert results.marked_blocks(text) is not None, name


def test_committed_results_record_commit_command_and_versions(rendered):
    for path in sorted((ROOT / "docs").glob("*.json")):
        data = results.read_json(str(path))
        if "provenance" not in data:
            continue
        p = data["provenance"]
        assert p["command"].startswith("python scripts/") and set(p["versions"]) >= {"torch", "transformers", "trl"}
        assert "commit" in p and "dirty" in p
