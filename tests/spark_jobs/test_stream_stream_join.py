"""The windowed stream-stream join (:class:`spark_jobs.primitives.StreamStreamJoin`, ``order_payments``): orders and
payments at most 10 minutes apart, held to the plain-Python reference of Kafka Streams 4.3.1's rules
(:mod:`spark_jobs.generators.payments`, which the Kafka Streams twin in tests/bench/test_kafka_streams_peer.py
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

from spark_jobs.generators import payments
from spark_jobs.kafka_topics import ensure_topic, kafka_partition
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.testing import JobHarness
from tests.helpers import every_record, order_payment_cuts

pytestmark = pytest.mark.integration

WINDOW_MS, GRACE_MS = 10 * 60_000, 60_000
ENTRYPOINTS = {
    "outer": "spark_jobs.jobs.order_payments:ORDER_PAYMENTS",
    "left": "tests.fixtures.join_jobs:LEFT_PAYMENTS",
    "inner": "tests.fixtures.join_jobs:INNER_PAYMENTS",
}


def _spec(unique: str, join: str, partitions: int = 2):
    return dataclasses.replace(
        get_job("order_payments"),
        name=f"paid_{join}_{unique}",
        source_topic=f"orders-{join}-{unique}",
        join_topic=f"payments-{join}-{unique}",
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


def results_by_place(rows) -> dict[tuple, tuple]:
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
    payments.produce(settings.kafka, spec.join_topic, paid, spec.source_partitions)


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
    chunks, results, letters = payments.arrival_chunks(orders, paid, 3), {}, []
    for n, (_bound, order_chunk, payment_chunk) in enumerate(chunks):
        payments.produce(settings.kafka, spec.source_topic, order_chunk, spec.source_partitions)
        payments.produce(settings.kafka, spec.join_topic, payment_chunk, spec.source_partitions)
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


@pytest.mark.parametrize(("join", "partitions", "limit"), [("left", 3, 25), ("inner", 2, None)])
def test_left_and_inner_joins_equal_kafka_streams(settings, kafka_broker, spark, unique, join, partitions, limit):
    """The left join read in micro-batches of at most 25 records (``STREAMSTATE_MAX_OFFSETS_PER_TRIGGER``: Spark
    shares them among the six partitions by what each has left), the inner one in one batch; each equals Kafka
    Streams' answer for the same records taken in those batches."""
    spec = _spec(unique, join, partitions)
    orders, paid = payments.adversarial(seed=11, partitions=partitions)
    _produce(settings, spec, orders, paid)
    harness = JobHarness(settings=settings.replace(max_offsets_per_trigger=limit), spark=spark)
    result = harness.run(spec, [])
    cuts = order_payment_cuts(settings.kafka, spec, limit) if limit else []
    assert result.report.batches >= len(cuts)
    want = payments.expected_join_in_cuts(orders, paid, partitions, cuts, WINDOW_MS, GRACE_MS, join)
    assert results_by_place(result.outputs) == want
    unmatched_orders = [place for place in want if place[3] is None]
    assert bool(unmatched_orders) == (join == "left") and all(place[1] is not None for place in want)


def test_a_stream_stream_join_is_declared_and_checked():
    from spark_jobs.jobs.order_payments import ORDER_PAYMENTS

    spec = get_job("order_payments")
    ORDER_PAYMENTS.check(spec)
    assert spec.output_keys == ("source_partition", "left_offset", "right_offset")
    with pytest.raises(JobSpecError, match="join_topic: a StreamStreamJoin reads its right stream"):
        ORDER_PAYMENTS.check(dataclasses.replace(spec, join_topic=None))
    with pytest.raises(JobSpecError, match="'event_time' is a reserved name or a field of both streams"):
        dataclasses.replace(ORDER_PAYMENTS, fields={}).check(spec)
    with pytest.raises(JobSpecError, match="fields.when: 'middle.event_time' is not"):
        dataclasses.replace(ORDER_PAYMENTS, fields={"when": "middle.event_time"}).check(spec)
    with pytest.raises(JobSpecError, match="right_time: 'paid' must be a TIMESTAMP field"):
        dataclasses.replace(ORDER_PAYMENTS, right_time="paid").check(spec)
    with pytest.raises(JobSpecError, match="window_ms must be > 0"):
        dataclasses.replace(ORDER_PAYMENTS, window_ms=0).check(spec)
    with pytest.raises(JobSpecError, match="repartition: re-keying a stream-stream join's input is not supported"):
        ORDER_PAYMENTS.check(dataclasses.replace(spec, repartition=True))


def test_the_readme_shows_the_declaration_of_the_job():
    from pathlib import Path

    import spark_jobs.jobs.order_payments as job
    from tests.helpers import readme_declaration

    assert readme_declaration("ORDER_PAYMENTS = StreamStreamJoin(") in Path(job.__file__).read_text()
