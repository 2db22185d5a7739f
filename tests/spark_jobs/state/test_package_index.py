"""The state package's docstring is its index: it names every module in it, and nothing that is gone."""

from __future__ import annotations

import re
from pathlib import Path

import spark_jobs.state as state


def test_the_index_names_every_module_and_only_those():
    modules = {p.stem for p in Path(state.__file__).parent.glob("*.py") if p.stem != "__init__"}
    named = set(re.findall(r":mod:`\.(\w+)`", state.__doc__))
    assert named == modules, f"not in the index: {sorted(modules - named)}; gone: {sorted(named - modules)}"
