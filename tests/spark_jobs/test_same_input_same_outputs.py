"""Same input, same outputs: purchase_counts' outputs and dead letters do not depend on how the input is
cut into micro-batches, equal the plain-Python reference, and equal what the Kafka Streams app of
``bench/kafka_streams`` computes from the same valid events.

The input is adversarial (spark_jobs.reference.generators.purchases.adversarial): users created and closed inside
one batch, closes of users that never bought, duplicates, out-of-order times, amounts at and past what
the declared type holds exactly. More seeds than CI runs::

    SAME_OUTPUT_SEEDS=1,2,3,4,5 .venv/bin/python -m pytest tests/spark_jobs/test_same_input_same_outputs.py
"""

from __future__ import annotations

import dataclasses
import os
from decimal import Decimal

import pytest

from spark_jobs.driver.run import run
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from tests.helpers import delta_purchase_counts, wait_for
from tests.spark_jobs.test_dead_letter import read_with_headers

pytestmark = pytest.mark.integration

SEEDS = [int(s) for s in os.environ.get("SAME_OUTPUT_SEEDS", "11").split(",")]
#: maxOffsetsPerTrigger of each run: everything in one batch, a few batches, many small ones (``all``: no
#: limit). ``SAME_OUTPUT_CUTS=all,60,13,7`` adds small and tiny batches (19 and 35 of them: 3 more minutes).
CUTS = tuple(None if c == "all" else int(c) for c in os.environ.get("SAME_OUTPUT_CUTS", "all,60,24").split(","))


