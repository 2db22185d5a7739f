"""End to end on the real stack: Kafka -> stateful Spark job (RocksDB) -> Delta, checked against plain Python."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, ConfigResource

from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.registry import get_job
from spark_jobs.run import report_path, run
from spark_jobs.state.changelog import MARKER_KEY, changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from tests.helpers import delta_purchase_counts, end_offsets, expected_purchase_counts

pytestmark = pytest.mark.integration


@pytest.fixture
def job(unique):
    spec = get_job("purchase_counts")
    return dataclasses.replace(spec, name=f"purchase_counts_{unique}", source_topic=f"purchases-{unique}",
                               output_table=f"purchase_counts_{unique}")  # fmt: skip


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

    # A second run continues from the checkpoint: only the new events are read, nothing twice.
    second = list(purchases.generate(2000, users=300, seed=2))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, second)
    report = run(job, settings, available_now=True, spark=spark)
    assert report.input_rows == 2000
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
        consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": f"t-{topic}",
                             "auto.offset.reset": "earliest", "enable.partition.eof": True})  # fmt: skip
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
    assert set(changelog) == set(source)
    assert all(changelog[k] == source[k] and len(source[k]) == 1 for k in source)


def test_generator_is_deterministic():
    assert list(purchases.generate(50, seed=3)) == list(purchases.generate(50, seed=3))
    assert list(purchases.generate(50, seed=3)) != list(purchases.generate(50, seed=4))
