"""kill -9 of the Spark driver at the named phases of the job (:mod:`spark_jobs.driver.failpoints`), for the reference
job of each store kind beside purchase_counts' key-value store (tests/faults/test_driver_kills.py): an ``lru``
store (``recent_buyers``, 10 users per partition: it evicts), Spark's ``in_memory`` store
(``purchase_counts_in_memory``), a ``session`` store (``user_sessions``), a TopN over an upsert topic
(``top_movers``), a table-table join of two topics (``customer_accounts``), a stream-table join
(``order_enrichment``, with a grace longer than a small micro-batch's skew between its topics, and re-keyed from
unkeyed orders: ``order_enrichment_rekeyed``, whose re-keying stage dies with the driver) and a windowed
stream-stream join (``order_payments``, held to the reference whatever the micro-batches Spark cuts; and re-keyed from
unkeyed orders: ``order_payments_rekeyed``, on an input inside one join window), and a stream joined with two tables
(``order_credit_enrichment``: three topics in one task, records of each waiting for the others). Each job is a copy with a snapshot after every batch (tests/fixtures/store_kind_jobs.py), all
its input is produced first and read in small micro-batches; after the kills a last run drains it, and the
outputs (and, where cheap, the changelog's compacted view) must equal the job's plain-Python reference.

CI kills the two jobs no other fault test kills (the in-memory store's, whose state Spark loads from its own
files, and the sessions', whose outputs are appended unless a batch may replay) once, where it hurts most:
between a batch's outputs and its changelog markers, the checkpoint lost with it (the outputs are ahead of
what the restore trusts); ``purchase_counts_in_memory`` is also killed while it restores. (The TopN's stage is
killed at that point in test_top_movers.py too.) CI also kills the re-keyed join before a snapshot, and its
resume replays that batch from the repartition topic, and the stream-stream join at the riskiest point in the middle
of its backlog (records of one topic waiting for the other's, restored from the changelog). ``FAULT_TRIALS=4`` (or more) kills every job at every
phase (about 10 minutes)::

    FAULT_TRIALS=4 .venv/bin/python -m pytest tests/faults/test_store_kind_kills.py -s
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from collections.abc import Callable

import pytest

from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import (
    customer_accounts,
    orders,
    payments,
    purchases,
    recent_buyers,
    sessions,
    upserts,
)
from spark_jobs.reference.jobs.order_payments import ORDER_PAYMENTS
from spark_jobs.registry import JobSpec, registered_versions
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.versions import read_rows
from tests.faults.test_driver_kills import TRIALS, Kill, kill_at
from tests.helpers import every_record
from tests.spark_jobs.test_purchase_counts import decode_counts
from tests.spark_jobs.test_stream_stream_join import place, rekeyed_place, results_by_place

pytestmark = [pytest.mark.integration, pytest.mark.faults]

JOB_MODULES = "tests.fixtures.store_kind_jobs"

# Every phase, in an order where each kill leaves the next something to trip on: a snapshot due and not taken
# (the checkpoint kept: the next driver resumes from it), outputs ahead of the markers with the checkpoint lost,
# a restore (from the snapshot and the changelog's tail) killed half-way, then a batch killed before its
# outputs after that restore (the checkpoint kept: the last run resumes from it). nth=2: the driver has
# committed a batch of its own first.
EVERY_PHASE = (
    Kill("before_snapshot", 2),
    Kill("between_outputs_and_markers", 2, lose_checkpoint=True),
    Kill("restoring", lose_checkpoint=True),
    Kill("before_outputs", 2),
)
RISKIEST = Kill("between_outputs_and_markers", 2, lose_checkpoint=True)
#: the jobs CI kills, and where: the others only with FAULT_TRIALS >= 4 (each costs about 90 s)
CI_KILLS = {
    # after RISKIEST, while it restores: Spark's in-memory store seeded by the restore
    "purchase_counts_in_memory": (RISKIEST, Kill("restoring", lose_checkpoint=True)),
    "user_sessions": (RISKIEST,),
    # the resume replays the batch killed before its snapshot, whose repartition-topic records must still be
    # there (they were purged below the batch's end once)
    "order_enrichment_rekeyed": (Kill("before_snapshot", 2),),
    # in the middle of its backlog, read in batches that hold one topic ahead: the records waiting for the other
    # topic are restored from the changelog with the rest of the store
    "order_payments": (RISKIEST,),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """A reference job: its fixture copy, how its input is made and produced, and the check of its outputs."""

    job: str
    #: ``max_offsets_per_trigger``: about a dozen micro-batches for the input, so every kill finds batches to run
    cut: int
    #: produces the job's input to its source topic; returns what ``check`` compares with
    produce: Callable[[Settings, JobSpec], object]
    #: (settings, spec, the last run's output rows, produce's result): asserts the outputs equal the reference
    check: Callable[[Settings, JobSpec, list[dict], object], None]

    def __str__(self) -> str:
        return self.job


def _unique(rows: list[dict], key: Callable[[dict], object]) -> dict:
    """The rows by their output key: a row written twice (by a killed batch and its replay) fails here."""
    by_key = {key(r): r for r in rows}
    assert len(by_key) == len(rows), f"{len(rows) - len(by_key)} output rows share their output key"
    return by_key


def _ms(t) -> int:
    return int(t.timestamp() * 1000)


# --- recent_buyers: an lru store -------------------------------------------------------------------------------
MAX_ENTRIES = 10


def _produce_recent_buyers(settings: Settings, spec: JobSpec):
    events = list(purchases.generate(600, users=150, seed=71, close_rate=0.03))
    purchases.produce(settings.kafka, spec.source_topic, events)
    want = recent_buyers.expected(events, MAX_ENTRIES, spec.source_partitions)
    assert want.evicted > 200 and len(want.state) == MAX_ENTRIES * spec.source_partitions, want.evicted
    return want.state


def _check_recent_buyers(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    outputs = {user: (r["purchases"], r["amount_spent"]) for user, r in _unique(rows, lambda r: r["user_id"]).items()}
    assert outputs == want  # evicted and closed users gone, nothing counted twice
    # every eviction is a tombstone in the changelog: its compacted view is the store
    store = spec.stores[0].name
    changelog = read_changelog(settings.kafka, changelog_topic_name(spec.application_id, store))
    assert decode_counts(changelog.state) == want


# --- purchase_counts_in_memory: Spark's in-memory state store ------------------------------------------------------
def _produce_counts(settings: Settings, spec: JobSpec):
    # users created and closed in one batch, closes of unknown users, duplicates, records refused
    events = list(purchases.adversarial(480, users=24, seed=72))
    purchases.produce(settings.kafka, spec.source_topic, events)
    return purchases.expected_counts([e for e in events if purchases.is_valid(e)])


def _check_counts(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    outputs = {user: (r["purchases"], r["amount_spent"]) for user, r in _unique(rows, lambda r: r["user_id"]).items()}
    assert outputs == want
    changelog = read_changelog(settings.kafka, changelog_topic_name(spec.application_id, spec.stores[0].name))
    assert decode_counts(changelog.state) == want


# --- user_sessions: a session store ------------------------------------------------------------------------------
def _produce_sessions(settings: Settings, spec: JobSpec):
    events = list(sessions.adversarial(360, users=6, seed=73))
    sessions.produce(settings.kafka, spec.source_topic, events)
    store = spec.stores[0]
    want = sessions.expected_visits(events, store.gap_ms, store.grace_ms, store.retention_ms, spec.source_partitions)
    assert want.late and want.bridges and want.reopened  # the input holds what a session store gets wrong
    return want.emitted


def _check_sessions(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    from spark_jobs.reference.jobs.user_sessions import VISITS

    by_key = _unique(rows, lambda r: (r["user_id"], _ms(r["session_start"])))
    outputs = {key: (_ms(r["session_end"]), tuple(r[v] for v in VISITS.values)) for key, r in by_key.items()}
    assert outputs == want


# --- top_movers: a TopN over an upsert topic (a key-value store of each day's members) -------------------------------
def _produce_top_movers(settings: Settings, spec: JobSpec):
    # updates dropping a leader out of the top, tombstones, rows back after a delete, ties, refused records
    records = upserts.adversarial(count=240, seed=74)
    upserts.produce(settings.kafka, spec.source_topic, records)
    return upserts.top_n(records)


def _check_top_movers(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    by_key = _unique(rows, lambda r: (_ms(r["window_start"]), r["rank"]))
    assert {key: (r["symbol"], r["change"], r["ticks"]) for key, r in by_key.items()} == want


# --- customer_accounts: a table-table join (one key-value store of both sides) --------------------------------
def _produce_customer_accounts(settings: Settings, spec: JobSpec):
    # updates and deletes on both sides, keys on one side only, refused records in both topics
    customers, accounts = customer_accounts.adversarial(count=300, seed=75)
    ensure_topic(settings.kafka, spec.join_topics[0], spec.source_partitions)
    customer_accounts.produce(settings.kafka, spec.source_topic, customers)
    customer_accounts.produce(settings.kafka, spec.join_topics[0], accounts)
    return customer_accounts.expected_join(customers, accounts, "left")


def _check_customer_accounts(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    by_key = _unique(rows, lambda r: r["customer_id"])
    assert {key: tuple(r[f] for f in customer_accounts.FIELDS) for key, r in by_key.items()} == want


# --- order_enrichment: a stream-table join (a versioned table, events waiting out their grace, appended outputs) ---
ENRICHMENT_GRACE_MS = 3_600_000  # tests.fixtures.join_jobs.LONG_GRACE_ENRICHMENT


def _produce_order_enrichment(settings: Settings, spec: JobSpec):
    stream, table = orders.adversarial(orders=300, customers=10, seed=76, span_ms=3 * 3600_000)
    ensure_topic(settings.kafka, spec.join_topics[0], spec.source_partitions)
    orders.produce(settings.kafka, spec.source_topic, stream, spec.source_partitions)
    orders.produce(settings.kafka, spec.join_topics[0], table, spec.source_partitions)
    retention = spec.stores[0].retention_ms
    return orders.expected_enrichment(stream, table, spec.source_partitions, ENRICHMENT_GRACE_MS, retention)


def _check_order_enrichment(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    by_key = _unique(rows, lambda r: (r["source_partition"], r["source_offset"]))  # a replayed order joined once
    iso = {key: orders.iso_time(_ms(r["event_time"])) for key, r in by_key.items()}
    got = {key: tuple(iso[key] if f == "event_time" else r[f] for f in orders.FIELDS) for key, r in by_key.items()}
    assert got == want


def _produce_rekeyed_enrichment(settings: Settings, spec: JobSpec):
    """Orders without keys over 3 partitions: re-keyed by customer into the 2 partitions of the table. With the
    grace longer than a micro-batch's skew, the answer does not depend on the order the re-keying stage wrote
    the orders in: the reference over the orders keyed by customer, row for row (their places differ)."""
    from spark_jobs.reference.generators.producer import produce_unkeyed

    stream, table = orders.adversarial(orders=300, customers=10, seed=78, span_ms=3 * 3600_000)
    ensure_topic(settings.kafka, spec.join_topics[0], spec.state_partitions)
    produce_unkeyed(settings.kafka, spec.source_topic, [r.value for r in stream], spec.source_partitions, seed=7)
    orders.produce(settings.kafka, spec.join_topics[0], table, spec.state_partitions)
    retention = spec.stores[0].retention_ms
    keyed = orders.expected_enrichment(stream, table, spec.state_partitions, ENRICHMENT_GRACE_MS, retention)
    return collections.Counter(keyed.values())


def _check_rekeyed_enrichment(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    by_place = _unique(rows, lambda r: (r["source_partition"], r["source_offset"]))  # places in the source
    assert {partition for partition, _offset in by_place} == set(range(spec.source_partitions))
    iso = {key: orders.iso_time(_ms(r["event_time"])) for key, r in by_place.items()}
    got = [tuple(iso[key] if f == "event_time" else r[f] for f in orders.FIELDS) for key, r in by_place.items()]
    assert collections.Counter(got) == want


# --- order_credit_enrichment: a stream joined with two tables (three topics in one task, no grace) -----------------
def _produce_order_credit_enrichment(settings: Settings, spec: JobSpec):
    from spark_jobs.reference.generators import credit

    inputs = credit.adversarial_inputs(orders=300, seed=80)
    for topic, records in zip(spec.input_topics, inputs, strict=True):
        ensure_topic(settings.kafka, topic, spec.source_partitions)
        orders.produce(settings.kafka, topic, records, spec.source_partitions)
    return credit.expected_credit_enrichment([inputs], spec.source_partitions, spec.stores[0].retention_ms)


def _check_order_credit_enrichment(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    from spark_jobs.reference.generators import credit

    by_key = _unique(rows, lambda r: (r["source_partition"], r["source_offset"]))  # a replayed order joined once
    iso = {key: orders.iso_time(_ms(r["event_time"])) for key, r in by_key.items()}
    got = {key: tuple(iso[key] if f == "event_time" else r[f] for f in credit.FIELDS) for key, r in by_key.items()}
    assert got == want


# --- order_payments: a windowed stream-stream join (two window stores, unmatched records held to their window's close) ---
def _produce_order_payments(settings: Settings, spec: JobSpec):
    """The reference, whatever the micro-batches Spark cuts under the case's limit and wherever a kill lands: a
    task's records of the topic ahead wait for the other's, in the store (restored with it)."""
    placed, paid = payments.adversarial(seed=77, partitions=spec.source_partitions)
    ensure_topic(settings.kafka, spec.join_topics[0], spec.source_partitions)
    payments.produce(settings.kafka, spec.source_topic, placed, spec.source_partitions)
    payments.produce(settings.kafka, spec.join_topics[0], paid, spec.source_partitions)
    join = ORDER_PAYMENTS
    return payments.expected_join(placed, paid, spec.source_partitions, join.window_ms, join.grace_ms, join.join)


def _check_order_payments(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    assert results_by_place(rows) == want  # a replayed result written once (its place is its key)
    # the event topic too, though a record cannot be "inserted if absent": a batch replayed from the checkpoint
    # after its transaction committed (killed before_snapshot) writes nothing again
    published = every_record(settings.kafka, JobLayout.of(spec, settings).output_topic)
    assert sorted((place(json.loads(value)) for _p, _k, value in published), key=repr) == sorted(want, key=repr)


def _produce_rekeyed_payments(settings: Settings, spec: JobSpec):
    """Orders without keys over 3 partitions, re-keyed by order id into the 2 partitions of the payments (keyed).
    Which order the re-keying stage writes a batch's orders in, and how far it is ahead of the payments when a
    stateful batch is cut, are not fixed; every record lies within one span shorter than the join window, so the
    answer does not depend on them: each payment joins every record of its order (a retried order twice, an order
    paid twice twice), whichever of the two comes first; no record is late and no window closes, so the orders
    nobody paid and the payments of no order stay pending (Kafka Streams emits them only when a later record
    closes their window: the keyed ``order_payments`` case checks those under kills). A Counter of the rows."""
    import random
    from decimal import Decimal

    from spark_jobs.reference.generators.producer import produce_unkeyed

    rng, span_ms = random.Random(79), 8 * payments.MINUTE
    assert span_ms < ORDER_PAYMENTS.window_ms
    start_ms = int(time.time() * 1000) - 2 * 3_600_000
    placed, paid = [], []
    for n in range(240):
        t = start_ms + rng.randrange(span_ms)
        order = {
            "order_id": f"o{n:04d}",
            "customer_id": f"c{n % 10:02d}",
            "amount": 12.5,
            "event_time": orders.iso_time(t),
        }
        placed += [order] * (2 if rng.random() < 0.04 else 1)  # a producer's retry: the same order twice
        draw = rng.random()
        for part in range(0 if draw < 0.15 else 2 if draw > 0.92 else 1):
            at = start_ms + rng.randrange(span_ms)
            value = {"payment_id": f"p{n:04d}-{part}", "order_id": order["order_id"], "paid": 6.25}
            paid.append(orders.Record(order["order_id"], {**value, "event_time": orders.iso_time(at)}, at, at))
    for n in range(8):  # payments of orders that never exist
        at = start_ms + rng.randrange(span_ms)
        value = {"payment_id": f"p9{n:03d}", "order_id": f"o9{n:03d}", "paid": 1.0, "event_time": orders.iso_time(at)}
        paid.append(orders.Record(value["order_id"], value, at, at))
    ensure_topic(settings.kafka, spec.join_topics[0], spec.state_partitions)
    produce_unkeyed(settings.kafka, spec.source_topic, placed, spec.source_partitions, seed=9)
    payments.produce(settings.kafka, spec.join_topics[0], sorted(paid, key=lambda r: r.time_ms), spec.state_partitions)
    by_order = collections.Counter(o["order_id"] for o in placed)
    first = {o["order_id"]: o for o in placed}
    return collections.Counter(
        {
            (
                p.value["order_id"],
                first[p.key]["customer_id"],
                Decimal(str(first[p.key]["amount"])),
                first[p.key]["event_time"],
                p.value["payment_id"],
                Decimal(str(p.value["paid"])),
                p.value["event_time"],
            ): by_order[p.key]
            for p in paid
            if p.key in by_order
        }
    )


def _check_rekeyed_payments(settings: Settings, spec: JobSpec, rows: list[dict], want) -> None:
    by_place = results_by_place(rows, rekeyed_place)  # a replayed result written twice fails here
    assert {p for p, *_ in by_place if p is not None} == set(range(spec.source_partitions))  # source places
    assert collections.Counter(by_place.values()) == want
    published = every_record(settings.kafka, JobLayout.of(spec, settings).output_topic)
    assert sorted((rekeyed_place(json.loads(value)) for _p, _k, value in published), key=repr) == sorted(
        by_place, key=repr
    )


CASES = (
    Case("recent_buyers", 50, _produce_recent_buyers, _check_recent_buyers),
    Case("purchase_counts_in_memory", 40, _produce_counts, _check_counts),
    Case("user_sessions", 30, _produce_sessions, _check_sessions),
    Case("top_movers", 20, _produce_top_movers, _check_top_movers),
    Case("customer_accounts", 40, _produce_customer_accounts, _check_customer_accounts),
    Case("order_enrichment", 40, _produce_order_enrichment, _check_order_enrichment),
    Case("order_enrichment_rekeyed", 40, _produce_rekeyed_enrichment, _check_rekeyed_enrichment),
    Case("order_credit_enrichment", 40, _produce_order_credit_enrichment, _check_order_credit_enrichment),
    Case("order_payments", 40, _produce_order_payments, _check_order_payments),
    Case("order_payments_rekeyed", 40, _produce_rekeyed_payments, _check_rekeyed_payments),
)


def _assert_outputs_ahead_of_the_changelog(settings: Settings, spec: JobSpec) -> None:
    """The kill landed where it matters: the killed batch wrote outputs (Delta's idempotent-write version is its
    changelog batch id) past the last batch the changelog has complete."""
    from deltalake import DeltaTable

    written = DeltaTable(str(settings.lake / spec.output_table_dir)).transaction_version(
        JobLayout.of(spec, settings).output_transaction_app_id
    )
    marked = read_changelog(settings.kafka, changelog_topic_name(spec.application_id, spec.stores[0].name))
    assert written is not None and (marked.cut_batch_id is None or written > marked.cut_batch_id), (
        f"outputs written through batch {written}, changelog complete through {marked.cut_batch_id}"
    )


def kills_of(job: str) -> tuple[Kill, ...]:
    return EVERY_PHASE if TRIALS >= len(EVERY_PHASE) else CI_KILLS[job]


def _killed_here(case: Case):
    """``case`` as a parameter, skipped before its stack starts when this run does not kill its job."""
    if case.job in CI_KILLS or TRIALS >= len(EVERY_PHASE):
        return case
    reason = f"{case.job}: killed with FAULT_TRIALS={len(EVERY_PHASE)} or more (the suite's time)"
    return pytest.param(case, marks=pytest.mark.skip(reason=reason))


@pytest.mark.parametrize("case", [_killed_here(case) for case in CASES], ids=str)
def test_a_store_kinds_reference_job_killed_9_at_each_phase_ends_equal_to_its_reference(private_stack, spark, case):
    settings = private_stack.replace(job_modules=JOB_MODULES, max_offsets_per_trigger=case.cut)
    spec = registered_versions(JOB_MODULES)[f"kills_{case.job}"][1]
    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions)
    want = case.produce(settings, spec)

    kills = kills_of(case.job)
    for trial, kill in enumerate(kills, start=1):
        started = time.monotonic()
        stopped = kill_at(settings, spec, kill, f"driver-{trial}.log")
        print(
            f"{case.job} trial {trial}: killed at {kill} ({json.dumps(stopped)}) after {time.monotonic() - started:.1f} s"
        )

    report = run(spec, settings, available_now=True, spark=spark)  # restores or resumes, and drains the rest
    assert report.error is None, report.error
    assert report.lease_epoch == JobLease(settings.status_dir, spec.application_id).last_epoch() == len(kills) + 1
    case.check(settings, spec, read_rows(report.output), want)
