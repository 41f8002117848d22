"""README.md and docs/reliability.md: every in-page link resolves to a heading, every relative link to a file, and
every test the reliability table names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_slug_rule_on_known_headings():
    assert _slug("Dream's sampler (`diffusion_sampler`, `dream_*`)") == "dreams-sampler-diffusion_sampler-dream_"
    assert _slug("Block diffusion (SDAR, TraDo, LLaDA2)") == "block-diffusion-sdar-trado-llada2"


def test_in_page_links_resolve_to_headings():
    text = (ROOT / "README.md").read_text()
    anchors = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links, "the README's contents list links to its sections"
    missing = sorted(set(links) - anchors)
    assert not missing, f"README links to headings that do not exist: {missing}"


def test_relative_links_point_at_files():
    for doc in (ROOT / "README.md", ROOT / "docs" / "reliability.md"):
        for target in re.findall(r"\]\((?!https?://|#)([^)#\s]+)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"


def test_reliability_table_names_existing_tests():
    text = (ROOT / "docs" / "reliability.md").read_text()
    names = re.findall(r"`([\w/]+\.py)::(\w+)", text)
    assert len(names) > 20
    for path, test in names:
        source = ROOT / "tests" / path
        assert source.is_file(), f"docs/reliability.md names {path}, which is not a test file"
        assert re.search(rf"def {test}\b", source.read_text()), f"docs/reliability.md names {path}::{test}, not defined"
