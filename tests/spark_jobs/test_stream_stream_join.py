"""The windowed stream-stream join (:class:`spark_jobs.primitives.StreamStreamJoin`, ``order_payments``): orders and
payments at most 10 minutes apart, held to the plain-Python reference of Kafka Streams 4.3.1's rules
(:mod:`spark_jobs.reference.generators.payments`, which the Kafka Streams twin in tests/bench/test_kafka_streams_peer.py
equals record for record) for inner, left and outer joins, over adversarial input: payments at the window's
bounds (inside, at, outside by 1 ms), unpaid orders, payments of no order, orders paid twice, duplicates, both
topics out of order, records arriving after their window closed, and the scene where Kafka Streams holds closed
unmatched records back; the input arriving in chunks with a lost checkpoint between them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil

import pytest

from spark_jobs.io.kafka_topics import ensure_topic, kafka_partition
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import payments
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.testing import JobHarness
from tests.helpers import every_record, order_payment_cuts

pytestmark = pytest.mark.integration

WINDOW_MS, GRACE_MS = 10 * 60_000, 60_000
ENTRYPOINTS = {
    "outer": "spark_jobs.reference.jobs.order_payments:ORDER_PAYMENTS",
    "left": "tests.fixtures.join_jobs:LEFT_PAYMENTS",
    "inner": "tests.fixtures.join_jobs:INNER_PAYMENTS",
}


def _spec(unique: str, join: str, partitions: int = 2):
    return dataclasses.replace(
        get_job("order_payments"),
        name=f"paid_{join}_{unique}",
        source_topic=f"orders-{join}-{unique}",
        join_topics=(f"payments-{join}-{unique}",),
        output_table=f"paid_{join}_{unique}",
        source_partitions=partitions,
        entrypoint=ENTRYPOINTS[join],
    )


def _iso(value: dt.datetime | None) -> str | None:
    if value is None:
        return None
    moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def place(r) -> tuple:
    """An output row's place as the reference keys it: (order partition, offset, payment partition, offset)."""
    p, left, right = r["source_partition"], r["left_offset"], r["right_offset"]
    return (
        p if left >= 0 else None,
        left if left >= 0 else None,
        p if right >= 0 else None,
        right if right >= 0 else None,
    )


def rekeyed_place(r) -> tuple:
    """A re-keyed job's output row's place: its order's in the source (partition, offset) and its payment's offset
    (the payment's partition is the order's task's, not named), or an unmatched payment's partition and offset."""
    p, left, right = r["source_partition"], r["left_offset"], r["right_offset"]
    if left < 0:
        return (None, None, p, right)
    return (p, left, None, right if right >= 0 else None)


def results_by_place(rows, place=place) -> dict[tuple, tuple]:
    """The outputs as the reference keys them: (order partition, offset, payment partition, offset)."""
    by_place = {}
    for r in rows:
        where = place(r)
        assert where not in by_place, f"result {where} written twice"
        by_place[where] = (
            r["order_id"],
            r["customer_id"],
            r["amount"],
            _iso(r["order_time"]),
            r["payment_id"],
            r["paid"],
            _iso(r["payment_time"]),
        )
    return by_place


def _produce(settings, spec, orders, paid) -> None:
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, spec.source_partitions)
    payments.produce(settings.kafka, spec.source_topic, orders, spec.source_partitions)
    payments.produce(settings.kafka, spec.join_topics[0], paid, spec.source_partitions)


