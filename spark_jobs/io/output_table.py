"""A micro-batch's writes to a job's Delta output table: the one place that knows how they reach the table.

Rules:

* **One commit per table and batch, idempotent.** Every write of a batch carries the batch's
  :class:`OutputCommit`: Delta's idempotent-write transaction (``txn``: the version's app id, the changelog
  batch id as version) and the input position the batch reached (``userMetadata``, see
  :mod:`spark_jobs.state.output_marks`). A table whose ``txn`` already holds that version (or a higher one: a
  newer driver's, see :mod:`spark_jobs.state.fencing`) is not written again.
* **Small batches through the driver.** A batch of at most ``Settings.driver_output_max_rows`` changed rows
  is collected as Arrow and committed by delta-rs from the driver: a Spark MERGE of a thousand rows costs
  about a second and a half of planning and five Spark jobs, delta-rs's some tens of milliseconds. A
  larger batch is written by Spark's executors, never entering the driver. Both commit the same rows, the
  same ``txn`` and the same metadata, so readers, restores and output marks do not know which one wrote.
* **Every batch's write is a commit**, even one that changes no row (a replayed batch's), as Spark's are:
  the batch's ``txn`` and input mark are in the table's log.
* **Three kinds of write**, each what a primitive's outputs need: :meth:`OutputTable.upsert` (rows matched by
  the table's keys are replaced, or deleted when a ``gone`` column says so; the others inserted unless
  gone), :meth:`OutputTable.insert_absent` (rows inserted unless the key is there: a replayed batch of
  rows that never change) and :meth:`OutputTable.append`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from runtime.object_store import Location
from spark_jobs.driver.session import session_conf
from spark_jobs.io.driver_rows import DriverRows
from spark_jobs.state import output_marks


@dataclasses.dataclass(frozen=True)
class OutputCommit:
    """What every output commit of one micro-batch carries, and which engine writes it.

    Attributes:
        app_id: the idempotent-write app id of the job version's outputs (``JobLayout.output_transaction_app_id``).
        version: the idempotent-write version: the batch's changelog batch id (grows across drivers).
        input_end: the source offsets (exclusive) per partition the batch reached.
        through_driver: the batch is small enough to be collected and committed by delta-rs in the driver.
        rows: how the written rows reach the driver (with the batch's other driver-side reads, in one Spark
            job, see :mod:`spark_jobs.io.driver_rows`); None: each write collects its own.
        open_tables: the delta-rs tables the driver opened for earlier batches of the same query, by location,
            reused (brought up to date first: a few new log entries read instead of the whole log's state);
            None: each write opens its table.
    """

    app_id: str
    version: int
    input_end: Mapping[int, int]
    through_driver: bool = True
    rows: DriverRows | None = None
    open_tables: dict | None = None

    def spark_conf(self) -> dict[str, str]:
        """The session settings that make a Spark Delta write carry this commit (see :func:`session_conf`)."""
        return {
            "spark.databricks.delta.write.txnAppId": self.app_id,
            "spark.databricks.delta.write.txnVersion": str(self.version),
            "spark.databricks.delta.commitInfo.userMetadata": output_marks.commit_metadata(self.input_end),
        }

    def commit_properties(self):
        """The same for a delta-rs commit."""
        from deltalake import CommitProperties, Transaction

        return CommitProperties(
            custom_metadata={"userMetadata": output_marks.commit_metadata(self.input_end)},
            app_transactions=[Transaction(self.app_id, self.version)],
        )

    def written_in(self, table) -> bool:
        """Whether the delta-rs ``table`` already holds this commit or a later one (Spark's idempotent write
        skips such a write; the driver's path does too)."""
        written = table.transaction_version(self.app_id)
        return written is not None and written >= self.version


@dataclasses.dataclass(frozen=True)
class OutputTable:
    """A job's Delta output table, matched on ``keys`` (the columns that identify a row)."""

    location: Location
    keys: tuple[str, ...]

    def upsert(self, rows, commit: OutputCommit, *, gone: str | None = None) -> bool:
        """Replace the rows matching ``rows`` on the keys and insert the others; with ``gone`` (a boolean
        column of ``rows``, not written), a gone row deletes its match and is never inserted. Returns
        whether ``rows`` held any row (else nothing is committed)."""
        columns = [c for c in rows.columns if c != gone]
        merge = _Merge(self.keys, tuple(columns), gone=gone, update=True)
        return self._write(rows, commit, merge)

    def insert_absent(self, rows, commit: OutputCommit) -> bool:
        """Insert the rows whose keys the table lacks (a replayed batch's rows that never change)."""
        return self._write(rows, commit, _Merge(self.keys, tuple(rows.columns), gone=None, update=False))

    def append(self, rows, commit: OutputCommit) -> bool:
        """Append ``rows`` (their keys are new to the table)."""
        return self._write(rows, commit, None)

    def _write(self, rows, commit: OutputCommit, merge: _Merge | None) -> bool:
        if commit.through_driver:
            arrow = commit.rows.arrow(rows) if commit.rows is not None else rows.toArrow()
            return self._write_in_driver(arrow, commit, merge)
        if rows.isEmpty():
            return False
        with session_conf(rows.sparkSession, commit.spark_conf()):
            if merge is None:
                rows.write.format("delta").mode("append").save(str(self.location))
            else:
                merge.in_spark(rows, str(self.location))
        return True

    def _write_in_driver(self, arrow, commit: OutputCommit, merge: _Merge | None) -> bool:
        from deltalake import DeltaTable

        if not arrow.num_rows:
            return False
        tables = commit.open_tables if commit.open_tables is not None else {}
        table = tables.pop(self.location, None)  # back once written: a failed write's table is not reused
        if table is not None:
            table.update_incremental()  # a newer driver's commits included: its txn fences this write
        else:
            table = DeltaTable(str(self.location), storage_options=self.location.storage_options())
        self._commit_in_driver(table, arrow, commit, merge)
        tables[self.location] = table
        return True

    @staticmethod
    def _commit_in_driver(table, arrow, commit: OutputCommit, merge: _Merge | None) -> None:
        from deltalake import write_deltalake

        if commit.written_in(table):
            return
        if merge is None:
            write_deltalake(table, arrow, mode="append", commit_properties=commit.commit_properties())
            return
        version = table.version()
        merge.in_delta_rs(table, arrow, commit.commit_properties())
        if table.version() == version:  # the table object follows its own merge's commit
            # delta-rs commits nothing for a MERGE that changes no row (a replay of rows written already),
            # where Spark commits one: the batch's txn and input mark are committed all the same
            table.create_write_transaction([], "append", table.schema(), commit_properties=commit.commit_properties())


@dataclasses.dataclass(frozen=True)
class _Merge:
    """A MERGE of a batch's rows (``s``) into the table (``t``), said once for both engines."""

    keys: tuple[str, ...]
    columns: tuple[str, ...]
    gone: str | None
    update: bool

    def in_spark(self, rows, path: str) -> None:
        from delta.tables import DeltaTable

        def q(name: str) -> str:
            return "`" + name.replace("`", "``") + "`"

        on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in self.keys)
        values = {q(c): f"s.{q(c)}" for c in self.columns}
        merge = DeltaTable.forPath(rows.sparkSession, path).alias("t").merge(rows.alias("s"), on)
        if self.gone:
            merge = merge.whenMatchedDelete(condition=f"s.{q(self.gone)}")
        if self.update:
            merge = merge.whenMatchedUpdate(set=values)
        merge.whenNotMatchedInsert(condition=f"NOT s.{q(self.gone)}" if self.gone else None, values=values).execute()

    def in_delta_rs(self, table, arrow, commit_properties) -> None:
        def q(name: str) -> str:  # DataFusion's quoted identifier (an unquoted one is read in lower case)
            return '"' + name.replace('"', '""') + '"'

        on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in self.keys)
        values = {q(c): f"s.{q(c)}" for c in self.columns}
        merge = table.merge(arrow, on, source_alias="s", target_alias="t", commit_properties=commit_properties)
        if self.gone:
            merge = merge.when_matched_delete(predicate=f"s.{q(self.gone)}")
        if self.update:
            merge = merge.when_matched_update(updates=values)
        merge.when_not_matched_insert(updates=values, predicate=f"NOT s.{q(self.gone)}" if self.gone else None)
        merge.execute()
