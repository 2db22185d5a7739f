"""A new job version that starts from the previous version's state, migrated, instead of recomputing it.

Kafka Streams answers a change of a store's format with a reset: recompute from the source topic, which
must still hold the whole history (topics keep days, state keeps years). Flink has savepoints and the
State Processor API. Here a version's state is already a table: its latest Delta snapshot plus the
changelog tail. A migration

1. reads the old version's stores at their last complete batch, in Spark (the state never enters the
   driver; the old version may keep running: the changelog's batch markers say what is complete);
2. maps each store through the migration the new version declares (:class:`~spark_jobs.registry.StoreMigration`:
   a function from the old store's DataFrame(key, value JSON) to the new one's; a copy by default);
3. copies the old version's output tables as they were at that batch into the new version's (a Delta
   time-travel read: the newest version whose idempotent writes are of that batch or before), so that
   the new version's outputs hold the history its state holds (windows closed before the migration);
4. commits the result as the new version's first snapshot, :data:`MIGRATED_BATCH_ID`, at the old
   version's input position, recording where it came from.

The new version then starts the way every version restarts: it restores from that snapshot and reads
the source from that position (a job whose outputs are a view of its store rewrites them from the
restored store first). Every batch id a driver of the new version writes is above the migrated
snapshot's (generation g >= 1 writes ``g * GENERATION_SPAN + n``), and the snapshot's changelog offsets
are empty: the new version's whole changelog comes after it.

A migration is re-runnable: a store already migrated is kept (Delta's transaction id makes the write
idempotent), and one that died half-way committed nothing. It is refused once the new version runs
from state of its own, and when the old version has no state.

The same path bootstraps a version from any table of (key, value) a user provides
(:func:`bootstrap_store`), and :func:`read_store` reads a version's state at any snapshot
(Delta time travel): the State Processor API's roles.

Run from ``reprocess_job`` (mode ``migrate``), or by hand::

    spark-submit spark_jobs/state/migration.py purchase_counts 3 4 [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
from collections.abc import Callable

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec, StoreMigration, get_job
from spark_jobs.state.checkpoint_offsets import KafkaOffsets, latest_committed_batch_id
from spark_jobs.state.restore import SilentRestoreListener, restore_from_snapshot, tail_records
from spark_jobs.state.snapshots import SnapshotInfo, SnapshotStore

#: the batch id of a migrated snapshot: below every batch id a driver of the new version writes
MIGRATED_BATCH_ID = 0


class MigrationRefused(RuntimeError):
    """The migration cannot be done as asked; the message says why and what to do instead."""


@dataclasses.dataclass
class StoreMigrationPlan:
    """One store of the new version: what it is built from, how, and from how much."""

    store: str
    #: the old version's store it reads (None: it starts empty)
    from_store: str | None
    #: ``module:function``, ``copy`` or ``empty``
    function: str
    target: str
    #: the old store's latest snapshot and the changelog records after it
    snapshot: SnapshotInfo | None = None
    tail_records: int = 0
    #: the new store's migrated snapshot, when an earlier run already wrote it
    migrated: SnapshotInfo | None = None

    def describe(self) -> str:
        if self.migrated is not None:
            return f"{self.store}: already migrated ({self.migrated.migrated_from}, {self.migrated.rows} rows): kept"
        if self.from_store is None:
            return f"{self.store}: starts empty (the old version has no store of that name)"
        source = (
            f"snapshot at batch {self.snapshot.batch_id} (Delta version {self.snapshot.delta_version}, "
            f"{self.snapshot.rows_scanned} rows)"
            if self.snapshot
            else "no snapshot"
        )
        return (
            f"{self.store} <- {self.from_store} through {self.function}: {source} + {self.tail_records} "
            f"changelog records; written to {self.target}"
        )


@dataclasses.dataclass
class MigrationPlan:
    job: str
    from_version: int
    to_version: int
    stores: list[StoreMigrationPlan]
    #: (old version's output table, new version's) pairs, copied as of the migration point
    outputs: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def render(self) -> str:
        lines = [f"State migration: {self.job} v{self.from_version} -> v{self.to_version}"]
        lines += [f"  {s.describe()}" for s in self.stores]
        if self.copies_outputs:
            lines += [f"  output {old} as of the migration point -> {new} (replaced)" for old, new in self.outputs]
        lines.append(
            f"  v{self.to_version} then starts from the migrated state, at v{self.from_version}'s input position "
            "(its last complete batch when the migration runs)"
        )
        return "\n".join(lines)

    @property
    def copies_outputs(self) -> bool:
        """Whether the migration reads old state (and copies the outputs with it): not when every store is
        already migrated (a re-run) or starts empty."""
        return any(s.migrated is None and s.from_store is not None for s in self.stores)

    def to_dict(self) -> dict:
        return {
            "job": self.job,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "stores": [
                {
                    "store": s.store,
                    "from_store": s.from_store,
                    "function": s.function,
                    "target": s.target,
                    "snapshot_batch_id": s.snapshot.batch_id if s.snapshot else None,
                    "snapshot_rows": s.snapshot.rows_scanned if s.snapshot else None,
                    "tail_records": s.tail_records,
                    "already_migrated": s.migrated is not None,
                }
                for s in self.stores
            ],
            "outputs": [{"from": old, "to": new} for old, new in self.outputs],
        }


def _migration(new: JobSpec, store: str) -> StoreMigration:
    return next((m for m in new.migrations if m.store == store), StoreMigration(store))


def refuse_unportable_position(old: JobSpec, new: JobSpec) -> None:
    """A migration whose input position would not mean the same in the new version is refused: to or from a
    version that re-keys its source (``JobSpec.repartition``), or between versions reading other topics.

    A migrated snapshot carries the old version's position in *its* input, and the new version resumes
    its input there. A re-keyed version's input is its own repartition topic, whose offsets mean nothing in
    the source or in another version's repartition topic; and where the new version's re-keying stage
    would have to start in the source (the first record the old state has not applied, per source
    partition) is not recorded with the state. Recomputing the state from the source (side_by_side from
    a start position) is what stays exact.

    A join reads two topics, and a migrated state's position holds both; a version reading other topics (or
    only one of them) would start where that position says nothing.

    Raises:
        MigrationRefused: either version re-keys its source, or the two read different topics.
    """
    if old.input_topics != new.input_topics:
        raise MigrationRefused(
            f"job {new.name}: migrate v{old.version} -> v{new.version} is not supported: v{old.version} reads "
            f"{', '.join(old.input_topics)} and v{new.version} {', '.join(new.input_topics)}; a migrated state "
            "carries its position in the old version's inputs. Reprocess side_by_side from a start position instead"
        )
    rekeyed = [f"v{spec.version}" for spec in (old, new) if spec.repartition]
    if rekeyed:
        raise MigrationRefused(
            f"job {new.name}: migrate v{old.version} -> v{new.version} is not supported: "
            f"{' and '.join(rekeyed)} re-key{'s' if len(rekeyed) == 1 else ''} the source through a repartition "
            "topic, whose offsets a migrated state's position cannot carry over to another version's input. "
            "Reprocess side_by_side from a start position instead (the new state is recomputed from the source)"
        )


def plan_migration(settings: Settings, old: JobSpec, new: JobSpec) -> MigrationPlan:
    """What a migration from ``old`` to ``new`` would read and write (reads sizes; changes nothing).

    Raises:
        MigrationRefused: either version re-keys its source (:func:`refuse_unportable_position`), the new version
            already runs from its own state, a declared source store does not exist, or the old version
            has no state to migrate.
    """
    if old.name != new.name or old.version == new.version:
        raise MigrationRefused(
            f"a migration goes from one version of a job to another, not {old.application_id} -> {new.application_id}"
        )
    refuse_unportable_position(old, new)
    old_layout, new_layout = JobLayout.of(old, settings), JobLayout.of(new, settings)
    if latest_committed_batch_id(new_layout.checkpoint) is not None:
        raise MigrationRefused(
            f"{new.application_id} has committed batches of its own ({new_layout.checkpoint}): it runs from its own "
            "state, which a migration would not replace. Reset it first (reprocess_job mode reset), or migrate "
            "into a newer version."
        )
    old_stores = {s.name for s in old.stores}
    plans = []
    for store in new.stores:
        migration = _migration(new, store.name)
        target = SnapshotStore.of(new_layout, store.name)
        latest = target.latest()
        if latest is not None and latest.writer != "migration":
            raise MigrationRefused(
                f"{new.application_id}/{store.name} already has snapshots of its own ({target.path}): reset "
                "the version before migrating into it"
            )
        if migration.source_store not in old_stores:
            if migration.from_store is not None or migration.function is not None:
                raise MigrationRefused(
                    f"job {new.name} v{new.version}: migrations: store {store.name!r} reads "
                    f"{migration.source_store!r}, which v{old.version} does not have (its stores: {sorted(old_stores)})"
                )
            plans.append(StoreMigrationPlan(store.name, None, "empty", str(target.path)))
            continue
        source = SnapshotStore.of(old_layout, migration.source_store)
        snapshot = source.latest()
        tail = tail_records(
            settings.kafka,
            old_layout.changelog_topic(migration.source_store),
            snapshot.changelog_offsets if snapshot else None,
        )
        plans.append(
            StoreMigrationPlan(
                store.name,
                migration.source_store,
                migration.function or "copy",
                str(target.path),
                snapshot,
                tail,
                latest if latest is not None and latest.batch_id == MIGRATED_BATCH_ID else None,
            )
        )
    if not any(p.snapshot is not None or p.tail_records > 0 or p.migrated for p in plans):
        raise MigrationRefused(
            f"{old.application_id} has no state to migrate (no snapshot, an empty changelog): start "
            f"{new.application_id} side by side instead"
        )
    outputs = [
        (str(o), str(n))
        for o, n in zip(old_layout.output_tables, new_layout.output_tables, strict=False)
        if _is_delta(o)
    ]
    return MigrationPlan(old.name, old.version, new.version, plans, outputs)


def _is_delta(table: Location) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(str(table), storage_options=table.storage_options())


def output_version_at(table: Location, transaction_app_id: str, batch_id: int) -> int:
    """The newest Delta version of an output ``table`` that holds what batches up to ``batch_id`` wrote and
    nothing a later batch wrote: a job writes its outputs as Delta idempotent writes whose transaction
    version is the batch id, which only grows, so the versions are searched by halves."""
    from deltalake import DeltaTable

    def written_up_to(version: int) -> int:
        loaded = DeltaTable(str(table), version=version, storage_options=table.storage_options())
        return loaded.transaction_version(transaction_app_id) or -1

    low, high = 0, DeltaTable(str(table), storage_options=table.storage_options()).version()
    if written_up_to(high) <= batch_id:
        return high
    if written_up_to(low) > batch_id:
        raise MigrationRefused(f"{table}: its first version holds batch outputs after batch {batch_id}")
    while high - low > 1:  # invariant: written_up_to(low) <= batch_id < written_up_to(high)
        middle = (low + high) // 2
        if written_up_to(middle) <= batch_id:
            low = middle
        else:
            high = middle
    return low


def copy_outputs(settings: Settings, old: JobSpec, new: JobSpec, batch_id: int, spark) -> dict[str, int]:
    """Replace ``new``'s output tables by ``old``'s as they were after ``batch_id`` (see
    :func:`output_version_at`); returns table -> the old table's Delta version copied. The new version has
    not run (:func:`plan_migration` checks), so its tables hold nothing of its own."""
    old_layout, new_layout = JobLayout.of(old, settings), JobLayout.of(new, settings)
    copied = {}
    for source, target in zip(old_layout.output_tables, new_layout.output_tables, strict=False):
        if not _is_delta(source):
            continue
        version = output_version_at(source, old_layout.output_transaction_app_id, batch_id)
        rows = spark.read.format("delta").option("versionAsOf", version).load(str(source))
        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(str(target))
        copied[str(target)] = version
    return copied


def migrated_and_running(settings: Settings, new: JobSpec) -> SnapshotInfo | None:
    """The migrated snapshot ``new`` started from, once it has committed batches of its own since (a
    migration that already happened: a re-run of the reprocessing resumes after it), else None."""
    layout = JobLayout.of(new, settings)
    if latest_committed_batch_id(layout.checkpoint) is None:
        return None
    for store in new.stores:
        history = SnapshotStore.of(layout, store.name).history()
        if history and history[0].writer == "migration":
            return history[0]
    return None


def load_function(reference: str) -> Callable:
    """``module:function`` -> the function."""
    module_name, _, name = reference.partition(":")
    return getattr(importlib.import_module(module_name), name)


def _store_frame(frame, where: str):
    """``frame`` as the store's DataFrame(key STRING, value STRING) with no deleted keys, or a clear error."""
    from pyspark.sql import functions as F

    columns = {f.name: f.dataType.simpleString() for f in frame.schema.fields}
    if columns != {"key": "string", "value": "string"}:
        raise MigrationRefused(f"{where} returned columns {columns}; a store is key STRING, value STRING (JSON)")
    return frame.select("key", "value").where(F.col("key").isNotNull() & F.col("value").isNotNull())


