"""Delta state snapshots: the full state of a store at a complete micro-batch, with where it stands.

One Delta table per store (``<lake>/_state/<application_id>/<store>``, columns ``key``, ``value``).
Each snapshot is one overwrite commit; its commit ``userMetadata`` records the batch id, the input
offsets the state corresponds to and the changelog offsets to resume from. So:

* the table's history *is* the snapshot log, and older snapshots stay readable by time travel until
  the configured retention (``delta.logRetentionDuration`` / ``deletedFileRetentionDuration``);
* a snapshot write that dies half-way never commits, so readers only ever see complete snapshots.

A snapshot is built from the previous snapshot plus the changelog tail up to the last complete
batch (:func:`take_snapshot`), never from a live query, so it is consistent by construction. It is
written in one of two modes (:data:`SnapshotMode`):

* ``full``: the whole state, one overwrite (a first snapshot, or a store small enough for the driver);
* ``incremental``: a MERGE of the tail's changes (the latest value per changed key, null: deleted)
  over the previous snapshot. Snapshot tables have deletion vectors on, so a MERGE writes the changed
  rows and marks the replaced ones deleted instead of rewriting every file that holds a changed key:
  it writes about the changed keys' bytes (though it reads the key column of every file it may touch,
  which for keys changed at random is every file: BENCHMARKS.md). Spark's executors run the job's incremental
  snapshots; the warm standby (:mod:`spark_jobs.standby`) commits the same kind with delta-rs.

Both carry the same metadata. An incremental commit records the rows of the snapshot it was merged
over; its own row count is that plus the MERGE's inserted minus deleted rows (the commit's
``operationMetrics``), so no writer scans the table to count it.
:class:`SnapshotStore` is the only code that reads or writes a snapshot table (driver, standby, state
API, audit); it does not read Kafka. It works without Spark (delta-rs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Literal

from spark_jobs.layout import JobLayout, snapshot_table_path
from spark_jobs.state.checkpoint_offsets import KafkaOffsets

METADATA_KIND = "streamstate.snapshot/v1"

#: how a snapshot was written: the whole state (an overwrite) or the changes since the previous one (a MERGE)
SnapshotMode = Literal["full", "incremental"]


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot: a Delta version of the store's snapshot table and what it corresponds to."""

    delta_version: int
    application_id: str
    store: str
    batch_id: int
    input_offsets: KafkaOffsets
    changelog_offsets: dict[int, int]
    rows: int
    taken_at: str
    #: bytes the snapshot's commit wrote (the whole table when ``full``, the changed rows when ``incremental``)
    bytes: int = 0
    #: the event-time watermark of ``batch_id`` (0: none)
    watermark_ms: int = 0
    #: the snapshot holds every change written to the changelog before this time (epoch ms; 0: unknown)
    as_of_ms: int = 0
    #: who wrote it: ``driver`` (the job's cadence) or ``standby`` (the warm standby)
    writer: str = "driver"
    mode: SnapshotMode = "full"
    #: ``incremental``: the rows of the snapshot the changes were merged over
    rows_before: int | None = None

    def metadata_json(self) -> str:
        """The commit's ``userMetadata``. An incremental snapshot's ``rows`` is not known before its MERGE
        commits: it records ``rows_before`` and :meth:`from_commit` adds the MERGE's metrics."""
        incremental = self.mode == "incremental"
        return json.dumps(
            {
                "kind": METADATA_KIND,
                "application_id": self.application_id,
                "store": self.store,
                "batch_id": self.batch_id,
                "rows": None if incremental else self.rows,
                "rows_before": self.rows_before if incremental else None,
                "mode": self.mode,
                "taken_at": self.taken_at,
                "watermark_ms": self.watermark_ms,
                "input_offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.input_offsets.items()},
                "changelog_offsets": {str(p): o for p, o in self.changelog_offsets.items()},
                "as_of_ms": self.as_of_ms,
                "writer": self.writer,
            },
            sort_keys=True,
        )

    @classmethod
    def from_commit(cls, version: int, user_metadata: str | None, metrics: dict) -> SnapshotInfo | None:
        """The snapshot a commit wrote (None: the commit is not a snapshot), from its ``userMetadata`` and
        ``operationMetrics`` (Spark names them in camelCase, delta-rs in snake_case)."""
        try:
            data = json.loads(user_metadata or "")
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("kind") != METADATA_KIND:
            return None
        mode = data.get("mode", "full")
        if mode == "incremental":
            changed = _metric(metrics, "numTargetRowsInserted", "num_target_rows_inserted") - _metric(
                metrics, "numTargetRowsDeleted", "num_target_rows_deleted"
            )
            rows = int(data["rows_before"]) + changed
        else:
            rows = int(data["rows"])
        return cls(
            delta_version=version,
            application_id=data["application_id"],
            store=data["store"],
            batch_id=int(data["batch_id"]),
            input_offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in data["input_offsets"].items()},
            changelog_offsets={int(p): int(o) for p, o in data["changelog_offsets"].items()},
            rows=rows,
            taken_at=data["taken_at"],
            # an overwrite's output bytes, a Spark MERGE's bytes added (delta-rs' MERGE reports none)
            bytes=_metric(metrics, "numOutputBytes", "numTargetBytesAdded") or int(data.get("bytes", 0)),
            watermark_ms=int(data.get("watermark_ms", 0)),
            as_of_ms=int(data.get("as_of_ms", 0)),
            writer=data.get("writer", "driver"),
            mode=mode,
            rows_before=data.get("rows_before"),
        )


