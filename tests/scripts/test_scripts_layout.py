"""scripts/ holds user entry points and benchmarks, nothing else: every file is either an entry point listed in the
Layout section (docs/layout.md) or a benchmark named `bench_<what>.py` (listed there too), and every Python script has the
TRL-style `make_parser()` and `main(...)`, with `main` run under `if __name__ == "__main__":`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPTS = ROOT / "scripts"
BENCHMARK = re.compile(r"bench_[a-z0-9_]+\.py")


def layout_lists(readme: str) -> tuple[list[str], list[str]]:
    """(entry points, benchmarks) named in the `scripts/` bullet of the README's Layout section: one `  - `name`: ...`
    line each, entry points before the line that starts the benchmarks ("  Benchmarks ...")."""
    layout = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    lines = layout.split("\n- `scripts/`", 1)[1].split("\n- ", 1)[0].splitlines()
    split = next(i for i, line in enumerate(lines) if line.startswith("  Benchmarks"))

    def names(part):
        return [m.group(1) for m in (re.match(r"  - `([^`]+)`: \S", line) for line in part) if m]

    return names(lines[:split]), names(lines[split:])


def top_level_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}


def calls_main_when_run(path: Path) -> bool:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__"):
            return any(isinstance(n, ast.Name) and n.id == "main" for n in ast.walk(node))
    return False


ENTRY_POINTS, BENCHMARKS = layout_lists((ROOT / "docs" / "layout.md").read_text())
FILES = sorted(p.name for p in SCRIPTS.iterdir() if p.is_file())


def test_layout_parser_on_a_hand_written_section():
    text = (
        "# x\n\n## Layout\n\n- `pkg/`: a package.\n- `scripts/`: user entry points:\n  - `a.py`: does a.\n"
        "  - `b.sh`: does b.\n\n  Benchmarks, each `bench_<what>.py`:\n  - `bench_c.py`: measures c.\n"
        "- `configs/`: configs.\n\n## Next\n- `scripts/`: not this one\n"
    )
    assert layout_lists(text) == (["a.py", "b.sh"], ["bench_c.py"])


def test_every_script_is_a_listed_entry_point_or_a_listed_benchmark():
    assert ENTRY_POINTS and BENCHMARKS, "the Layout section's scripts/ bullet lists no entry points or benchmarks"
    listed = ENTRY_POINTS + BENCHMARKS
    assert len(listed) == len(set(listed)), f"a script is listed twice in the README's Layout: {listed}"
    unlisted = sorted(set(FILES) - set(listed))
    assert not unlisted, (
        f"scripts/ holds {unlisted}, which the README's Layout lists neither as an entry point nor as a benchmark: "
        "add a line for it (a benchmark is named bench_<what>.py)"
    )
    missing = sorted(set(listed) - set(FILES))
    assert not missing, f"the README's Layout lists {missing}, which scripts/ does not hold"


def test_benchmarks_are_named_bench_and_entry_points_are_not():
    misnamed = [name for name in BENCHMARKS if not BENCHMARK.fullmatch(name)]
    assert not misnamed, f"benchmarks {misnamed} are not named bench_<what>.py"
    disguised = [name for name in ENTRY_POINTS if name.startswith("bench_")]
    assert not disguised, f"entry points {disguised} are named like benchmarks: list them under Benchmarks"


@pytest.mark.parametrize("name", [n for n in FILES if n.endswith(".py")])
def test_python_script_has_make_parser_and_main(name):
    path = SCRIPTS / name
    missing = {"make_parser", "main"} - top_level_functions(path)
    assert not missing, f"scripts/{name} lacks {sorted(missing)} (TRL style: make_parser() builds the flags)"
    assert calls_main_when_run(path), f"scripts/{name} does not call main() under `if __name__ == '__main__':`"
