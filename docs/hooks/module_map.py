"""MkDocs hook: the map of every module of ``spark_jobs``, generated from the modules' docstrings.

``docs/architecture.md`` holds the marker ``<!-- module-map -->``, followed by a one-line note for readers of the
repository's own view of the page (:data:`NOTE`); this hook replaces both with one table per package: each
module's path and the first sentence of its module docstring (a package's ``__init__.py`` when it has a
docstring, and ``__main__.py``). The map cannot drift from the code: a module added, moved or re-documented
changes the page at the next build (``tests/test_architecture_doc.py`` checks every module is on it, with a
docstring). :func:`render` is a pure function of the files under ``spark_jobs/``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "spark_jobs"
MARKER = "<!-- module-map -->"
#: the line after the marker in docs/architecture.md: what a reader of the Markdown file (GitHub) sees instead
NOTE = "*The documentation site shows the module map here, generated from the modules' docstrings by `docs/hooks/module_map.py`.*"

#: Sphinx roles as the docstrings write them: ``:class:`~spark_jobs.x.Y``` -> `Y`, ``:mod:`.fencing``` -> `fencing`
ROLE = re.compile(r":(?:class|func|data|mod|meth|attr|exc|obj):`(~?)\.?([^`]+)`")
#: a sentence's end: ``.``, ``?`` or ``!`` before a space or the paragraph's end (code spans are masked first)
SENTENCE_END = re.compile(r"[.?!](?=\s|$)")
#: abbreviations whose period ends no sentence
ABBREVIATIONS = ("e.g.", "i.e.", "cf.", "vs.")


class Module(NamedTuple):
    path: str  #: relative to the repository root, e.g. ``spark_jobs/state/changelog.py``
    package: str  #: the package's directory, e.g. ``spark_jobs/state``
    summary: str  #: the first sentence of its docstring, as Markdown ("" without a docstring)


def _role_target(tilde: str, target: str) -> str:
    """What Sphinx shows of a role's target: its last name after ``~``, else all of it."""
    return target.rsplit(".", 1)[-1] if tilde else target


def _markdown(text: str) -> str:
    """reST literals and roles as Markdown code spans; outside them, ``<``, ``>`` and table pipes escaped."""
    text = ROLE.sub(lambda m: "``" + _role_target(m.group(1), "".join(m.group(2).split())) + "``", text)
    parts = re.split(r"(``.*?``)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span
            out.append("`" + part[2:-2].replace("|", "\\|") + "`")
        else:
            out.append(part.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|"))
    return "".join(out)


def first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, its lines joined. A period inside a code span or after
    ``e.g.`` ends none; a question is followed by its answer (``Is a query checkpoint usable? Checked before ...``);
    a paragraph with no sentence end is whole, a colon that introduced a list ending it as a period."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    masked = re.sub(r"``.*?``|`[^`]*`", lambda m: "x" * len(m.group(0)), paragraph)
    for abbreviation in ABBREVIATIONS:
        masked = masked.replace(abbreviation, "x" * len(abbreviation))
    end = SENTENCE_END.search(masked)
    if end is not None and masked[end.start()] == "?":
        end = SENTENCE_END.search(masked, end.end()) or end
    if end is None:
        return paragraph[:-1] + "." if paragraph.endswith(":") else paragraph
    return paragraph[: end.end()]


def modules(package: Path = PACKAGE) -> list[Module]:
    """Every module under ``package``: its ``.py`` files, a package's ``__init__.py`` only when it has a docstring;
    by package (the top one first, then the subpackages by name), in each the ``__init__.py`` first, then by name."""
    root = package.parent
    found = []
    for path in package.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if path.name == "__init__.py" and not docstring.strip():
            continue
        summary = _markdown(first_sentence(docstring)) if docstring.strip() else ""
        found.append(Module(path.relative_to(root).as_posix(), path.parent.relative_to(root).as_posix(), summary))
    top = package.name
    return sorted(found, key=lambda m: (m.package != top, m.package, m.path.rsplit("/", 1)[1] != "__init__.py", m.path))


def render(found: list[Module] | None = None) -> str:
    """The generated map: per package a heading and a table of its modules."""
    found = modules() if found is None else found
    lines = [
        "Generated from the code when the site is built: every module of `spark_jobs`, with the first sentence",
        "of its docstring, by package.",
        "",
    ]
    packages = list(dict.fromkeys(m.package for m in found))
    for package in packages:
        lines += [f"### `{package}/`", "", "| module | what it is |", "|---|---|"]
        lines += [f"| `{m.path}` | {m.summary} |" for m in found if m.package == package]
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 - MkDocs' hook signature
    if MARKER not in markdown:
        return markdown
    return markdown.replace(f"{MARKER}\n{NOTE}", MARKER).replace(MARKER, render())
