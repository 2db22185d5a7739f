"""End to end on the real stack: Kafka -> stateful Spark job (RocksDB) -> Delta, checked against plain Python."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from decimal import Decimal

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, ConfigResource

from spark_jobs.driver.run import report_path, run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.reference.jobs import purchase_counts
from spark_jobs.registry import StoreSpec, get_job
from spark_jobs.state.batch_records import MARKER_KEY
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from tests.helpers import delta_purchase_counts, end_offsets, expected_purchase_counts

pytestmark = pytest.mark.integration


@pytest.fixture
def job(unique):
    spec = get_job("purchase_counts")
    return dataclasses.replace(
        spec,
        name=f"purchase_counts_{unique}",
        source_topic=f"purchases-{unique}",
        output_table=f"purchase_counts_{unique}",
    )


def test_state_equals_an_independent_computation_across_runs(spark, kafka_broker, settings, job):
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    first = list(purchases.generate(3000, users=200, seed=1))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, first)

    report = run(job, settings, available_now=True, spark=spark)
    assert report.error is None
    assert report.input_rows == 3000
    assert report.state_rows == len(expected_purchase_counts(first))
    assert delta_purchase_counts(spark, report.output) == expected_purchase_counts(first)
    assert json.loads(report_path(job, settings).read_text())["input_rows"] == 3000

    # where batch time went (a first run with nothing restored and empty outputs has nothing to reconcile)
    assert set(report.phase_seconds) == {"state", "dead_letters", "changelog", "outputs", "snapshot"}

    # A second run continues from the checkpoint: only the new events are read, nothing twice; with
    # max_offsets_per_trigger the backlog is worked off in bounded micro-batches.
    second = list(purchases.generate(2000, users=300, seed=2))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, second)
    report = run(job, settings.replace(max_offsets_per_trigger=1000), available_now=True, spark=spark)
    assert report.input_rows == 2000 and report.batches >= 2
    assert delta_purchase_counts(spark, report.output) == expected_purchase_counts(first + second)
    assert sum(report.end_offsets[job.source_topic].values()) == 5000

    # The changelog's latest value per key is the state, and its last complete batch sits exactly
    # at the input position the job reached.
    read = read_changelog(settings.kafka_bootstrap_servers, changelog_topic_name(job.application_id, "counts"))
    assert decode_counts(read.state) == expected_purchase_counts(first + second)
    assert read.input_offsets == {job.source_topic: end_offsets(settings.kafka_bootstrap_servers, job.source_topic)}
    assert read.records_dropped_incomplete == 0


def decode_counts(state: dict[bytes, bytes]) -> dict[str, tuple[int, Decimal]]:
    values = {k.decode(): json.loads(v, parse_float=Decimal) for k, v in state.items()}
    return {k: (v["purchases"], Decimal(v["amount_spent"]).quantize(Decimal("0.01"))) for k, v in values.items()}


def test_changelog_topic_is_created_compacted_and_co_partitioned(spark, kafka_broker, settings, job):
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    events = list(purchases.generate(800, users=60, seed=5))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, events)
    run(job, settings, available_now=True, spark=spark)

    name = changelog_topic_name(job.application_id, "counts")
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    assert len(admin.list_topics(name, timeout=10).topics[name].partitions) == job.source_partitions
    configs = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)])
    described = next(iter(configs.values())).result()
    assert described["cleanup.policy"].value == "compact"

    # Same key, same partition number in the source and in the changelog (murmur2 on both sides).
    def partitions_by_key(topic: str) -> dict[bytes, set[int]]:
        consumer = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap_servers,
                "group.id": f"t-{topic}",
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
            }
        )
        consumer.subscribe([topic])
        seen: dict[bytes, set[int]] = {}
        eof: set[int] = set()
        try:
            while len(eof) < job.source_partitions:
                msg = consumer.poll(10)
                assert msg is not None, f"stalled reading {topic}"
                if msg.error():
                    eof.add(msg.partition())
                    continue
                seen.setdefault(msg.key(), set()).add(msg.partition())
        finally:
            consumer.close()
        return seen

    source, changelog = partitions_by_key(job.source_topic), partitions_by_key(name)
    changelog.pop(MARKER_KEY)
    # Users opened and closed within one micro-batch never reach the store; everyone else does.
    assert {k.encode() for k in expected_purchase_counts(events)} <= set(changelog) <= set(source)
    assert all(changelog[k] == source[k] and len(source[k]) == 1 for k in changelog)


def _event(n: int, user: str, kind: str = "purchase", amount: float = 10.0) -> dict:
    event = {"event_id": f"e-{n}", "type": kind, "user_id": user, "event_time": f"2026-11-01T09:00:{n:02d}.000Z"}
    return {**event, "item": "sku-1", "amount": amount} if kind == "purchase" else event


def _latest_changelog_values(settings, job) -> dict[str, bytes | None]:
    """Latest value per key in the changelog as written (tombstones kept as None)."""
    latest: dict[str, bytes | None] = {}
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap_servers,
            "group.id": f"t-{uuid.uuid4()}",
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([changelog_topic_name(job.application_id, "counts")])
    eof: set[int] = set()
    try:
        while len(eof) < job.source_partitions:
            msg = consumer.poll(10)
            assert msg is not None
            if msg.error():
                eof.add(msg.partition())
            elif msg.key() != MARKER_KEY:
                latest[msg.key().decode()] = msg.value()
    finally:
        consumer.close()
    return latest


def test_account_closed_deletes_the_user_with_a_tombstone(spark, kafka_broker, settings, job):
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    first = [_event(1, "alice"), _event(2, "bob"), _event(3, "alice", amount=5.5), _event(4, "carol")]
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, first)
    run(job, settings, available_now=True, spark=spark)
    assert delta_purchase_counts(spark, job_output(settings, job)) == expected_purchase_counts(first)

    # alice closes her account; carol closes hers and comes back within the same batch.
    second = [_event(5, "alice", "account_closed"), _event(6, "carol", "account_closed"), _event(7, "carol", amount=1)]
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, second)
    report = run(job, settings, available_now=True, spark=spark)
    expected = expected_purchase_counts(first + second)
    assert expected == {"bob": (1, Decimal("10.00")), "carol": (1, Decimal("1.00"))}
    assert delta_purchase_counts(spark, report.output) == expected
    assert report.state_rows == 2

    latest = _latest_changelog_values(settings, job)
    assert latest["alice"] is None  # the tombstone
    assert json.loads(latest["carol"])["purchases"] == 1
    read = read_changelog(settings.kafka_bootstrap_servers, changelog_topic_name(job.application_id, "counts"))
    assert decode_counts(read.state) == expected


def test_a_store_with_ttl_evicts_idle_users_with_tombstones(spark, kafka_broker, settings, job):
    job = dataclasses.replace(job, stores=(StoreSpec("counts", ttl_ms=2_000),))
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, [_event(1, "idle"), _event(2, "busy")])
    run(job, settings, available_now=True, spark=spark)
    time.sleep(3)  # past the TTL of both users
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, [_event(3, "busy"), _event(4, "new")])
    report = run(job, settings, available_now=True, spark=spark)

    # "busy" was touched again before its timer fired; "idle" expired.
    assert delta_purchase_counts(spark, report.output) == {"busy": (2, Decimal("20.00")), "new": (1, Decimal("10.00"))}
    latest = _latest_changelog_values(settings, job)
    assert latest["idle"] is None and latest["busy"] is not None


def job_output(settings, job) -> str:
    return str(settings.lake / job.output_table_dir)


def test_generator_is_deterministic():
    assert list(purchases.generate(50, seed=3)) == list(purchases.generate(50, seed=3))
    assert list(purchases.generate(50, seed=3)) != list(purchases.generate(50, seed=4))


def test_a_first_start_reconciles_only_outputs_that_hold_rows(spark, kafka_broker, settings, job):
    """Nothing restored and empty outputs: the reconciling MERGE is skipped (a new version starts seconds
    sooner). Nothing restored but a row in the outputs (written by a driver whose batch never reached the
    changelog, then the checkpoint lost): it still runs, and the row goes."""
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    events = list(purchases.generate(60, users=6, seed=8))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, events)
    fresh = dataclasses.replace(job, name=f"{job.name}_fresh", output_table=f"{job.output_table}_fresh")
    report = run(fresh, settings, available_now=True, spark=spark)
    assert "reconcile" not in report.phase_seconds and report.input_rows == len(events)
    assert delta_purchase_counts(spark, job_output(settings, fresh)) == expected_purchase_counts(events)

    output = job_output(settings, job)
    ghost = spark.createDataFrame(
        [("ghost", 7, Decimal("70.00"), None)], purchase_counts.COUNTS.output_schema("user_id")
    )
    ghost.write.format("delta").save(output)
    report = run(job, settings, available_now=True, spark=spark)
    assert not report.restores and "reconcile" in report.phase_seconds
    assert delta_purchase_counts(spark, output) == expected_purchase_counts(events)


def test_a_restore_reconciles_the_outputs_with_the_restored_store(spark, kafka_broker, settings, job):
    """Rows the changelog never recorded (a batch whose outputs were written before its driver died)
    do not survive a restore, even for keys the replay never touches again."""
    import shutil

    from delta.tables import DeltaTable

    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    events = list(purchases.generate(300, users=30, seed=5))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, events)
    run(job, settings, available_now=True, spark=spark)
    output = job_output(settings, job)
    expected = expected_purchase_counts(events)
    some_user = sorted(expected)[0]
    table = DeltaTable.forPath(spark, output)
    table.update(f"user_id = '{some_user}'", {"purchases": "purchases + 100"})  # a value the store never had
    ghost = spark.createDataFrame([("ghost", 7, Decimal("70.00"), None)], table.toDF().schema)
    ghost.write.format("delta").mode("append").save(output)  # a user the store never had

    shutil.rmtree(settings.checkpoints / job.application_id)  # the checkpoint is lost: restore
    report = run(job, settings, available_now=True, spark=spark)
    assert report.restores, "the run restored from the changelog"
    assert delta_purchase_counts(spark, output) == expected
