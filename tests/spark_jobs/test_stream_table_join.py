"""The stream-table join (:class:`spark_jobs.primitives.StreamTableJoin`, ``order_enrichment``): orders joined with
their customer's row valid at the order's time (a versioned table, a minute of grace), held to the plain-Python
reference (:func:`spark_jobs.reference.generators.orders.expected_enrichment`, Kafka Streams' task record by record) over
adversarial input: both topics out of order, customers updated at, before and after an order's time, deleted and
brought back, customers without orders and orders without customers, retried (duplicate) orders, orders arriving
minutes late; the input arriving in chunks, with a lost checkpoint between them (the table's versions, the orders
waiting out their grace and both times restored from the changelog)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil

import pytest

from spark_jobs.io.kafka_topics import ensure_topic, kafka_partition
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import orders
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.testing import JobHarness
from tests.helpers import every_record

pytestmark = pytest.mark.integration

GRACE_MS, RETENTION_MS = 60_000, 24 * 3600 * 1000


def _spec(unique: str, partitions: int = 2, **changes):
    return dataclasses.replace(
        get_job("order_enrichment"),
        name=f"enriched_{unique}",
        source_topic=f"orders-{unique}",
        join_topics=(f"profiles-{unique}",),
        output_table=f"enriched_{unique}",
        source_partitions=partitions,
        **changes,
    )


def _iso(value: dt.datetime) -> str:
    moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return moment.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _enriched(rows) -> dict[tuple[int, int], tuple]:
    by_place = {}
    for r in rows:
        place = (r["source_partition"], r["source_offset"])
        assert place not in by_place, f"order at {place} written twice"
        by_place[place] = (r["customer_id"], r["order_id"], r["amount"], _iso(r["event_time"]), r["name"], r["tier"])
    return by_place


def test_orders_join_their_customer_as_of_their_time_whatever_the_arrival(settings, kafka_broker, spark, unique):
    """The input arrives in three chunks (by arrival time, both topics), a run after each; the checkpoint is lost
    before the last. The outputs are the reference's: every order whose time is a minute behind the stream time
    joined with the row valid at its time (a customer's update that arrived after the order, within the grace,
    counts), the orders of the last minute still waiting. Refused orders are dead letters."""
    spec = _spec(unique, output_topic=f"enriched-{unique}")
    stream, table = orders.adversarial(orders=300, customers=10, seed=5)
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, spec.source_partitions)
    harness = JobHarness(settings=settings, spark=spark)
    results, letters = {}, []
    for n, (_bound, stream_chunk, table_chunk) in enumerate(orders.arrival_chunks(stream, table, chunks=3)):
        orders.produce(settings.kafka, spec.source_topic, stream_chunk, spec.source_partitions)
        orders.produce(settings.kafka, spec.join_topics[0], table_chunk, spec.source_partitions)
        bad = [b'{"customer_id": "c05", "amount": 1.0, "event_time": "2026-11-29T00:00:00Z"}', b"{not json"]
        result = harness.run(spec, [] if n < 2 else bad, keyed=False)
        results.update(_enriched(result.outputs))
        letters += [letter.reason for letter in result.dead_letters]
        if n == 1:
            shutil.rmtree(result.report.checkpoint)

    want = orders.expected_enrichment(stream, table, spec.source_partitions, GRACE_MS, RETENTION_MS)
    assert results == want
    assert result.report.restores["customer-profiles"].keys > 0
    # the output topic: each joined order once, keyed by its customer, in the partition a Java client picks
    published = every_record(settings.kafka, JobLayout.of(spec, settings).output_topic)
    assert all(partition == kafka_partition(key, spec.output_partitions) for partition, key, _ in published)
    events = [json.loads(value) for _partition, _key, value in published]
    assert sorted((e["source_partition"], e["source_offset"]) for e in events) == sorted(want)
    assert all(e["customer_id"] == key for e, (_p, key, _v) in zip(events, published, strict=True))
    # the situations this test is for: orders joined with a row, orders of unknown or deleted customers,
    # orders still waiting out their grace at the end
    assert sum(1 for row in want.values() if row[4] is None) > 10 and len(want) > 0.8 * len(stream) > 0
    assert len(want) < len(stream)
    assert sorted(letters) == ["undecodable", "wrong_key"], letters  # no Kafka key; not JSON


def test_an_inner_join_over_three_partitions_in_one_batch(settings, kafka_broker, spark, unique):
    """Everything in one micro-batch, three partitions: an order joins only when its customer has a row at its
    time; the order of both topics' records in a task is their timestamps' (each topic's in offset order)."""
    spec = _spec(unique, partitions=3, entrypoint="tests.fixtures.join_jobs:INNER_ENRICHMENT")
    stream, table = orders.adversarial(orders=240, customers=12, seed=9)
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, 3)
    orders.produce(settings.kafka, spec.source_topic, stream, 3)
    orders.produce(settings.kafka, spec.join_topics[0], table, 3)
    result = JobHarness(settings=settings, spark=spark).run(spec, [])
    want = orders.expected_enrichment(stream, table, 3, GRACE_MS, RETENTION_MS, join="inner")
    assert _enriched(result.outputs) == want
    assert all(row[4] is not None for row in want.values())
    left = orders.expected_enrichment(stream, table, 3, GRACE_MS, RETENTION_MS, join="left")
    assert len(left) > len(want) > 0


