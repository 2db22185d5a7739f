"""Keys that do not follow partitions: a source produced without Kafka keys, over 3 partitions.

Without ``repartition``, every such record is a ``wrong_key`` dead letter and no output row is wrong (a
key spread over partitions would be counted apart in each partition's task: patient_heart_rate wrote each
window twice, once per partition). With ``repartition=True`` the job re-keys the source through its
repartition topic, as a Kafka Streams ``groupBy`` does: one row per key (and window), equal to the
reference applied in the repartition topic's order, for the order-free sums equal to the keyed run.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import json

import pytest
from confluent_kafka import Consumer, TopicPartition

from runtime.kafka_connection import client_config
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.io import dead_letter
from spark_jobs.io.kafka_topics import partition_offsets
from spark_jobs.io.repartition import ORIGIN_HEADER_PREFIX, PROGRESS_KEY
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import pulse, purchases
from spark_jobs.registry import get_job, store
from spark_jobs.state.checkpoint_offsets import batch_end_offsets, latest_committed_batch_id
from spark_jobs.testing import JobHarness

pytestmark = pytest.mark.integration

PARTITIONS = 3


@pytest.fixture(scope="module")
def harness(settings, kafka_broker, spark):
    return JobHarness(settings=settings, spark=spark)


def _spec(job: str, unique: str, **changes):
    spec = get_job(job)
    name = f"{job[:10]}_{unique}"
    return dataclasses.replace(
        spec, name=name, source_topic=f"{name}-in", output_table=name, source_partitions=PARTITIONS, **changes
    )


def _source_places(settings, topic: str) -> dict[bytes, set[tuple[str, int, int]]]:
    """Each record's value in ``topic`` -> its places there (topic, partition, offset), as a dead letter names
    them (a duplicated record has several)."""
    from spark_jobs.io.kafka_topics import read_partition

    consumer = Consumer(client_config(settings.kafka, {"group.id": f"places-{topic}", "enable.partition.eof": True}))
    places = collections.defaultdict(set)
    try:
        for p in partition_offsets(settings.kafka, topic):
            for msg in read_partition(consumer, topic, p):
                places[msg.value()].add((topic, p, msg.offset()))
    finally:
        consumer.close()
    return places


def _repartitioned(settings, spec) -> list[list[dict]]:
    """The repartition topic's committed records, per partition in offset order (what the stateful stage read)."""
    topic = JobLayout.of(spec, settings).repartition_topic
    ends = {p: high for p, (_, high) in partition_offsets(settings.kafka, topic).items()}
    committed = {"group.id": "test-repartition", "isolation.level": "read_committed", "enable.partition.eof": True}
    consumer = Consumer(client_config(settings.kafka, committed))
    out: list[list[dict]] = []
    try:
        for p in sorted(ends):
            records: list[dict] = []
            consumer.assign([TopicPartition(topic, p, 0)])
            while ends[p]:
                msg = consumer.poll(10)
                assert msg is not None, f"partition {p} of {topic} did not reach its end"
                if msg.error():
                    if msg.offset() is not None and msg.offset() >= ends[p] - 1:
                        break
                    continue
                event = json.loads(msg.value())
                headers = dict(msg.headers() or [])
                assert msg.key() == event[spec.key_field].encode(), "keyed by the job's key field"
                assert headers[ORIGIN_HEADER_PREFIX + "topic"] == spec.source_topic.encode()
                records.append(event)
                if msg.offset() >= ends[p] - 1:
                    break
            out.append(records)
    finally:
        consumer.close()
    return out


def test_a_source_not_keyed_by_the_key_is_refused_record_by_record(harness, unique):
    """The default: a record whose Kafka key is not its key field is a wrong_key dead letter, never applied."""
    spec = _spec("patient_heart_rate", unique)
    events = list(pulse.generate(patients=6, seconds=200, seed=11))
    result = harness.run(spec, events, keyed=False)
    assert result.outputs == []
    reasons = {letter.reason for letter in result.dead_letters}
    assert reasons == {dead_letter.WRONG_KEY}, reasons
    assert len(result.dead_letters) == len(events)
    message = result.dead_letters[0].message
    assert "Kafka key is none, not its patient_id 'p0" in message and "repartition=True" in message, message
    # counted by reason in the run's status (its metrics and the supervision's source_not_keyed alert read it)
    assert read_status(harness.settings.status_dir, spec.application_id).dead_letters == {"wrong_key": len(events)}