@pytest.mark.parametrize("seed", SEEDS)
def test_outputs_and_dead_letters_do_not_depend_on_batching(spark, kafka_broker, settings, unique, seed):
    events = list(purchases.adversarial(240, users=12, seed=seed))
    topic = f"adversarial-{unique}"
    ensure_topic(settings.kafka, topic, 2)
    purchases.produce(settings.kafka, topic, events)
    spec = get_job("purchase_counts")

    outputs, letters = {}, {}
    for cut in CUTS:
        name = f"same_{unique}_{cut or 'all'}"
        job = dataclasses.replace(spec, name=name, source_topic=topic, output_table=name)
        report = run(job, settings.replace(max_offsets_per_trigger=cut), available_now=True, spark=spark)
        assert report.error is None and report.input_rows == len(events)
        if cut:
            assert report.batches >= len(events) // cut, report.batches
        outputs[cut] = delta_purchase_counts(spark, report.output)
        letters[cut] = sorted(
            (int(d["headers"]["source.partition"]), int(d["headers"]["source.offset"]), d["headers"]["reason"])
            for d in read_with_headers(settings.kafka_bootstrap_servers, dead_letter_topic(job.application_id))
        )

    valid = [e for e in events if purchases.is_valid(e)]
    assert outputs[None] == purchases.expected_counts(valid)
    assert len(letters[None]) == len(events) - len(valid)
    for cut in CUTS[1:]:
        assert outputs[cut] == outputs[None], f"maxOffsetsPerTrigger={cut} changed the outputs"
        assert letters[cut] == letters[None], f"maxOffsetsPerTrigger={cut} changed the dead letters"
    # The input really holds the situations this test is for.
    closed_unknown = {e["user_id"] for e in events if e["type"] == "account_closed"} - {
        e["user_id"] for e in valid if e["type"] == "purchase"
    }
    assert any(e["type"] == "account_closed" for e in valid) and len(valid) < len(events)
    assert outputs[None] and sum(n for n, _ in outputs[None].values()) < len(valid), closed_unknown


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "app",
    [
        "purchase_counts",  # Stores.persistentKeyValueStore (RocksDB)
        "purchase_counts_in_memory",  # Stores.inMemoryKeyValueStore, the twin of test_in_memory_store.py's job
    ],
)
def test_kafka_streams_computes_the_same_counts_from_the_same_valid_events(
    kafka_broker, settings, tmp_path, unique, seed, app
):
    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build
    from tests.bench.test_kafka_streams_peer import _compacted_view

    # Kafka Streams stamps its records with event time: keep the input in the past (see the peer's test).
    start = purchases.start_ending_by(240 * 10)
    valid = [e for e in purchases.adversarial(240, users=12, seed=seed, start=start) if purchases.is_valid(e)]
    topic = f"adversarial-ks-{unique}"
    ensure_topic(settings.kafka, topic, 2)
    purchases.produce(settings.kafka, topic, valid)
    application, output = f"ks-{unique}", f"ks-{unique}-out"
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    peer = KafkaStreamsPeer(build(), settings, app, application, tmp_path / application, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()
    counts = {
        user: (state["purchases"], Decimal(state["amount_spent"]))
        for user, state in _compacted_view(settings, f"{application}-counts-changelog").items()
    }
    assert counts == purchases.expected_counts(valid)


def test_vote_counts_do_not_depend_on_batching(spark, kafka_broker, settings, unique):
    """The latest vote by event time, and the counts, whatever the cut: votes arrive out of order, some
    twice (a retried producer), ties in event time are broken by event id."""
    from spark_jobs.reference.generators import votes

    events = list(votes.generate(voters=15, seed=3, max_votes=6, shuffle_window=20))
    events += events[::9]  # duplicates, arriving late
    tie = {**events[0], "event_id": events[0]["event_id"] + "-tie", "candidate": "tie-breaker"}
    events.insert(len(events) // 2, tie)  # same voter, same event time: the larger event id wins
    topic = f"adversarial-votes-{unique}"
    ensure_topic(settings.kafka, topic, 2)
    votes.produce(settings.kafka, topic, events)
    spec = get_job("vote_counts")

    results = {}
    for cut in (None, 9):
        name = f"votes_{unique}_{cut or 'all'}"
        job = dataclasses.replace(spec, name=name, source_topic=topic, output_table=name)
        report = run(job, settings.replace(max_offsets_per_trigger=cut), available_now=True, spark=spark)
        assert report.error is None and report.input_rows == len(events)
        table = spark.read.format("delta")
        results[cut] = (
            {r.voter_id: r.candidate for r in table.load(report.output).collect()},
            {r.candidate: r.votes for r in table.load(f"{report.output}_counts").collect()},
        )
    want = {voter: e["candidate"] for voter, e in votes.latest_votes(events).items()}
    assert results[None] == (want, votes.expected_counts(events))
    assert results[9] == results[None], "maxOffsetsPerTrigger=9 changed the outputs"


def test_kafka_streams_counts_the_same_votes(kafka_broker, settings, tmp_path, unique):
    """The bench's Kafka Streams app (a versioned table, counted per candidate) counts the same votes as
    the plain-Python reference that vote_counts is held to above. No two votes of a voter share an
    event time here: on a tie Kafka Streams keeps the later arrival, vote_counts the larger event id
    (README, "Semantics")."""
    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build
    from spark_jobs.reference.generators import votes

    events = list(votes.generate(voters=40, seed=4, max_votes=6, shuffle_window=30))
    events += events[::7]  # duplicates, arriving late
    topic, app, output = f"votes-ks-{unique}", f"ksvotes-{unique}", f"ksvotes-{unique}-out"
    ensure_topic(settings.kafka, topic, 2)
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    votes.produce(settings.kafka, topic, events)
    peer = KafkaStreamsPeer(build(), settings, "vote_counts", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
        # the count's repartition topic is consumed after the input's offsets are committed
        wait_for(
            lambda: _counts(settings, output) == votes.expected_counts(events),
            60,
            "the counts to settle",
            diagnose=lambda: f"{_counts(settings, output)} != {votes.expected_counts(events)}",
        )
    finally:
        peer.stop()


def _counts(settings, topic: str) -> dict[str, int]:
    from tests.bench.test_kafka_streams_peer import _compacted_view

    return {
        candidate: value["votes"] for candidate, value in _compacted_view(settings, topic).items() if value["votes"]
    }


#: the joins' cuts (records per micro-batch over both topics) beside a run with no limit, and their partitions:
#: ``SAME_OUTPUT_JOIN_CUTS=7,25,100 SAME_OUTPUT_JOIN_PARTITIONS=1,3`` runs the whole matrix (about 8 minutes)
JOIN_CUTS = tuple(int(c) for c in os.environ.get("SAME_OUTPUT_JOIN_CUTS", "7").split(","))
JOIN_PARTITIONS = [int(p) for p in os.environ.get("SAME_OUTPUT_JOIN_PARTITIONS", "3").split(",")]
JOIN_GRACE_MS, JOIN_RETENTION_MS = 60_000, 24 * 3600 * 1000  # order_enrichment's
#: records no join can take: not JSON, and (produced without a Kafka key) not keyed by the join key
REFUSED = (b"{not json", b'{"customer_id": "c01", "order_id": "o-x", "amount": 1.0}')


def _enrichment_input(partitions: int):
    from spark_jobs.reference.generators import orders

    stream, table = orders.adversarial(orders=70, customers=6, seed=23, late_orders=4)
    tie_stream, tie_table = orders.tie_then_late(max(r.time_ms for r in stream + table), partitions)
    stream, table = stream + tie_stream, table + tie_table
    want = orders.expected_enrichment(stream, table, partitions, JOIN_GRACE_MS, JOIN_RETENTION_MS)
    assert [row[4].endswith("-first") for row in want.values() if row[1] == "late-k"] == [True]

    def produce(settings, spec) -> None:
        orders.produce(settings.kafka, spec.source_topic, stream, partitions)
        orders.produce(settings.kafka, spec.join_topics[0], table, partitions)

    def results(rows) -> dict:
        return {
            (r["source_partition"], r["source_offset"]): (r["customer_id"], r["order_id"], r["amount"], r["name"])
            for r in rows
        }

    reference = {place: (row[0], row[1], row[2], row[4]) for place, row in want.items()}
    return produce, results, reference


def _credit_input(partitions: int):
    from spark_jobs.reference.generators import credit, orders

    stream, profiles, lines = credit.adversarial_inputs(orders=70, customers=6, seed=29)
    want = credit.expected_credit_enrichment([(stream, profiles, lines)], partitions, JOIN_RETENTION_MS)

    def produce(settings, spec) -> None:
        for topic, records in zip(spec.input_topics, (stream, profiles, lines), strict=True):
            orders.produce(settings.kafka, topic, records, partitions)

    def results(rows) -> dict:
        return {(r["source_partition"], r["source_offset"]): (r["order_id"], r["name"], r["standing"]) for r in rows}

    return produce, results, {place: (row[1], row[4], row[7]) for place, row in want.items()}


def _payments_input(partitions: int):
    from spark_jobs.reference.generators import payments
    from spark_jobs.reference.jobs.order_payments import ORDER_PAYMENTS
    from tests.spark_jobs.test_stream_stream_join import results_by_place

    orders, paid = payments.adversarial(orders=70, seed=13, late=4, strays=6, partitions=partitions)
    join = ORDER_PAYMENTS
    want = payments.expected_join(orders, paid, partitions, join.window_ms, join.grace_ms, join.join)

    def produce(settings, spec) -> None:
        payments.produce(settings.kafka, spec.source_topic, orders, partitions)
        payments.produce(settings.kafka, spec.join_topics[0], paid, partitions)

    return produce, results_by_place, want


@pytest.mark.parametrize("partitions", JOIN_PARTITIONS)
@pytest.mark.parametrize(
    ("job", "make_input"),
    [
        ("order_enrichment", _enrichment_input),
        ("order_credit_enrichment", _credit_input),
        ("order_payments", _payments_input),
    ],
)
def test_a_joins_outputs_and_dead_letters_do_not_depend_on_batching(
    spark, kafka_broker, settings, unique, job, make_input, partitions
):
    """A join's topics (two, or three for a stream joined with two tables) read in micro-batches of at most
    JOIN_CUTS records: Spark cuts each topic by a share of the limit, so a batch may hold one topic minutes of
    event time ahead of another. A task's records of the topic ahead wait for the others' (spark_jobs/state/input_lag.py), as a Kafka Streams task waits for records it
    knows exist: the outputs and dead letters equal the run with no limit, row for row, and the reference (the
    Kafka Streams twins equal it: tests/bench/test_kafka_streams_peer.py), on adversarial input (late table
    updates, versions at the boundaries, tombstones, duplicates, out-of-order records on both sides, ties between
    the topics, records the job refuses)."""
    from spark_jobs.reference.generators.producer import produce_unkeyed
    from spark_jobs.versions import read_rows

    spec = get_job(job)
    right = tuple(f"{job}-right{n}-{unique}" for n in range(len(spec.join_topics)))
    spec = dataclasses.replace(
        spec, source_partitions=partitions, source_topic=f"{job}-left-{unique}", join_topics=right
    )
    for topic in spec.input_topics:
        ensure_topic(settings.kafka, topic, partitions)
    produce, results, reference = make_input(partitions)
    produce(settings, spec)
    for topic in spec.input_topics:
        produce_unkeyed(settings.kafka, topic, list(REFUSED), partitions)

    outputs, letters = {}, {}
    for cut in (None, *JOIN_CUTS):
        name = f"cut_{job}_{unique}_{cut or 'all'}"
        copy = dataclasses.replace(spec, name=name, output_table=name)
        report = run(copy, settings.replace(max_offsets_per_trigger=cut), available_now=True, spark=spark)
        assert report.error is None
        if cut:
            # the input was cut up (Spark shares the limit among the topics' partitions, rounding each share)
            assert report.batches >= report.input_rows // (2 * cut), report.batches
        outputs[cut] = results(read_rows(report.output))
        letters[cut] = sorted(
            (
                d["headers"]["source.topic"],
                int(d["headers"]["source.partition"]),
                int(d["headers"]["source.offset"]),
                d["headers"]["reason"],
            )
            for d in read_with_headers(settings.kafka_bootstrap_servers, dead_letter_topic(copy.application_id))
        )
    assert outputs[None] == reference
    assert len(letters[None]) == len(spec.input_topics) * len(REFUSED)
    for cut in JOIN_CUTS:
        assert outputs[cut] == outputs[None], f"maxOffsetsPerTrigger={cut} changed the outputs"
        assert letters[cut] == letters[None], f"maxOffsetsPerTrigger={cut} changed the dead letters"
