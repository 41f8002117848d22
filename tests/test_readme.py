"""README.md and the docs/*.md pages: the README is a short front page; every in-page or cross-page link resolves to
a heading, every relative link to a file; no page cites a document users do not have; every test the reliability
table names exists."""

import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_slug_rule_on_known_headings():
    assert _slug("Dream's sampler (`diffusion_sampler`, `dream_*`)") == "dreams-sampler-diffusion_sampler-dream_"
    assert _slug("Block diffusion (SDAR, TraDo, LLaDA2)") == "block-diffusion-sdar-trado-llada2"


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '# comment' in a code block is no heading
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_links_resolve_to_files_and_headings():
    """`](#x)` needs heading x in the page; `](page.md#x)` needs the file and heading x in it; `](file)` the file."""
    checked = 0
    for page in PAGES:
        for target, anchor in re.findall(r"\]\((?!https?://)([^)#\s]*)(?:#([^)\s]+))?\)", page.read_text()):
            linked = (page.parent / target).resolve() if target else page
            assert linked.exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"
            if anchor:
                assert anchor in _anchors(linked), f"{page.relative_to(ROOT)} links to {target}#{anchor}: no heading"
            checked += 1
    assert checked > 30


def test_readme_is_a_front_page_linking_every_docs_page():
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines: move reference material to a page under docs/"
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    for needed in ("Install", "Quick start", "Three ways to use it", "Tests", "Where to go next"):
        assert any(h.startswith(needed) for h in headings), f"README.md has no '{needed}' section"
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", text))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - {"architecture.md"} <= linked, f"docs pages the README does not link: {sorted(pages - linked)}"
    assert "architecture.md" in linked  # written by its own change; the link is the README's part
    tests = text.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    ci_command = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci_command.startswith("python -m pytest") and f"{ci_command}  " in tests  # CI runs the full suite
    durations = re.findall(r"# (the full suite|the quick check|a smoke check)[^\n]*?: (?:about )?\d+ (?:min|s)\b", tests)
    assert set(durations) == {"the full suite", "the quick check", "a smoke check"}, "each test command gives its time"
    for command in ("python scripts/train.py --config configs/tiny.yaml", "scripts/make_tiny_model.py",
                    "--config_file configs/accelerate/cpu_2proc.yaml", "--use_peft true", '-m "not slow"'):  # fmt: skip
        assert command in text, command


def test_pages_cite_no_internal_reference_document():
    for page in PAGES:
        assert not re.search(r"REFERENCE\s*(§|:)", page.read_text()), f"{page.name} cites REFERENCE, which users lack"


def test_reliability_table_names_existing_tests():
    text = (ROOT / "docs" / "reliability.md").read_text()
    names = re.findall(r"`([\w/]+\.py)::(\w+)", text)
    assert len(names) > 20
    for path, test in names:
        source = ROOT / "tests" / path
        assert source.is_file(), f"docs/reliability.md names {path}, which is not a test file"
        assert re.search(rf"def {test}\b", source.read_text()), f"docs/reliability.md names {path}::{test}, not defined"


def test_readme_states_the_sequence_ratio_form_the_trainer_uses():
    """The README says the sequence ratio is a per-token mean (the official code's form); the objectives' input is
    that masked mean over the completion tokens, so a sum would change the weights the sentence describes."""
    import torch

    from stabledrl_trl import objectives

    text = (ROOT / "README.md").read_text()
    assert "The sequence ratio is a per-token mean, as in the official code" in text and "docs/length_noise.md" in text
    # one group of 2; row 0 scores 3 tokens (the 4th is padding), row 1 all 4; the old policy's values are 0
    new = torch.tensor([[0.2, -0.4, 0.8, 5.0], [0.1, 0.1, 0.1, 0.1]])  # (B, T)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    x = objectives.PolicyLossInputs(per_token_logps=new, old_per_token_logps=torch.zeros_like(new),
                                    advantages=torch.tensor([1.0, -1.0]), mask=mask, group_size=2,
                                    settings={"clip_c": 5.0})  # fmt: skip
    stats = objectives.get_objective("stable_drl")(x).stats
    mean_form = math.exp((0.2 - 0.4 + 0.8) / 3)  # row 0's weight: exp of the mean per-token log-ratio, 1.22
    assert stats["weight_max"].item() == pytest.approx(mean_form)  # the sum form would give exp(0.6) = 1.82
