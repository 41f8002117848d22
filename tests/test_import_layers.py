"""Every module of the package imports first, in an interpreter that has imported nothing of the package.

An import cycle shows only when a module of the cycle is imported first (the others then see it half initialised),
so each module is imported on its own. One interpreter per module would spend most of its time importing torch and
transformers again; instead one fresh interpreter imports the third-party modules the package uses (found by a
forked child that imports the whole package), never the package itself, and then forks one child per module: each
child starts with no `stabledrl_trl` module loaded, as a fresh interpreter would.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import stabledrl_trl

PACKAGE_ROOT = pathlib.Path(stabledrl_trl.__file__).parent


def package_modules() -> list[str]:
    """Every module of the package, by dotted name (packages by their own name)."""
    names = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.append(".".join(parts))
    return names


_SCRIPT = r"""
import importlib, json, os, sys, traceback

modules = json.loads(sys.argv[1])

def in_child(work):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            out = work()
            code = 0
        except BaseException:
            out, code = traceback.format_exc(limit=6), 1
        os.write(write, out.encode())
        os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode()

def import_all():
    for name in modules:
        importlib.import_module(name)
    return "\n".join(sorted(m for m in sys.modules if m.split(".")[0] != "stabledrl_trl"))

code, third_party = in_child(import_all)
if code:
    print(json.dumps({"all": third_party}))
    sys.exit(0)
for name in third_party.splitlines():  # warm the third-party modules; the package stays unimported here
    try:
        importlib.import_module(name)
    except BaseException:
        pass
assert not any(m.split(".")[0] == "stabledrl_trl" for m in sys.modules)
failures = {}
for name in modules:
    code, out = in_child(lambda: importlib.import_module(name) and "")
    if code:
        failures[name] = out
print(json.dumps(failures))
"""


@pytest.mark.slow
def test_every_module_imports_first_in_a_fresh_interpreter(tmp_path):
    modules = package_modules()
    assert "stabledrl_trl.diffusion.families.dream" in modules and "stabledrl_trl.stabledrl_trainer" in modules
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(modules)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT.parent)},  # this checkout's package, whatever the cwd
    )
    assert result.returncode == 0, result.stderr[-4000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    assert failures == {}, "\n\n".join(f"{name}:\n{trace}" for name, trace in failures.items())


_CONTRIB_FAMILY = '''
from ..family import DiffusionFamily, register_family
from .llada import MaskedDiffusionFamily

assert issubclass(MaskedDiffusionFamily, DiffusionFamily)


class ContribFamily(MaskedDiffusionFamily):
    name = "contrib"
    label = "a contributed family"
    model_types = ("contrib_dlm",)


register_family(ContribFamily())
'''


@pytest.mark.slow
def test_a_new_family_module_importing_the_base_from_family_py_imports_first(tmp_path):
    """A contributed family module in `diffusion/families/` that imports the base class from `diffusion/family.py`
    and is listed in `families/__init__.py` (on a copy of the package): importing it first, the family module first
    or the trainer first all work, and the family is registered once."""
    import shutil

    copy = tmp_path / "stabledrl_trl"
    shutil.copytree(PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    families = copy / "diffusion" / "families"
    (families / "contrib.py").write_text(_CONTRIB_FAMILY)
    init = families / "__init__.py"
    init.write_text(init.read_text() + "\nfrom . import contrib  # noqa: E402, F401\n")
    check = (
        "from stabledrl_trl.diffusion.family import FAMILIES, get_family; "
        "assert get_family('contrib').label == 'a contributed family' and list(FAMILIES).count('contrib') == 1"
    )
    for first in (
        "stabledrl_trl.diffusion.families.contrib",
        "stabledrl_trl.diffusion.family",
        "stabledrl_trl.diffusion.families",
        "stabledrl_trl.stabledrl_trainer",
    ):
        result = subprocess.run(
            [sys.executable, "-c", f"import {first}; {check}"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
        )
        assert result.returncode == 0, (first, result.stderr[-3000:])
