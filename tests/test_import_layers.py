"""Layers in one direction, every import counted (a function-level import is an import too):

    streamstate_cli   the command, the demo, set-up's training program: may use everything below
    plugins/ (Airflow: hooks, operators, triggers, the jobs page, the state API) and dags/
    spark_jobs        the jobs, their state, reprocessing, audits
    runtime           settings, the JVM, Kafka and object-store connections, the local services

A module imports its own layer and the ones below it, never one above: ``runtime`` is the ground floor. Inside a
layer the modules import in one direction too: no two of them import each other, however far round (a cycle makes
the pair one module that cannot be read, tested or changed alone).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: each layer's directory and the top-level packages it may not import (the ones above it)
FORBIDDEN = {
    "streamstate_cli": set(),
    "runtime": {"spark_jobs", "streamstate", "streamstate_cli", "dags"},
    "spark_jobs": {"streamstate", "streamstate_cli", "dags"},
    "plugins": {"streamstate_cli", "dags"},
    "dags": {"streamstate_cli"},
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str], root: Path) -> set[str]:
    """Which of ``modules`` ``path`` imports (``from a.b import c`` imports ``a.b``, and ``a.b.c`` when that is a
    module), anywhere in it: at its top, in a function, under ``TYPE_CHECKING``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return (found & modules) - {module_name(path, root)}


def import_cycles(layer: Path, root: Path = ROOT) -> list[list[str]]:
    """The import cycles among the modules under ``layer``: each strongly connected component of the import graph
    with more than one module (Tarjan's algorithm), its modules sorted."""
    paths = {module_name(path, root): path for path in sorted(layer.rglob("*.py"))}
    edges = {name: sorted(imported_modules(path, set(paths), root)) for name, path in paths.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for other in edges[name]:
            if other not in index:
                visit(other)
                low[name] = min(low[name], low[other])
            elif other in stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            component = []
            while (member := stack.pop()) != name:
                component.append(member)
            if component:
                cycles.append(sorted([name, *component]))

    for name in paths:
        if name not in index:
            visit(name)
    return cycles


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """The top-level package of every import in ``path`` (absolute imports), with its line."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_layer_imports_one_above_it(layer):
    upward = [
        f"{path.relative_to(ROOT)}:{line} imports {package}"
        for path in sorted((ROOT / layer).rglob("*.py"))
        for package, line in sorted(imported_packages(path))
        if package in FORBIDDEN[layer]
    ]
    assert upward == [], f"{layer} imports a layer above it:\n" + "\n".join(upward)


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from spark_jobs.registry import get_job\n    return get_job\n")
    assert ("spark_jobs", 2) in imported_packages(module)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_modules_of_a_layer_import_each_other(layer):
    cycles = import_cycles(ROOT / layer)
    assert cycles == [], f"{layer}: modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_check_sees_a_cycle_however_far_round(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("from pkg.b import x\n")
    (package / "b.py").write_text("def f():\n    from pkg import c\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import y\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert import_cycles(package, root=tmp_path) == [["pkg.a", "pkg.b", "pkg.c"]]
