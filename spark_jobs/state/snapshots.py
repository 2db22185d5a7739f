"""Delta state snapshots: the full state of a store at a complete micro-batch, with where it stands.

One Delta table per store (``<lake>/_state/<application_id>/<store>``, columns ``key``, ``value``).
Each snapshot is one overwrite commit; its commit ``userMetadata`` records the batch id, the input
offsets the state corresponds to and the changelog offsets to resume from. So:

* the table's history *is* the snapshot log, and older snapshots stay readable by time travel until
  the configured retention (``delta.logRetentionDuration`` / ``deletedFileRetentionDuration``);
* a snapshot write that dies half-way never commits, so readers only ever see complete snapshots.

A snapshot is built from the previous snapshot plus the changelog tail up to the last complete
batch (:func:`take_snapshot`), never from a live query, so it is consistent by construction.
:class:`SnapshotStore` is the source of truth for snapshots; it does not read Kafka.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

from spark_jobs.state.checkpoint_offsets import KafkaOffsets

METADATA_KIND = "streamstate.snapshot/v1"


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
    bytes: int = 0
    #: the event-time watermark of ``batch_id`` (0: none)
    watermark_ms: int = 0

    def metadata_json(self) -> str:
        return json.dumps({
            "kind": METADATA_KIND, "application_id": self.application_id, "store": self.store,
            "batch_id": self.batch_id, "rows": self.rows, "taken_at": self.taken_at, "watermark_ms": self.watermark_ms,
            "input_offsets": {t: {str(p): o for p, o in ps.items()} for t, ps in self.input_offsets.items()},
            "changelog_offsets": {str(p): o for p, o in self.changelog_offsets.items()},
        }, sort_keys=True)  # fmt: skip

    @classmethod
    def from_commit(cls, version: int, user_metadata: str | None, output_bytes: int) -> SnapshotInfo | None:
        try:
            data = json.loads(user_metadata or "")
        except ValueError:
            return None
        if not isinstance(data, dict) or data.get("kind") != METADATA_KIND:
            return None
        return cls(
            delta_version=version,
            application_id=data["application_id"],
            store=data["store"],
            batch_id=int(data["batch_id"]),
            input_offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in data["input_offsets"].items()},
            changelog_offsets={int(p): int(o) for p, o in data["changelog_offsets"].items()},
            rows=int(data["rows"]),
            taken_at=data["taken_at"],
            bytes=output_bytes,
            watermark_ms=int(data.get("watermark_ms", 0)),
        )


def snapshot_path(lake_dir: Path, application_id: str, store: str) -> Path:
    return lake_dir / "_state" / application_id / store


class SnapshotStore:
    """Writes and reads the snapshots of one store."""

    def __init__(self, spark, path: Path | str, application_id: str, store: str, retention: str = "7 days") -> None:
        self.spark = spark
        self.path = str(path)
        self.application_id = application_id
        self.store = store
        self.retention = retention

    def _exists(self) -> bool:
        from delta.tables import DeltaTable

        return DeltaTable.isDeltaTable(self.spark, self.path)

    def history(self) -> list[SnapshotInfo]:
        """Every snapshot still in the table's history, oldest first."""
        if not self._exists():
            return []
        from delta.tables import DeltaTable

        rows = DeltaTable.forPath(self.spark, self.path).history().select(
            "version", "userMetadata", "operationMetrics").collect()  # fmt: skip
        infos = []
        for row in rows:
            metrics = row["operationMetrics"] or {}
            info = SnapshotInfo.from_commit(row["version"], row["userMetadata"], int(metrics.get("numOutputBytes", 0)))
            if info is not None:
                infos.append(info)
        return sorted(infos, key=lambda i: i.delta_version)

    def latest(self) -> SnapshotInfo | None:
        history = self.history()
        return history[-1] if history else None

    def read(self, info: SnapshotInfo) -> dict[bytes, bytes]:
        """The state of one snapshot (time travel to its Delta version)."""
        df = self.spark.read.format("delta").option("versionAsOf", info.delta_version).load(self.path)
        # Through Arrow: row-by-row collection over py4j cost ~5 s per 100k rows (bench/restore_time.py).
        table = df.toArrow()
        keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
        return {k.encode(): v.encode() for k, v in zip(keys, values)}

    def write(self, state: dict[bytes, bytes], batch_id: int, input_offsets: KafkaOffsets,
              changelog_offsets: dict[int, int], watermark_ms: int = 0) -> SnapshotInfo:  # fmt: skip
        """Commit ``state`` as a new snapshot (one atomic Delta overwrite)."""
        from pyspark.sql import types as T

        info = SnapshotInfo(
            delta_version=-1, application_id=self.application_id, store=self.store, batch_id=batch_id,
            input_offsets=input_offsets, changelog_offsets=dict(changelog_offsets), rows=len(state),
            taken_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), watermark_ms=watermark_ms,
        )  # fmt: skip
        import pyarrow as pa

        schema = T.StructType([T.StructField("key", T.StringType(), False), T.StructField("value", T.StringType())])
        # Through Arrow: a Python row list costs ~25 s per 100k rows here (bench/restore_time.py).
        table = pa.table({"key": [k.decode() for k in state], "value": [v.decode() for v in state.values()]})
        df = self.spark.createDataFrame(table, schema).repartition(max(1, min(8, len(state) // 50_000 + 1)))
        created = not self._exists()
        # The transaction id makes the commit idempotent (a retried snapshot of one batch is skipped)
        # and never empty: Delta drops a commit without actions, e.g. empty state over empty state.
        (df.write.format("delta").mode("overwrite").option("userMetadata", info.metadata_json())
         .option("txnAppId", f"streamstate-snapshot:{self.application_id}:{self.store}").option("txnVersion", batch_id)
         .save(self.path))  # fmt: skip
        if created:
            # Old snapshots stay readable by time travel for this long (then VACUUM may drop them).
            self.spark.sql(
                f"ALTER TABLE delta.`{self.path}` SET TBLPROPERTIES ("
                f"'delta.logRetentionDuration' = 'interval {self.retention}', "
                f"'delta.deletedFileRetentionDuration' = 'interval {self.retention}')"
            )
        written = next((i for i in reversed(self.history()) if i.batch_id == batch_id), None)
        if written is None:
            raise RuntimeError(f"snapshot of {self.application_id}/{self.store} at batch {batch_id} was not committed")
        return written
