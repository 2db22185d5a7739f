"""Read the live state out of every job's checkpoint: rows and bytes per store and partition.

A Spark batch application (``spark-submit spark_jobs/operations/state_audit/checkpoint_state.py <run id>``, run by
the audit DAG). For each registered job version with a committed batch it asks Spark's
``state-metadata`` reader which stateful operators the checkpoint holds, then reads each store with
the ``statestore`` reader (``stateVarName`` = the store: the jobs' transformWithState state variables
are named after their stores) and counts rows and bytes (key + value as JSON) per partition. Bytes
on disk per partition come from the checkpoint's ``state/<operator>/<partition>`` directories. A
store that cannot be read is recorded with its error; the others are still read.

Rows go to ``<lake>/_streamstate/state_checkpoint_audit`` (delta-rs append, one
:class:`~spark_jobs.operations.state_audit.rows.CheckpointStateRow` per store and partition, or one error row); the
audit task reads them back with :func:`checkpoint_rows`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import sys

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.documents import to_row
from spark_jobs.layout import JobLayout
from spark_jobs.operations.state_audit.rows import CheckpointStateRow
from spark_jobs.registry import JobSpec, StoreSpec, registered_versions
from spark_jobs.state.checkpoint_offsets import latest_batch_id
from spark_jobs.versions import append_rows, platform_table, read_rows

_INTS = ("version", "partition", "rows", "bytes", "disk_bytes", "batch_id", "operator_id")
_STRINGS = ("run_id", "application_id", "store", "error")


def checkpoint_audit_table(settings: Settings):
    return platform_table(settings, "state_checkpoint_audit")


def _schema():
    import pyarrow as pa

    return pa.schema(
        [pa.field("read_at", pa.timestamp("us", tz="UTC"))]
        + [pa.field(n, pa.int64()) for n in _INTS]
        + [pa.field(n, pa.string()) for n in _STRINGS]
    )


def checkpoint_rows(settings: Settings, run_id: str) -> list[CheckpointStateRow]:
    """The rows the checkpoint reader wrote in run ``run_id``."""
    rows = (CheckpointStateRow.of(row) for row in read_rows(checkpoint_audit_table(settings)))
    return [row for row in rows if row.run_id == run_id]


def disk_bytes_per_partition(checkpoint: Location, operator_id: int) -> dict[int, int]:
    """partition -> bytes of the state files Spark keeps for it (RocksDB snapshots and changelogs)."""
    sizes: dict[int, int] = {}
    for name, size in (Location.of(checkpoint) / "state" / str(operator_id)).files():
        partition, _, rest = name.partition("/")
        if partition.isdigit() and rest:
            sizes[int(partition)] = sizes.get(int(partition), 0) + size
    return sizes


def read_store(spark, checkpoint: Location, store: StoreSpec, operator_id: int) -> dict[int, tuple[int, int]]:
    """partition -> (rows, bytes) of ``store`` in ``checkpoint`` at its latest committed batch (read out of
    Spark's own result rows)."""
    from pyspark.sql import functions as F

    reader = spark.read.format("statestore").option("operatorId", operator_id)
    if (
        store.kind != "in_memory"
    ):  # a transformWithState processor's variable; an in_memory store is its operator's only state
        reader = reader.option("stateVarName", store.name)
    df = reader.load(str(checkpoint))
    payload = [c for c in df.columns if c != "partition_id"]
    sized = df.select("partition_id", F.length(F.to_json(F.struct(*[F.col(c) for c in payload]))).alias("size"))
    return {
        r.partition_id: (r.rows, r.bytes or 0)
        for r in sized.groupBy("partition_id").agg(F.count("*").alias("rows"), F.sum("size").alias("bytes")).collect()
    }


def audit_checkpoint(spark, settings: Settings, spec: JobSpec, run_id: str) -> list[CheckpointStateRow]:
    checkpoint = JobLayout.of(spec, settings).checkpoint
    batch_id = latest_batch_id(checkpoint)
    if batch_id is None or not spec.stores:
        return []
    now = dt.datetime.now(dt.timezone.utc)
    base = CheckpointStateRow(run_id, now, spec.application_id, spec.version, batch_id, store="")
    try:
        operators = spark.read.format("state-metadata").load(str(checkpoint)).collect()
        operator_id = operators[0]["operatorId"] if operators else 0  # Spark's state-metadata row
    except Exception as err:  # noqa: BLE001 - recorded, the audit goes on
        return [
            dataclasses.replace(base, store=s.name, error=f"state-metadata: {str(err).splitlines()[0][:500]}")
            for s in spec.stores
        ]
    base = dataclasses.replace(base, operator_id=operator_id)
    disk = disk_bytes_per_partition(checkpoint, operator_id)
    rows, read = [], {}
    for store in spec.stores:
        try:
            read[store.name] = read_store(spark, checkpoint, store, operator_id)
        except Exception as err:  # noqa: BLE001
            rows.append(dataclasses.replace(base, store=store.name, error=str(err).splitlines()[0][:500]))
    for name, counts in read.items():
        for partition in sorted(set(counts) | set(disk)):
            n, size = counts.get(partition, (0, 0))
            # The stores of a processor share its operator's RocksDB files: each gets its share of the disk
            # bytes by its state bytes (all of them when it is the only store).
            total = sum(other.get(partition, (0, 0))[1] for other in read.values())
            share = size / total if total else 1 / len(read)
            rows.append(
                dataclasses.replace(
                    base,
                    store=name,
                    partition=partition,
                    rows=n,
                    bytes=size,
                    disk_bytes=round(disk.get(partition, 0) * share),
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Read every job's live state out of its checkpoint.")
    parser.add_argument("run_id")
    args = parser.parse_args(argv)
    from spark_jobs.driver.session import build_spark_session

    settings = Settings.from_env()
    spark = build_spark_session(settings, "state-audit-checkpoints")
    # The RocksDB state store reports to the driver's StateStoreCoordinator, which exists only once the
    # session's streaming query manager does (a batch-only application never creates it).
    spark.streams.active  # noqa: B018
    try:
        rows = []
        for versions in registered_versions().values():
            for spec in versions.values():
                rows += audit_checkpoint(spark, settings, spec, args.run_id)
        if rows:
            append_rows(checkpoint_audit_table(settings), [to_row(row) for row in rows], _schema())
        print(f"state audit: {len(rows)} checkpoint rows for run {args.run_id}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
