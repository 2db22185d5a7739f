"""The reader cuts a changelog at the last batch whose markers reached every partition (real broker)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.changelog_reader import read_changelog

pytestmark = pytest.mark.integration


def _produce(settings, topic, partition, records, batch_id):
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for key, value in records:
        producer.produce(
            topic, key=key, value=value, partition=partition, headers=[(BATCH_HEADER, str(batch_id).encode())]
        )
    assert producer.flush(30) == 0


def test_incomplete_batches_are_not_restored(kafka_broker, settings, unique):
    topic = ChangelogTopic(f"reader-{unique}", "store", partitions=2)
    topic.ensure(settings.kafka_bootstrap_servers)
    writer = ChangelogWriter(topic, settings.kafka_bootstrap_servers)

    _produce(settings, topic.name, 0, [(b"a", b"1"), (b"b", b"1")], batch_id=0)
    _produce(settings, topic.name, 1, [(b"c", b"1")], batch_id=0)
    writer._write_markers(BatchMarker(0, {"in": {0: 10, 1: 20}}, 3))

    # Batch 1 is complete: an update and a tombstone.
    _produce(settings, topic.name, 0, [(b"a", b"2"), (b"b", None)], batch_id=1)
    writer._write_markers(BatchMarker(1, {"in": {0: 15, 1: 20}}, 2))

    # Batch 2 crashed: data in both partitions, the marker reached partition 0 only.
    _produce(settings, topic.name, 0, [(b"a", b"3")], batch_id=2)
    _produce(settings, topic.name, 1, [(b"c", b"3"), (b"d", b"3")], batch_id=2)
    marker_producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    marker_producer.produce(
        topic.name,
        key=MARKER_KEY,
        value=BatchMarker(2, {"in": {0: 18, 1: 25}}, 3).to_bytes(),
        partition=0,
        headers=[(BATCH_HEADER, b"2")],
    )
    assert marker_producer.flush(30) == 0

    read = read_changelog(settings.kafka_bootstrap_servers, topic.name)
    assert read.cut_batch_id == 1
    assert read.state == {b"a": b"2", b"c": b"1"}
    assert read.input_offsets == {"in": {0: 15, 1: 20}}
    assert read.records_read == 13  # 8 data records + 5 markers
    assert read.records_applied == 5 and read.tombstones_applied == 1
    assert read.records_dropped_incomplete == 3

    # Resuming from the cut applies only what follows it, on top of the earlier state.
    tail = read_changelog(settings.kafka_bootstrap_servers, topic.name, read.resume_offsets, base_state=read.state)
    assert tail.cut_batch_id is None and tail.state == read.state
    # ...until a later batch is marked in every partition.
    writer._write_markers(BatchMarker(3, {"in": {0: 30, 1: 30}}, 0))
    tail = read_changelog(settings.kafka_bootstrap_servers, topic.name, read.resume_offsets, base_state=read.state)
    assert tail.cut_batch_id == 3
    assert tail.state == {b"a": b"3", b"c": b"3", b"d": b"3"}
    assert tail.input_offsets == {"in": {0: 30, 1: 30}}


def test_half_written_batch_before_a_checkpoint_loss_is_never_applied(kafka_broker, settings, unique):
    topic = ChangelogTopic(f"void-{unique}", "store", partitions=1)
    topic.ensure(settings.kafka_bootstrap_servers)
    bootstrap = settings.kafka_bootstrap_servers
    _produce(settings, topic.name, 0, [(b"k", b"1")], batch_id=0)
    ChangelogWriter(topic, bootstrap)._write_markers(BatchMarker(0, {"in": {0: 1}}, 1))
    # Batch 1 crashed after writing its data, and then the checkpoint was lost.
    _produce(settings, topic.name, 0, [(b"k", b"WRONG"), (b"x", b"WRONG")], batch_id=1)

    restored = read_changelog(bootstrap, topic.name)
    assert restored.cut_batch_id == 0 and restored.max_batch_seen == 1

    # The new query continues above every id seen and voids the gap (0, 2).
    writer = ChangelogWriter(topic, bootstrap, batch_base=restored.max_batch_seen + 1, void=((0, 2),))
    _produce(settings, topic.name, 0, [(b"k", b"2")], batch_id=2)
    writer._write_markers(BatchMarker(2, {"in": {0: 3}}, 1, void=writer.void))

    read = read_changelog(bootstrap, topic.name)
    assert read.cut_batch_id == 2
    assert read.state == {b"k": b"2"}
    assert read.records_dropped_incomplete == 2
