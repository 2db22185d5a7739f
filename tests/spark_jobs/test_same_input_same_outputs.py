"""Same input, same outputs: purchase_counts' outputs and dead letters do not depend on how the input is
cut into micro-batches, equal the plain-Python reference, and equal what the Kafka Streams app of
``bench/kafka_streams`` computes from the same valid events.

The input is adversarial (spark_jobs.generators.purchases.adversarial): users created and closed inside
one batch, closes of users that never bought, duplicates, out-of-order times, amounts at and past what
the declared type holds exactly. More seeds than CI runs::

    SAME_OUTPUT_SEEDS=1,2,3,4,5 .venv/bin/python -m pytest tests/spark_jobs/test_same_input_same_outputs.py
"""

from __future__ import annotations

import dataclasses
import os
from decimal import Decimal

import pytest

from spark_jobs.dead_letter import dead_letter_topic
from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.registry import get_job
from spark_jobs.run import run
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
    from spark_jobs.generators import votes

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
    from spark_jobs.generators import votes

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
