"""The README's main-job command path, on a fresh stack of its own, as a user runs it.

``python -m streamstate_cli demo`` (``make run``): Airflow standalone comes up, ``supervise__purchase_counts``
launches the driver, events flow in, the summary (jobs page API + Delta, checked against plain Python)
says the job runs under supervision; a second run adds to the running job. ``down`` stops Airflow, the
driver and its standby, and Kafka. ``demo --no-airflow`` then drains the new events from the same
checkpoint without Airflow.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.driver.lease import JobLease
from spark_jobs.layout import spare_name, standby_name
from spark_jobs.registry import get_job
from tests.conftest import fresh_ports

pytestmark = pytest.mark.integration

CHECK_OK = "OK: Delta = plain-Python counts over every event in the topic"


def _cli(env, *args, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "streamstate_cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_make_run_is_the_platform_running_until_make_down(tmp_path):
    env = {**os.environ, "STREAMSTATE_DATA_DIR": str(tmp_path)}
    env.update({f"STREAMSTATE_{k.upper()}": str(v) for k, v in fresh_ports().items()})
    app = get_job("purchase_counts").application_id
    status_dir = Path(tmp_path) / "status"
    demo = ("demo", "--events", "3000", "--users", "250", "--seconds", "1")
    try:
        first = _cli(env, *demo, timeout=1500)
        assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-4000:]
        assert CHECK_OK in first.stdout
        assert "RUNNING under supervise__purchase_counts (desired running)" in first.stdout
        assert "launched by supervise__purchase_counts/" in first.stdout and "/launch#" in first.stdout
        assert re.search(r"events in topic \(all runs\)\s*│\s*3,000", first.stdout), first.stdout

        second = _cli(env, *demo)  # the job is running: the events go to it
        assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-4000:]
        assert f"{app} already runs under supervise__purchase_counts" in second.stdout
        assert re.search(r"events in topic \(all runs\)\s*│\s*6,000", second.stdout), second.stdout
        assert CHECK_OK in second.stdout

        status = _cli(env, "status", "--json", timeout=60)
        assert '"running": true' in status.stdout
    finally:
        down = _cli(env, "down", timeout=300)
    assert down.returncode == 0 and "kafka: stopped" in down.stdout, down.stdout + down.stderr
    assert f"{app}: stopped" in down.stdout
    assert JobLease(status_dir, app).holder() is None and JobLease(status_dir, standby_name(app)).holder() is None
    assert JobLease(status_dir, spare_name(app)).holder() is None  # make run keeps a spare driver; down stops it
    # a stop is no failure: the driver, the standby and the spare (warming up or waiting) each exit 0 on it
    exits = {path.name: path.read_text().strip() for path in (Path(tmp_path) / "logs" / "jobs").glob("*.exit")}
    assert exits and set(exits.values()) == {"0"}, exits

    try:  # without Airflow: the stopped job drains the new events from its checkpoint
        drained = _cli(env, "demo", "--no-airflow", "--events", "3000", "--users", "250")
        assert drained.returncode == 0, drained.stdout[-4000:] + drained.stderr[-4000:]
        assert re.search(r"events in \(this run\)\s*│\s*3,000", drained.stdout), drained.stdout
        assert re.search(r"events in topic \(all runs\)\s*│\s*9,000", drained.stdout), drained.stdout
        assert CHECK_OK in drained.stdout
    finally:
        _cli(env, "down", timeout=300)
