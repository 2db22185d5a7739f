"""The state-size audit measures whether a declared TTL evicts keys, on a real broker.

A real job's changelog, as its driver writes it, shows the reference processor evicting idle users and
a processor that ignores its timers not evicting them. The changelog of ``ttl_counts`` (TTL 1 h, tests/fixtures/audit_jobs.py) is written as the driver writes
it (changes tagged with their batch, then a batch marker per partition), with record timestamps set in
the past: users last written 3 h ago and never tombstoned are keys the TTL should have evicted. The
audit's own entry point (``audit_store``, what the DAG's operator calls) reads it.
"""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from confluent_kafka import Producer

from runtime.kafka_connection import client_config
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.operations.state_audit.collect import audit_rows, audit_store, record_audit
from spark_jobs.operations.state_audit.rows import StoreAudit
from spark_jobs.operations.state_audit.ttl import tolerance_ms
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import StoreSpec, SupervisionPolicy, get_job
from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.changelog import ChangelogTopic
from tests.fixtures.audit_jobs import NEVER_EVICTS, TTL_COUNTS

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000


def _write_batch(settings, topic: str, partitions: int, batch_id: int, at_ms: int, changes: dict[str, dict | None]):
    """One complete batch written at ``at_ms``: the changes (None: a tombstone), then its markers."""
    producer = Producer(client_config(settings.kafka, {"acks": "all", "log_level": 3}))
    header = [(BATCH_HEADER, str(batch_id).encode())]
    for user, value in changes.items():
        payload = None if value is None else json.dumps(value).encode()
        producer.produce(topic, key=user.encode(), value=payload, headers=header, timestamp=at_ms)
    assert producer.flush(30) == 0
    marker = BatchMarker(batch_id, {TTL_COUNTS.source_topic: {0: batch_id + 1}}, len(changes)).to_bytes()
    for p in range(partitions):
        producer.produce(topic, key=MARKER_KEY, value=marker, partition=p, headers=header, timestamp=at_ms)
    assert producer.flush(30) == 0


def _users(numbers: range) -> dict[str, dict]:
    return {f"u{n:03d}": {"purchases": 1, "amount_spent": "1.50", "touched_at_ms": 0} for n in numbers}


def _audit(settings, version: int, batches: list[tuple[int, dict]]) -> StoreAudit:
    """Write ``batches`` ((age in ms, changes), oldest first) to a fresh version's changelog and audit it."""
    spec = dataclasses.replace(TTL_COUNTS, version=version)
    store = spec.stores[0]
    topic = ChangelogTopic(spec.application_id, store.name, spec.source_partitions)
    assert topic.name == JobLayout.of(spec, settings).changelog_topic(store.name)
    topic.ensure(settings.kafka)
    now_ms = int(time.time() * 1000)
    for batch_id, (age_ms, changes) in enumerate(batches):
        _write_batch(settings, topic.name, spec.source_partitions, batch_id, now_ms - age_ms, changes)
    row = audit_store(
        settings, f"test-ttl-{version}", spec, store, checkpoint_rows=[], changelog=None, restores=[], history=[]
    )
    record_audit(settings, [row])
    assert audit_rows(settings, spec.application_id, store.name)[-1].ttl_verdict == row.ttl_verdict
    return row


def test_keys_idle_past_the_ttl_and_never_tombstoned_mean_the_ttl_is_not_enforced(settings, kafka_broker):
    # 10 users last written 3 h ago (TTL 1 h) and still there; 10 active ones written now
    row = _audit(settings, 1, [(3 * HOUR_MS, _users(range(10))), (0, _users(range(10, 20)))])
    assert row.ttl_verdict == "ttl_not_enforced", row.ttl_reason
    assert (row.ttl_keys_checked, row.ttl_keys_overdue) == (20, 10)
    assert 3 * HOUR_MS - 60_000 <= row.ttl_oldest_overdue_ms <= 3 * HOUR_MS + 60_000
    assert row.unbounded and "TTL is not enforced" in row.unbounded_reason


def test_expired_keys_tombstoned_verify_the_ttl(settings, kafka_broker):
    # the same old users, evicted an hour and a minute after their last write
    evicted = dict.fromkeys(_users(range(10)))
    row = _audit(
        settings, 2, [(3 * HOUR_MS, _users(range(10))), (2 * HOUR_MS - 60_000, evicted), (0, _users(range(10, 20)))]
    )
    assert row.ttl_verdict == "ttl_verified", row.ttl_reason
    assert (row.ttl_keys_checked, row.ttl_keys_overdue) == (10, 0)
    assert not row.unbounded and "evicted (measured" in row.unbounded_reason


def test_a_store_younger_than_its_ttl_is_unverifiable_and_not_called_bounded(settings, kafka_broker):
    row = _audit(settings, 3, [(10 * 60_000, _users(range(10))), (0, _users(range(10, 20)))])
    assert row.ttl_verdict == "ttl_unverifiable", row.ttl_reason
    assert "are evicted" not in row.unbounded_reason and "not verified" in row.unbounded_reason


@pytest.mark.parametrize(
    ("entrypoint", "verdict"),
    [("spark_jobs.reference.jobs.purchase_counts:build", "ttl_verified"), (NEVER_EVICTS, "ttl_not_enforced")],
    ids=["the-reference-processor-evicts", "a-processor-that-never-evicts"],
)
def test_a_real_jobs_eviction_is_measured(spark, kafka_broker, settings, unique, entrypoint, verdict):
    """The job runs as in production (Spark, its changelog written by the driver); users idle past the
    TTL are evicted by the next batch, or, by a processor that ignores its timers, never."""
    spec = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"ttl_{unique}",
        source_topic=f"ttl-purchases-{unique}",
        output_table=f"ttl_{unique}",
        entrypoint=entrypoint,
        stores=(StoreSpec("counts", ttl_ms=2_000),),
        trigger_interval="1 second",
        supervision=SupervisionPolicy(batch_duration_budget_s=2),
    )
    ensure_topic(settings.kafka_bootstrap_servers, spec.source_topic, spec.source_partitions)

    def round_(users: range) -> None:
        events = [
            {
                "event_id": f"e-{u}",
                "type": "purchase",
                "user_id": f"u{u:03d}",
                "item": "sku-1",
                "amount": 1.5,
                "event_time": "2026-11-01T09:00:00Z",
            }
            for u in users
        ]
        purchases.produce(settings.kafka_bootstrap_servers, spec.source_topic, events)
        run(spec, settings, available_now=True, spark=spark)

    round_(range(10))
    time.sleep((2_000 + tolerance_ms(spec)) / 1000 + 1)  # past the TTL and its tolerance
    round_(range(10, 20))  # the batch that evicts users 0-9 (a TTL job runs no batch without input)
    row = audit_store(
        settings,
        f"test-ttl-{unique}",
        spec,
        spec.stores[0],
        checkpoint_rows=[],
        changelog=None,
        restores=[],
        history=[],
    )
    assert row.ttl_verdict == verdict, row.ttl_reason
    assert (row.ttl_keys_checked, row.ttl_keys_overdue) == ((10, 0) if entrypoint != NEVER_EVICTS else (20, 10))
