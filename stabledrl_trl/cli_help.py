"""Fast `--help` for the scripts: the fields of a config dataclass read from its source file, without importing it.

`python scripts/train.py --help` used to build TRL's argument parser first, which imports torch, transformers and
TRL (7 s at load average 3, 20 s at load average 14 on a 2-core machine) and then printed 1,634 lines with
TrainingArguments' fields first. This module reads the dataclasses' fields (name, type, default and
`metadata["help"]`) with `ast` from their source files, grouped by the `# ...` section comments above them, and
renders a help page that starts with the script's description and its usage with `--config` (0.6 s at load average
14). It imports nothing beyond the standard library and is loaded by the scripts by file path (scripts/train.py's
`_cli_help`), so `import stabledrl_trl` (which registers the models with transformers) is not run either.
`tests/scripts/test_script_help.py` checks that what it reads equals the imported dataclasses' fields.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import textwrap
from dataclasses import dataclass

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
HELP_FLAGS = ("-h", "--help")
HELP_ALL_FLAG = "--help-all"


@dataclass(frozen=True)
class SourceField:
    """One dataclass field as written in its source: the section comment above it, name, type, default and help."""

    group: str
    name: str
    type: str
    default: str
    help: str


def help_request(argv: list[str]) -> str | None:
    """The help asked for: "all" for `--help-all`, "short" for `-h` / `--help`, else None."""
    if HELP_ALL_FLAG in argv:
        return "all"
    if any(a in HELP_FLAGS for a in argv):
        return "short"
    return None


def installed_source(package: str, relative: str) -> str | None:
    """The path of `relative` inside an installed top-level package, found without importing it (None if absent)."""
    spec = importlib.util.find_spec(package)  # a top-level name: located, not imported
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], relative)
    return path if os.path.isfile(path) else None


def _section(comment: str) -> str:
    """A `# ---- Fast rollouts: approximate ... ----` comment line as a group title ("Fast rollouts")."""
    text = comment.strip().lstrip("#").strip().strip("-").strip()
    text = re.split(r"[:(]", text, maxsplit=1)[0].strip()
    return text[:1].upper() + text[1:] if text else ""


_UNKNOWN = object()


class _DefaultsLookup(dict):
    """A function returning a dataclass field's default by name (`sampler_settings.sampler_default`), read as the
    {field: default} of that dataclass's source."""


# function name -> the dataclass whose field defaults it returns (in the module the function is imported from)
_DEFAULT_LOOKUPS = {"sampler_default": "SamplerSettings"}
_WRAPPERS = "<classes subclassing int, float or str>"


def _evaluate(node: ast.AST | None, constants: dict):
    """The value of a simple expression (literals, module constants, f-strings of those, list/tuple/str/repr of
    one), else _UNKNOWN."""
    if node is None:
        return _UNKNOWN
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _evaluate(node.operand, constants)
        return -value if isinstance(value, (int, float)) else _UNKNOWN
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_evaluate(e, constants) for e in node.elts]
        if any(i is _UNKNOWN for i in items):
            return _UNKNOWN
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords:
        lookup = constants.get(node.func.id)
        if isinstance(lookup, _DefaultsLookup):  # e.g. sampler_default("temperature"): a dataclass field's default
            key = _evaluate(node.args[0], constants)
            return lookup.get(key, _UNKNOWN) if isinstance(key, str) else _UNKNOWN
        converters = {"list": list, "tuple": tuple, "str": str, "repr": repr, "int": int, "float": float}
        convert = converters.get(node.func.id)
        if node.func.id in constants.get(_WRAPPERS, ()):  # a module class subclassing int / float / str
            convert = lambda value: value  # noqa: E731  (the value it wraps is what a user sets)
        value = _evaluate(node.args[0], constants)
        return _UNKNOWN if convert is None or value is _UNKNOWN else convert(value)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            value = _evaluate(part.value if isinstance(part, ast.FormattedValue) else part, constants)
            if value is _UNKNOWN or (isinstance(part, ast.FormattedValue) and part.format_spec is not None):
                return _UNKNOWN
            conversion = getattr(part, "conversion", -1)
            parts.append(repr(value) if conversion == ord("r") else str(value))
        return "".join(parts)
    return _UNKNOWN


def _text(node: ast.AST | None, constants: dict, as_repr: bool) -> str:
    value = _evaluate(node, constants)
    if value is _UNKNOWN:
        return ast.unparse(node) if node is not None else ""
    return repr(value) if as_repr or not isinstance(value, str) else value


def _dataclass_defaults(path: str, class_name: str) -> _DefaultsLookup:
    """{field: default value} of the plainly written defaults (`name: type = value`) of class `class_name` in `path`."""
    with open(path) as f:
        tree = ast.parse(f.read())
    constants = module_constants(path, tree, follow_imports=False)
    defaults = _DefaultsLookup()
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                value = _evaluate(node.value, constants)
                if value is not _UNKNOWN:
                    defaults[node.target.id] = value
    return defaults


