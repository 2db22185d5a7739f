"""MkDocs hook: the configuration reference, generated from ``runtime/settings.py``.

``docs/configuration.md`` holds the marker ``<!-- settings-reference -->``; this hook replaces it with one table
row per :class:`runtime.settings.Settings` field (its ``STREAMSTATE_*`` variable, type, default and the ``#:``
comment above the field) and one per :class:`runtime.settings.CompactionPolicy` field
(``STREAMSTATE_COMPACTION_<FIELD>``). The page cannot drift from the code: a field added, renamed or
re-documented changes the page at the next build (``tests/test_docs_site.py`` checks every field is on it).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ROOT / "runtime" / "settings.py"
MARKER = "<!-- settings-reference -->"
PREFIX = "STREAMSTATE_"


class Field(NamedTuple):
    variable: str
    type: str
    default: str
    meaning: str


def _markdown(text: str) -> str:
    """A ``#:`` comment as Markdown: reST literals as code spans, table pipes escaped."""
    for role in (":class:", ":data:", ":mod:", ":func:", ":meth:"):
        text = text.replace(role, "")
    return text.replace("``", "`").replace("|", "\\|").strip()


def _constants(tree: ast.Module) -> dict[str, object]:
    """The module's constants that are arithmetic over literals (``MIB``, ``HOUR_MS``, ...), evaluated."""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = eval(compile(ast.Expression(node.value), "<settings>", "eval"), {}, found)
            except Exception:  # noqa: BLE001 - not a constant expression: not one a default can use
                continue
    return found


def _value(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _default(node: ast.expr | None, source: str, constants: dict[str, object]) -> str:
    if node is None:
        return "required"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "field":
        default = next((k.value for k in node.keywords if k.arg == "default"), None)
        return _default(default, source, constants)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return f"see `{node.func.id}` below"
    text = ast.get_source_segment(source, node) or ""
    if text.startswith("PROJECT_ROOT / "):  # a path in the project directory
        return f"`{ast.literal_eval(text.removeprefix('PROJECT_ROOT / '))}` in the project directory"
    value = eval(compile(ast.Expression(node), "<settings>", "eval"), {}, dict(constants))
    shown = _value(value)
    return shown if isinstance(node, ast.Constant) else f"{shown} (`{text}`)"


def fields_of(class_name: str, variable_prefix: str) -> list[Field]:
    """The fields of dataclass ``class_name`` in runtime/settings.py, in their order, with their ``#:`` comments."""
    source = SETTINGS.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    constants = _constants(tree)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    found = []
    for node in cls.body:
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        comment, row = [], node.lineno - 2  # the lines just above the field, while they are ``#:`` comments
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip().removeprefix("#:").strip())
            row -= 1
        found.append(
            Field(
                variable=variable_prefix + node.target.id.upper(),
                type=ast.get_source_segment(source, node.annotation) or "",
                default=_default(node.value, source, constants),
                meaning=_markdown(" ".join(comment)),
            )
        )
    return found


def settings_fields() -> list[Field]:
    return [f for f in fields_of("Settings", PREFIX) if f.variable != PREFIX + "COMPACTION"]


def compaction_fields() -> list[Field]:
    return fields_of("CompactionPolicy", PREFIX + "COMPACTION_")


def _type(annotation: str) -> str:
    """``str | None`` as "`str`, optional" (a pipe would end the table's cell)."""
    if annotation.endswith(" | None"):
        return f"`{annotation.removesuffix(' | None')}`, optional"
    return f"`{annotation}`"


def _table(fields: list[Field]) -> str:
    rows = ["| variable | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{f.variable}` | {_type(f.type)} | {f.default} | {f.meaning} |" for f in fields]
    return "\n".join(rows)


def render() -> str:
    """The generated part of the configuration page."""
    return "\n".join(
        [
            "Generated from `runtime/settings.py` when the site is built: the `Settings` fields, each read from",
            "`STREAMSTATE_<FIELD>`.",
            "",
            _table(settings_fields()),
            "",
            "### Changelog compaction tuning (`CompactionPolicy`)",
            "",
            "The bounds and targets of the changelog tuning DAG ([Changelog compaction tuning](tuning/changelog-compaction.md)),",
            "each read from `STREAMSTATE_COMPACTION_<FIELD>`.",
            "",
            _table(compaction_fields()),
            "",
        ]
    )


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