def test_the_outer_join_arriving_in_chunks_across_a_lost_checkpoint_equals_kafka_streams(
    settings, kafka_broker, spark, unique
):
    """Three chunks by arrival time (both topics), a run after each, the checkpoint lost before the last: every
    match, and every unmatched order and payment once its window closed, as Kafka Streams emits them; the
    records still waiting at the end are not emitted (neither does Kafka Streams). Refused records are dead
    letters."""
    spec = dataclasses.replace(_spec(unique, "outer"), output_topic=f"paid-{unique}")
    orders, paid = payments.adversarial(seed=7)
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, spec.source_partitions)
    harness = JobHarness(settings=settings, spark=spark)
    chunks, results, letters = payments.arrival_chunks(orders, paid, chunks=3), {}, []
    for n, (_bound, order_chunk, payment_chunk) in enumerate(chunks):
        payments.produce(settings.kafka, spec.source_topic, order_chunk, spec.source_partitions)
        payments.produce(settings.kafka, spec.join_topics[0], payment_chunk, spec.source_partitions)
        bad = [b'{"order_id": "o9999", "amount": 1.0, "event_time": "2026-11-29T00:00:00Z"}', b"{not json"]
        result = harness.run(spec, [] if n < 2 else bad, keyed=False)
        results.update(results_by_place(result.outputs))
        letters += [letter.reason for letter in result.dead_letters]
        if n == 1:
            shutil.rmtree(result.report.checkpoint)

    bounds = [bound for bound, *_ in chunks]
    want = payments.expected_join_in_batches(orders, paid, 2, bounds, WINDOW_MS, GRACE_MS, "outer")
    assert results == want
    assert result.report.restores["order-payments"].keys > 0
    # the output topic: each result once, keyed by its order id, in the partition a Java client picks
    published = every_record(settings.kafka, JobLayout.of(spec, settings).output_topic)
    assert all(partition == kafka_partition(key, spec.output_partitions) for partition, key, _ in published)
    events = [json.loads(value) for _partition, _key, value in published]
    assert sorted(map(place, events), key=repr) == sorted(want, key=repr)
    assert all(e["order_id"] == key for e, (_p, key, _v) in zip(events, published, strict=True))
    kinds = {(place[1] is not None, place[3] is not None) for place in want}
    assert kinds == {(True, True), (True, False), (False, True)}  # matches, unmatched orders, unmatched payments
    assert sorted(letters) == ["undecodable", "wrong_key"], letters  # no Kafka key; not JSON

    # A key's records leave the window store once no lookup can find them, those no batch put to again (read by the
    # other side's lookups or not) in a sweep as stream time passes each half retention, the last run's from the
    # changelog's restore: over an input spanning about five retentions, every entry left is within 1.5 retentions
    # of stream time.
    live = read_changelog(settings.kafka, JobLayout.of(spec, settings).changelog_topic("order-payments")).state
    values = {key.decode(): json.loads(value) for key, value in live.items()}
    stream_time = {
        int(k.split("@")[1]): v["stream_time_ms"] for k, v in values.items() if k.startswith("~stream-time@")
    }
    behind = {  # ~window@<partition>@<side>@<key> -> how far its newest record is behind its partition's stream time
        k: stream_time[int(k.split("@")[1])] - max(r["time_ms"] for r in v["records"])
        for k, v in values.items()
        if k.startswith("~window@")
    }
    assert behind and max(behind.values()) <= 1.5 * (2 * WINDOW_MS + GRACE_MS), sorted(behind.values())[-5:]


@pytest.mark.parametrize(("join", "partitions", "limit"), [("left", 3, 25), ("inner", 2, None)])
def test_left_and_inner_joins_equal_kafka_streams(settings, kafka_broker, spark, unique, join, partitions, limit):
    """The left join read in micro-batches of at most 25 records (``STREAMSTATE_MAX_OFFSETS_PER_TRIGGER``: Spark
    shares them among the six partitions by what each has left, so a batch holds one topic minutes ahead of the
    other), the inner one in one batch; each equals Kafka Streams' answer, the same whatever the cut: a task's
    records of the topic ahead wait for the other's (spark_jobs/state/input_lag.py)."""
    spec = _spec(unique, join, partitions)
    orders, paid = payments.adversarial(seed=11, partitions=partitions)
    _produce(settings, spec, orders, paid)
    harness = JobHarness(settings=settings.replace(max_offsets_per_trigger=limit), spark=spark)
    result = harness.run(spec, [])
    if limit:
        assert result.report.batches >= len(order_payment_cuts(settings.kafka, spec, limit))
    want = payments.expected_join(orders, paid, partitions, WINDOW_MS, GRACE_MS, join)
    assert results_by_place(result.outputs) == want
    unmatched_orders = [place for place in want if place[3] is None]
    assert bool(unmatched_orders) == (join == "left") and all(place[1] is not None for place in want)


def test_a_stream_stream_join_is_declared_and_checked():
    from spark_jobs.reference.jobs.order_payments import ORDER_PAYMENTS

    spec = get_job("order_payments")
    ORDER_PAYMENTS.check(spec)
    assert spec.output_keys == ("source_partition", "left_offset", "right_offset")
    with pytest.raises(JobSpecError, match="join_topics: a StreamStreamJoin reads its right stream"):
        ORDER_PAYMENTS.check(dataclasses.replace(spec, join_topics=()))
    with pytest.raises(JobSpecError, match="'event_time' is a reserved name or a field of both streams"):
        dataclasses.replace(ORDER_PAYMENTS, fields={}).check(spec)
    with pytest.raises(JobSpecError, match="fields.when: 'middle.event_time' is not"):
        dataclasses.replace(ORDER_PAYMENTS, fields={"when": "middle.event_time"}).check(spec)
    with pytest.raises(JobSpecError, match="right_time: 'paid' must be a TIMESTAMP field"):
        dataclasses.replace(ORDER_PAYMENTS, right_time="paid").check(spec)
    with pytest.raises(JobSpecError, match="window_ms must be > 0"):
        dataclasses.replace(ORDER_PAYMENTS, window_ms=0).check(spec)
    ORDER_PAYMENTS.check(dataclasses.replace(spec, repartition=True))  # its orders re-keyed: see the test below