def module_constants(path: str, tree: ast.Module | None = None, follow_imports: bool = True) -> dict:
    """{NAME: value} of the module-level constants of `path` whose value `_evaluate` can compute, with the names it
    imports relatively (`from .x import NAME`) read from those files (one level)."""
    if tree is None:
        with open(path) as f:
            tree = ast.parse(f.read())
    constants: dict = {}
    for node in tree.body:
        if follow_imports and isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            target = os.path.join(os.path.dirname(path), *node.module.split(".")) + ".py"
            if os.path.isfile(target):
                imported = module_constants(target, follow_imports=False)
                constants.update({a.asname or a.name: imported[a.name] for a in node.names if a.name in imported})
                for a in node.names:
                    if a.name in _DEFAULT_LOOKUPS:
                        constants[a.asname or a.name] = _dataclass_defaults(target, _DEFAULT_LOOKUPS[a.name])
        elif isinstance(node, ast.ClassDef) and any(ast.unparse(b) in ("int", "float", "str") for b in node.bases):
            constants[_WRAPPERS] = (*constants.get(_WRAPPERS, ()), node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = _evaluate(node.value, constants)
            if value is not _UNKNOWN:
                constants.update({t.id: value for t in targets if isinstance(t, ast.Name)})
    return constants


def source_fields(path: str, class_name: str, default_group: str = "") -> list[SourceField]:
    """The annotated fields of class `class_name` in the Python file `path`, in source order.

    A field's group is the last `# ...` comment line (at the class body's indentation, above the field) since the
    previous group, else `default_group`. Default: the literal of `default=` / a plain value, `default_factory`'s
    call, or "required"; help: `metadata={"help": ...}`."""
    with open(path) as f:
        source = f.read()
    lines = source.splitlines()
    tree = ast.parse(source)
    constants = module_constants(path, tree)
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    if not classes:
        raise ValueError(f"{path} defines no class {class_name}")
    cls = classes[0]
    fields, group, previous_end = [], default_group, cls.lineno
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            previous_end = getattr(node, "end_lineno", previous_end)
            continue
        indent = " " * node.col_offset
        for i in range(previous_end, node.lineno - 1):  # the first line of each comment block above the field
            line, above = lines[i], lines[i - 1].strip() if i else ""
            if line.startswith(indent + "#") and not above.startswith("#") and _section(line):
                group = _section(line)
        previous_end = node.end_lineno
        annotation = ast.unparse(node.annotation)
        if annotation.startswith("ClassVar"):
            continue
        default, help_text = "required", ""
        value = node.value
        if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "field":
            keywords = {k.arg: k.value for k in value.keywords}
            if "default" in keywords:
                default = _text(keywords["default"], constants, as_repr=True)
            elif "default_factory" in keywords:
                default = ast.unparse(keywords["default_factory"]) + "()"
            metadata = keywords.get("metadata")
            if isinstance(metadata, ast.Dict):
                for key, item in zip(metadata.keys, metadata.values):
                    if isinstance(key, ast.Constant) and key.value == "help":
                        help_text = _text(item, constants, as_repr=False)
        elif value is not None:
            default = _text(value, constants, as_repr=True)
        fields.append(SourceField(group, node.target.id, annotation, default, " ".join(help_text.split())))
    return fields


def description(docstring: str | None) -> str:
    """A script's description: its module docstring's first paragraph."""
    return (docstring or "").strip().split("\n\n", 1)[0].strip()


def render_fields(title: str, fields: list[SourceField], width: int = 100) -> str:
    """One section of the help: `title:`, then per field `--name TYPE (default D)` and its wrapped help."""
    out = [f"{title}:"]
    for f in fields:
        out.append(f"  --{f.name} {f.type.replace(' | None', '').replace('None | ', '')}  (default: {f.default})")
        if f.help:
            out.extend(textwrap.wrap(f.help, width=width, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(out)


def grouped(fields: list[SourceField], prefix: str) -> list[tuple[str, list[SourceField]]]:
    """[(section title, fields)] in source order, titles prefixed (`prefix`: group)."""
    sections: dict[str, list[SourceField]] = {}
    for f in fields:
        sections.setdefault(f"{prefix}: {f.group}" if f.group else prefix, []).append(f)
    return list(sections.items())


def help_page(
    docstring: str | None, usage: list[str], sections: list[tuple[str, list[SourceField]]], footer: str = ""
) -> str:
    """The whole page: description, usage lines, the `--config` / help options, the field sections, a footer."""
    parts = [description(docstring), "usage: " + "\n       ".join(usage)]
    parts.append(
        "options:\n"
        "  --config CONFIG.yaml  YAML file whose keys are the fields below (command-line flags override it; an unknown\n"
        "                        or misspelt key is an error naming the closest field)\n"
        "  -h, --help            this help: the script's and the project's own fields\n"
        f"  {HELP_ALL_FLAG}            every field, TRL's and transformers' inherited ones included, last"
    )
    parts.extend(render_fields(title, fields) for title, fields in sections if fields)
    if footer:
        parts.append(footer)
    return "\n\n".join(parts) + "\n"


def short_usage(script: str, usage: list[str]) -> str:
    """What a script prints when run with no arguments: its usage and where the help is."""
    return "usage: " + "\n       ".join(usage) + f"\n\nRun `python {script} --help` for the fields and what they do.\n"
