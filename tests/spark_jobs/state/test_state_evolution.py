"""A compatible change of a store's value keeps the job's version, checkpoint and state; an incompatible one
is refused at start, saying to migrate. On a real broker, Spark and Delta: one job version runs
``counts_as_int``'s processor (``purchases INT``), then tiered_counts v2's (``purchases BIGINT`` and a new
field ``tier``: a type widened and a field added), then ``counts_as_int``'s again (narrowed: refused)."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from spark_jobs.generators import purchases
from spark_jobs.jobs.purchase_counts import STORE
from spark_jobs.layout import JobLayout
from spark_jobs.run import StateFormatChanged, run
from spark_jobs.state.checkpoint_offsets import state_encoding
from spark_jobs.state.migration import read_store
from spark_jobs.state.restore import take_snapshot
from spark_jobs.state.snapshots import SnapshotStore
from tests.fixtures.reprocess_jobs import tier_of
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
    assert restored.restores[STORE]["keys"] == len(so_far)
    assert delta_purchase_counts(spark, restored.output) == expected_purchase_counts(
        batches[0] + batches[1] + batches[2]
    )


def count_per_key(ctx):
    """A job whose state is a built-in aggregation (Spark keeps no Avro state for it)."""
    counts = ctx.kafka_source().groupBy("key").count()
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