def test_the_readme_shows_the_declaration_of_the_job():
    from pathlib import Path

    import spark_jobs.reference.jobs.order_payments as job
    from tests.helpers import readme_declaration

    assert readme_declaration("ORDER_PAYMENTS = StreamStreamJoin(") in Path(job.__file__).read_text()


def _repartitioned(kafka, topic: str, place) -> list[list[tuple[int, tuple[int, int], payments.Record]]]:
    """A repartition topic's committed orders, per partition in offset order: (offset, its place in the source by
    ``place(message, order)``, the order)."""
    from confluent_kafka import Consumer

    from runtime.kafka_connection import client_config
    from spark_jobs.io.kafka_topics import partition_offsets, read_partition

    config = {"group.id": f"read-{topic}", "enable.partition.eof": True, "isolation.level": "read_committed"}
    consumer = Consumer(client_config(kafka, config))
    out = []
    try:
        for partition in sorted(partition_offsets(kafka, topic)):
            placed = []
            for msg in read_partition(consumer, topic, partition):
                order = json.loads(msg.value())
                assert msg.key().decode() == order["order_id"], "keyed by the join key"
                time_ms = int(dt.datetime.fromisoformat(order["event_time"]).timestamp() * 1000)
                placed.append((msg.offset(), place(msg, order), payments.Record(order["order_id"], order, time_ms, 0)))
            out.append(placed)
    finally:
        consumer.close()
    return out


def _origin(msg, _order) -> tuple[int, int]:
    from spark_jobs.io.repartition import ORIGIN_HEADER_PREFIX

    headers = dict(msg.headers())
    return tuple(int(headers[ORIGIN_HEADER_PREFIX + name]) for name in ("partition", "offset"))


def _ks_origin(_msg, order) -> tuple[int, int]:
    """The twin's orders carry their place in the source as fields (``WithSource``, before ``selectKey``)."""
    return order["order_partition"], order["order_offset"]


def _ends(kafka, topic: str) -> dict[int, int]:
    from spark_jobs.io.kafka_topics import partition_offsets

    return {p: high for p, (_low, high) in partition_offsets(kafka, topic).items()}


def _rekeyed_want(want: dict[tuple, tuple]) -> dict[tuple, tuple]:
    """The reference's results keyed as :func:`rekeyed_place` keys the outputs."""
    return {(k[0], k[1], None, k[3]) if k[0] is not None else k: row for k, row in want.items()}


def _stateful_cuts(spec, settings) -> list[dict[tuple[str, int], int]]:
    """Where each committed batch of a re-keyed ``order_payments`` copy's stateful stage ended: (side, partition) ->
    offset in its repartition topic (orders) or its payments topic."""
    from spark_jobs.state.checkpoint_offsets import batch_end_offsets, latest_committed_batch_id

    layout = JobLayout.of(spec, settings)
    last = latest_committed_batch_id(layout.checkpoint)
    sides = {layout.repartition_topic: payments.ORDER, spec.join_topics[0]: payments.PAYMENT}
    return [
        {
            (sides[topic], p): end
            for topic, ends in batch_end_offsets(layout.checkpoint, b).items()
            for p, end in ends.items()
        }
        for b in range(0 if last is None else last + 1)
    ]