@pytest.mark.variation(
    of="test_user_sessions_re_keyed_through_the_repartition_topic (stream time through the repartition topic; "
    "here fixed windows)"
)
def test_heart_rate_re_keyed_through_the_repartition_topic(harness, settings, unique):
    """Unkeyed pulses over 3 partitions: one row per patient and window, equal to Kafka Streams' semantics
    applied in the repartition topic's order (stream time per repartition partition); a second run resumes."""
    spec = _spec("patient_heart_rate", unique, repartition=True)
    events = list(pulse.adversarial(400, patients=7, seed=13))
    bad = [b"not json", json.dumps({"type": "pulse", "event_time": "2026-11-01T09:00:00Z"}).encode()]
    first = harness.run(spec, events[:250] + bad, keyed=False)
    second = harness.run(spec, events[250:], keyed=False)
    letters = first.dead_letters + second.dead_letters

    by_partition = _repartitioned(settings, spec)
    assert sorted(e["event_id"] for part in by_partition for e in part) == sorted(e["event_id"] for e in events)
    s = store(spec, "pulse-counts")
    want = pulse.expected(by_partition, s.window_ms, s.grace_ms, s.retention_ms, partitions=PARTITIONS)
    rows = second.outputs
    windows = [
        (r["patient_id"], int(r["window_start"].replace(tzinfo=dt.timezone.utc).timestamp() * 1000)) for r in rows
    ]
    assert len(windows) == len(set(windows)), "a window was written twice"
    assert {w: r["heart_rate"] for w, r in zip(windows, rows, strict=True)} == want.emitted
    late = {json.loads(letter.value)["event_id"] for letter in letters if letter.reason == dead_letter.LATE}
    assert late == want.late
    # every letter names its record's place in the source, whichever stage refused it (late: the stateful one)
    places = _source_places(settings, spec.source_topic)
    assert all(letter.source in places[letter.value] for letter in letters)
    assert sorted(letter.reason for letter in letters if letter.reason != dead_letter.LATE) == [
        dead_letter.MISSING_KEY,
        dead_letter.UNDECODABLE,
    ]


def test_user_sessions_re_keyed_through_the_repartition_topic(harness, settings, unique):
    """Unkeyed clicks over 3 partitions: one row per user and session, equal to the session rules applied in
    the repartition topic's order (stream time per repartition partition: the reference's partition of a user
    is its repartition partition, both murmur2 of the key), late events dead-lettered."""
    from spark_jobs.reference.generators import sessions

    spec = _spec("user_sessions", unique, repartition=True)
    events = list(sessions.adversarial(300, users=7, seed=23))
    result = harness.run(spec, events, keyed=False)

    by_partition = _repartitioned(settings, spec)
    assert sorted(e["event_id"] for part in by_partition for e in part) == sorted(e["event_id"] for e in events)
    want = sessions.expected_visits([e for part in by_partition for e in part], partitions=PARTITIONS)
    assert want.late and len(want.emitted) > 10

    def ms(t: dt.datetime) -> int:
        return int(t.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)

    rows = result.outputs
    got = {
        (r["user_id"], ms(r["session_start"])): (ms(r["session_end"]), (r["events"], r["page_views"], r["last_page"]))
        for r in rows
    }
    assert len(got) == len(rows), "a session was written twice"
    assert got == want.emitted
    late = {json.loads(letter.value)["event_id"] for letter in result.dead_letters if letter.reason == dead_letter.LATE}
    assert late == want.late
    places = _source_places(settings, spec.source_topic)
    assert all(letter.source in places[letter.value] for letter in result.dead_letters)
    # the re-keying stage's lag in the source is published beside the stateful stage's (drained: none)
    status = read_status(settings.status_dir, spec.application_id)
    assert set(status.rekeying_lag) == {f"{spec.source_topic}-{p}" for p in range(PARTITIONS)}
    assert status.input_lag_records == 0


