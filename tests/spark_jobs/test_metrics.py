"""The driver's Prometheus metrics follow its status documents (pure), and a served endpoint answers a
scrape with them and with the dead-letter topic's size read from a real broker. A running driver and
standby are scraped in tests/plugins/test_state_api.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
from confluent_kafka import Producer

from spark_jobs.driver.lifecycle import BatchProgress, JobState, PublishedStatus, SnapshotTaken, StoreRestore
from spark_jobs.driver.metrics import DriverMetrics, MetricsServer
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import StatusFiles
from tests.helpers import scrape_metrics

pytestmark = pytest.mark.integration


def _status(state: str, lag: dict[str, int]) -> PublishedStatus:
    return PublishedStatus(
        "app",
        JobState(state),
        progress=BatchProgress(
            batch_id=7,
            batch_duration_ms=1500,
            input_rows_per_second=12.5,
            processed_rows_per_second=40.0,
            input_lag=lag,
            state_rows=321,
            state_memory_bytes=4096,
        ),
        restore={"counts": StoreRestore(records_read=900)},
        snapshots={"counts": SnapshotTaken(batch_id=3, rows=300, taken_at="2026-11-24T10:00:00+00:00")},
    )


def test_a_scrape_shows_the_status_and_the_dead_letter_topic(settings, kafka_broker, unique):
    app = f"metrics-{unique}-v1"
    dead_letters = f"{app}-dead-letter"
    ensure_topic(settings.kafka, dead_letters, 2)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for i in range(5):
        producer.produce(dead_letters, value=b"rejected", partition=i % 2)
    assert producer.flush(30) == 0

    metrics = DriverMetrics(app, dead_letters, settings.kafka)
    files = StatusFiles(settings.status_dir, app)
    server = MetricsServer(settings, files)
    try:
        # Prometheus finds it by its target file (file-based discovery), labelled with the job and the role
        (target,) = json.loads(files.metrics_target.read_text())
        assert target["targets"] == [f"{settings.host}:{server.port}"]
        assert target["labels"] == {"application_id": app, "role": "driver"}
        metrics.update(_status("RUNNING", {"in-0": 4, "in-1": 0}))
        scraped = scrape_metrics(settings.host, server.port)
        label = (("application_id", app),)
        assert scraped[("streamstate_job_state", (*label, ("state", "RUNNING")))] == 1
        assert scraped[("streamstate_job_state", (*label, ("state", "RESTORING")))] == 0
        assert scraped[("streamstate_batch_id", label)] == 7
        assert scraped[("streamstate_batch_duration_seconds", label)] == 1.5
        assert scraped[("streamstate_input_rows_per_second", label)] == 12.5
        assert scraped[("streamstate_input_lag_records", (*label, ("partition", "in-0")))] == 4
        assert scraped[("streamstate_state_rows", label)] == 321
        assert scraped[("streamstate_restore_records_read", (*label, ("store", "counts")))] == 900
        assert scraped[("streamstate_snapshot_rows", (*label, ("store", "counts")))] == 300
        assert scraped[("streamstate_snapshot_timestamp_seconds", (*label, ("store", "counts")))] == 1_795_514_400
        assert scraped[("streamstate_dead_letter_records", label)] == 5

        # a partition no longer reported (the source was re-partitioned, or a new run) leaves the metrics
        metrics.update(_status("PENDING_SHUTDOWN", {"in-1": 2}))
        scraped = scrape_metrics(settings.host, server.port)
        assert ("streamstate_input_lag_records", (*label, ("partition", "in-0"))) not in scraped
        assert scraped[("streamstate_input_lag_records", (*label, ("partition", "in-1")))] == 2
        assert scraped[("streamstate_job_state", (*label, ("state", "PENDING_SHUTDOWN")))] == 1
    finally:
        server.close()
        metrics.close()
    assert all(name != "streamstate_dead_letter_records" for name, _ in _registered_samples())
    assert not files.metrics_target.exists(), "a process that stopped serving leaves discovery"


def test_a_restarted_process_keeps_its_target_when_the_old_one_closes_late(settings, unique):
    """A standby restarted while its predecessor still shuts down: the newer entry stays listed."""
    files = StatusFiles(settings.status_dir, f"metrics-{unique}-v1.standby")
    old, new = MetricsServer(settings, files), MetricsServer(settings, files)
    try:
        old.close()
        (target,) = json.loads(files.metrics_target.read_text())
        assert target["targets"] == [f"{settings.host}:{new.port}"] and target["labels"]["role"] == "standby"
        assert target["labels"]["application_id"] == f"metrics-{unique}-v1"
    finally:
        new.close()
    assert not files.metrics_target.exists()


def _registered_samples():
    from prometheus_client import REGISTRY

    return [(s.name, s.labels) for family in REGISTRY.collect() for s in family.samples]


def test_the_jobs_limits_and_a_running_restore_are_exported_beside_its_metrics(unique):
    """What the shipped alert rules compare (monitoring/alerts.yml): the job's own budgets, and when a running
    restore began (gone once it finished). No broker: the dead-letter topic is read only when scraped."""
    from spark_jobs.driver.metrics import Budgets
    from spark_jobs.registry import StateBudget, StoreSpec, get_job

    spec = get_job("purchase_counts")
    assert Budgets.of(spec) == Budgets(100_000, 600.0, 5_000_000)
    unbounded = dataclasses.replace(spec, stores=(*spec.stores, StoreSpec("other", budget=StateBudget())))
    assert Budgets.of(unbounded).state_rows is None, "a store without a row budget: no sum to compare with"

    app = f"limits-{unique}-v1"
    metrics = DriverMetrics(app, f"{app}-dead-letter", "127.0.0.1:1", Budgets.of(spec))
    running = StoreRestore(started_at="2026-12-06T10:00:00+00:00", records_read=10)
    try:
        metrics.update(PublishedStatus(app, JobState.RESTORING, restore={"counts": running}))
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in _samples_of(app)}
        assert samples[("streamstate_input_lag_budget_records", (("application_id", app),))] == 100_000
        assert samples[("streamstate_restore_budget_seconds", (("application_id", app),))] == 600
        assert samples[("streamstate_state_budget_rows", (("application_id", app),))] == 5_000_000
        started = ("streamstate_restore_started_timestamp_seconds", (("application_id", app), ("store", "counts")))
        assert samples[started] == 1_796_551_200
        finished = dataclasses.replace(running, finished_at="2026-12-06T10:00:05+00:00")
        metrics.update(PublishedStatus(app, JobState.RUNNING, restore={"counts": finished}))
        assert started not in {(s.name, tuple(sorted(s.labels.items()))) for s in _samples_of(app)}
    finally:
        metrics.close()


def _samples_of(application_id: str):
    from prometheus_client import REGISTRY

    return [
        sample
        for family in REGISTRY.collect()
        if family.name.startswith("streamstate_") and family.name != "streamstate_dead_letter_records"
        for sample in family.samples
        if sample.labels.get("application_id") == application_id
    ]
