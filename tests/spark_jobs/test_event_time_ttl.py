"""The keyed aggregate with a TTL counted in event time (``StoreSpec(ttl_clock="event_time")``,
``KeyedAggregate(time=...)``; ``streamstate.primitives.ExpiringAggregate``), held to a plain-Python
reference of its documented semantics (``spark_jobs.reference.generators.activity.expected``; the Kafka Streams peer
is held to it too, in tests/bench/test_kafka_streams_peer.py):

* the processor on the same events cut into micro-batches in different ways: the store it ends with,
  the partitions' stream times and the events refused as late are the same whatever the cut, on input
  that expires keys, restarts them, deletes them, applies old events to live keys and refuses events
  already too old for an absent key;
* the declared job end to end on the real broker, Spark and Delta, its checkpoint lost between two runs
  (the second restores keys, event times and stream times from the changelog): outputs equal the
  reference, and the late event is a dead letter saying why;
* declarations that cannot work are refused, naming the job and the field; the state audit's verdict.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from pyspark.sql import types as T

from spark_jobs.operations.state_audit.rows import SnapshotEntry
from spark_jobs.operations.state_audit.ttl import NOT_ENFORCED, UNVERIFIABLE, VERIFIED, event_time_ttl_verdict
from spark_jobs.primitives import Aggregate, JsonEvents, KeyedAggregate
from spark_jobs.reference.generators import activity
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec
from spark_jobs.testing import JobHarness
from tests.helpers import collect_available_now, file_stream, source_rows, with_source_columns

PARTITIONS = 2
TTL_MS = 60_000
SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("user", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("qty", T.IntegerType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)
ACTIVITY = KeyedAggregate(
    store="activity",
    events=JsonEvents(SCHEMA, types=(activity.CLICK, activity.VIEW, activity.LOGOUT)),
    values={"clicks": Aggregate.count(), "qty": Aggregate.sum("qty"), "last_at": Aggregate.max("event_time")},
    where="type = 'click'",
    delete_when="type = 'logout'",
    time="event_time",
)
STORE = StoreSpec("activity", ttl_ms=TTL_MS, ttl_clock="event_time")
SPEC = JobSpec(
    name="activity",
    version=1,
    source_topic="activity",
    key_field="user",
    output_table="activity",
    entrypoint=f"{__name__}:ACTIVITY",
    stores=(STORE,),
    source_partitions=PARTITIONS,
)


def _expected(events: list[dict]) -> activity.Outcome:
    return activity.expected(events, TTL_MS, PARTITIONS)


def _run(spark, tmp_path, events: list[dict], cut: int, name: str) -> list[activity.Outcome]:
    """The processor over ``events`` in micro-batches of ``cut`` records: the store, stream times and late
    events after each micro-batch, in the reference's terms."""
    rows = source_rows(events, SCHEMA, "user", PARTITIONS, activity.START)
    batches = [rows[i : i + cut] for i in range(0, len(rows), cut)]
    stream = file_stream(spark, batches, with_source_columns(SCHEMA), tmp_path / f"events-{name}")
    changes = ACTIVITY.changes(stream, "user", None, STORE, job="activity")

    def row_of(row, batch_id: int) -> tuple:
        return batch_id, tuple(sorted(row.asDict().items(), key=lambda item: item[0]))

    seen = sorted(collect_available_now(changes, "update", tmp_path / f"checkpoint-{name}", row_of), key=lambda r: r[0])
    got, after_each_batch = activity.Outcome({}, {}, set()), []
    for batch_id in range(len(batches)):
        for _, items in (r for r in seen if r[0] == batch_id):
            row = dict(items)
            if row["kind"] == "late":
                got.late.add(bytes(row["raw"]).decode())
                assert row["event_time_ms"] + TTL_MS <= row["stream_time_ms"]
            elif row["key"] is None:
                got.stream_times[row["source_partition"]] = row["stream_time_ms"]
            elif row["tombstone"]:
                got.state.pop(row["key"], None)
            else:
                last_at = int(row["last_at"].timestamp() * 1000)  # Spark hands out local times; so does .timestamp()
                got.state[row["key"]] = (row["clicks"], row["qty"], last_at, row["event_time_ms"])
        after_each_batch.append(
            dataclasses.replace(got, state=dict(got.state), stream_times=dict(got.stream_times), late=set(got.late))
        )
    return after_each_batch