def test_purchase_counts_re_keyed_equal_the_keyed_answer(harness, settings, unique):
    """Re-keyed from an unkeyed source, purchase_counts equals its reference applied in the repartition
    topic's order; for users never closed (order-free sums) it equals the answer over the events as produced.
    A snapshot after every batch purges the repartition topic below where the batch started."""
    events = list(purchases.adversarial(600, users=15, seed=21))
    # half the users are never closed: their counts do not depend on the order of their events
    users = sorted({e["user_id"] for e in events if isinstance(e.get("user_id"), str) and e["user_id"]})
    kept_open = set(users[::2])
    events = [e for e in events if not (e.get("type") == "account_closed" and e.get("user_id") in kept_open)]
    spec = _spec("purchase_counts", unique, repartition=True, repartition_partitions=2)
    first = harness.run(spec, events[:300], keyed=False)
    by_partition = _repartitioned(settings, spec)
    assert len(by_partition) == 2
    valid = purchases.is_valid
    got = {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in first.outputs}
    assert got == purchases.expected_counts(e for part in by_partition for e in part if valid(e))

    purging = dataclasses.replace(spec, snapshot_every_batches=1)
    result = harness.run(purging, events[300:], keyed=False)
    closed = {e.get("user_id") for e in events if e.get("type") == "account_closed"}
    as_produced = purchases.expected_counts(e for e in events if valid(e))
    never_closed = {u: v for u, v in as_produced.items() if u not in closed}
    got = {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in result.outputs}
    assert never_closed and {u: v for u, v in got.items() if u not in closed} == never_closed
    assert dead_letter.WRONG_KEY not in {letter.reason for letter in first.dead_letters + result.dead_letters}
    ends = {p: high for p, (_, high) in partition_offsets(settings.kafka, spec.source_topic).items()}
    assert _progress(settings, spec) == ends, "the progress record names the source's end"
    # purged below where the last batch started (Spark replays that batch from there if killed before its commit)
    layout = JobLayout.of(purging, settings)
    last = latest_committed_batch_id(layout.checkpoint)
    started = batch_end_offsets(layout.checkpoint, last - 1)[layout.repartition_topic]
    repartition = partition_offsets(settings.kafka, layout.repartition_topic)
    assert {p: low for p, (low, _high) in repartition.items()} == started and any(started.values()), repartition


def _progress(settings, spec) -> dict[int, int]:
    topic = JobLayout.of(spec, settings).repartition_progress_topic
    committed = {"group.id": "test-progress", "isolation.level": "read_committed", "enable.partition.eof": True}
    consumer = Consumer(client_config(settings.kafka, committed))
    consumer.assign([TopicPartition(topic, 0, 0)])
    newest = None
    try:
        while (msg := consumer.poll(10)) is not None and not msg.error():
            if msg.key() == PROGRESS_KEY:
                newest = json.loads(msg.value())["offsets"]
    finally:
        consumer.close()
    return {int(p): o for p, o in (newest or {}).items()}


