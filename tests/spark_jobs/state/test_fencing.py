"""Two drivers of one job version (as on two hosts, where the lease cannot see both): the newer claim
fences the older one's changelog writes, and what the older one writes after the takeover is never
applied (real broker, no Spark: the data records are written the way Spark's Kafka sink writes them)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from runtime.kafka_connection import client_config
from spark_jobs.state.batch_records import BATCH_HEADER, BatchMarker, OutputRecords
from spark_jobs.state.changelog import ChangelogTopic, fenced_writer
from spark_jobs.state.changelog_reader import last_complete_batch, read_changelog
from spark_jobs.state.fencing import GENERATION_SPAN, WriterFence, WriterFenced, read_claims
from spark_jobs.state.restore import tail_records

pytestmark = pytest.mark.integration


def _data(writer, batch_id: int, changes: dict[bytes, bytes]) -> None:
    """A batch's data records (not transactional, as Spark's Kafka sink writes them)."""
    producer = Producer(client_config(writer.kafka, {"acks": "all"}))
    for key, value in changes.items():
        producer.produce(
            writer.topic.name,
            key=key,
            value=value,
            partition=key[0] % writer.topic.partitions,
            headers=[(BATCH_HEADER, str(batch_id).encode())],
        )
    assert producer.flush(30) == 0


def _batch(writer, spark_batch: int, changes: dict[bytes, bytes]) -> int:
    batch_id = writer.batch_base + spark_batch
    _data(writer, batch_id, changes)
    writer._write_markers(BatchMarker(batch_id, {"in": {0: spark_batch}}, len(changes), void=writer.void))
    return batch_id


def test_a_takeover_fences_the_older_driver_and_voids_what_it_writes_afterwards(kafka_broker, settings, unique):
    kafka, app = settings.kafka, f"fence-{unique}"
    topic = ChangelogTopic(app, "store", partitions=2)
    topic.ensure(kafka)

    def driver() -> tuple[WriterFence, object]:
        fence = WriterFence(kafka, app, f"{app}-driver", f"{app}-generations")
        fence.claim_generation()
        return fence, fenced_writer(topic, kafka, fence)

    fence_a, a = driver()
    assert fence_a.generation == 1 and a.batch_base == GENERATION_SPAN and a.void == ((-1, GENERATION_SPAN),)
    complete_a = _batch(a, 0, {b"a": b"1", b"b": b"1"})
    _data(a, a.batch_base + 1, {b"a": b"stale"})  # A's next batch: data written, then A pauses

    fence_b, b = driver()  # another host: B claims the version while A is paused
    assert fence_b.generation == 2
    assert b.void == ((-1, GENERATION_SPAN), (complete_a, 2 * GENERATION_SPAN))
    _batch(b, 1, {b"a": b"2"})  # B replays A's batch from the shared checkpoint

    # A wakes up: it finishes writing its batch; its markers are refused, naming who took over
    _data(a, a.batch_base + 1, {b"b": b"stale", b"x": b"stale"})
    with pytest.raises(WriterFenced, match=r"generation 1 .*was fenced by generation 2 \(pid \d+ on "):
        a._write_markers(BatchMarker(a.batch_base + 1, {"in": {0: 1}}, 3, void=a.void))
    assert fence_a.fenced_by is not None and fence_a.fenced_by.generation == 2
    last_b = _batch(b, 2, {b"c": b"3"})

    read = read_changelog(kafka, topic.name)
    assert read.state == {b"a": b"2", b"b": b"1", b"c": b"3"}
    assert read.cut_batch_id == last_b and read.records_dropped_incomplete == 3
    assert [c.generation for c in read_claims(kafka, f"{app}-generations")] == [1, 2]
    # after the last marker only commit markers remain: they take offsets but are no records of a tail
    assert tail_records(kafka, topic.name, read.resume_offsets) == 0

    # a third driver continues above both and keeps B's void range (compaction may leave only its markers)
    fence_c, c = driver()
    assert fence_c.generation == 3 and last_complete_batch(kafka, topic.name).batch_id == last_b
    assert c.void[-2:] == ((complete_a, 2 * GENERATION_SPAN), (last_b, 3 * GENERATION_SPAN))
    for fence in (fence_a, fence_b, fence_c):
        fence.close()


def test_the_last_complete_batch_is_found_behind_a_long_unfinished_one(kafka_broker, settings, unique):
    kafka, app = settings.kafka, f"fence-tail-{unique}"
    topic = ChangelogTopic(app, "store", partitions=2)
    topic.ensure(kafka)
    fence = WriterFence(kafka, app, f"{app}-driver", f"{app}-generations")
    fence.claim_generation()
    writer = fenced_writer(topic, kafka, fence)
    assert last_complete_batch(kafka, topic.name) is None
    complete = _batch(writer, 0, {b"k": b"1"})
    _data(writer, complete + 1, {b"k%d" % i: b"v" for i in range(300)})  # more than the first window reads
    assert last_complete_batch(kafka, topic.name, window=16).batch_id == complete
    fence.close()


def test_a_fenced_driver_is_told_so_however_its_client_learns_it_and_closes_quietly(kafka_broker, settings, unique):
    """The client learns of a fencing asynchronously: the commit, or a produce() after it learned (``_FATAL``),
    may be what fails (a few records: the commit; many: a produce). Each is the takeover (the driver exits
    FENCED); a fenced writer stays refused whatever its client says when asked again (a commit the fencing
    failed may still count as in progress: ``_CONFLICT``), and closing the fenced producer, with records still
    queued, raises nothing that would hide it (seen in CI: exit 1)."""
    kafka = settings.kafka
    for count in (10, 20_000):
        app = f"fence-fatal-{unique}-{count}"
        topic = ChangelogTopic(app, "store", partitions=4)
        topic.ensure(kafka)
        fence_a = WriterFence(kafka, app, f"{app}-driver", f"{app}-generations")
        fence_a.claim_generation()
        a = fenced_writer(topic, kafka, fence_a)
        fence_b = WriterFence(kafka, app, f"{app}-driver", f"{app}-generations")
        fence_b.claim_generation()

        records = OutputRecords(topic.name, [b"k%d" % i for i in range(count)], [b"v" * 100] * count)
        for spark_batch in (1, 2, 3):
            marker = a.marker_records(a.marker(spark_batch, {"in": {0: spark_batch}}, len(records.keys)))
            with pytest.raises(WriterFenced, match=r"generation 1 .*was fenced by generation 2"):
                fence_a.commit_markers([marker], [records])
        fence_a.close()
        fence_b.close()
        assert read_changelog(kafka, topic.name).state == {}