def write_migrated(
    target: SnapshotStore, frame, input_offsets: KafkaOffsets, watermark_ms: int, migrated_from: str
) -> SnapshotInfo:
    """Commit ``frame`` (key, value) as the store's first snapshot at ``input_offsets`` (idempotent)."""
    return target.write_frame(frame, MIGRATED_BATCH_ID, input_offsets, {}, watermark_ms, migrated_from=migrated_from)


def migrate_state(settings: Settings, old: JobSpec, new: JobSpec, spark) -> dict[str, SnapshotInfo]:
    """Build ``new``'s stores from ``old``'s state (see the module docstring); returns the new snapshots.

    Raises:
        MigrationRefused: see :func:`plan_migration`; also when the old stores were cut at different
            input positions, or a migration function returns another shape than (key, value).
    """
    plan = plan_migration(settings, old, new)
    old_layout, new_layout = JobLayout.of(old, settings), JobLayout.of(new, settings)
    done = {p.store: p.migrated for p in plan.stores if p.migrated is not None}
    restored = {}
    for p in plan.stores:
        if p.migrated is None and p.from_store is not None:
            source = SnapshotStore.of(old_layout, p.from_store)
            changelog = old_layout.changelog_topic(p.from_store)
            restored[p.store] = restore_from_snapshot(
                source, settings.kafka, changelog, SilentRestoreListener(), spark=spark
            )
    positions = {json.dumps(r.input_offsets, sort_keys=True) for r in restored.values()}
    positions |= {json.dumps(s.input_offsets, sort_keys=True) for s in done.values()}
    if len(positions) > 1:
        raise MigrationRefused(
            f"{old.application_id}'s stores are at different input positions {sorted(positions)} (it was between "
            f"two stores' batches, or an earlier run migrated some stores): run again, or reset "
            f"{new.application_id} and migrate all stores at once"
        )
    if restored:  # (a re-run after every store was migrated keeps the outputs copied with them)
        copy_outputs(settings, old, new, next(iter(restored.values())).batch_id, spark)
    for p in plan.stores:
        if p.store not in restored:
            continue
        state = restored[p.store]
        frame = state.store_frame(spark)
        where = f"migration of {new.application_id}/{p.store}"
        if p.function != "copy":
            where += f" ({p.function})"
            frame = load_function(p.function)(frame)
        origin = f"{old.application_id}/{p.from_store}@batch {state.batch_id}"
        target = SnapshotStore.of(new_layout, p.store)
        done[p.store] = write_migrated(
            target, _store_frame(frame, where), state.input_offsets, state.watermark_ms, origin
        )
    return done


