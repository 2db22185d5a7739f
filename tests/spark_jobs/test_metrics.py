"""The driver's Prometheus metrics follow its status documents (pure), and a served endpoint answers a
scrape with them and with the dead-letter topic's size read from a real broker. A running driver and
standby are scraped in tests/plugins/test_state_api.py."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.lifecycle import BatchProgress, JobState, PublishedStatus, SnapshotTaken, StoreRestore
from spark_jobs.metrics import DriverMetrics, MetricsServer
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
    server = MetricsServer(settings)
    try:
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


def _registered_samples():
    from prometheus_client import REGISTRY

    return [(s.name, s.labels) for family in REGISTRY.collect() for s in family.samples]
