"""Monitoring that runs: Debian's Prometheus scrapes a running job's driver and its standby, found through the target
files they write (file-based discovery), evaluates the rules that ship with the platform (with windows of seconds
instead of minutes), and each alert is made to fire for real by causing what it is about:

- ``StreamstateRestoreRunningLong``: the driver's restore held past the job's 2-second restore budget;
- ``StreamstateInputLagGrowing`` and ``StreamstateStateOverBudget``: input produced faster than the job's
  micro-batches take it (20 records each), 30 users against a budget of 5;
- ``StreamstateNoProgress``: a micro-batch held for 45 s while input waits;
- ``StreamstateProcessDown``: the driver killed with kill -9 (its target file stays; nothing answers there).

``StreamstateStandbyBehind`` is only unit-tested (monitoring/alerts.test.yml): a standby's lag is the age of the
changes it has read and not committed, bounded by its commit interval, which the settings keep below the lag bound;
nothing short of a failing snapshot commit holds it behind, and a held commit holds its metrics with it.

Then every query of the Grafana dashboard, evaluated by Prometheus over the run, returns the job's series (the
standby's too: it joins once the driver has taken a snapshot, as a driver leaves snapshots to a running standby)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from runtime.process import free_port, kill_process_group, stop_process_group
from runtime.prometheus import AlertWindows, LocalPrometheus, alert_rules, render_alert_rules
from runtime.settings import PROJECT_ROOT
from spark_jobs.driver import failpoints
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import registered_versions
from tests.helpers import wait_for
from tests.test_grafana_dashboard import DASHBOARD

pytestmark = [pytest.mark.integration, pytest.mark.production]

#: the production rules with windows a test can wait for
WINDOWS = AlertWindows(
    down_for="5s",
    lag_window="15s",
    lag_for="5s",
    stalled_window="10s",
    stalled_for="5s",
    restore_for="2s",
    budget_for="5s",
    standby_for="5s",
)


def test_prometheus_scrapes_the_platform_and_each_shipped_alert_fires_when_caused(private_stack, tmp_path):
    settings = private_stack.replace(job_modules="tests.fixtures.monitoring_jobs", max_offsets_per_trigger=20)
    spec = registered_versions(settings.job_modules)["watched_counts"][1]
    app = spec.application_id
    prometheus = LocalPrometheus(settings, free_port(), render_alert_rules(settings, WINDOWS), interval_s=1)
    prometheus.start()
    started = time.time()
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(PROJECT_ROOT)}
    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions)
    purchases.produce(settings.kafka, spec.source_topic, purchases.adversarial(100, users=30, seed=11))  # invalid too

    submit = submit_spec(spec, settings)
    held = "restoring:1:hold:12,before_outputs:25:hold:45"
    driver = subprocess.Popen(
        submit.command(),
        env={**env, **submit.env, failpoints.ENV: held},
        stdout=open(tmp_path / "driver.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    standby = None
    producing = threading.Event()
    producer = threading.Thread(target=_produce_steadily, args=(settings, spec, producing), daemon=True)

    def firing(alert: str, timeout_s: float = 120) -> dict:
        def found():
            assert driver.poll() is None or alert == "StreamstateProcessDown", f"the driver exited: {tmp_path}"
            return prometheus.firing(alert)

        (fired,) = wait_for(found, timeout_s, f"{alert} firing", diagnose=lambda: json.dumps(prometheus.alerts()))
        return fired["labels"]

    try:
        # the driver found by its target file, labelled with the job and its role
        wait_for(lambda: prometheus.query(f'up{{application_id="{app}", role="driver"}} == 1'), 120, "the driver")

        assert firing("StreamstateRestoreRunningLong") == {
            "alertname": "StreamstateRestoreRunningLong",
            "application_id": app,
            "store": "counts",
            "severity": "page",
        }
        producer.start()  # faster than 20 records a batch
        assert firing("StreamstateInputLagGrowing")["application_id"] == app
        assert firing("StreamstateStateOverBudget")["application_id"] == app
        # once the driver has taken a snapshot (it leaves them to a running standby), its standby joins
        wait_for(lambda: read_status(settings.status_dir, app).snapshots, 120, "the driver's first snapshot")
        standby = subprocess.Popen(
            [sys.executable, "-m", "spark_jobs.operations.standby", spec.name, "--version", str(spec.version)],
            env=env,
            stdout=open(tmp_path / "standby.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: prometheus.query(f'up{{application_id="{app}", role="standby"}} == 1'), 120, "the standby")
        assert firing("StreamstateNoProgress")["application_id"] == app  # batch 25 held while input waits
        producing.set()

        kill_process_group(driver.pid)
        driver.wait(30)
        assert firing("StreamstateProcessDown", 60)["role"] == "driver"
        down = prometheus.query(f'up{{application_id="{app}", role="driver"}}')
        assert [r["value"][1] for r in down] == ["0"], "the killed driver's target stays listed, not answering"

        # every dashboard query, over the run: the job's series are there
        empty = [expr for expr in _dashboard_queries(app) if not prometheus.query_range(expr, started, time.time())]
        assert not empty, f"dashboard queries without data: {empty}"
    finally:
        producing.set()
        if driver.poll() is None:
            kill_process_group(driver.pid)
        if standby is not None:
            stop_process_group(standby, 30)
        prometheus.stop()
    assert alert_rules(settings, WINDOWS)["groups"][0]["rules"], "the rules ran"


def _produce_steadily(settings, spec, stop: threading.Event) -> None:
    """About 60 purchases a second until ``stop``: three times what the job's batches take."""
    seed = 100
    while not stop.is_set():
        purchases.produce(settings.kafka, spec.source_topic, purchases.generate(30, users=30, seed=seed, close_rate=0))
        seed += 1
        stop.wait(0.5)


def _dashboard_queries(application_id: str) -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return [
        re.sub(r"\$__rate_interval", "15s", expr).replace('=~"$application_id"', f'="{application_id}"')
        for expr in exprs
    ]
