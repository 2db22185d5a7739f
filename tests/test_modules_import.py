"""Every module of the repository imports: a name moved or renamed in a refactoring fails here in seconds,
not in a benchmark run weeks later or a DAG that no test parses."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: packages and the prefix their modules are imported under (plugins/ is on sys.path, as in Airflow)
PACKAGES = {"runtime": "", "spark_jobs": "", "streamstate_cli": "", "bench": "", "plugins": None}
#: modules that run something when imported (a script's body, Airflow's plugin registration)
SKIPPED = {"streamstate_cli.__main__", "streamstate_plugin"}


def modules() -> list[str]:
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    found = []
    for name in files.stdout.split():
        top = name.split("/")[0]
        if top not in PACKAGES or name.endswith("__init__.py") and "/" not in name:
            continue
        path = Path(name).with_suffix("")
        parts = path.parts[1:] if PACKAGES[top] is None else path.parts
        module = ".".join(p for p in parts if p != "__init__")
        if module and module not in SKIPPED:
            found.append(module)
    return sorted(found)


@pytest.mark.parametrize("module", modules())
def test_the_module_imports(module):
    sys.path.insert(0, str(ROOT / "plugins"))
    importlib.import_module(module)