def test_orders_not_keyed_by_order_id_are_re_keyed_before_the_join(settings, kafka_broker, spark, unique, tmp_path):
    """Orders produced without keys over 3 partitions, payments keyed by order id over 2: with ``repartition=True``
    (``repartition_partitions=2``) the job re-keys the orders through its repartition topic and joins what it reads
    back, as Kafka Streams' ``selectKey(order_id).outerJoin(payments)`` does (its twin, ``order_payments_outer_
    rekeyed``, on the same topics). The platform reads the orders and half of the payments, then loses its
    checkpoint, then reads the rest (the orders waiting for their window restored from the changelog). Each side
    equals the reference applied in its own repartition topic's order (how a producer interleaves the source's
    partitions there is not fixed, in Kafka Streams either) and its own batches (the twin waits for its re-keyed
    orders, ``max.task.idle.ms``, so it takes the topics as one batch); a result names its order's place in the
    source, not in a repartition topic."""
    from confluent_kafka import Consumer, TopicPartition

    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build
    from runtime.kafka_connection import client_config
    from spark_jobs.io.kafka_topics import read_partition
    from tests.helpers import wait_for

    spec = dataclasses.replace(
        _spec(unique, "outer", partitions=3), repartition=True, repartition_partitions=2, output_topic=f"paid-{unique}"
    )
    orders, paid = payments.adversarial(seed=19)
    early, late = paid[: len(paid) // 2], paid[len(paid) // 2 :]  # in arrival order
    ensure_topic(settings.kafka, spec.source_topic, 3)
    ensure_topic(settings.kafka, spec.join_topics[0], 2)
    payments.produce(settings.kafka, spec.join_topics[0], early, 2)
    harness = JobHarness(settings=settings, spark=spark)
    first = harness.run(spec, [r.value for r in orders], keyed=False)
    layout = JobLayout.of(spec, settings)
    placed = _repartitioned(settings.kafka, layout.repartition_topic, _origin)  # before a batch purges it
    cuts = _stateful_cuts(spec, settings)
    shutil.rmtree(first.report.checkpoint)
    payments.produce(settings.kafka, spec.join_topics[0], late, 2)
    second = harness.run(spec, [], keyed=False)
    cuts += _stateful_cuts(spec, settings)

    assert second.report.restores["order-payments"].keys > 0
    assert sorted(r.value["order_id"] for part in placed for _, _, r in part) == sorted(
        r.value["order_id"] for r in orders
    ), "each order re-keyed once"
    want = payments.expected_rekeyed_join_in_cuts(placed, paid, cuts, WINDOW_MS, GRACE_MS, "outer")
    assert results_by_place(second.outputs, rekeyed_place) == _rekeyed_want(want)
    assert {p for p, *_ in want if p is not None} == {0, 1, 2}  # places in the 3-partition source
    kinds = {(k[1] is not None, k[3] is not None) for k in want}
    assert kinds == {(True, True), (True, False), (False, True)}  # matches, unmatched orders, unmatched payments
    published = every_record(settings.kafka, layout.output_topic)
    assert sorted((rekeyed_place(json.loads(v)) for *_, v in published), key=repr) == sorted(
        _rekeyed_want(want), key=repr
    )

    # Kafka Streams on the same topics, every record written
    app = f"ksrekeyedpaid-{unique}"
    output = f"{app}-out"
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    peer = KafkaStreamsPeer(
        build(),
        settings,
        "order_payments_outer_rekeyed",
        app,
        tmp_path / app,
        f"{spec.source_topic},{spec.join_topics[0]}",
        output,
        1,
        (
            "-Dstreams.__emit.interval.ms.kstreams.outer.join.spurious.results.fix__=0",
            "-Dstreams.repartition.purge.interval.ms=3600000",  # kept: the test reads it
            "-Dstreams.max.task.idle.ms=20000",  # a task waits for its re-keyed orders: one batch, as all were written
        ),
    )
    try:
        peer.wait_caught_up(timeout_s=300)  # its input topics; then its repartition topic, read after the payments
        ks_topic = next(t for t in _topics(settings) if t.startswith(app) and t.endswith("-repartition"))
        ks_placed = _repartitioned(settings.kafka, ks_topic, _ks_origin)
        last = {p: entries[-1][0] for p, entries in enumerate(ks_placed) if entries}
        watcher = Consumer(client_config(settings.kafka, {"group.id": app, "enable.auto.commit": False}))
        try:
            wait_for(
                lambda: all(
                    tp.offset > last[tp.partition]
                    for tp in watcher.committed([TopicPartition(ks_topic, p) for p in last], timeout=10)
                ),
                120,
                "the twin to take every re-keyed order",
            )
        finally:
            watcher.close()
    finally:
        peer.stop()
    consumer = Consumer(client_config(settings.kafka, {"group.id": f"read-{output}", "enable.partition.eof": True}))
    try:
        emitted = [json.loads(msg.value()) for p in (0, 1) for msg in read_partition(consumer, output, p)]
    finally:
        consumer.close()
    got = {tuple(row[f] for f in payments.SOURCE): row["order_id"] for row in emitted}
    assert len(got) == len(emitted), "a result emitted more than once"
    assert sum(map(len, ks_placed)) == len(orders)
    ks_want = payments.expected_rekeyed_join_in_cuts(ks_placed, paid, [], WINDOW_MS, GRACE_MS, "outer")
    assert got == {k: row[0] for k, row in ks_want.items()}


def _topics(settings) -> list[str]:
    from confluent_kafka.admin import AdminClient

    from runtime.kafka_connection import client_config

    return list(AdminClient(client_config(settings.kafka)).list_topics(timeout=30).topics)