def _metric(metrics: dict, *names: str) -> int:
    """A commit's operation metric under the first of ``names`` it has (0: none)."""
    return next((int(metrics[n] or 0) for n in names if n in metrics), 0)


def snapshot_history(path: Path | str, limit: int | None = None) -> list[SnapshotInfo]:
    """The snapshots in a store's snapshot table (the newest ``limit`` commits only, when given), oldest first."""
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(path)):
        return []
    infos = []
    for commit in DeltaTable(str(path)).history(limit):
        metadata = commit.get("userMetadata") or _user_metadata(Path(path), int(commit["version"]))
        info = SnapshotInfo.from_commit(int(commit["version"]), metadata, commit.get("operationMetrics") or {})
        if info is not None:
            infos.append(info)
    return sorted(infos, key=lambda i: i.delta_version)


def _user_metadata(path: Path, version: int) -> str | None:
    """A commit's ``userMetadata`` read from the commit file itself (some delta-rs history rows omit it)."""
    commit = path / "_delta_log" / f"{version:020d}.json"
    if not commit.exists():
        return None
    for line in commit.read_text().splitlines():
        if '"commitInfo"' in line:
            return json.loads(line)["commitInfo"].get("userMetadata")
    return None


def latest_snapshot(path: Path | str) -> SnapshotInfo | None:
    """The newest snapshot: nearly always the newest commit, so the full history is read only if not."""
    for limit in (20, None):
        history = snapshot_history(path, limit)
        if history:
            return history[-1]
    return None


snapshot_path = snapshot_table_path  # the table's name has one owner: spark_jobs.layout


def snapshot_table_configuration(retention: str = "7 days") -> dict[str, str]:
    """Table properties of a new snapshot table: old snapshots stay readable by time travel this long, and
    a MERGE marks replaced rows in deletion vectors instead of rewriting their files (incremental snapshots)."""
    return {
        "delta.logRetentionDuration": f"interval {retention}",
        "delta.deletedFileRetentionDuration": f"interval {retention}",
        "delta.enableDeletionVectors": "true",
    }


class SnapshotConflict(RuntimeError):
    """Someone else committed to the snapshot table since the writer's last read."""


