"""Reproducible results: provenance of a results file, and documentation tables rendered from it.

A results script (scripts/bench_*.py) writes one summary JSON holding its numbers, the settings, and `provenance()`:
the commit (`git rev-parse HEAD` and whether the work tree had uncommitted changes), the exact command, the
versions of Python, torch, transformers and trl (and of the other libraries a run uses), and the machine (CPU model,
torch's CPU capability, cores): seeded runs repeat exactly on one machine, not always across machines. Its tables are
rendered from that JSON alone and sit between markers in one documentation page (README.md or a page docs/*.md)

    <!-- name:start -->
    ...rendered text...
    <!-- name:end -->

which `replace_block` (the scripts' `--write-readme`) rewrites. A block lives in exactly one page: `block_page(name)`
finds it by its markers, so a table moved to another page needs no change to the script that renders it.
tests/test_readme_results.py renders every marked block of every page again from the committed JSON and compares
it with the page, so a documented number cannot differ from the JSON.

Small statistics for the studies (no scipy): `mean_std`, `paired_t_test` (Student's t, exact p-value for integer
degrees of freedom) and `sign_test` (exact two-sided binomial test).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO_ROOT, "README.md")
DOCS = os.path.join(REPO_ROOT, "docs")
VERSIONED_PACKAGES = ("torch", "transformers", "trl")
# Libraries a run's numbers can also depend on, recorded beside VERSIONED_PACKAGES (not rendered in the docs line).
LIBRARIES = ("accelerate", "datasets", "numpy", "peft", "safetensors", "tokenizers")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", REPO_ROOT, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out


def git_state() -> dict:
    """{"commit": HEAD's hash or None outside a git checkout, "dirty": uncommitted changes to tracked files}."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head.strip() if head else None, "dirty": bool(status.strip()) if status is not None else None}


def package_versions(names=VERSIONED_PACKAGES, python: bool = True) -> dict:
    """{package: installed version (None if absent)}, plus "python" unless python=False."""
    versions = {"python": sys.version.split()[0]} if python else {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo, else `platform.processor()`), or None when unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_info() -> dict:
    """What a run's rounding can depend on beyond the package versions: the CPU model, the vector instructions
    torch's CPU kernels use (`torch.backends.cpu.get_cpu_capability()`), the core count and the platform. Two
    machines with different entries here can train the same seeded run to different numbers."""
    try:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        capability = None
    return {"cpu": cpu_model(), "cpu_capability": capability, "cores": os.cpu_count(), "platform": platform.platform()}


def command_line(script: str, argv: list[str] | None) -> str:
    """The command that reproduces a run: `python <script path relative to the repo> <arguments>`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    path = os.path.relpath(os.path.abspath(script), REPO_ROOT)
    return shlex.join(["python", path, *[str(a) for a in argv]])


def provenance(script: str, argv: list[str] | None = None) -> dict:
    """What a results file records about how it was made: commit, dirty flag, command, package versions (`versions`,
    named in the docs line; `libraries`, recorded only) and the machine (`machine_info`)."""
    return {**git_state(), "command": command_line(script, argv), "versions": package_versions(),
            "libraries": package_versions(LIBRARIES, python=False), "machine": machine_info()}  # fmt: skip


def write_json(path: str, data: dict) -> None:
    """Write `data` as indented JSON, creating the folder. A non-finite float (a diverged run's grad norm) is
    written as Python's json writes it (NaN, Infinity), which `read_json` reads back."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _markers(name: str) -> tuple[str, str]:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"block name {name!r}: use letters, digits, '_', '-' or '.'")
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


_BLOCK = re.compile(r"<!-- ([A-Za-z0-9_.-]+):start -->\n(.*?)<!-- \1:end -->", re.S)
_ANY_MARKER = re.compile(r"<!-- [A-Za-z0-9_.-]+:(?:start|end) -->")


def documentation_pages(readme: str | None = None) -> list[str]:
    """The pages that may hold rendered blocks: the README (default: the repository's README.md) and every *.md in
    the docs/ folder beside it, in a fixed order."""
    readme = README if readme is None else readme
    docs = os.path.join(os.path.dirname(os.path.abspath(readme)), "docs")
    pages = sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md")) if os.path.isdir(docs) else []
    return [readme, *pages]


def block_page(name: str, pages: list[str] | None = None) -> str:
    """The one page of `pages` (default: `documentation_pages()`) holding block `name`'s start marker.

    Raises SystemExit naming the pages when no page, or more than one, holds it."""
    start, _ = _markers(name)
    pages = documentation_pages() if pages is None else pages
    holding = []
    for page in pages:
        with open(page) as f:
            if start in f.read():
                holding.append(page)
    if len(holding) != 1:
        where = ", ".join(_shown(p) for p in holding) if holding else "no page"
        raise SystemExit(
            f"block {name!r}: its '{start}' marker is in {where}; it must be in exactly one of README.md and "
            "docs/*.md: put the two markers where the table belongs (one page) and rerun"
        )
    return holding[0]


def marked_blocks(text: str) -> dict[str, str]:
    """{name: content} of every marked block of a README text (content without the marker lines)."""
    blocks = {}
    for match in _BLOCK.finditer(text):
        if match.group(1) in blocks:
            raise ValueError(f"README block {match.group(1)!r} is marked twice")
        inner = _ANY_MARKER.search(match.group(2))
        if inner:
            raise ValueError(f"block {match.group(1)!r} holds the marker text {inner.group(0)!r} inside it")
        blocks[match.group(1)] = match.group(2)
    starts = re.findall(r"<!-- ([A-Za-z0-9_.-]+):start -->", text)
    unclosed = sorted(set(starts) - set(blocks))
    if unclosed:
        raise ValueError(f"README blocks without a matching end marker: {unclosed}")
    return blocks


def replace_block(text: str, name: str, content: str) -> str:
    """`text` with the content between the markers of block `name` replaced by `content` (a final newline added).

    Raises ValueError when the markers are absent or appear more than once (place them in the page first), or when
    `content` itself holds marker text (`<!-- x:start -->`, `<!-- x:end -->`): written into the page it would end
    the block early or open a second one, and the next rewrite would cut the page at the wrong place.
    """
    start, end = _markers(name)
    inner = _ANY_MARKER.search(content)
    if inner:
        raise ValueError(
            f"block {name!r}: its rendered content holds the marker text {inner.group(0)!r}, which would break the "
            "page's block structure on the next rewrite; render the text without '<!-- name:start/end -->' comments"
        )
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(
            f"README block {name!r}: expected one {start!r} line followed by one {end!r} line; add the two markers "
            "where the table belongs"
        )
    if not content.endswith("\n"):
        content += "\n"
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{content}{end}{tail}"


def _shown(path: str) -> str:
    """A page's path as messages show it: relative to the repository when inside it."""
    rel = os.path.relpath(os.path.abspath(path), REPO_ROOT)
    return path if rel.startswith("..") else rel


def check_readme_blocks(names, readme: str | None = None, pages: list[str] | None = None) -> None:
    """Raise SystemExit before a long run when the page of a block the run would write lacks its markers.

    `readme` None: each block's page is found by its markers among `pages` (default README.md and docs/*.md)."""
    for name in names:
        page = block_page(name, pages) if readme is None else readme
        with open(page) as f:
            text = f.read()
        start, end = _markers(name)
        if text.count(start) != 1 or text.count(end) != 1:
            raise SystemExit(
                f"--write-readme: {_shown(page)} needs one '{start}' line and one '{end}' line "
                f"where the {name} table belongs; add them (in the section the table belongs to) and rerun"
            )


def rewrite_readme_only(blocks: dict[str, str], docs_dir: str, expected: str, readme: str | None = None) -> None:
    """A results script's `--readme-only`: rewrite its blocks from the committed JSON alone (no run); stop with a
    message naming the `expected` JSON files when `docs_dir` holds none."""
    if not blocks:
        raise SystemExit(f"--readme-only: no {expected} in {docs_dir}; run with --write-readme first")
    written = write_readme_blocks(blocks, readme)
    print(f"rewrote blocks {', '.join(blocks)} in {', '.join(written)} from {docs_dir}", flush=True)


def write_readme_blocks(
    blocks: dict[str, str], readme: str | None = None, pages: list[str] | None = None
) -> list[str]:
    """Replace each named block by its rendering, in `readme` or (None) in the page of `pages` (default README.md
    and docs/*.md) holding the block's markers (`block_page`). Returns the pages written, as messages show them.

    Every block is rendered into its page's text before any page is written, so a refused block writes nothing."""
    texts: dict[str, str] = {}
    for name, content in blocks.items():
        page = block_page(name, pages) if readme is None else readme
        if page not in texts:
            with open(page) as f:
                texts[page] = f.read()
        texts[page] = replace_block(texts[page], name, content)
    for page, text in texts.items():
        with open(page, "w") as f:
            f.write(text)
    return [_shown(p) for p in texts]


def markdown_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table (cells converted with str)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def commit_label(state: dict) -> str:
    """A `git_state()` record as the docs print it: the short hash, and "(uncommitted changes)" when dirty."""
    return (state["commit"] or "unknown")[:10] + (" (uncommitted changes)" if state["dirty"] else "")


def provenance_line(data: dict) -> str:
    """One README line naming the JSON's commit, command and versions."""
    p = data["provenance"]
    commit = commit_label(p)
    v = p["versions"]
    return (
        f"Generated by `{p['command']}` at commit {commit}; Python {v['python']}, torch {v['torch']}, "
        f"transformers {v['transformers']}, trl {v['trl']}.\n"
    )


# --- statistics ---------------------------------------------------------------------------------------------------


def mean_std(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation with n - 1); the std of one value is 0."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_std: no values")
    mean = sum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def student_t_two_sided_p(t: float, df: int) -> float:
    """P(|T| >= |t|) for Student's t with integer df >= 1, exactly (Abramowitz & Stegun 26.7.3-26.7.4).

    With theta = atan(|t| / sqrt(df)), P(|T| < |t|) is
    odd df:  (2 / pi) * (theta + sin(theta) * sum_{k=0}^{(df-3)/2} c_k cos(theta)^(2k+1)),
             c_0 = 1, c_k = c_{k-1} * 2k / (2k + 1)                              (df = 1: 2 theta / pi)
    even df: sin(theta) * sum_{k=0}^{(df-2)/2} d_k cos(theta)^(2k), d_0 = 1, d_k = d_{k-1} * (2k - 1) / (2k).
    """
    if not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1, got {df!r}")
    if math.isinf(t):
        return 0.0
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        total, term = 0.0, c
        for k in range((df - 1) // 2):
            if k:
                term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        inside = 2.0 / math.pi * (theta + s * total)
    else:
        total, term = 0.0, 1.0
        for k in range(df // 2):
            if k:
                term *= c * c * (2 * k - 1) / (2 * k)
            total += term
        inside = s * total
    return min(1.0, max(0.0, 1.0 - inside))


def student_t_quantile(p: float, df: int) -> float:
    """The t > 0 with two-sided P(|T| >= t) = p (e.g. p = 0.05: the 95% critical value), by bisection."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p!r}")
    low, high = 0.0, 1.0
    while student_t_two_sided_p(high, df) > p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if student_t_two_sided_p(mid, df) > p:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Student-t confidence interval of the mean (mean +- t_{df} * std / sqrt(n)); None for fewer than 2 values."""
    if len(values) < 2:
        return None
    mean, std = mean_std(values)
    half = student_t_quantile(1.0 - level, len(values) - 1) * std / math.sqrt(len(values))
    return mean - half, mean + half


def paired_t_test(differences: list[float]) -> dict:
    """Two-sided paired t-test of mean(differences) = 0: {"n", "mean", "std", "t", "df", "p"}.

    t = mean / (std / sqrt(n)) with the sample std (n - 1), df = n - 1. Needs n >= 2; a zero std gives t = +-inf
    (p = 0) for a non-zero mean and t = 0 (p = 1) for a zero mean.
    """
    n = len(differences)
    if n < 2:
        raise ValueError(f"paired_t_test needs at least 2 differences, got {n}")
    mean, std = mean_std(differences)
    if std == 0.0:
        t = 0.0 if mean == 0.0 else math.copysign(math.inf, mean)
    else:
        t = mean / (std / math.sqrt(n))
    return {"n": n, "mean": mean, "std": std, "t": t, "df": n - 1, "p": student_t_two_sided_p(t, n - 1)}


def sign_test(differences: list[float]) -> dict:
    """Exact two-sided sign test (binomial, p = 1/2) of the differences; zeros are dropped.

    p = min(1, 2 * sum_{k <= min(pos, neg)} C(n, k) / 2^n) with n = pos + neg. Returns {"positive", "negative",
    "zero", "p"} (p = 1 when every difference is zero). With 5 non-zero differences the smallest p is 2/32 = 0.0625.
    """
    pos = sum(1 for d in differences if d > 0)
    neg = sum(1 for d in differences if d < 0)
    zero = len(differences) - pos - neg
    n = pos + neg
    if n == 0:
        return {"positive": 0, "negative": 0, "zero": zero, "p": 1.0}
    tail = sum(math.comb(n, k) for k in range(min(pos, neg) + 1)) / 2**n
    return {"positive": pos, "negative": neg, "zero": zero, "p": min(1.0, 2.0 * tail)}
