"""Layers in one direction, every import counted (a function-level import is an import too):

    streamstate_cli   the command, the demo, set-up's training program: may use everything below
    plugins/ (Airflow: hooks, operators, triggers, the jobs page, the state API) and dags/
    spark_jobs        the jobs, their state, reprocessing, audits
    runtime           settings, the JVM, Kafka and object-store connections, the local services

A module imports its own layer and the ones below it, never one above: ``runtime`` is the ground floor.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: each layer's directory and the top-level packages it may not import (the ones above it)
FORBIDDEN = {
    "runtime": {"spark_jobs", "streamstate", "streamstate_cli", "dags"},
    "spark_jobs": {"streamstate", "streamstate_cli", "dags"},
    "plugins": {"streamstate_cli", "dags"},
    "dags": {"streamstate_cli"},
}


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
