"""No function of the platform is over 100 lines (tests and benchmarks aside): a longer one is split into named
steps a newcomer can follow. ruff bounds each function's branches and statements (pyproject.toml); this bounds
its length, which ruff does not."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 100


def test_no_function_of_the_platform_is_over_100_lines():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    long = []
    for name in files.stdout.split():
        if name.startswith(("tests/", "bench/")):
            continue
        for node in ast.walk(ast.parse((ROOT / name).read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert long == [], f"functions over {MAX_LINES} lines (split them into named steps):\n" + "\n".join(long)