def test_a_stream_table_join_is_declared_and_checked():
    from spark_jobs.reference.jobs.order_enrichment import ORDER_ENRICHMENT

    spec = get_job("order_enrichment")
    ORDER_ENRICHMENT.check(spec)
    assert spec.output_keys == ("source_partition", "source_offset")
    with pytest.raises(JobSpecError, match="join_topics: a StreamTableJoin reads each of its 1 table"):
        ORDER_ENRICHMENT.check(dataclasses.replace(spec, join_topics=()))
    with pytest.raises(JobSpecError, match="join: 'outer' is not one of"):
        dataclasses.replace(ORDER_ENRICHMENT, join="outer").check(spec)
    latest = dataclasses.replace(spec.stores[0], kind="key_value", retention_ms=None)
    with pytest.raises(JobSpecError, match="grace_ms: a grace period needs a versioned store"):
        ORDER_ENRICHMENT.check(dataclasses.replace(spec, stores=(latest,)))
    dataclasses.replace(ORDER_ENRICHMENT, grace_ms=0).check(dataclasses.replace(spec, stores=(latest,)))
    with pytest.raises(JobSpecError, match="grace_ms 90000000 is longer than the store's retention_ms"):
        dataclasses.replace(ORDER_ENRICHMENT, grace_ms=90_000_000).check(spec)
    with pytest.raises(JobSpecError, match="time: 'order_id' must be a TIMESTAMP field"):
        dataclasses.replace(ORDER_ENRICHMENT, time="order_id").check(spec)
    from pyspark.sql import types as T

    from spark_jobs.primitives import UpsertTable
    from spark_jobs.reference.jobs.order_enrichment import CUSTOMER_SCHEMA

    with_amount = T.StructType([*CUSTOMER_SCHEMA.fields, T.StructField("amount", T.DoubleType())])
    clash = dataclasses.replace(ORDER_ENRICHMENT, table=UpsertTable(with_amount, ("customer_id",), "plain"))
    with pytest.raises(JobSpecError, match="'amount' is a reserved name or a field of both the stream and a table"):
        clash.check(spec)
    dataclasses.replace(clash, right_prefix="customer_").check(spec)
    with pytest.raises(JobSpecError, match="key_format 'plain' is for a key of one STRING field"):
        dataclasses.replace(ORDER_ENRICHMENT, table=UpsertTable(with_amount, ("customer_id", "name"), "plain")).check(
            spec
        )


def test_the_readme_shows_the_declaration_of_the_job():
    from pathlib import Path

    import spark_jobs.reference.jobs.order_enrichment as job
    from tests.helpers import docs_page, readme_declaration

    assert readme_declaration("ORDER_ENRICHMENT = StreamTableJoin(") in Path(job.__file__).read_text()
    page, spec = docs_page("writing-jobs/stream-table-join.md"), get_job("order_enrichment")
    assert f'source_topic="{spec.source_topic}", join_topics=("{spec.join_topics[0]}",)' in page
    assert 'kind="versioned", retention_ms=24 * 3600 * 1000' in page and spec.stores[0].retention_ms == RETENTION_MS


