"""The README's main-job command path, on a fresh stack of its own: exit 0 with the summary, twice.

Runs ``python -m runtime demo`` as a user would (Airflow left out here: the Airflow tests cover it),
then ``status`` and ``down``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import fresh_ports

pytestmark = pytest.mark.integration


def _cli(env, *args, timeout=900):
    return subprocess.run([sys.executable, "-m", "runtime", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def test_demo_runs_twice_and_stays_consistent(tmp_path):
    env = {**os.environ, "STREAMSTATE_DATA_DIR": str(tmp_path)}
    env.update({f"STREAMSTATE_{k.upper()}": str(v) for k, v in fresh_ports().items()})
    try:
        first = _cli(env, "demo", "--no-airflow", "--events", "3000", "--users", "250")
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
        assert "OK: Delta = plain-Python counts over every event in the topic" in first.stdout
        assert "events in (this run)" in first.stdout and "3,000" in first.stdout

        second = _cli(env, "demo", "--no-airflow", "--events", "3000", "--users", "250")
        assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
        # The second run read only the new events and the totals cover both runs.
        assert re.search(r"events in \(this run\)\s*│\s*3,000", second.stdout), second.stdout
        assert re.search(r"events in topic \(all runs\)\s*│\s*6,000", second.stdout), second.stdout
        assert "OK: Delta = plain-Python counts over every event in the topic" in second.stdout

        status = _cli(env, "status", "--json", timeout=60)
        assert '"running": true' in status.stdout
    finally:
        down = _cli(env, "down", timeout=120)
    assert down.returncode == 0 and "kafka: stopped" in down.stdout
