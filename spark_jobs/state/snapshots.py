"""Delta state snapshots: the full state of a store at a complete micro-batch, with where it stands.

One Delta table per store (``<lake>/_state/<application_id>/<store>``, columns ``key``, ``value``,
``layer``). Each snapshot is one commit (an overwrite or an append, below); its commit ``userMetadata``
records the batch id, the input offsets the state corresponds to and the changelog offsets to resume
from. So:

* the table's history *is* the snapshot log, and older snapshots stay readable by time travel until
  the configured retention (``delta.logRetentionDuration`` / ``deletedFileRetentionDuration``);
* a snapshot write that dies half-way never commits, so readers only ever see complete snapshots.

A snapshot is built from the previous snapshot plus the changelog tail up to the last complete
batch (:func:`take_snapshot`), never from a live query, so it is consistent by construction. It is
written in one of two modes (:data:`SnapshotMode`), the way RocksDB-backed incremental checkpoints are
(Flink): a base and the layers of changes on top of it.

* ``full``: the whole state, one overwrite (the *base*: rows whose ``layer`` is null). A first
  snapshot, a store small enough for the driver, or a *fold* of the layers into a new base.
* ``layered``: one append of the tail's changes (the latest value per changed key, null: deleted),
  tagged ``layer`` = the snapshot's batch id. It costs the changed keys only: nothing is looked up
  or rewritten. A reader takes each key's value from its newest layer, else from the base
  (:func:`resolve_layers`, :meth:`SnapshotStore.frame`). Once the layers hold more rows than
  ``fold_fraction`` of the base (or ``max_layers`` of them exist), the next snapshot is a fold.

Both carry the same metadata. A layered snapshot does not know its live row count (that would need a
lookup of every changed key in the base): its ``rows`` is None, and ``rows_scanned`` (base + layers)
is what a reader reads. Spark's executors write the job's snapshots of large stores; the warm standby
(:mod:`spark_jobs.operations.standby`) appends layers with delta-rs.
:class:`SnapshotStore` is the only code that reads or writes a snapshot table (driver, standby, state
API, audit); it does not read Kafka. It works without Spark (delta-rs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Literal

from runtime.object_store import Location
from spark_jobs.io.table_maintenance import maintain_table
from spark_jobs.layout import JobLayout, snapshot_table_path
from spark_jobs.state.checkpoint_offsets import KafkaOffsets

METADATA_KIND = "streamstate.snapshot/v1"

#: a Spark read filters the base against at most this many changed keys held in the driver and broadcast
#: (tens of MB, :func:`overlay`) instead of shuffling the base: Spark cannot tell from the table's statistics
#: how few they are
BROADCAST_MAX_KEYS = 2_000_000

#: how a snapshot was written: the whole state (an overwrite: a new base) or a layer of changes on the latest one
SnapshotMode = Literal["full", "layered"]
#: who writes snapshots (see ``SnapshotInfo.writer``)
SnapshotWriter = Literal["driver", "standby", "migration"]


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot: a Delta version of the store's snapshot table and what it corresponds to."""

    delta_version: int
    application_id: str
    store: str
    batch_id: int
    input_offsets: KafkaOffsets
    changelog_offsets: dict[int, int]
    #: live keys (None for a ``layered`` snapshot: counting them would look every changed key up in the base)
    rows: int | None
    taken_at: str
    #: bytes the snapshot's commit wrote (the whole state when ``full``, the layer when ``layered``)
    bytes: int = 0
    #: the event-time watermark of ``batch_id`` (0: none)
    watermark_ms: int = 0
    #: the snapshot holds every change written to the changelog before this time (epoch ms; 0: unknown)
    as_of_ms: int = 0
    #: who wrote it: ``driver`` (the job's cadence), ``standby`` (the warm standby) or ``migration`` (built
    #: from another version's state: :mod:`spark_jobs.state.migration`)
    writer: SnapshotWriter = "driver"
    mode: SnapshotMode = "full"
    #: ``layered``: the batch of the base (the last ``full`` snapshot) the layers lie on, and its rows
    base_batch_id: int | None = None
    base_rows: int | None = None
    #: ``layered``: rows in the layers since the base (this one included), and how many layers there are
    layer_rows: int = 0
    layers: int = 0
    #: ``migration``: the state it was built from, e.g. ``purchase_counts-v3/counts@batch 1000000004``
    migrated_from: str = ""

    @property
    def base_batch(self) -> int:
        """The batch of the base: layers of later batches lie on it (rows of older layers are stale)."""
        return self.batch_id if self.base_batch_id is None else self.base_batch_id

    @property
    def rows_scanned(self) -> int:
        """The rows a reader of this snapshot reads: the base and its layers."""
        return self.layer_rows + (self.base_rows or 0) if self.mode == "layered" else self.rows or 0

    def metadata_json(self) -> str:
        """The commit's ``userMetadata``. A layer's row count is not known before it commits: it records
        the layers' rows before it, and :meth:`from_commit` adds the rows its commit wrote."""
        layered = self.mode == "layered"
        return json.dumps(
            {
                "kind": METADATA_KIND,
                "application_id": self.application_id,
                "store": self.store,
                "batch_id": self.batch_id,
                "rows": None if layered else self.rows,
                "mode": self.mode,
                "base_batch_id": self.base_batch_id if layered else None,
                "base_rows": self.base_rows if layered else None,
                "layer_rows_before": self.layer_rows if layered else None,
                "layers": self.layers if layered else 0,
                "taken_at": self.taken_at,
                "watermark_ms": self.watermark_ms,
                "input_offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.input_offsets.items()},
                "changelog_offsets": {str(p): o for p, o in self.changelog_offsets.items()},
                "as_of_ms": self.as_of_ms,
                "writer": self.writer,
                "migrated_from": self.migrated_from or None,
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
        layered = data.get("mode") == "layered"
        if layered:
            rows, layer_rows = (
                None,
                int(data["layer_rows_before"]) + _metric(metrics, "numOutputRows", "num_added_rows"),
            )
        elif data.get("mode") == "incremental":  # a MERGE over the previous snapshot (written before layers)
            inserted = _metric(metrics, "numTargetRowsInserted", "num_target_rows_inserted")
            rows, layer_rows = (
                int(data["rows_before"])
                + inserted
                - _metric(metrics, "numTargetRowsDeleted", "num_target_rows_deleted"),
                0,
            )
        else:
            rows, layer_rows = int(data["rows"]), 0
        return cls(
            delta_version=version,
            application_id=data["application_id"],
            store=data["store"],
            batch_id=int(data["batch_id"]),
            input_offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in data["input_offsets"].items()},
            changelog_offsets={int(p): int(o) for p, o in data["changelog_offsets"].items()},
            rows=rows,
            taken_at=data["taken_at"],
            bytes=_metric(metrics, "numOutputBytes", "num_added_bytes") or int(data.get("bytes", 0)),
            watermark_ms=int(data.get("watermark_ms", 0)),
            as_of_ms=int(data.get("as_of_ms", 0)),
            writer=data.get("writer", "driver"),
            mode="layered" if layered else "full",
            base_batch_id=data["base_batch_id"] if layered else None,
            base_rows=data["base_rows"] if layered else rows,
            layer_rows=layer_rows,
            layers=int(data.get("layers") or 0),
            migrated_from=data.get("migrated_from") or "",
        )

    def layer_on(self, base: SnapshotInfo) -> SnapshotInfo:
        """This snapshot as the next layer on ``base`` (its ``layer_rows`` are added when it commits)."""
        return dataclasses.replace(
            self,
            rows=None,
            mode="layered",
            base_batch_id=base.base_batch,
            base_rows=base.base_rows if base.mode == "layered" else base.rows,
            layer_rows=base.layer_rows,
            layers=base.layers + 1,
        )


def _metric(metrics: dict, *names: str) -> int:
    """A commit's operation metric under the first of ``names`` it has (0: none)."""
    return next((int(metrics[n] or 0) for n in names if n in metrics), 0)


def resolve_layers(table, base_batch: int):
    """The state a snapshot table's rows hold (pyarrow Table(key, value[, layer]) -> Table(key, value)): a
    key's value is its newest layer's (null: deleted), else the base's. Rows of layers at or before
    ``base_batch`` are stale (a layer written after a fold of a later batch raced it) and ignored."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = table.cast(pa.schema([(f.name, pa.string() if f.name != "layer" else f.type) for f in table.schema]))
    if "layer" not in table.column_names:
        return table
    layer = table.column("layer")
    base = table.filter(pc.is_null(layer)).select(["key", "value"])
    layers = table.filter(pc.greater(layer, base_batch))
    if layers.num_rows == 0:
        return base
    newest = (
        layers.sort_by("layer")
        .group_by("key", use_threads=False)  # in order: "last" is the newest layer's value
        .aggregate([("value", "last", pc.ScalarAggregateOptions(skip_nulls=False))])
        .rename_columns(["key", "value"])
    )
    untouched = base.filter(pc.invert(pc.is_in(base.column("key"), value_set=newest.column("key"))))
    return pa.concat_tables([untouched, newest.filter(pc.is_valid(newest.column("value")))])


def overlay(base, changes, *, broadcast: bool):
    """``changes`` applied to ``base`` in Spark, both DataFrame(key STRING, value STRING), a change's null
    value deleting its key: the base's rows whose key no change touches, then the changes' live values.
    What :func:`resolve_layers` does in this process, for a base too large for it.

    ``broadcast``: the changes are few enough to hold in the driver and send to every executor (see
    ``BROADCAST_MAX_KEYS``). They are read once, by this call, and the base is filtered where it is read,
    never shuffled: a Bloom filter of the changed keys ahead of their exact set (``streamstate.state.Overlay``,
    Java; a hash join's probe per base row is the cost it saves, BENCHMARKS.md "the overlay's Bloom filter").
    Otherwise the base is anti-joined with the changes through a shuffle, lazily.

    In the shuffled join the changes are computed once. Both branches use them whole (key and value): a join
    on the keys alone would let the optimizer prune the values from that side, the two branches would then
    plan two different aggregations, and the changes' source (a changelog tail in Kafka, a snapshot's layers)
    would be read twice. With the same plan on both sides Spark reuses the first one's shuffle.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if broadcast:
        spark = base.sparkSession
        return DataFrame(spark._jvm.streamstate.state.Overlay.apply(base._jdf, changes._jdf), spark)
    # the join infers "key IS NOT NULL" on its side; stated here it is on both, so the two plans stay equal
    changes = changes.where(F.col("key").isNotNull())
    touched = changes.select(F.col("key").alias("touched_key"), F.col("value").alias("touched_value"))
    # a touched key is dropped whether its change is a value or a delete; naming the value keeps it planned
    keeps_value = touched["touched_value"].isNull() | touched["touched_value"].isNotNull()
    untouched = base.join(touched, (base["key"] == touched["touched_key"]) & keeps_value, "left_anti")
    return untouched.unionByName(changes.where(F.col("value").isNotNull()))


def snapshot_history(table: Location | Path | str, limit: int | None = None) -> list[SnapshotInfo]:
    """The snapshots in a store's snapshot table (the newest ``limit`` commits only, when given), oldest first."""
    from deltalake import DeltaTable

    table = Location.of(table)
    options = table.storage_options()
    if not DeltaTable.is_deltatable(str(table), storage_options=options):
        return []
    infos = []
    for commit in DeltaTable(str(table), storage_options=options).history(limit):
        metadata = commit.get("userMetadata") or _user_metadata(table, int(commit["version"]))
        info = SnapshotInfo.from_commit(int(commit["version"]), metadata, commit.get("operationMetrics") or {})
        if info is not None:
            infos.append(info)
    return sorted(infos, key=lambda i: i.delta_version)


def _user_metadata(table: Location, version: int) -> str | None:
    """A commit's ``userMetadata`` read from the commit file itself (some delta-rs history rows omit it)."""
    commit = table / "_delta_log" / f"{version:020d}.json"
    if not commit.exists():
        return None
    for line in commit.read_text().splitlines():
        if '"commitInfo"' in line:
            return json.loads(line)["commitInfo"].get("userMetadata")
    return None


def latest_snapshot(table: Location | Path | str) -> SnapshotInfo | None:
    """The newest snapshot: nearly always the newest commit, so the full history is read only if not."""
    for limit in (20, None):
        history = snapshot_history(table, limit)
        if history:
            return history[-1]
    return None


snapshot_path = snapshot_table_path  # the table's name has one owner: spark_jobs.layout


def snapshot_table_configuration(retention: str = "7 days") -> dict[str, str]:
    """Table properties of a new snapshot table: old snapshots stay readable by time travel this long."""
    return {
        "delta.logRetentionDuration": f"interval {retention}",
        "delta.deletedFileRetentionDuration": f"interval {retention}",
    }


class SnapshotConflict(RuntimeError):
    """Someone else committed to the snapshot table since the writer's last read."""


def _table_schema():
    """A snapshot table's columns: a base row has no ``layer``; a layer's rows carry its batch id (null value: deleted)."""
    import pyarrow as pa

    return pa.schema(
        [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()), pa.field("layer", pa.int64())]
    )