def _placed_orders(settings, topic: str, place) -> list[list[tuple[tuple[int, int], orders.Record]]]:
    """A repartition topic's committed orders, per partition in offset order, each with its place in the source
    (``place(message, order)``: (source partition, source offset))."""
    from confluent_kafka import Consumer

    from runtime.kafka_connection import client_config
    from spark_jobs.io.kafka_topics import partition_offsets, read_partition

    config = {"group.id": f"read-{topic}", "enable.partition.eof": True, "isolation.level": "read_committed"}
    consumer = Consumer(client_config(settings.kafka, config))
    out = []
    try:
        for partition in sorted(partition_offsets(settings.kafka, topic)):
            placed = []
            for msg in read_partition(consumer, topic, partition):
                order = json.loads(msg.value())
                assert msg.key().decode() == order["customer_id"], "keyed by the join key"
                time_ms = int(dt.datetime.fromisoformat(order["event_time"]).timestamp() * 1000)
                placed.append((place(msg, order), orders.Record(order["customer_id"], order, time_ms, 0)))
            out.append(placed)
    finally:
        consumer.close()
    return out


def test_orders_not_keyed_by_customer_are_re_keyed_before_the_join(settings, kafka_broker, spark, unique, tmp_path):
    """Orders produced without keys over 3 partitions, the customers' change stream keyed by id over 2: with
    ``repartition=True`` (``repartition_partitions=2``, the table's count) the job re-keys the orders through its
    repartition topic and joins what it reads back, as Kafka Streams' ``selectKey(customer_id).leftJoin(customers)``
    does (its twin, ``order_enrichment_rekeyed``, runs on the same topics). Each side equals the reference applied
    in its own repartition topic's order, and the two equal each other; an output row's coordinates are the
    order's place in the source, not in a repartition topic, also for the orders held over a lost checkpoint.
    Two runs, the checkpoint lost between them; bad orders in the second are dead letters of the re-keying stage."""
    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build
    from spark_jobs.io.repartition import ORIGIN_HEADER_PREFIX
    from spark_jobs.reference.generators.producer import produce_unkeyed
    from tests.helpers import wait_for

    spec = _spec(unique, partitions=3, repartition=True, repartition_partitions=2, output_topic=f"enriched-{unique}")
    stream, table = orders.adversarial(orders=240, customers=10, seed=17)
    ensure_topic(settings.kafka, spec.source_topic, 3)
    ensure_topic(settings.kafka, spec.join_topics[0], 2)
    harness = JobHarness(settings=settings, spark=spark)
    results, letters = {}, []
    for n, (_bound, stream_chunk, table_chunk) in enumerate(orders.arrival_chunks(stream, table, chunks=2)):
        produce_unkeyed(settings.kafka, spec.source_topic, [r.value for r in stream_chunk], 3, seed=n)
        orders.produce(settings.kafka, spec.join_topics[0], table_chunk, 2)
        bad = [b'{"order_id": "o-none", "amount": 1.0, "event_time": "2026-11-29T00:00:00Z"}', b"{not json"]
        result = harness.run(spec, bad if n else [], keyed=False)
        results.update(_enriched(result.outputs))
        letters += [letter.reason for letter in result.dead_letters]
        if n == 0:  # both stages' checkpoints: the re-keying resumes from its progress record, the join restores
            shutil.rmtree(result.report.checkpoint)
    assert sorted(letters) == ["missing_key", "undecodable"], letters
    assert result.report.restores["customer-profiles"].keys > 0

    def source_place(msg, _order):
        headers = dict(msg.headers())
        return tuple(int(headers[ORIGIN_HEADER_PREFIX + name]) for name in ("partition", "offset"))

    repartition_topic = JobLayout.of(spec, settings).repartition_topic
    placed = _placed_orders(settings, repartition_topic, source_place)
    rekeyed_ids = sorted(r.value["order_id"] for part in placed for _, r in part)
    assert rekeyed_ids == sorted(r.value["order_id"] for r in stream), "each order re-keyed once"
    want = orders.expected_rekeyed_enrichment(placed, table, GRACE_MS, RETENTION_MS)
    assert results == want
    assert {partition for partition, _ in results} == {0, 1, 2}  # places in the 3-partition source
    assert sum(1 for row in want.values() if row[4] is None) > 5 and len(want) > 0.8 * len(stream)
    published = every_record(settings.kafka, JobLayout.of(spec, settings).output_topic)
    assert sorted((e["source_partition"], e["source_offset"]) for e in map(json.loads, (v for *_, v in published))) == (
        sorted(want)
    )

    # Kafka Streams on the same topics: its own repartition topic (kept: not purged while the test reads it)
    app, output = f"ksrekeyed-{unique}", f"ksrekeyed-{unique}-out"
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    inputs = f"{spec.source_topic},{spec.join_topics[0]}"
    purge = "-Dstreams.repartition.purge.interval.ms=3600000"
    peer = KafkaStreamsPeer(
        build(), settings, "order_enrichment_rekeyed", app, tmp_path / app, inputs, output, 1, (purge,)
    )
    try:
        peer.wait_caught_up(timeout_s=300)
        ks_topic = next(t for t in _topics(settings) if t.startswith(app) and t.endswith("-repartition"))
        wait_for(lambda: sum(map(len, _placed_orders(settings, ks_topic, _ks_place))) == len(stream), 120, "re-keyed")
        ks_want = orders.expected_rekeyed_enrichment(
            _placed_orders(settings, ks_topic, _ks_place), table, GRACE_MS, RETENTION_MS
        )
        wait_for(lambda: len(every_record(settings.kafka, output)) >= len(ks_want), 120, "Kafka Streams' joins")
    finally:
        peer.stop()
    emitted = [json.loads(value) for _p, _key, value in every_record(settings.kafka, output)]
    ks = {(e["source_partition"], e["source_offset"]): _ks_row(e) for e in emitted}
    assert len(ks) == len(emitted), "an order joined more than once"
    assert ks == ks_want
    assert ks == results


