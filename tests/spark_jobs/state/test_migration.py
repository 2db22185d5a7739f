"""A new version starts from the previous version's state, migrated, instead of recomputing it from the
source: purchase_counts v3 -> a v4 whose store's value gains a field (``tier``; the rules and the
migration are tiered_counts v2's, tests/fixtures/reprocess_jobs.py), on a real broker, Spark and Delta.
The migrated state plus the input after it must equal what recomputing everything gives, with the
source's early history deleted (which recomputing cannot survive)."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.driver.run import StateFormatChanged, run
from spark_jobs.io.kafka_topics import truncate_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.reference.jobs.purchase_counts import STORE
from spark_jobs.registry import StoreMigration
from spark_jobs.state.checkpoint_offsets import committed_input_offsets
from spark_jobs.state.migration import (
    MIGRATED_BATCH_ID,
    MigrationRefused,
    bootstrap_store,
    migrate_state,
    output_version_at,
    plan_migration,
    read_store,
)
from spark_jobs.state.restore import restore_from_snapshot
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.snapshotting import take_snapshot
from tests.fixtures import reprocess_jobs
from tests.fixtures.reprocess_jobs import add_tier, tier_of
from tests.helpers import (
    delta_purchase_counts,
    end_offsets,
    expected_purchase_counts,
    purchase_batches,
    purchase_counts_copy,
)

pytestmark = pytest.mark.integration

HERE = "tests.spark_jobs.state.test_migration"


def add_tier_but_fail(old: DataFrame) -> DataFrame:
    """A migration that dies while Spark writes its result (one user's row fails)."""
    migrated = add_tier(old)
    failing_key = migrated.select(F.min("key")).first()[0]
    return migrated.select(
        "key",
        F.when(F.col("key") == failing_key, F.raise_error(F.lit("boom"))).otherwise(F.col("value")).alias("value"),
    )


def only_keys(old: DataFrame) -> DataFrame:
    return old.select("key")


def test_a_new_version_starts_from_the_old_versions_state_migrated(spark, kafka_broker, settings, unique):
    bootstrap = settings.kafka_bootstrap_servers
    v3 = purchase_counts_copy("mig", unique, bootstrap)
    # v4: tiered_counts v2's rules and migration
    tiered = next(s for s in reprocess_jobs.JOBS if (s.name, s.version) == ("tiered_counts", 2))
    v4 = dataclasses.replace(v3, version=4, entrypoint=tiered.entrypoint, migrations=tiered.migrations)
    batches = purchase_batches((1500, 200, 51), (500, 260, 52), (400, 300, 53))
    old_layout = JobLayout.of(v3, settings)
    old_snapshots = SnapshotStore.of(old_layout, STORE)

    # v3 ran: a snapshot, then a batch after it (the migration reads the snapshot and the changelog tail)
    purchases.produce(bootstrap, v3.source_topic, batches[0])
    run(v3, settings, available_now=True, spark=spark)
    first = take_snapshot(old_snapshots, settings.kafka, old_layout.changelog_topic(STORE), spark=spark)
    purchases.produce(bootstrap, v3.source_topic, batches[1])
    run(v3, settings, available_now=True, spark=spark)
    # the source keeps days, not years: its history is gone, so recomputing v4 from it is impossible
    assert truncate_topic(bootstrap, v3.source_topic) == len(batches[0]) + len(batches[1])

    plan = plan_migration(settings, v3, v4)
    (store,) = plan.stores
    assert (
        store.function == "tests.fixtures.reprocess_jobs:add_tier"
        and store.snapshot is not None
        and store.tail_records > 0
    )
    assert "add_tier" in plan.render() and f"batch {store.snapshot.batch_id}" in plan.render()
    assert plan.outputs == [(str(old_layout.output_table), str(JobLayout.of(v4, settings).output_table))]

    # a migration whose result is not a store is refused, naming the store and the function
    wrong = dataclasses.replace(v4, migrations=(StoreMigration(STORE, function=f"{HERE}:only_keys"),))
    with pytest.raises(MigrationRefused, match=f"{v4.application_id}/{STORE} .*only_keys.*key STRING, value STRING"):
        migrate_state(settings, v3, wrong, spark)
    # one that dies half-way commits nothing, and a second run migrates
    failing = dataclasses.replace(v4, migrations=(StoreMigration(STORE, function=f"{HERE}:add_tier_but_fail"),))
    with pytest.raises(Exception, match="boom"):
        migrate_state(settings, v3, failing, spark)
    new_snapshots = SnapshotStore.of(JobLayout.of(v4, settings), STORE)
    assert new_snapshots.latest() is None

    migrated = migrate_state(settings, v3, v4, spark)[STORE]
    before = expected_purchase_counts(batches[0] + batches[1])
    # v4's outputs start as v3's were at the migration point (output_version_at finds a batch's table version)
    new_layout = JobLayout.of(v4, settings)
    assert delta_purchase_counts(spark, str(new_layout.output_table)) == before
    at_first = output_version_at(old_layout.output_table, old_layout.output_transaction_app_id, first.batch_id)
    first_outputs = spark.read.format("delta").option("versionAsOf", at_first).load(str(old_layout.output_table))
    assert {r.user_id: (r.purchases, r.amount_spent) for r in first_outputs.collect()} == expected_purchase_counts(
        batches[0]
    )
    assert migrated.batch_id == MIGRATED_BATCH_ID and migrated.rows == len(before) and migrated.writer == "migration"
    assert migrated.migrated_from.startswith(f"{v3.application_id}/{STORE}@batch ")
    # at v3's input position: after its last complete batch
    assert migrated.input_offsets == {v3.source_topic: committed_input_offsets(old_layout.checkpoint, v3.source_topic)}
    assert migrate_state(settings, v3, v4, spark)[STORE].delta_version == migrated.delta_version  # re-run: kept

    # v4 restores the migrated state and reads the source from v3's position: only the new input
    purchases.produce(bootstrap, v3.source_topic, batches[2])
    # (v4's rules on v3's checkpoint instead: Spark refuses the state format, and the error says what to do)
    with pytest.raises(StateFormatChanged, match=f"{v3.application_id}: .*reprocess_job mode migrate"):
        run(dataclasses.replace(v3, entrypoint=tiered.entrypoint), settings, available_now=True, spark=spark)
    report = run(v4, settings, available_now=True, spark=spark)
    assert report.restores[STORE].snapshot_batch_id == MIGRATED_BATCH_ID and report.input_rows == len(batches[2])
    everything = expected_purchase_counts(batches[0] + batches[1] + batches[2])
    assert delta_purchase_counts(spark, report.output) == everything

    # v4's store holds v4's value for every user, the tier included (migrated, or computed by v4 since)
    take_snapshot(new_snapshots, settings.kafka, new_layout.changelog_topic(STORE), spark=spark)
    state = {r.key: json.loads(r.value, parse_float=Decimal) for r in read_store(settings, v4, STORE, spark).collect()}
    assert {user: (v["purchases"], v["amount_spent"]) for user, v in state.items()} == everything
    assert {user: v["tier"] for user, v in state.items()} == {
        u: tier_of(spent) for u, (_n, spent) in everything.items()
    }
    # and the migrated snapshot stays readable by time travel: v3's users at the migration
    assert {
        r.key for r in read_store(settings, v4, STORE, spark, batch_id=MIGRATED_BATCH_ID).collect()
    } == before.keys()

    # v4 now runs from its own state: migrating into it again is refused
    with pytest.raises(MigrationRefused, match="committed batches of its own"):
        plan_migration(settings, v3, v4)
    with pytest.raises(MigrationRefused, match="committed batches of its own"):
        bootstrap_store(settings, v4, STORE, read_store(settings, v4, STORE, spark), migrated.input_offsets)

    # a table of your own (here: v4's state as of now, as a backfill would compute it) becomes a new
    # version's starting state, at the input position you give
    v5 = dataclasses.replace(v3, version=5)
    position = {v3.source_topic: end_offsets(bootstrap, v3.source_topic)}
    seeded = bootstrap_store(settings, v5, STORE, read_store(settings, v4, STORE, spark), position, source="a backfill")
    assert (seeded.rows, seeded.batch_id, seeded.migrated_from) == (len(everything), MIGRATED_BATCH_ID, "a backfill")
    v5_layout = JobLayout.of(v5, settings)
    restored = restore_from_snapshot(
        SnapshotStore.of(v5_layout, STORE), settings.kafka, v5_layout.changelog_topic(STORE)
    )
    assert restored.input_offsets == position and len(restored.state) == len(everything)


def test_a_new_version_whose_outputs_gained_a_column_writes_it_beside_the_copied_rows(
    spark, kafka_broker, settings, unique
):
    """A migration copies the old version's outputs with their schema; the new version's outputs have a
    column more. Its table gains the column (old rows read null) and its MERGE writes it."""
    from delta.tables import DeltaTable
    from pyspark.sql import types as T

    from spark_jobs.driver.context import JobContext
    from spark_jobs.reference.jobs.purchase_counts import COUNTS

    v4 = dataclasses.replace(purchase_counts_copy("out", unique, settings.kafka_bootstrap_servers), version=4)
    ctx = JobContext(spark, v4, settings)
    output_schema = COUNTS.output_schema("user_id")
    copied = spark.createDataFrame([("u1", 3, Decimal("120.00"), None)], output_schema)
    copied.write.format("delta").save(str(ctx.layout.output_table))  # what copy_outputs leaves: v3's schema
    with_tier = T.StructType([*output_schema.fields, T.StructField("tier", T.StringType())])
    ctx.outputs.ensure_table(with_tier)
    ctx.outputs.ensure_table(with_tier)  # a restart: nothing to add
    table = DeltaTable.forPath(spark, str(ctx.layout.output_table))
    assert [(f.name, f.dataType) for f in table.toDF().schema.fields] == [(f.name, f.dataType) for f in with_tier]
    new_rows = spark.createDataFrame([("u2", 1, Decimal("5.00"), None, "standard")], with_tier)
    merge = table.alias("t").merge(new_rows.alias("s"), "t.user_id = s.user_id")
    merge.whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    rows = {r.user_id: r.tier for r in spark.read.format("delta").load(str(ctx.layout.output_table)).collect()}
    assert rows == {"u1": None, "u2": "standard"}