class SnapshotStore:
    """The only reader and writer of one store's snapshot table.

    In this process, with delta-rs: the full snapshots of a store small enough for the driver
    (:meth:`write`), the warm standby's layers (:meth:`append_layer`), the state API's and the audit's
    reads (:meth:`read`; a Spark job would only add its start-up to one Parquet scan). With Spark's
    executors, for a store too large for one process: reads (:meth:`frame`), full snapshots
    (:meth:`write_frame`) and layers (:meth:`append_layer_frame`). :meth:`next_mode` says which a new
    snapshot should be.
    """

    @classmethod
    def of(cls, layout: JobLayout, store: str) -> SnapshotStore:
        """The snapshot table of ``store`` of the job version ``layout`` names."""
        return cls(layout.snapshot_table(store), layout.application_id, store)

    def __init__(
        self,
        table: Location | Path | str,
        application_id: str,
        store: str,
        retention: str = "7 days",
        file_size_bytes: int = 128 * 1024 * 1024,
        fold_fraction: float = 0.1,
        max_layers: int = 50,
    ) -> None:
        """``file_size_bytes``: Parquet files of a snapshot are cut at about this size (a big state is
        then several files that a reader can scan in parallel, not one huge one). ``fold_fraction``,
        ``max_layers``: layers are folded into a new base once they hold more rows than this fraction of
        the base, or once there are this many (a reader's work beyond the base stays bounded)."""
        self.table = Location.of(table)
        #: the table's URI: a local path, or ``s3a://`` in an object store
        self.path = str(self.table)
        self.application_id = application_id
        self.store = store
        self.retention = retention
        self.file_size_bytes = file_size_bytes
        self.fold_fraction = fold_fraction
        self.max_layers = max_layers

    @property
    def transaction_app_id(self) -> str:
        """Delta ``txn`` application id: a snapshot of a batch already committed is not written twice."""
        return f"streamstate-snapshot:{self.application_id}:{self.store}"

    def history(self) -> list[SnapshotInfo]:
        """Every snapshot still in the table's history, oldest first."""
        return snapshot_history(self.table)

    def latest(self) -> SnapshotInfo | None:
        return latest_snapshot(self.table)

    def _delta(self, version: int | None = None):
        """The table through delta-rs (with the object store's options when it is in one)."""
        from deltalake import DeltaTable

        return DeltaTable(self.path, version=version, storage_options=self.table.storage_options())

    def exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.path, storage_options=self.table.storage_options())

    def version(self) -> int | None:
        """The table's current Delta version (None: no table yet)."""
        return self._delta().version() if self.exists() else None

    def next_mode(self, latest: SnapshotInfo | None) -> SnapshotMode:
        """How the snapshot after ``latest`` should be written: a layer on it, or a fold into a new base."""
        if latest is None:
            return "full"
        base_rows = latest.base_rows if latest.mode == "layered" else latest.rows
        if latest.layers >= self.max_layers or latest.layer_rows > self.fold_fraction * (base_rows or 0):
            return "full"
        return "layered"

    def read(self, info: SnapshotInfo) -> dict[bytes, bytes]:
        """The state of one snapshot (time travel to its Delta version)."""
        return {k.encode(): v.encode() for k, v in self.read_text(info).items()}

    def read_text(self, info: SnapshotInfo) -> dict[str, str]:
        """The state of one snapshot as text (keys and values are UTF-8 JSON/strings in the table)."""
        table = self.arrow(info)
        return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True))

    def arrow(self, info: SnapshotInfo):
        """The state of one snapshot as a pyarrow Table(key, value), its layers resolved (:func:`resolve_layers`)."""
        import pyarrow as pa

        table = self._delta(self.readable_version(info))
        names = {field.name for field in table.schema().fields}
        columns = [c for c in ("key", "value", "layer") if c in names]
        # scan() applies deletion vectors (snapshots MERGEd before layers existed); to_pyarrow_table refuses them
        return resolve_layers(pa.table(table.scan(columns=columns)), info.base_batch)

    def frame(self, spark, info: SnapshotInfo):
        """One snapshot as a DataFrame(key STRING, value STRING), read by Spark's executors (Delta time travel,
        see :meth:`readable_version`): the restore path for stores too large for one process. Its base is read
        lazily. Its layers are resolved like :func:`resolve_layers` does, by :func:`overlay`: the base's keys a
        layer touches are dropped, and each touched key's newest value added (layers of few keys are read by
        this call, see :func:`overlay`)."""
        from pyspark.sql import functions as F

        table = self._spark_table(spark, self.readable_version(info))
        if "layer" not in table.columns:
            return table.select("key", "value")
        base = table.where(F.col("layer").isNull()).select("key", "value")
        if info.mode != "layered":
            return base
        newest = (
            table.where(F.col("layer") > info.base_batch)
            .groupBy("key")
            .agg(F.max(F.struct("layer", "value")).alias("newest"))
            .select("key", F.col("newest.value").alias("value"))
        )
        return overlay(base, newest, broadcast=info.layer_rows <= BROADCAST_MAX_KEYS)

    def _spark_table(self, spark, version: int):
        """The table's rows at ``version`` as a Spark DataFrame.

        The files of the version come from the Delta log as delta-rs reads it, and Spark scans them as
        plain Parquet: Spark's Delta reader would replay the same log with Spark jobs of its own, seconds
        in a driver's first minute (a restore's), for a table that needs no more than its file list.
        A table whose protocol asks more of a reader than its files (reader version 2 and up: column
        mapping, deletion vectors) is read by Spark's Delta reader, as is one without files.
        """
        import pyarrow as pa

        table = self._delta(version)
        if table.protocol().min_reader_version == 1:
            files = pa.table(table.get_add_actions()).column("path").to_pylist()
            if files and not any("://" in f for f in files):  # relative to the table, as its writers put them
                columns = {"key": "STRING", "value": "STRING", "layer": "BIGINT"}
                names = [field.name for field in table.schema().fields]
                schema = ", ".join(f"{name} {columns[name]}" for name in names if name in columns)
                return spark.read.schema(schema).parquet(*(f"{self.path.rstrip('/')}/{f}" for f in files))
        return spark.read.format("delta").option("versionAsOf", version).load(self.path)

    def values(self, info: SnapshotInfo) -> list[str]:
        """The values of one snapshot, without their keys (the audit's scan of what a store holds)."""
        return [v for v in self.arrow(info).column("value").to_pylist() if v]

    def count(self, info: SnapshotInfo) -> int:
        """The live keys of one snapshot: its ``rows``, or for a layered one a read of the table."""
        return info.rows if info.rows is not None else self.arrow(info).num_rows

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
            s
            for s in snapshot_history(self.table, current - info.delta_version)
            if s.delta_version > info.delta_version
        ]
        return info.delta_version if later else current

    def files(self) -> list[int]:
        """The sizes in bytes of the Parquet files the table's current version is made of."""
        import pyarrow as pa

        if not self.exists():
            return []
        actions = pa.table(self._delta().get_add_actions(flatten=True)).select(["size_bytes"])
        return [int(size) for size in actions.column("size_bytes").to_pylist()]

    def _committed_batch(self) -> int | None:
        """The newest batch whose snapshot this table holds through its ``txn`` (None: none yet)."""
        return self._delta().transaction_version(self.transaction_app_id) if self.exists() else None

    def write(
        self,
        state: dict[bytes, bytes],
        batch_id: int,
        input_offsets: KafkaOffsets,
        changelog_offsets: dict[int, int],
        watermark_ms: int = 0,
    ) -> SnapshotInfo:
        """Commit ``state`` as a new base (one atomic Delta overwrite, which drops every layer); a second write
        of the same batch (a retried task) commits nothing and returns the first."""
        import pyarrow as pa

        info = self.new_info(batch_id, input_offsets, changelog_offsets, watermark_ms, rows=len(state))
        committed = self._committed_batch()
        if committed is None or committed < batch_id:
            keys, values = [k.decode() for k in state], [v.decode() for v in state.values()]
            table = pa.table({"key": keys, "value": values, "layer": pa.nulls(len(keys), pa.int64())}, _table_schema())
            self._write_arrow(table, info, "overwrite")
        return self._committed(batch_id)

    def _write_arrow(self, table, info: SnapshotInfo, mode: Literal["overwrite", "append"]) -> None:
        """One delta-rs commit of ``table`` carrying ``info`` and the batch's ``txn`` (a new table gets the
        retention properties; an older one gains the ``layer`` column). The ``txn`` also keeps an empty
        state over an empty state a real commit; old snapshots stay readable by time travel for ``retention``."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        properties = CommitProperties(
            custom_metadata={"userMetadata": info.metadata_json()},
            app_transactions=[Transaction(self.transaction_app_id, info.batch_id)],
        )
        write_deltalake(
            self.path,
            table,
            mode=mode,
            storage_options=self.table.storage_options(),
            schema_mode="merge" if self.exists() else None,
            target_file_size=self.file_size_bytes,
            commit_properties=properties,
            configuration=None if self.exists() else snapshot_table_configuration(self.retention),
        )

    def new_info(
        self,
        batch_id: int,
        input_offsets: KafkaOffsets,
        changelog_offsets: dict[int, int],
        watermark_ms: int = 0,
        *,
        rows: int = 0,
    ) -> SnapshotInfo:
        """A snapshot of this store at ``batch_id``, described but not yet written (this driver's)."""
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
        written = next((i for i in reversed(snapshot_history(self.table, 20)) if i.batch_id == batch_id), None)
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
        *,
        migrated_from: str = "",
    ) -> SnapshotInfo:
        """:meth:`write` for a state Spark holds (DataFrame(key, value)): Spark's executors write it, one
        atomic Delta overwrite, idempotent per batch through Delta's own ``txnAppId``/``txnVersion``; the
        state never enters this process. ``migrated_from`` names the state it was built from (a migration)."""
        from deltalake import DeltaTable
        from pyspark import StorageLevel

        if not self.exists():  # created by delta-rs, with the retention properties (a commit without a snapshot)
            DeltaTable.create(
                self.path,
                _table_schema(),
                configuration=snapshot_table_configuration(self.retention),
                storage_options=self.table.storage_options(),
            )
        committed = self._committed_batch()
        if committed is None or committed < batch_id:
            frame = frame.persist(StorageLevel.DISK_ONLY)  # counted, then written: evaluated once, on the executors
            try:
                info = self.new_info(batch_id, input_offsets, changelog_offsets, watermark_ms, rows=frame.count())
                if migrated_from:
                    info = dataclasses.replace(info, writer="migration", migrated_from=migrated_from)
                self._write_spark(frame, None, info, "overwrite")
            finally:
                frame.unpersist()
        return self._committed(batch_id)

    def _check_base(self, base: SnapshotInfo | None, batch_id: int | None = None) -> None:
        """Refuse a write over anything but ``base`` (the latest snapshot; maintenance commits since do not
        count), or of a batch not after it."""
        latest = self.latest()
        if (latest.delta_version if latest else None) != (base.delta_version if base else None):
            raise SnapshotConflict(
                f"{self.path}: a snapshot landed after version {base.delta_version if base else None}"
            )
        if base is not None and batch_id is not None and base.batch_id >= batch_id:
            raise SnapshotConflict(f"{self.path}: batch {batch_id} is not after the latest snapshot's {base.batch_id}")

    def append_layer_frame(
        self,
        changes,
        base: SnapshotInfo,
        batch_id: int,
        input_offsets: KafkaOffsets,
        changelog_offsets: dict[int, int],
        watermark_ms: int = 0,
    ) -> SnapshotInfo:
        """A layered snapshot of a state Spark holds: one Spark Delta append of ``changes`` (DataFrame(key,
        value): the latest value of every key changed since ``base``, null: deleted), tagged with
        ``batch_id``, by the executors. It reads nothing of the table; idempotent per batch like
        :meth:`write_frame`. (Few changes are faster through :meth:`append_layer`: a Spark Delta commit
        costs seconds whatever its size, it loads the table's log; BENCHMARKS.md.)

        Raises:
            SnapshotConflict: the table is no longer at ``base`` (another snapshot landed since).
        """
        committed = self._committed_batch()
        if committed is not None and committed >= batch_id:
            return self._committed(batch_id)
        self._check_base(base, batch_id)
        info = self.new_info(batch_id, input_offsets, changelog_offsets, watermark_ms).layer_on(base)
        self._write_spark(changes, batch_id, info, "append")
        return self._committed(batch_id)

    def _write_spark(self, frame, layer: int | None, info: SnapshotInfo, mode: Literal["overwrite", "append"]) -> None:
        """One Spark Delta commit of ``frame``(key, value) tagged ``layer`` (None: base rows) carrying ``info``
        and the batch's ``txnAppId``/``txnVersion`` (an older table gains the ``layer`` column)."""
        from pyspark.sql import functions as F

        (
            frame.withColumn("layer", F.lit(layer).cast("long"))
            .write.format("delta")
            .mode(mode)
            .option("mergeSchema", "true")
            .option("txnAppId", self.transaction_app_id)
            .option("txnVersion", info.batch_id)
            .option("userMetadata", info.metadata_json())
            .save(self.path)
        )

    def append_layer(
        self, changes: dict[bytes, bytes | None], info: SnapshotInfo, *, base: SnapshotInfo | None
    ) -> SnapshotInfo:
        """Commit ``changes`` (key -> new value, None: deleted) as a new snapshot described by ``info``: a
        layer on ``base``, or the first base when there is none. One delta-rs commit: the warm standby's
        write, and a driver's layer of a short changelog tail (:func:`~spark_jobs.state.snapshotting.take_snapshot`).

        Raises:
            SnapshotConflict: the table is no longer at ``base`` (a driver snapshot landed).
        """
        import pyarrow as pa

        self._check_base(base, info.batch_id)
        keys = [k.decode() for k in changes]
        values = [None if v is None else v.decode() for v in changes.values()]
        if base is None:
            live = [(k, v) for k, v in zip(keys, values, strict=True) if v is not None]
            keys, values = [k for k, _ in live], [v for _, v in live]
            info = dataclasses.replace(info, rows=len(keys), mode="full")
            layer = pa.nulls(len(keys), pa.int64())
        else:
            info = info.layer_on(base)
            layer = pa.array([info.batch_id] * len(keys), pa.int64())
        table = pa.table({"key": keys, "value": values, "layer": layer}, _table_schema())
        self._write_arrow(table, info, "overwrite" if base is None else "append")
        return self._committed(info.batch_id)

    def fold(self, info: SnapshotInfo) -> SnapshotInfo:
        """Rewrite the snapshot ``info`` (the latest) as a new base of the same batch, its layers resolved in
        this process (:func:`resolve_layers`; the warm standby's fold). A no-op for a ``full`` snapshot."""
        import pyarrow as pa

        if info.mode != "layered":
            return info
        self._check_base(info)
        table = self.arrow(info)
        table = table.append_column("layer", pa.nulls(table.num_rows, pa.int64())).cast(_table_schema())
        folded = dataclasses.replace(
            info, mode="full", rows=table.num_rows, base_batch_id=None, base_rows=None, layer_rows=0, layers=0
        )
        self._write_arrow(table, folded, "overwrite")
        return snapshot_history(self.table, 1)[-1]

    def maintain(self, *, dry_run: bool = True, writer_running: str | None = None):
        """Compact the table's small files and vacuum files past the time-travel window
        (:func:`spark_jobs.io.table_maintenance.maintain_table`); every snapshot inside the window stays readable."""
        return maintain_table(self.table, "snapshot", dry_run=dry_run, writer_running=writer_running)