def _ks_place(_msg, order) -> tuple[int, int]:
    """The twin's orders carry their place in the source as fields (``WithSource``, before ``selectKey``)."""
    return order["partition"], order["offset"]


def _ks_row(event: dict) -> tuple:
    from decimal import Decimal

    amount = Decimal(str(event["amount"]))
    return (event["customer_id"], event["order_id"], amount, event["event_time"], event["name"], event["tier"])


def _topics(settings) -> list[str]:
    from confluent_kafka.admin import AdminClient

    from runtime.kafka_connection import client_config

    return list(AdminClient(client_config(settings.kafka)).list_topics(timeout=30).topics)


def test_a_re_keyed_join_starts_each_stage_where_a_reprocessing_said(settings, tmp_path):
    """A reprocessing's start (one position per input) splits over the two stages: the source's is the re-keying
    stage's start, the table's the stateful stage's, whose repartition topic is read from its beginning."""
    from spark_jobs.driver.context import JobContext
    from spark_jobs.operations.reprocess.plan import write_start_offsets

    stack = settings.replace(data_dir=tmp_path)
    spec = _spec("start", partitions=3, repartition=True, repartition_partitions=2)
    context = JobContext(None, spec, stack)
    layout = context.layout
    assert (
        context.sources.starting_offsets == "earliest"
        and context.sources.repartitioner.starting_offsets(None) == "earliest"
    )
    write_start_offsets(layout, {spec.source_topic: {0: 5, 1: 6, 2: 7}, spec.join_topics[0]: {0: 0, 1: 0}})
    assert json.loads(context.sources.repartitioner.starting_offsets(None)) == {
        spec.source_topic: {"0": 5, "1": 6, "2": 7}
    }
    assert json.loads(context.sources.starting_offsets) == {
        layout.repartition_topic: {"0": -2, "1": -2},
        spec.join_topics[0]: {"0": 0, "1": 0},
    }


def test_a_re_keyed_stream_is_refused_unless_its_repartition_topic_has_the_tables_partitions(
    settings, kafka_broker, spark, unique
):
    """Kafka Streams sizes a join's repartition topic by the table's partitions; here the declaration does
    (``repartition_partitions``), checked at start before either stage runs."""
    from spark_jobs.driver.run import run

    spec = _spec(unique, partitions=3, repartition=True, repartition_partitions=2)
    ensure_topic(settings.kafka, spec.source_topic, 3)
    ensure_topic(settings.kafka, spec.join_topics[0], 3)
    with pytest.raises(JobSpecError, match="co-partitioned, 2 partitions each \\(repartition_partitions\\)") as refused:
        run(spec, settings, available_now=True, spark=spark)
    layout = JobLayout.of(spec, settings)
    for words in (f"{layout.repartition_topic} has 2 partitions", f"{spec.join_topics[0]} has 3 partitions"):
        assert words in str(refused.value)


def _credit_enriched(rows) -> dict[tuple[int, int], tuple]:
    from spark_jobs.reference.generators.credit import FIELDS

    by_place = {}
    for r in rows:
        place = (r["source_partition"], r["source_offset"])
        assert place not in by_place, f"order at {place} written twice"
        by_place[place] = tuple(_iso(r[f]) if f == "event_time" else r[f] for f in FIELDS)
    return by_place


