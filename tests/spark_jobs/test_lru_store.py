"""A keyed aggregate in an ``lru`` store (``StoreSpec(kind="lru", max_entries=N)``;
``streamstate.primitives.LruAggregate``), held to the plain-Python reference of its documented semantics
(``spark_jobs.reference.generators.recent_buyers.expected``) and to Kafka Streams' ``Stores.lruMap`` (the
``recent_buyers`` case of ``bench/kafka_streams``):

* the processor on the same events cut into micro-batches of every size down to one record: after every
  micro-batch the store holds the reference's users with the reference's values, in the reference's
  recency order per partition (evictions, re-entries after an eviction, closes);
* the declared job end to end on the real broker, Spark and Delta: an LRU of 10 over 1,000 users holds the
  10 most recently used per partition, in one batch, in batches of 97 records, and across a lost checkpoint
  (the second run restores values and recency from the changelog and evicts in the same order); the
  Kafka Streams app's store (printed by interactive query on exit) holds the same users and counts;
* declarations and stores that cannot work are refused, naming the job or the store and the field.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from decimal import Decimal
from types import SimpleNamespace

import pytest

from bench import answers
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import changelog_topic_name
from spark_jobs.reference.generators import purchases, recent_buyers
from spark_jobs.reference.generators.producer import kafka_partition
from spark_jobs.reference.jobs.purchase_counts import COUNTS
from spark_jobs.reference.jobs.recent_buyers import RECENT
from spark_jobs.registry import JobSpecError, StoreSpec, get_job
from spark_jobs.state.batch_records import MARKER_KEY
from spark_jobs.testing import JobHarness
from tests.helpers import collect_available_now, file_stream, source_rows, state_key_schema, with_source_columns

PARTITIONS = 2
MAX_ENTRIES = 10


def _spec(name: str, topic: str, max_entries: int = MAX_ENTRIES):
    store = dataclasses.replace(get_job("recent_buyers").stores[0], max_entries=max_entries)
    return dataclasses.replace(
        get_job("recent_buyers"),
        name=name,
        source_topic=topic,
        output_table=name,
        stores=(store,),
        source_partitions=PARTITIONS,
    )


def _events(count: int, users: int, seed: int) -> list[dict]:
    # in the past: the Kafka Streams app stamps its changelog with event time, and the broker refuses the future
    return list(
        purchases.generate(count, users=users, seed=seed, start=purchases.start_ending_by(count), close_rate=0.03)
    )


def _run_processor(spark, tmp_path, events: list[dict], cut: int, max_entries: int) -> list[dict[str, tuple]]:
    """The processor over ``events`` in micro-batches of ``cut`` records: after each micro-batch, user ->
    (purchases, amount spent, source partition, recency)."""
    decoded = [{**e, "amount": Decimal(str(e["amount"])) if "amount" in e else None} for e in events]
    schema = COUNTS.events.schema
    rows = source_rows(decoded, schema, "user_id", PARTITIONS, purchases.START)
    batches = [rows[i : i + cut] for i in range(0, len(rows), cut)]
    stream = file_stream(spark, batches, with_source_columns(schema), tmp_path / f"events-{cut}")
    store = StoreSpec(RECENT.store, kind="lru", max_entries=max_entries)
    changes = RECENT.changes(stream, "user_id", None, store, job="recent_buyers")

    def row_of(row, batch_id: int) -> tuple:
        return batch_id, row.key, row.tombstone, row.purchases, row.amount_spent, row.source_partition, row.recency

    seen = collect_available_now(changes, "update", tmp_path / f"checkpoint-{cut}", row_of)
    state: dict[str, tuple] = {}
    after_each_batch = []
    for batch_id in range(len(batches)):
        for _, key, tombstone, n, spent, partition, recency in (r for r in seen if r[0] == batch_id):
            if tombstone:
                state.pop(key, None)
            else:
                state[key] = (n, spent, partition, recency)
        after_each_batch.append(dict(state))
    return after_each_batch


def _order(state: dict[str, tuple]) -> dict[int, list[str]]:
    """Per partition, the users least recently used first (by their stored recency)."""
    order: dict[int, list[str]] = {}
    for user, (_, _, partition, _) in sorted(state.items(), key=lambda item: item[1][3]):
        order.setdefault(partition, []).append(user)
    return order


@pytest.mark.integration
def test_the_lru_keeps_the_most_recently_used_whatever_the_batching(spark, tmp_path):
    events = _events(50, users=25, seed=4)
    max_entries = 3
    want = recent_buyers.expected(events, max_entries, PARTITIONS)
    # the input exercises every rule: evictions, a user back after eviction, closes
    assert want.evicted >= 10 and any(e["type"] == "account_closed" for e in events), want
    for cut in (len(events), 1):
        for batch, got in enumerate(_run_processor(spark, tmp_path, events, cut, max_entries)):
            so_far = recent_buyers.expected(events[: (batch + 1) * cut], max_entries, PARTITIONS)
            assert {user: v[:2] for user, v in got.items()} == so_far.state, f"batches of {cut}: after batch {batch}"
            assert _order(got) == {p: users for p, users in so_far.order.items() if users}, f"cut {cut}, batch {batch}"
            assert all(v[2] == kafka_partition(user, PARTITIONS) for user, v in got.items())
    # the store's key (the partition's task key, a bigint) as every checkpoint so far holds it: keyed otherwise,
    # a later build could not continue them
    assert state_key_schema(spark, tmp_path / "checkpoint-1", RECENT.store) == "struct<value:bigint>"


def _outputs(rows) -> dict[str, tuple[int, Decimal]]:
    return {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in rows}


@pytest.mark.integration
def test_an_lru_of_10_over_1000_users_equals_the_reference_and_kafka_streams_lru_map(
    spark, kafka_broker, settings, tmp_path, unique
):
    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build

    events = _events(1500, users=1000, seed=8)
    want = recent_buyers.expected(events, MAX_ENTRIES, PARTITIONS)
    assert want.evicted > 500 and len(want.state) == 2 * MAX_ENTRIES, want.evicted
    topic = f"recent-{unique}"
    ensure_topic(settings.kafka, topic, PARTITIONS)
    purchases.produce(settings.kafka, topic, events)

    # whatever the cut: everything in one batch, batches of 97 records
    for cut in (None, 97):
        spec = _spec(f"recent_{unique}_{cut or 'all'}", topic)
        report = run(spec, settings.replace(max_offsets_per_trigger=cut), available_now=True, spark=spark)
        assert report.error is None, report.error
        assert report.batches >= (len(events) // cut if cut else 1)
        outputs = {
            r.user_id: (r.purchases, r.amount_spent) for r in spark.read.format("delta").load(report.output).collect()
        }
        assert outputs == want.state, f"maxOffsetsPerTrigger={cut}"
        # every eviction is in the changelog as a tombstone: its compacted view is the store
        changelog = answers.latest_per_key(settings.kafka, changelog_topic_name(spec.application_id, RECENT.store))
        assert set(changelog) - {MARKER_KEY.decode()} == set(want.state)

    # across a lost checkpoint: values and recency come back from the changelog, and the evictions after
    # the restore follow the restored order (a few events after it, so that order decides what they evict)
    restored = recent_buyers.expected(events[:700], MAX_ENTRIES, PARTITIONS)
    after = recent_buyers.expected(events[700:720], MAX_ENTRIES, PARTITIONS, start=restored)
    in_another_order = dataclasses.replace(restored, order={p: users[::-1] for p, users in restored.order.items()})
    assert recent_buyers.expected(events[700:720], MAX_ENTRIES, PARTITIONS, start=in_another_order).state != after.state
    assert after.state == recent_buyers.expected(events[:720], MAX_ENTRIES, PARTITIONS).state
    spec = _spec(f"recent_{unique}_lost", f"recent-lost-{unique}")
    with JobHarness(settings=settings, spark=spark) as harness:
        first = harness.run(spec, events[:700])
        assert _outputs(first.outputs) == restored.state
        shutil.rmtree(first.report.checkpoint)
        second = harness.run(spec, events[700:720])
        assert second.report.restores[RECENT.store].keys == 2 * MAX_ENTRIES
        assert _outputs(second.outputs) == after.state
        third = harness.run(spec, events[720:])  # from the second run's checkpoint
    assert _outputs(third.outputs) == want.state

    # Kafka Streams: groupByKey().aggregate() in Stores.lruMap("recent-buyers", 10), its store read on exit
    app, output = f"ksrecent-{unique}", f"ksrecent-{unique}-out"
    ensure_topic(settings.kafka, output, PARTITIONS, config=OUTPUT_TOPIC_CONFIG)
    peer = KafkaStreamsPeer(build(), settings, "recent_buyers", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()
    deadline = time.monotonic() + 10  # the reader thread takes the last lines after the process ended
    while not any(e.get("event") == "store_printed" for e in peer.events) and time.monotonic() < deadline:
        time.sleep(0.1)
    entries = [e for e in peer.events if e.get("event") == "store_entry"]
    assert any(e.get("event") == "store_printed" for e in peer.events), peer.events[-3:]
    kafka_streams = {
        e["key"]: (json.loads(e["value"])["purchases"], Decimal(json.loads(e["value"])["amount_spent"]))
        for e in entries
    }
    assert kafka_streams == want.state
    # Kafka Streams logs none of these evictions (an aggregate's timestamped wrapper hides the LRU from the
    # change-logging layer's eviction listener): its changelog keeps every user put since, which its own
    # restore bounds again by replaying them through the LRU. README, "Known differences".
    ks_changelog = answers.latest_per_key(settings.kafka, f"{app}-{RECENT.store}-changelog")
    assert set(kafka_streams) < set(ks_changelog) and len(ks_changelog) > 500


def test_an_lru_store_and_its_declaration_are_checked():
    with pytest.raises(JobSpecError, match="store 's': max_entries is for, and needed by, an lru store"):
        StoreSpec("s", kind="lru")
    with pytest.raises(JobSpecError, match="store 's': max_entries is for, and needed by, an lru store"):
        StoreSpec("s", max_entries=3)
    with pytest.raises(JobSpecError, match="lru store 's': max_entries must be >= 1, got 0"):
        StoreSpec("s", kind="lru", max_entries=0)
    spec = get_job("recent_buyers")
    with pytest.raises(
        JobSpecError, match="job recent_buyers: lru: store 'recent-buyers' is of kind key_value; lru=True"
    ):
        RECENT.check(dataclasses.replace(spec, stores=(StoreSpec("recent-buyers"),)))
    counts = get_job("purchase_counts")
    with pytest.raises(JobSpecError, match="job purchase_counts: lru: store 'counts' is of kind lru: declare lru=True"):
        COUNTS.check(dataclasses.replace(counts, stores=(StoreSpec("counts", kind="lru", max_entries=5),)))
    RECENT.check(spec)
    assert RECENT.state_ddl.endswith("recency BIGINT, source_partition INT")


def test_an_lru_store_refuses_a_python_processor():
    class Counter:  # a Python processor keeping the declaration's store (it would not evict)
        changes = RECENT.store_changes

    with pytest.raises(JobSpecError, match="job recent_buyers: an lru store runs the primitive's Java processor only"):
        RECENT.build(SimpleNamespace(spec=get_job("recent_buyers")), processor=Counter)