class SnapshotStore:
    """The only reader and writer of one store's snapshot table.

    In this process, with delta-rs: the full snapshots of a store small enough for the driver
    (:meth:`write`), the warm standby's incremental ones (:meth:`merge`), the state API's and the audit's
    reads (:meth:`read`; a Spark job would only add its start-up to one Parquet scan). With Spark's
    executors, for a store too large for one process: reads (:meth:`frame`), full snapshots
    (:meth:`write_frame`) and incremental ones (:meth:`merge_frame`).
    """

    @classmethod
    def of(cls, layout: JobLayout, store: str) -> SnapshotStore:
        """The snapshot table of ``store`` of the job version ``layout`` names."""
        return cls(layout.snapshot_table(store), layout.application_id, store)

    def __init__(self, path: Path | str, application_id: str, store: str, retention: str = "7 days",
                 file_size_bytes: int = 128 * 1024 * 1024) -> None:  # fmt: skip
        """``file_size_bytes``: Parquet files of a snapshot are cut at about this size (a big state is
        then several files that a reader can scan in parallel, not one huge one)."""
        self.path = str(path)
        self.application_id = application_id
        self.store = store
        self.retention = retention
        self.file_size_bytes = file_size_bytes

    @property
    def transaction_app_id(self) -> str:
        """Delta ``txn`` application id: a snapshot of a batch already committed is not written twice."""
        return f"streamstate-snapshot:{self.application_id}:{self.store}"

    def history(self) -> list[SnapshotInfo]:
        """Every snapshot still in the table's history, oldest first."""
        return snapshot_history(self.path)

    def latest(self) -> SnapshotInfo | None:
        return latest_snapshot(self.path)

    def exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.path)

    def version(self) -> int | None:
        """The table's current Delta version (None: no table yet)."""
        from deltalake import DeltaTable

        return DeltaTable(self.path).version() if self.exists() else None

    def read(self, info: SnapshotInfo) -> dict[bytes, bytes]:
        """The state of one snapshot (time travel to its Delta version)."""
        return {k.encode(): v.encode() for k, v in self.read_text(info).items()}

    def read_text(self, info: SnapshotInfo) -> dict[str, str]:
        """The state of one snapshot as text (keys and values are UTF-8 JSON/strings in the table)."""
        table = self._arrow(self.readable_version(info), ["key", "value"])
        return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))

    def frame(self, spark, info: SnapshotInfo):
        """One snapshot as a lazy DataFrame(key STRING, value STRING), read by Spark's executors (Delta time
        travel, see :meth:`readable_version`): the restore path for stores too large for one process."""
        version = self.readable_version(info)
        return spark.read.format("delta").option("versionAsOf", version).load(self.path).select("key", "value")

    def values(self, info: SnapshotInfo) -> list[str]:
        """The values of one snapshot, without their keys (the audit's scan of what a store holds)."""
        return [v for v in self._arrow(self.readable_version(info), ["value"]).column("value").to_pylist() if v]

    def readable_version(self, info: SnapshotInfo) -> int:
        """The Delta version to read ``info`` at: the table's current version while no snapshot came after
        it (the commits since are maintenance, which changes files, not rows), else its own version.

        Compaction removes the files a snapshot's own version lists and vacuum deletes them once the
        time-travel window has passed, so the latest snapshot of a job stopped longer than that is only
        readable at the current version; older snapshots are readable inside the window only.
        """
        current = self.version()
        if current is None or current == info.delta_version:
            return info.delta_version
        later = [
            s for s in snapshot_history(self.path, current - info.delta_version) if s.delta_version > info.delta_version
        ]
        return info.delta_version if later else current

    def files(self) -> list[int]:
        """The sizes in bytes of the Parquet files the table's current version is made of."""
        import pyarrow as pa
        from deltalake import DeltaTable

        if not self.exists():
            return []
        actions = pa.table(DeltaTable(self.path).get_add_actions(flatten=True)).select(["size_bytes"])
        return [int(size) for size in actions.column("size_bytes").to_pylist()]

    def _arrow(self, version: int, columns: list[str]):
        import pyarrow as pa
        from deltalake import DeltaTable

        # scan() applies deletion vectors (an incremental snapshot's replaced rows); to_pyarrow_table refuses them
        return pa.table(DeltaTable(self.path, version=version).scan(columns=columns))

    def write(self, state: dict[bytes, bytes], batch_id: int, input_offsets: KafkaOffsets,
              changelog_offsets: dict[int, int], watermark_ms: int = 0) -> SnapshotInfo:  # fmt: skip
        """Commit ``state`` as a new snapshot (one atomic Delta overwrite); a second write of the same
        batch (a retried task) commits nothing and returns the first."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        info = self._new_info(batch_id, input_offsets, changelog_offsets, len(state), watermark_ms)
        created = not (Path(self.path) / "_delta_log").is_dir()
        committed = None if created else DeltaTable(self.path).transaction_version(self.transaction_app_id)
        if committed is None or committed < batch_id:
            schema = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())])
            table = pa.table({"key": [k.decode() for k in state], "value": [v.decode() for v in state.values()]},
                             schema=schema)  # fmt: skip
            # The txn action records the batch (checked above), and keeps even an empty state over an empty
            # state a real commit; old snapshots stay readable by time travel for ``retention``.
            write_deltalake(
                self.path, table, mode="overwrite", target_file_size=self.file_size_bytes,
                commit_properties=CommitProperties(custom_metadata={"userMetadata": info.metadata_json()},
                                                   app_transactions=[Transaction(self.transaction_app_id, batch_id)]),
                configuration=snapshot_table_configuration(self.retention) if created else None,
            )  # fmt: skip
        return self._committed(batch_id)

    def _new_info(
        self,
        batch_id: int,
        input_offsets: KafkaOffsets,
        changelog_offsets: dict[int, int],
        rows: int,
        watermark_ms: int,
    ) -> SnapshotInfo:
        return SnapshotInfo(
            delta_version=-1,
            application_id=self.application_id,
            store=self.store,
            batch_id=batch_id,
            input_offsets=input_offsets,
            changelog_offsets=dict(changelog_offsets),
            rows=rows,
            taken_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            watermark_ms=watermark_ms,
        )

    def _committed(self, batch_id: int) -> SnapshotInfo:
        """The snapshot of ``batch_id`` just committed (or committed by an earlier try of the same batch)."""
        written = next((i for i in reversed(snapshot_history(self.path, 20)) if i.batch_id == batch_id), None)
        if written is None:
            raise RuntimeError(f"snapshot of {self.application_id}/{self.store} at batch {batch_id} was not committed")
        return written

    def write_frame(
        self,
        frame,
        batch_id: int,
        input_offsets: KafkaOffsets,
        changelog_offsets: dict[int, int],
        watermark_ms: int = 0,
    ) -> SnapshotInfo:
        """:meth:`write` for a state Spark holds (DataFrame(key, value)): Spark's executors write it, one
        atomic Delta overwrite, idempotent per batch through Delta's own ``txnAppId``/``txnVersion``; the
        state never enters this process."""
        from deltalake import DeltaTable
        from pyspark import StorageLevel

        if not self.exists():  # created by delta-rs, with the retention properties (a commit without a snapshot)
            import pyarrow as pa

            schema = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())])
            DeltaTable.create(self.path, schema, configuration=snapshot_table_configuration(self.retention))
        committed = DeltaTable(self.path).transaction_version(self.transaction_app_id)
        if committed is None or committed < batch_id:
            frame = frame.persist(StorageLevel.DISK_ONLY)  # counted, then written: evaluated once, on the executors
            try:
                info = self._new_info(batch_id, input_offsets, changelog_offsets, frame.count(), watermark_ms)
                (
                    frame.write.format("delta")
                    .mode("overwrite")
                    .option("txnAppId", self.transaction_app_id)
                    .option("txnVersion", batch_id)
                    .option("userMetadata", info.metadata_json())
                    .save(self.path)
                )
            finally:
                frame.unpersist()
        return self._committed(batch_id)

    def merge_frame(
        self,
        changes,
        base: SnapshotInfo,
        batch_id: int,
        input_offsets: KafkaOffsets,
        changelog_offsets: dict[int, int],
        watermark_ms: int = 0,
    ) -> SnapshotInfo:
        """An incremental snapshot written by Spark's executors: one Delta MERGE of ``changes``
        (DataFrame(key, value): the latest value of every key changed since ``base``, null: deleted) over
        the table at ``base``. Deletion vectors keep its writes to the changed rows; idempotent per batch
        like :meth:`write_frame`.

        Raises:
            SnapshotConflict: the table is no longer at ``base`` (another snapshot landed since).
        """
        from delta.tables import DeltaTable as SparkDeltaTable
        from deltalake import DeltaTable

        from spark_jobs.session import session_conf

        committed = DeltaTable(self.path).transaction_version(self.transaction_app_id)
        if committed is not None and committed >= batch_id:
            return self._committed(batch_id)
        if self.version() != base.delta_version:
            raise SnapshotConflict(f"{self.path} changed since version {base.delta_version}")
        spark = changes.sparkSession
        if DeltaTable(self.path).metadata().configuration.get("delta.enableDeletionVectors") != "true":
            # a table created before snapshots were incremental: one protocol upgrade, then MERGEs stay cheap
            spark.sql(f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        info = dataclasses.replace(
            self._new_info(batch_id, input_offsets, changelog_offsets, base.rows, watermark_ms),
            mode="incremental",
            rows_before=base.rows,
        )
        # A MERGE takes its commit's metadata and transaction from the session, not from options.
        with session_conf(
            spark,
            {
                "spark.databricks.delta.commitInfo.userMetadata": info.metadata_json(),
                "spark.databricks.delta.write.txnAppId": self.transaction_app_id,
                "spark.databricks.delta.write.txnVersion": str(batch_id),
            },
        ):
            (
                SparkDeltaTable.forPath(spark, self.path)
                .alias("t")
                .merge(changes.alias("s"), "t.key = s.key")
                .whenMatchedDelete("s.value IS NULL")
                .whenMatchedUpdate("s.value IS NOT NULL", {"value": "s.value"})
                .whenNotMatchedInsert("s.value IS NOT NULL", {"key": "s.key", "value": "s.value"})
                .execute()
            )
        return self._committed(batch_id)

    def merge(
        self,
        changes: dict[bytes, bytes | None],
        info: SnapshotInfo,
        *,
        expected_version: int | None,
        previous_rows: int | None = None,
    ) -> SnapshotInfo:
        """Commit ``changes`` (key -> new value, None: deleted) over the table as a new snapshot described
        by ``info``: one Delta MERGE (the warm standby's write; delta-rs writes no deletion vectors, so it
        rewrites every file that holds a changed key).
        ``previous_rows``: the rows of the table at ``expected_version`` (counted when not given).

        Raises:
            SnapshotConflict: the table is no longer at ``expected_version`` (a driver snapshot landed).
        """
        import pyarrow as pa
        import pyarrow.compute as pc
        from deltalake import CommitProperties, DeltaTable, write_deltalake

        if self.version() != expected_version:
            raise SnapshotConflict(f"{self.path} changed since version {expected_version}")
        schema = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())])
        keys = [k.decode() for k in changes]
        values = [None if v is None else v.decode() for v in changes.values()]
        source = pa.table({"key": keys, "value": values}, schema=schema)
        if expected_version is None:
            live = source.filter(pc.is_valid(source.column("value")))
            info = dataclasses.replace(info, rows=live.num_rows, mode="full")
            metadata = CommitProperties(custom_metadata={"userMetadata": info.metadata_json()})
            write_deltalake(
                self.path,
                live,
                mode="error",
                commit_properties=metadata,
                configuration=snapshot_table_configuration(self.retention),
            )
            return dataclasses.replace(info, delta_version=DeltaTable(self.path).version())
        if previous_rows is None:
            previous_rows = self._arrow(expected_version, ["key"]).num_rows
        info = dataclasses.replace(info, rows=previous_rows, mode="incremental", rows_before=previous_rows)
        metadata = CommitProperties(custom_metadata={"userMetadata": info.metadata_json()})
        # a commit racing this one (after the check above) fails the MERGE's own commit
        (
            DeltaTable(self.path)
            .merge(source, "t.key = s.key", source_alias="s", target_alias="t", commit_properties=metadata)
            .when_matched_delete("s.value IS NULL")
            .when_matched_update(updates={"value": "s.value"}, predicate="s.value IS NOT NULL")
            .when_not_matched_insert(updates={"key": "s.key", "value": "s.value"}, predicate="s.value IS NOT NULL")
            .execute()
        )
        return snapshot_history(self.path, 1)[-1]

    def maintain(self, *, dry_run: bool = True, writer_running: str | None = None):
        """Compact the table's small files and vacuum files past the time-travel window
        (:func:`spark_jobs.maintenance.maintain_table`); every snapshot inside the window stays readable."""
        from spark_jobs.maintenance import maintain_table

        return maintain_table(self.path, "snapshot", dry_run=dry_run, writer_running=writer_running)