def test_orders_join_their_customer_and_credit_line_as_of_their_time(settings, kafka_broker, spark, unique):
    """A stream joined with two tables keyed as it is (``order_credit_enrichment``: ``more_tables``, three
    co-partitioned topics in one task). The input arrives in three chunks (by arrival time, all three topics), a
    run after each, the checkpoint lost before the last. The outputs are the reference's for those runs: each
    order joined at once with the customer's row and the credit line valid at its time (as far as its run had
    read them), each table's versions and time restored from the changelog; records of two or three topics at one time taken as the reference takes them (the input
    taken least recently first: a different rule changes rows of this input)."""
    from spark_jobs.reference.generators import credit

    spec = dataclasses.replace(
        get_job("order_credit_enrichment"),
        name=f"credit_{unique}",
        source_topic=f"orders-{unique}",
        join_topics=(f"profiles-{unique}", f"credit-{unique}"),
        output_table=f"credit_{unique}",
    )
    stream, profiles, lines = credit.adversarial_inputs(orders=300, seed=5)
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, spec.source_partitions)
    harness = JobHarness(settings=settings, spark=spark)
    results, runs = {}, [tuple(chunk) for _bound, *chunk in orders.arrival_chunks(stream, profiles, lines, chunks=3)]
    for n, chunk in enumerate(runs):
        for topic, records in zip(spec.input_topics, chunk, strict=True):
            orders.produce(settings.kafka, topic, records, spec.source_partitions)
        result = harness.run(spec, [])
        results.update(_credit_enriched(result.outputs))
        if n == 1:
            shutil.rmtree(result.report.checkpoint)

    # each run took what was written before it: an order written before a change at its time did not see it
    want = credit.expected_credit_enrichment(runs, spec.source_partitions, RETENTION_MS)
    assert results == want
    assert result.report.restores["customer-credit"].keys > 0
    # the situations this test is for: orders with both rows, with one, with none
    assert len(want) == len(stream)
    with_profile = {place for place, row in want.items() if row[4] is not None}
    with_line = {place for place, row in want.items() if row[6] is not None}
    assert len(with_profile & with_line) > 100 and with_profile - with_line and with_line - with_profile
    assert len(want) - len(with_profile | with_line) > 5
    inner = credit.expected_credit_enrichment(runs, spec.source_partitions, RETENTION_MS, "inner")
    assert len(inner) == len(with_profile & with_line)


def test_a_join_of_several_tables_is_checked():
    """A declaration with ``more_tables`` names one join topic per table, a prefix per table when their fields
    meet, and no grace period; a spec's ``join_topics`` is a tuple of distinct topics."""
    from spark_jobs.primitives import JoinedTable
    from spark_jobs.reference.jobs.order_credit_enrichment import ORDER_CREDIT_ENRICHMENT as join

    spec = get_job("order_credit_enrichment")
    join.check(spec)
    assert spec.input_kinds() == {"orders": "stream", "customer-profiles": "table", "credit-lines": "table"}
    assert [f.name for f in join.output_schema(spec.key_field).fields][4:] == [
        "name",
        "tier",
        "credit_limit",
        "standing",
        "source_partition",
        "source_offset",
    ]
    with pytest.raises(
        JobSpecError, match=r"reads each of its 2 table\(s\) from the spec's join_topics, in order; it has 1"
    ):
        join.check(dataclasses.replace(spec, join_topics=("customer-profiles",)))
    with pytest.raises(JobSpecError, match="grace_ms: a grace period is for a join of one table"):
        dataclasses.replace(join, grace_ms=1_000).check(spec)
    twice = dataclasses.replace(join, more_tables=(JoinedTable(join.table),))
    with pytest.raises(JobSpecError, match="'name' is a reserved name or a field of both the stream and a table, or"):
        twice.check(spec)
    dataclasses.replace(join, more_tables=(JoinedTable(join.table, prefix="again_"),)).check(spec)
    with pytest.raises(JobSpecError, match=r"more_tables\[0\].prefix: 'X-': use lower-case letters"):
        dataclasses.replace(join, more_tables=(JoinedTable(join.table, prefix="X-"),)).check(spec)
    with pytest.raises(JobSpecError, match=r"join_topics is a tuple of topics: \('credit-lines',\)"):
        dataclasses.replace(spec, join_topics="credit-lines")
    with pytest.raises(JobSpecError, match="must differ from each other and from source_topic"):
        dataclasses.replace(spec, join_topics=("credit-lines", "credit-lines"))