def read_store(settings: Settings, spec: JobSpec, store: str, spark, *, batch_id: int | None = None):
    """A version's store as DataFrame(key, value JSON) at its snapshot of ``batch_id`` (default: the latest
    snapshot; older ones by Delta time travel, within the table's retention), for analysis or a backfill."""
    snapshots = SnapshotStore.of(JobLayout.of(spec, settings), store)
    history = snapshots.history()
    chosen = history[-1] if history and batch_id is None else next((s for s in history if s.batch_id == batch_id), None)
    if chosen is None:
        batches = [s.batch_id for s in history]
        raise LookupError(f"{spec.application_id}/{store}: no snapshot at batch {batch_id} (snapshots: {batches})")
    return snapshots.frame(spark, chosen)


def bootstrap_store(
    settings: Settings,
    spec: JobSpec,
    store: str,
    frame,
    input_offsets: KafkaOffsets,
    *,
    watermark_ms: int = 0,
    source: str = "a provided table",
) -> SnapshotInfo:
    """Make ``frame`` (key, value JSON; e.g. a backfill computed in batch) a version's starting state: the
    version restores it and reads its source from ``input_offsets`` ({topic: {partition: offset}}).

    Raises:
        MigrationRefused: the version already runs from its own state or has snapshots of its own.
    """
    layout = JobLayout.of(spec, settings)
    if latest_committed_batch_id(layout.checkpoint) is not None:
        raise MigrationRefused(f"{spec.application_id} has committed batches of its own: reset it before a bootstrap")
    target = SnapshotStore.of(layout, store)
    latest = target.latest()
    if latest is not None and latest.batch_id != MIGRATED_BATCH_ID:
        raise MigrationRefused(f"{spec.application_id}/{store} already has snapshots of its own ({target.path})")
    return write_migrated(
        target, _store_frame(frame, f"bootstrap of {spec.application_id}/{store}"), input_offsets, watermark_ms, source
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a job version's state from the previous version's state.")
    parser.add_argument("job")
    parser.add_argument("from_version", type=int)
    parser.add_argument("to_version", type=int)
    parser.add_argument("--dry-run", action="store_true", help="print the plan; change nothing")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    old, new = get_job(args.job, args.from_version), get_job(args.job, args.to_version)
    if (done := migrated_and_running(settings, new)) is not None:
        print(
            f"{new.application_id} started from {done.migrated_from} and runs from its own state since: nothing to do"
        )
        return 0
    try:
        plan = plan_migration(settings, old, new)
        print(plan.render())
        if args.dry_run:
            return 0
        from spark_jobs.driver.session import build_spark_session

        spark = build_spark_session(settings, f"migrate-{new.application_id}")
        for store, snapshot in migrate_state(settings, old, new, spark).items():
            print(
                json.dumps(
                    {
                        "store": store,
                        "rows": snapshot.rows,
                        "batch_id": snapshot.batch_id,
                        "input_offsets": snapshot.input_offsets,
                        "migrated_from": snapshot.migrated_from,
                    }
                )
            )
    except MigrationRefused as err:
        print(f"refused: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
