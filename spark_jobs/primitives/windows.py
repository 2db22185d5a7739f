"""The event-time windows primitive: per key, aggregates of the events in each of their windows, tumbling
or hopping, with Kafka Streams' ``TimeWindows.ofSizeAndGrace(size, grace).advanceBy(advance)``,
``withRetention`` and ``suppress(untilWindowCloses)`` semantics (or, with ``emit="update"``, every update
as a table without ``suppress``), decided record by record as a Kafka Streams task decides them
(``streamstate.primitives.WindowedAggregate``):

* **stream time** is per source partition: the largest event time of the events read so far from that
  partition, advanced by each record before it is applied;
* an event at time t belongs to every window ``[start, start + size)`` whose start is a multiple of the
  advance with ``start <= t < start + size``: one window when they tumble (advance = size, the default),
  ``size / advance`` when they hop;
* a window **closes** when stream time reaches its end + grace. With ``emit="close"`` it is then written
  to the outputs (key, ``window_start``, ``window_end`` and the ``outputs``) once and never changed; with
  ``emit="update"`` the outputs hold every window's current values, open ones included, changed as
  events arrive;
* an event is applied to its windows that are still open; if any of its windows had closed it is also
  **late**: a dead letter (reason ``late``, naming the latest closed window and how many open windows it
  was counted in), never dropped silently;
* a window is **evicted** from the store when stream time reaches its start + retention (a tombstone; the
  outputs keep it);
* an event for which ``delete_when`` holds deletes all of its key's windows (open ones are never emitted,
  and ``emit="update"`` removes them from the outputs; closed windows stay in the outputs).

None of this depends on how the input is cut into micro-batches or partitions. The window size, advance,
grace and retention are the store's (``StoreSpec(kind="windowed", window_ms=..., advance_ms=...,
grace_ms=..., retention_ms=...)``). The changelog is keyed ``<key>@<window start ms>``, plus one
``~stream-time@<partition>`` entry per partition so a restore continues stream time exactly.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from spark_jobs.primitives.event_time import CHANGE, EventTimeAggregate
from spark_jobs.primitives.pipeline import iso_time
from spark_jobs.registry import StoreSpec
from spark_jobs.state.store_changes import TOMBSTONE

#: columns of the processor's rows and of the outputs that a value or an output may not be named
_TAKEN = (
    "key",
    "kind",
    TOMBSTONE,
    "window_start",
    "window_end",
    "window_start_ms",
    "closed",
    "source_partition",
    "stream_time_ms",
    "source_offset",
    "source_timestamp",
    "raw",
    "open_windows",
)


@dataclasses.dataclass(frozen=True)
class WindowedAggregate(EventTimeAggregate):
    """A job that aggregates each key's events per event-time window (see the module docstring). Callable:
    it is the job's ``build(ctx)``.

    Attributes:
        store: a ``windowed`` ``StoreSpec``: its ``window_ms``, ``advance_ms``, ``grace_ms`` and ``retention_ms``.
        events: the job's input.
        time: the event field that is the event's time (a TIMESTAMP; records without one are dead letters).
        values: a window's stored values, in order: name -> :class:`Aggregate` (count, sum, min, max, latest;
            types as in :class:`~spark_jobs.primitives.KeyedAggregate`). Default: ``count``.
        outputs: the outputs' columns after the key, ``window_start`` and ``window_end``: name -> a Spark SQL
            expression over the values (e.g. ``"temperature_sum / readings"``). Default: the values.
        emit: ``"close"`` (a window is written once, when it closes) or ``"update"`` (every change).
        where: a Spark SQL condition over the event's fields: the events aggregated (default: all).
        delete_when: a Spark SQL condition over the event's fields: the events that delete their key's windows.
        summaries: companion outputs recomputed from the outputs after every batch that changed them (see
            :class:`~spark_jobs.primitives.pipeline.StoreDeclaration`), e.g. the warmest sensor per window.

    Example, the average temperature over the last 5 minutes, every minute::

        AVERAGES = WindowedAggregate(
            store="temperature-windows",  # StoreSpec(kind="windowed", window_ms=300_000, advance_ms=60_000, ...)
            events=JsonEvents(SCHEMA, types=("reading",)),
            time="event_time",
            values={"readings": Aggregate.count(), "temperature_sum": Aggregate.sum("temperature")},
            outputs={"readings": "readings", "avg_temperature": "temperature_sum / readings"},
        )
    """

    store_kinds: ClassVar[tuple[str, ...]] = ("windowed",)
    processor: ClassVar[str] = "WindowedAggregate"
    span: ClassVar[str] = "window"
    span_columns: ClassVar[tuple[str, str]] = ("window_start", "window_end")
    taken_columns: ClassVar[tuple[str, ...]] = _TAKEN

    def state_ddl_for(self, key_field: str) -> str:
        """A store entry: a window (key, start, values, closed, its source partition), or a partition's
        stream time (key and start null)."""
        return (
            f"{key_field} STRING, window_start_ms BIGINT, {self.values_ddl}, closed BOOLEAN, "
            "source_partition INT, stream_time_ms BIGINT"
        )

    def output_ddl_for(self, key_field: str) -> str:
        """The processor's rows: store changes (kind = change) and late events (kind = late, with their
        source coordinates, raw bytes, the stream time that made them late and how many open windows they
        were counted in, for the dead letter)."""
        return (
            f"kind STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl_for(key_field)}, source_offset BIGINT, "
            "source_timestamp TIMESTAMP, raw BINARY, open_windows INT"
        )

    def span_writer(self, outputs, key_field: str, store: StoreSpec, may_repeat):
        """What a batch's change rows do to the outputs (an :class:`spark_jobs.io.output_table.OutputTable`).
        ``emit="close"``: append the windows that closed (a closed window never changes); a batch that may
        repeat written outputs (``may_repeat(batch_id)``: a replay after a crash or a restore, see
        ``spark_jobs/state/output_marks.py``) inserts them only if absent instead, so a replayed window is not
        written twice. ``emit="update"``: upsert every changed window and delete the open windows a delete
        removed (tombstones with ``closed = false``; evictions leave the outputs alone, as Kafka Streams'
        emitted updates stay). It returns whether it wrote to the outputs (then the summaries are recomputed)."""

        window_ms = store.window_ms

        def write(batch, batch_id: int, commit) -> bool:
            if self.emit == "close":
                # most batches close no window: nothing is committed then
                closed = self._emitted(batch, key_field, window_ms).drop("_gone")
                if may_repeat(batch_id):
                    return outputs.insert_absent(closed, commit)
                return outputs.append(closed, commit)  # a MERGE joins the whole table; an append writes the batch
            return outputs.upsert(self._emitted(batch, key_field, window_ms), commit, gone="_gone")

        return write

    def _emitted(self, batch, key_field: str, window_ms: int):
        """A batch's windows as the outputs get them (key, ``window_start``, ``window_end``, the outputs and
        ``_gone``: the window was deleted): with ``emit="close"`` the windows that closed; with
        ``emit="update"`` every changed window and every open window a delete removed (a tombstone that is not
        a delete is an eviction, unless the window closed in this batch: it then carries its final values)."""
        windows = batch.where(f"kind = '{CHANGE}' AND `{key_field}` IS NOT NULL")
        windows = (
            windows.where("closed") if self.emit == "close" else windows.where(f"NOT {TOMBSTONE} OR closed IS NOT NULL")
        )
        return windows.selectExpr(
            f"`{key_field}`",
            "timestamp_millis(window_start_ms) AS window_start",
            f"timestamp_millis(window_start_ms + {int(window_ms)}) AS window_end",
            *self._output_sql(),
            f"{TOMBSTONE} AND closed = false AS _gone",
        )

    def processor_args(self, store: StoreSpec) -> tuple:
        return (store.window_ms, store.window_advance_ms, store.grace_ms, store.retention_ms)

    def span_records(self, batch, key_field: str, store: StoreSpec):
        return self.output_records(batch, key_field, window_ms=store.window_ms)

    def output_records(self, batch, key_field: str, *, window_ms: int):
        """A batch's emitted windows (:meth:`_emitted`) as upsert records for the job's output topic: the key
        the JSON object of the key field and ``window_start`` (``{"patient_id": "p1", "window_start":
        "2026-03-02T00:00:00.000Z"}``), the value the output row as JSON, null for a deleted window."""
        from pyspark.sql import functions as F

        rows = self._emitted(batch, key_field, window_ms)
        values = [c for c in rows.columns if c != "_gone"]
        return rows.select(
            F.to_json(F.struct(key_field, "window_start")).cast("binary").alias("key"),
            F.when(~F.col("_gone"), F.to_json(F.struct(*values))).cast("binary").alias("value"),
        )

    def span_aggregates(self) -> list:
        """A key's restored windows as ``WindowedAggregate.initialDdl`` holds them: its open windows (start and
        values) and its closed windows' starts, each in start order."""
        from pyspark.sql import functions as F

        open_window = F.struct("window_start_ms", *self.values)
        return [
            F.sort_array(F.collect_list(F.when(~F.col("closed"), open_window))).alias("open_windows"),
            F.sort_array(F.collect_list(F.when(F.col("closed"), F.col("window_start_ms")))).alias("closed_starts"),
        ]

    @staticmethod
    def late_message() -> str:
        """Why a late event was refused, for the dead letter (SQL): its latest closed window, the stream time that
        closed it and, for hopping windows, how many open windows still counted it."""
        counted = (
            "CASE WHEN open_windows > 0 THEN concat('; counted in its ', CAST(open_windows AS STRING), ' open windows') "
            "ELSE '' END"
        )
        parts = [
            "'window starting '",
            iso_time("window_start_ms"),
            "' had closed: stream time of partition '",
            "CAST(source_partition AS STRING)",
            "' was '",
            iso_time("stream_time_ms"),
            counted,
        ]
        return f"concat({', '.join(parts)})"
