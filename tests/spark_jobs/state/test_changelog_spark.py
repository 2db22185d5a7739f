"""Spark's reader of a changelog cuts and applies exactly what the Python reader does (real broker, real Spark).

The logs are the generated ones of test_cut_rules.py (the writer's crashes, replays and checkpoint
losses, and adversarial ones), produced to real topics with their headers and markers.
"""

from __future__ import annotations

import json
import random

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.operations.changelog_tuning.measure import broker_log_dirs, read_log_files
from spark_jobs.state import changelog_spark
from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.changelog_reader import apply_changes, read_changelog, summarize_range
from spark_jobs.state.changelog_spark import read_changelog_frame
from tests.spark_jobs.state.test_cut_rules import Log, adversarial_log, writer_log

pytestmark = pytest.mark.integration

VOID_LOG: Log = {  # a batch half-written before a checkpoint loss: the keep table, not the offset range
    0: [
        (b"a", b"1", 0),
        (MARKER_KEY, BatchMarker(0, {"in": {0: 1}}, 1).to_bytes(), 0),
        (b"a", b"half", 1),
        (b"b", b"2", 5),
        (MARKER_KEY, BatchMarker(5, {"in": {0: 3}}, 1, void=((0, 5),)).to_bytes(), 5),
    ],
    1: [
        (b"c", b"1", 0),
        (MARKER_KEY, BatchMarker(0, {"in": {0: 1}}, 1).to_bytes(), 0),
        (b"c", None, 5),
        (MARKER_KEY, BatchMarker(5, {"in": {0: 3}}, 1, void=((0, 5),)).to_bytes(), 5),
    ],
}


def _produce(bootstrap: str, topic: str, log: Log) -> None:
    ensure_topic(bootstrap, topic, len(log))
    producer = Producer({"bootstrap.servers": bootstrap})
    for p, records in log.items():
        for key, value, batch in records:
            headers = [(BATCH_HEADER, str(batch).encode())] if batch is not None else []
            producer.produce(topic, key=key, value=value, partition=p, headers=headers)
    assert producer.flush(30) == 0


def _logs() -> list[tuple[str, Log]]:
    logs = [("void", VOID_LOG)]
    logs += [(f"writer-{seed}", writer_log(random.Random(seed))) for seed in range(6)]
    logs += [(f"adversarial-{seed}", adversarial_log(random.Random(seed))) for seed in range(2)]
    return logs


def test_spark_applies_what_the_python_reader_applies(spark, kafka_broker, settings, unique):
    bootstrap = settings.kafka_bootstrap_servers
    ranges_only = []
    for name, log in _logs():
        topic = f"cut-{unique}-{name}"
        _produce(bootstrap, topic, log)
        python = read_changelog(bootstrap, topic)
        frame = read_changelog_frame(spark, bootstrap, topic)
        state: dict = {}
        apply_changes(
            state,
            [(r.key.encode(), r.value.encode() if r.value is not None else None) for r in frame.changes.collect()],
        )
        where = f"{name}: {log}"
        assert state == python.state, where
        assert (frame.cut_batch_id, frame.max_batch_seen) == (python.cut_batch_id, python.max_batch_seen), where
        assert frame.resume_offsets == python.resume_offsets, where
        assert (frame.input_offsets, frame.watermark_ms) == (python.input_offsets, python.watermark_ms), where
        assert frame.records_read == python.records_read, where
        if frame.plan.records_applied is not None:
            assert frame.plan.records_applied == python.records_applied, where
        ranges_only.append(frame.plan.offset_range_only)
        # a short range is summarized by the driver's consumer, a long one by a Spark job: the same summary
        start, end = frame.start_offsets, frame.end_offsets
        records = changelog_spark._records(spark, bootstrap, topic, start, end)
        by_spark = changelog_spark._summarize_in_spark(records, records["key"] == MARKER_KEY)
        by_driver = summarize_range(bootstrap, topic, start, end)
        assert [sorted(found, key=repr) for found in by_driver] == [sorted(found, key=repr) for found in by_spark], (
            where
        )
    assert ranges_only[0] is False and any(ranges_only), "both ways of keeping records were exercised"


def test_a_start_below_the_log_start_reads_from_the_log_start(spark, kafka_broker, settings, unique):
    """A snapshot's offsets can be older than what retention left (a windowed store's changelog deletes):
    both readers read from the log start instead of skipping the partition."""
    bootstrap = settings.kafka_bootstrap_servers
    topic = f"cut-{unique}-trimmed"
    marker = BatchMarker(0, {"in": {0: 1}}, 1).to_bytes()
    _produce(
        bootstrap,
        topic,
        {
            0: [(b"gone", b"1", 0), (b"a", b"1", 0), (MARKER_KEY, marker, 0)],
            1: [(b"b", b"1", 0), (MARKER_KEY, marker, 0)],
        },
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 1)]).values():
        future.result(30)

    frame = read_changelog_frame(spark, bootstrap, topic, {0: 0, 1: 0})
    python = read_changelog(bootstrap, topic, {0: 0, 1: 0})
    assert frame.start_offsets == {0: 1, 1: 0}
    assert {r.key: r.value for r in frame.changes.collect()} == {"a": "1", "b": "1"}
    assert python.state == {b"a": b"1", b"b": b"1"} and python.cut_batch_id == frame.cut_batch_id == 0


def test_a_batch_of_changes_is_written_compressed(spark, kafka_broker, settings, unique):
    """Spark's Kafka sink writes a batch's changes as compressed record batches: the broker's log holds
    fewer bytes than the changes themselves, and both readers read them back as written."""
    bootstrap = settings.kafka_bootstrap_servers
    topic = ChangelogTopic(f"compressed-{unique}", "counts", partitions=2)
    topic.ensure(bootstrap)
    changes = {f"user-{i:05d}": json.dumps({"purchases": i % 7, "amount_spent": f"{i}.50"}) for i in range(4000)}
    frame = spark.createDataFrame(list(changes.items()), "key STRING, value STRING")
    assert ChangelogWriter(topic, bootstrap).write_batch(frame, 0, {"in": {0: 4000}}) == len(changes)

    raw = sum(len(k) + len(v) for k, v in changes.items())
    log = read_log_files(broker_log_dirs(AdminClient({"bootstrap.servers": bootstrap})), topic.name, topic.partitions)
    assert log is not None and log.bytes < raw / 2, (log, raw)  # uncompressed, the log exceeds the raw bytes
    restored = read_changelog(bootstrap, topic.name)
    assert restored.cut_batch_id == 0 and restored.state == {k.encode(): v.encode() for k, v in changes.items()}
    assert {r.key: r.value for r in read_changelog_frame(spark, bootstrap, topic.name).changes.collect()} == changes