@pytest.mark.faults
def test_kill_9_around_the_repartition_write_counts_nothing_twice(settings, kafka_broker, spark):
    """kill -9 of a re-keying driver after a re-keying batch's transaction committed (Spark's commit log not
    yet written: the next driver's replay must write nothing again), before a later one (with the checkpoint
    lost: both stages resume, the re-keying one from its progress record), and between a stateful batch's outputs and its
    markers; then a drain. Each source record is in the repartition topic exactly once, and the outputs and
    the changelog equal the reference applied in the repartition topic's order."""
    from spark_jobs.driver.run import run
    from spark_jobs.io.kafka_topics import ensure_topic
    from spark_jobs.reference.generators.producer import produce_unkeyed
    from spark_jobs.registry import registered_versions
    from spark_jobs.state.changelog_reader import read_changelog
    from tests.faults.test_driver_kills import Kill, kill_at
    from tests.spark_jobs.test_purchase_counts import decode_counts

    stack = settings.replace(job_modules="tests.fixtures.repartition_jobs", max_offsets_per_trigger=150)
    spec = registered_versions(stack.job_modules)["rekeyed_counts"][1]
    layout = JobLayout.of(spec, stack)
    ensure_topic(stack.kafka, spec.source_topic, spec.source_partitions)
    events = list(purchases.adversarial(900, users=25, seed=31))
    produce_unkeyed(stack.kafka, spec.source_topic, events[:500], spec.source_partitions, seed=1)
    kill_at(stack, spec, Kill("after_repartition_write", 2), "rekeyed-kill-1.log")
    produce_unkeyed(stack.kafka, spec.source_topic, events[500:700], spec.source_partitions, seed=2)
    # the next driver replays that batch first (written already: nothing again), writes one, and is killed
    # before the next, its checkpoint lost with it
    kill_at(stack, spec, Kill("before_repartition_write", 2, lose_checkpoint=True), "rekeyed-kill-2.log")
    produce_unkeyed(stack.kafka, spec.source_topic, events[700:], spec.source_partitions, seed=3)
    kill_at(stack, spec, Kill("between_outputs_and_markers", 1), "rekeyed-kill-3.log")
    report = run(spec, stack, available_now=True, spark=spark)
    assert report.error is None

    valid = purchases.is_valid
    by_partition = _repartitioned(stack, spec)
    rekeyed = collections.Counter(json.dumps(e, sort_keys=True) for part in by_partition for e in part)
    keyed = [e for e in events if isinstance(e.get("user_id"), str) and e["user_id"]]
    assert rekeyed == collections.Counter(json.dumps(e, sort_keys=True) for e in keyed), "re-keyed once each"
    want = purchases.expected_counts(e for part in by_partition for e in part if valid(e))
    got = {r.user_id: (r.purchases, r.amount_spent) for r in spark.read.format("delta").load(report.output).collect()}
    assert got == want
    assert decode_counts(read_changelog(stack.kafka_bootstrap_servers, layout.changelog_topic("counts")).state) == want


def test_kafka_streams_groups_the_unkeyed_source_to_the_same_counts(harness, settings, tmp_path, unique):
    """The Kafka Streams twin (``purchase_counts_rekeyed`` in bench/kafka_streams: ``groupBy(user_id)``, its
    own repartition topic) and the platform's re-keyed job count the same unkeyed purchases alike (order-free
    sums: no closes), and both equal the answer over the events keyed by user."""
    from decimal import Decimal

    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build
    from spark_jobs.io.kafka_topics import ensure_topic
    from spark_jobs.reference.generators.producer import produce_unkeyed
    from tests.bench.test_kafka_streams_peer import _compacted_view
    from tests.helpers import wait_for

    # Kafka Streams stamps its records with event time: keep the input in the past (see the peer's test).
    start = purchases.start_ending_by(900 * 10)
    events = [e for e in purchases.generate(900, users=60, seed=23, start=start, close_rate=0) if purchases.is_valid(e)]
    want = purchases.expected_counts(events)
    spec = _spec("purchase_counts", unique, repartition=True)
    ensure_topic(settings.kafka, spec.source_topic, PARTITIONS)
    produce_unkeyed(settings.kafka, spec.source_topic, events, PARTITIONS, seed=5)

    result = harness.run(spec, [], keyed=False)
    assert {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in result.outputs} == want

    app, output = f"ks-rekeyed-{unique}", f"ks-rekeyed-{unique}-out"
    ensure_topic(settings.kafka, output, PARTITIONS, config=OUTPUT_TOPIC_CONFIG)
    peer = KafkaStreamsPeer(
        build(), settings, "purchase_counts_rekeyed", app, tmp_path / app, spec.source_topic, output, threads=1
    )
    try:
        peer.wait_caught_up(timeout_s=300)

        def counted():  # the repartition sub-topology catches up after the source offsets are committed
            view = _compacted_view(settings, f"{app}-counts-changelog")
            return {u: (s["purchases"], Decimal(s["amount_spent"])) for u, s in view.items()} == want

        wait_for(counted, 120, "Kafka Streams' counts over its repartition topic")
    finally:
        peer.stop()
