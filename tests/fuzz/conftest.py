"""Hypothesis profiles for the fuzz tests.

``ci`` (the default, part of ``make test``): derandomized, so a CI run is repeatable, and small enough
to keep the suite's time. ``deep``: many more random examples, for a person hunting bugs::

    HYPOTHESIS_PROFILE=deep .venv/bin/python -m pytest tests/fuzz
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# deadline=None: an example runs a Spark job or an Airflow validation; its time says nothing about the code.
settings.register_profile(
    "ci",
    max_examples=30,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "deep",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
