"""A compatible change of a store's value keeps the job's version, checkpoint and state; an incompatible one
is refused at start, saying to migrate. On a real broker, Spark and Delta: one job version runs
``counts_as_int``'s processor (``purchases INT``), then tiered_counts v2's (``purchases BIGINT`` and a new
field ``tier``: a type widened and a field added), then ``counts_as_int``'s again (narrowed: refused). And a
store added to a running version (``CountsAndItems``): the counts go on, the new store starts empty."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from spark_jobs.driver.run import StateFormatChanged, run
from spark_jobs.layout import JobLayout
from spark_jobs.operations.state_audit.checkpoint_state import audit_checkpoint
from spark_jobs.reference.generators import purchases
from spark_jobs.reference.jobs.purchase_counts import STORE
from spark_jobs.registry import JobSpecError, StoreSpec
from spark_jobs.state.checkpoint_offsets import state_encoding
from spark_jobs.state.migration import read_store
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.snapshotting import take_snapshot
from tests.fixtures.reprocess_jobs import ITEMS, expected_items, tier_of
from tests.helpers import delta_purchase_counts, expected_purchase_counts, purchase_batches, purchase_counts_copy

pytestmark = pytest.mark.integration

FIXTURES = "tests.fixtures.reprocess_jobs"


def test_a_compatible_change_keeps_the_state_and_an_incompatible_one_is_refused(spark, kafka_broker, settings, unique):
    bootstrap = settings.kafka_bootstrap_servers
    as_int = purchase_counts_copy("evo", unique, bootstrap, entrypoint=f"{FIXTURES}:build_counts_as_int")
    tiered = dataclasses.replace(as_int, entrypoint=f"{FIXTURES}:build_tiered")  # the same version
    batches = purchase_batches((800, 150, 61), (300, 200, 62), (300, 220, 63))
    layout = JobLayout.of(as_int, settings)

    purchases.produce(bootstrap, as_int.source_topic, batches[0])
    first = run(as_int, settings, available_now=True, spark=spark)
    assert first.state_encoding == "avro"

    # the value widened and gained a field: the same checkpoint, its state read through the new schema
    purchases.produce(bootstrap, as_int.source_topic, batches[1])
    evolved = run(tiered, settings, available_now=True, spark=spark)
    assert evolved.restores == {} and evolved.input_rows == len(batches[1]), "the checkpoint must be kept"
    assert evolved.last_batch_id > first.last_batch_id
    so_far = expected_purchase_counts(batches[0] + batches[1])
    assert delta_purchase_counts(spark, evolved.output) == so_far  # counts went on from the old state

    # what the store holds: every user's counts; a tier for each user changed since (the others were not
    # recomputed: a new field of an evolved value starts as null, which is why a derived one migrates)
    snapshots = SnapshotStore.of(layout, STORE)
    take_snapshot(snapshots, settings.kafka, layout.changelog_topic(STORE), spark=spark)
    state = {
        r.key: json.loads(r.value, parse_float=Decimal) for r in read_store(settings, tiered, STORE, spark).collect()
    }
    assert {user: (v["purchases"], v["amount_spent"]) for user, v in state.items()} == so_far
    touched = {e["user_id"] for e in batches[1]} & so_far.keys()
    assert {u: v.get("tier") for u, v in state.items() if u in touched} == {u: tier_of(so_far[u][1]) for u in touched}
    assert all(v.get("tier") is None for u, v in state.items() if u not in touched)

    # narrowing back is not a change Avro can read: refused at start, the error says what to do
    purchases.produce(bootstrap, as_int.source_topic, batches[2])
    with pytest.raises(StateFormatChanged, match=f"{as_int.application_id}: .*reprocess_job mode migrate"):
        run(as_int, settings, available_now=True, spark=spark)

    # a restore (checkpoint lost) reads both formats from the snapshot and the changelog
    layout.checkpoint.remove()
    restored = run(tiered, settings, available_now=True, spark=spark)
    assert restored.restores[STORE].keys == len(so_far)
    assert delta_purchase_counts(spark, restored.output) == expected_purchase_counts(
        batches[0] + batches[1] + batches[2]
    )


def test_a_store_added_in_place_starts_empty_and_the_other_keeps_its_state(spark, kafka_broker, settings, unique):
    bootstrap = settings.kafka_bootstrap_servers
    counts_only = purchase_counts_copy("added", unique, bootstrap, entrypoint=f"{FIXTURES}:build_python")
    # the same version, a store more: its processor gains a state variable, the spec a store
    with_items = dataclasses.replace(
        counts_only, entrypoint=f"{FIXTURES}:build_with_items", stores=(*counts_only.stores, StoreSpec(ITEMS))
    )
    batches = purchase_batches((600, 120, 71), (300, 150, 72), (300, 150, 73))
    layout = JobLayout.of(with_items, settings)

    def stored(store: str) -> dict[str, dict]:
        take_snapshot(SnapshotStore.of(layout, store), settings.kafka, layout.changelog_topic(store), spark=spark)
        rows = read_store(settings, with_items, store, spark).collect()
        return {r.key: json.loads(r.value, parse_float=Decimal) for r in rows}

    purchases.produce(bootstrap, counts_only.source_topic, batches[0])
    run(counts_only, settings, available_now=True, spark=spark)

    purchases.produce(bootstrap, counts_only.source_topic, batches[1])
    added = run(with_items, settings, available_now=True, spark=spark)
    assert added.error is None and added.restores == {} and added.input_rows == len(batches[1]), "checkpoint kept"
    so_far = expected_purchase_counts(batches[0] + batches[1])
    assert delta_purchase_counts(spark, added.output) == so_far  # the counts went on from their state
    # the new store holds what its rules give over the input since it was added (Kafka Streams: a store
    # added to a running topology starts empty), logged to a changelog of its own
    assert {user: v["items"] for user, v in stored(ITEMS).items()} == expected_items(batches[1])
    assert {user: (v["purchases"], v["amount_spent"]) for user, v in stored(STORE).items()} == so_far
    # the state audit reads each store of the one operator apart
    live_rows = {}
    for row in audit_checkpoint(spark, settings, with_items, "evolution"):
        live_rows[row.store] = live_rows.get(row.store, 0) + row.rows
    assert live_rows == {STORE: len(so_far), ITEMS: len(expected_items(batches[1]))}

    # the checkpoint lost: both stores restored, to one input position, and both go on from there
    purchases.produce(bootstrap, counts_only.source_topic, batches[2])
    layout.checkpoint.remove()
    restored = run(with_items, settings, available_now=True, spark=spark)
    assert restored.error is None and restored.input_rows == len(batches[2])
    assert restored.restores[STORE].keys == len(so_far)
    assert restored.restores[ITEMS].keys == len(expected_items(batches[1]))
    assert delta_purchase_counts(spark, restored.output) == expected_purchase_counts(sum(batches, []))
    assert {user: v["items"] for user, v in stored(ITEMS).items()} == expected_items(batches[1] + batches[2])

    # a processor that keeps a store the spec does not declare (or the reverse) is refused at build
    with pytest.raises(
        JobSpecError, match=r"job added_\w+: stores: the spec declares \['counts'\], the processor keeps"
    ):
        run(
            dataclasses.replace(counts_only, entrypoint=with_items.entrypoint),
            settings,
            available_now=True,
            spark=spark,
        )


def count_per_key(ctx):
    """A job whose state is a built-in aggregation (Spark keeps no Avro state for it)."""
    counts = ctx.sources.stream().groupBy("key").count()
    return counts.writeStream.outputMode("update").foreachBatch(lambda batch, _id: batch.count())


def test_a_built_in_stateful_operator_runs_with_unsaferow_state(spark, kafka_broker, settings, unique):
    entrypoint = "tests.spark_jobs.state.test_state_evolution:count_per_key"
    spec = purchase_counts_copy("agg", unique, settings.kafka_bootstrap_servers, entrypoint=entrypoint, stores=())
    purchases.produce(
        settings.kafka_bootstrap_servers, spec.source_topic, list(purchases.generate(50, users=5, seed=1))
    )
    report = run(spec, settings, available_now=True, spark=spark)
    assert report.error is None and report.input_rows == 50
    assert state_encoding(JobLayout.of(spec, settings).checkpoint) == "unsaferow"
