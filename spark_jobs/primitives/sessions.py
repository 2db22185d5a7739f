"""The session windows primitive: per key, aggregates of the events of each of its sessions, with Kafka
Streams' ``SessionWindows.ofInactivityGapAndGrace(gap, grace)``, ``withRetention`` and
``suppress(untilWindowCloses)`` semantics (or, with ``emit="update"``, every update as a table without
``suppress``), decided record by record as a Kafka Streams task decides them
(``streamstate.primitives.SessionAggregate``, after ``KStreamSessionWindowAggregate``):

* **stream time** is per source partition: the largest event time of the events read so far from that
  partition, advanced by each record before it is applied;
* a **session** is ``[session_start, session_end]``, its first and last event times, both inclusive; events
  of a key less than the gap apart are one session;
* an event at t **merges** every session of its key whose ``[start - gap, end + gap]`` holds t, closed
  sessions still in the store included (``findSessions(key, t - gap, t + gap)``): so a late event within
  grace can **bridge** two sessions into one. The merged session's values are the old sessions' merged in
  start order (count and sum add, min and max, latest: the later session's unless it had none), then the
  event applied; the sessions it replaces leave the store, and with ``emit="update"`` the outputs (Kafka
  Streams forwards tombstones for them);
* a session **closes** when stream time reaches its end + gap + grace (Kafka Streams' suppress duration for
  session windows is gap + grace, counted from the session's end). With ``emit="close"`` it is then written
  to the outputs; a closed session may still be extended by an event within gap of its end that is not late,
  and the extended session is written again when it closes (same start: the row is replaced; Kafka Streams
  emits it again too);
* an event whose merged session's end + gap + grace is before stream time is **late**: a dead letter (reason
  ``late``), never dropped silently;
* a closed session is **evicted** from the store when stream time reaches its end + retention (a tombstone;
  the outputs keep it). A retention of at least 2 x gap + grace keeps every session an event could still
  extend on its own; a bridging event, not late while the later session it joins is recent, can reach an
  earlier session older than that (the later session's length + 3 x gap + grace): evicted, it is not merged;
* an event for which ``delete_when`` holds deletes all of its key's sessions (open ones are never emitted,
  and ``emit="update"`` removes them from the outputs; closed sessions stay in the outputs).

None of this depends on how the input is cut into micro-batches. The gap, grace and retention are the
store's (``StoreSpec(kind="session", gap_ms=..., grace_ms=..., retention_ms=...)``). The changelog is
keyed ``<key>@<session start ms>``, plus one ``~stream-time@<partition>`` entry per partition so a restore
continues stream time exactly.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from spark_jobs.primitives.event_time import EventTimeAggregate
from spark_jobs.primitives.pipeline import iso_time
from spark_jobs.registry import StoreSpec
from spark_jobs.state.store_changes import TOMBSTONE

#: the processor's row kind of a change of the outputs (besides a store change and a late event)
EMIT = "emit"
#: columns of the processor's rows and of the outputs that a value or an output may not be named
_TAKEN = (
    "key",
    "kind",
    TOMBSTONE,
    "session_start",
    "session_end",
    "session_start_ms",
    "session_end_ms",
    "closed",
    "reopened",
    "source_partition",
    "stream_time_ms",
    "source_offset",
    "source_timestamp",
    "raw",
)


@dataclasses.dataclass(frozen=True)
class SessionAggregate(EventTimeAggregate):
    """A job that aggregates each key's events per session (see the module docstring). Callable: it is the
    job's ``build(ctx)``.

    Attributes:
        store: a ``session`` ``StoreSpec``: its ``gap_ms``, ``grace_ms`` and ``retention_ms``.
        events: the job's input.
        time: the event field that is the event's time (a TIMESTAMP; records without one are dead letters).
        values: a session's stored values, in order: name -> :class:`Aggregate` (count, sum, min, max, latest;
            types as in :class:`~spark_jobs.primitives.KeyedAggregate`). Default: ``count``.
        outputs: the outputs' columns after the key, ``session_start`` and ``session_end``: name -> a Spark
            SQL expression over the values. Default: the values.
        emit: ``"close"`` (a session is written when it closes) or ``"update"`` (every change).
        where: a Spark SQL condition over the event's fields: the events aggregated (default: all).
        delete_when: a Spark SQL condition over the event's fields: the events that delete their key's sessions.
        summaries: companion outputs recomputed from the outputs after every batch that changed them.

    Example, visits per user with a 30 minute inactivity gap::

        VISITS = SessionAggregate(
            store="user-sessions",  # StoreSpec(kind="session", gap_ms=1_800_000, grace_ms=300_000, ...)
            events=JsonEvents(SCHEMA, types=("click", "page_view")),
            time="event_time",
            values={"events": Aggregate.count()},
        )
    """

    store_kinds: ClassVar[tuple[str, ...]] = ("session",)
    processor: ClassVar[str] = "SessionAggregate"
    span: ClassVar[str] = "session"
    span_columns: ClassVar[tuple[str, str]] = ("session_start", "session_end")
    taken_columns: ClassVar[tuple[str, ...]] = _TAKEN

    def state_ddl_for(self, key_field: str) -> str:
        """A store entry: a session (key, start, end, values, closed, reopened: it merged a closed session,
        so its start may be in the outputs already; its source partition), or a partition's stream time (key
        and start null)."""
        return (
            f"{key_field} STRING, session_start_ms BIGINT, session_end_ms BIGINT, {self.values_ddl}, "
            "closed BOOLEAN, reopened BOOLEAN, source_partition INT, stream_time_ms BIGINT"
        )

    def output_ddl_for(self, key_field: str) -> str:
        """The processor's rows: store changes (kind = change), changes of the outputs (kind = emit) and
        late events (kind = late, with their source coordinates, raw bytes and the stream time that made
        them late, for the dead letter)."""
        return (
            f"kind STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl_for(key_field)}, source_offset BIGINT, "
            "source_timestamp TIMESTAMP, raw BINARY"
        )

    def processor_args(self, store: StoreSpec) -> tuple:
        return (store.gap_ms, store.grace_ms, store.retention_ms, self.emit == "update")

    def span_records(self, batch, key_field: str, store: StoreSpec):
        return self.output_records(batch, key_field)

    def _emitted(self, batch, key_field: str):
        """A batch's changes of the outputs (the processor's emit rows): the output row, whether it leaves the
        outputs (``_gone``) and whether it is a session that merged a closed one (``reopened``)."""
        return batch.where(f"kind = '{EMIT}'").selectExpr(
            f"`{key_field}`",
            "timestamp_millis(session_start_ms) AS session_start",
            "timestamp_millis(session_end_ms) AS session_end",
            *self._output_sql(),
            f"`{TOMBSTONE}` AS _gone",
            "coalesce(reopened, false) AS reopened",
        )

    def output_records(self, batch, key_field: str):
        """A batch's changes of the outputs as upsert records for the job's output topic: the key the JSON
        object of the key field and ``session_start`` (``{"user_id": "u1", "session_start":
        "2026-03-02T09:00:00.000Z"}``), the value the output row as JSON, null when the session leaves the
        outputs (``emit="update"``: merged away or deleted), as Kafka Streams forwards a windowed key's tombstone."""
        from pyspark.sql import functions as F

        rows = self._emitted(batch, key_field)
        values = [F.col(f"`{c}`") for c in rows.columns if c not in ("_gone", "reopened")]
        return rows.select(
            F.to_json(F.struct(key_field, "session_start")).cast("binary").alias("key"),
            F.when(~F.col("_gone"), F.to_json(F.struct(*values))).cast("binary").alias("value"),
        )

    def span_writer(self, outputs, key_field: str, store: StoreSpec, may_repeat):
        """What a batch's emit rows do to the outputs (an :class:`spark_jobs.io.output_table.OutputTable`). The
        processor emits at most one row per session and batch, its last change: with ``emit="close"`` each
        session as it closed, with ``emit="update"`` every change (merged-away and deleted open sessions as
        tombstones). With ``emit="close"`` a session is a new row of the outputs unless it is *reopened* (it
        merged a closed session, whose row may have its start): a batch without a reopened session appends its
        sessions (inserts them if absent when the batch may repeat written outputs: a replay, see
        ``spark_jobs/state/output_marks.py``); one with a reopened session upserts them all by (key,
        ``session_start``), replacing that row (one write per batch: the sink's idempotent-write id skips a
        second). With ``emit="update"`` one upsert takes every row, a tombstone deleting the row. Either is
        idempotent, so a replayed batch writes the same rows again. It returns whether it wrote."""
        from pyspark.sql import functions as F

        def write(batch, batch_id: int, commit) -> bool:
            rows = self._emitted(batch, key_field)
            if self.emit == "update":  # most batches change no session: nothing is committed then
                return outputs.upsert(rows.drop("reopened"), commit, gone="_gone")
            if rows.where(F.col("reopened")).isEmpty():
                new_rows = rows.drop("_gone", "reopened")
                if may_repeat(batch_id):
                    return outputs.insert_absent(new_rows, commit)
                return outputs.append(new_rows, commit)  # a MERGE joins the table; an append writes the batch
            return outputs.upsert(rows.drop("reopened"), commit, gone="_gone")

        return write

    def span_aggregates(self) -> list:
        """A key's restored sessions as ``SessionAggregate.initialDdl`` holds them: in start order."""
        from pyspark.sql import functions as F

        session = F.struct("session_start_ms", "session_end_ms", "closed", "reopened", *self.values)
        return [F.sort_array(F.collect_list(session)).alias("sessions")]

    @staticmethod
    def late_message() -> str:
        """Why a late event was refused, for the dead letter (SQL): the session it would have made and the stream
        time it had closed by."""
        parts = [
            "'session ['",
            iso_time("session_start_ms"),
            "', '",
            iso_time("session_end_ms"),
            "'] had closed (end + gap + grace before stream time): stream time of partition '",
            "CAST(source_partition AS STRING)",
            "' was '",
            iso_time("stream_time_ms"),
        ]
        return f"concat({', '.join(parts)})"