@pytest.mark.integration
def test_keys_expire_by_event_time_whatever_the_batching(spark, tmp_path):
    events = activity.generate(100, seed=11)
    want = _expected(events)
    # the input exercises every rule
    assert want.expired >= 3 and want.restarted and want.old_but_alive and want.late and want.on_the_boundary, want
    assert any(e["type"] == "logout" for e in events) and want.state
    for cut in (len(events), 5):
        # after every micro-batch the store is the reference's over the events so far (users expire so
        # often that the end alone would hide a rule broken on the way)
        for batch, got in enumerate(_run(spark, tmp_path, events, cut, f"cut-{cut}")):
            so_far = events[: (batch + 1) * cut]
            assert got == _expected(so_far).final(), f"micro-batches of {cut}: after batch {batch}"


@pytest.mark.integration
def test_the_job_expires_keys_dead_letters_late_events_and_survives_a_lost_checkpoint(
    spark, kafka_broker, settings, unique
):
    spec = dataclasses.replace(
        SPEC, source_topic=f"activity-{unique}", name=f"activity_{unique}", output_table=f"activity_{unique}"
    )
    events = activity.generate(120, seed=5)
    want = _expected(events)
    assert want.expired and want.late and want.state
    with JobHarness(settings=settings, spark=spark) as harness:
        first = harness.run(spec, events[:60])
        shutil.rmtree(first.report.checkpoint)  # the second run restores keys and stream times from the changelog
        second = harness.run(spec, events[60:])
    assert second.report.restores[STORE.name].keys > 0
    outputs = {r["user"]: (r["clicks"], r["qty"], int(r["last_at"].timestamp() * 1000)) for r in second.outputs}
    assert outputs == {k: v[:3] for k, v in want.state.items()}
    late = {
        json.loads(x.value)["event_id"]: x for x in [*first.dead_letters, *second.dead_letters] if x.reason == "late"
    }
    assert late.keys() == want.late, late
    sample = next(iter(late.values()))
    assert "is older than the store's TTL: stream time of partition" in sample.message, sample.message


@pytest.mark.parametrize(
    ("declaration", "store", "message"),
    [
        (dataclasses.replace(ACTIVITY, time=None), STORE, "counts its TTL in event time: name the event's time"),
        (ACTIVITY, StoreSpec("activity", ttl_ms=TTL_MS), "only a store whose TTL counts event time"),
        (dataclasses.replace(ACTIVITY, time="user"), STORE, "'user' must be a TIMESTAMP field"),
    ],
)
def test_a_declaration_that_does_not_fit_its_event_time_ttl_is_refused(declaration, store, message):
    with pytest.raises(JobSpecError, match=f"job activity: time: .*{message}"):
        declaration.check(dataclasses.replace(SPEC, stores=(store,)))


def test_a_store_refuses_a_ttl_clock_it_cannot_keep():
    with pytest.raises(JobSpecError, match="ttl_clock 'wall' is not one of"):
        StoreSpec("s", ttl_ms=1, ttl_clock="wall")
    with pytest.raises(JobSpecError, match="ttl_clock is for a store with ttl_ms"):
        StoreSpec("s", ttl_clock="event_time")


def test_the_audit_judges_an_event_time_ttl_on_the_snapshot():
    times = [SnapshotEntry(source_partition=0, stream_time_ms=100_000), SnapshotEntry(1, stream_time_ms=50_000)]
    fresh = [SnapshotEntry(source_partition=0, event_time_ms=60_000), SnapshotEntry(1, event_time_ms=0)]
    assert event_time_ttl_verdict(TTL_MS, times + fresh).verdict == VERIFIED
    overdue = event_time_ttl_verdict(TTL_MS, [*times, *fresh, SnapshotEntry(0, event_time_ms=40_000)])
    assert (overdue.verdict, overdue.keys_overdue, overdue.oldest_overdue_ms) == (NOT_ENFORCED, 1, 60_000)
    assert event_time_ttl_verdict(TTL_MS, fresh).verdict == UNVERIFIABLE
