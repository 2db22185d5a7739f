"""Heart rate per patient: the seeds' windowed ``pulse-counts`` store, in Spark.

Each ``pulse`` event is one heartbeat; the heart rate of a 60 s tumbling window is its beat count.
Semantics are Kafka Streams' ``TimeWindows.of(60 s).grace(5 s)`` with ``withRetention(6 h)`` and
``suppress(untilWindowCloses)``:

* stream time is the largest event time seen (Spark's watermark with no delay: it advances between
  micro-batches, so within a batch it is the maximum of the batches before);
* a window **closes** when stream time reaches its end + grace: it is emitted once, to the Delta
  table ``patient_heart_rate``, and never changes again;
* a pulse for a closed window is **late**: it goes to the dead-letter topic (reason ``late``) instead of
  being dropped silently;
* a window is **evicted** from the store when stream time reaches its start + retention (tombstone);
* ``checked_out`` deletes all of the patient's windows (tombstones; open windows are not emitted).

The store is a ``transformWithState`` map state per patient (window start -> beats, closed), with
event-time timers for closing and eviction. The rules exist twice: :class:`PulseWindows` (Python, to
subclass) and ``streamstate.jobs.PulseWindows`` in ``jvm/state-processors`` (Java, what the job runs:
no Python-to-JVM round trip per state call); a parity test holds them to the same output rows. Its
changelog ``…-pulse-counts-changelog`` is keyed ``<patient>@<window start ms>`` and is
``compact,delete`` with ``retention.ms`` = the store retention.

Spark drops input rows behind the watermark before a processor sees them when the grouped input
carries the watermarked column. The job keeps them visible by grouping a *copy* of the event time, so
late pulses are judged here, by window, and dead-lettered rather than lost.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from spark_jobs import dead_letter
from spark_jobs.context import JobContext
from spark_jobs.registry import StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.jvm_processor import jvm_changes
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

STORE = "pulse-counts"
PULSE, CHECKED_OUT = "pulse", "checked_out"
EVENT_TYPES = (PULSE, CHECKED_OUT)

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("patient_id", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)

STATE_DDL = "patient_id STRING, window_start_ms BIGINT, beats BIGINT, closed BOOLEAN"
CHANGE, LATE = "change", "late"
#: Processor output: store changes (kind = change) and late pulses (kind = late, with their source
#: coordinates and raw bytes for the dead-letter record).
OUTPUT_DDL = (f"kind STRING, {TOMBSTONE} BOOLEAN, {STATE_DDL}, "
              "source_partition INT, source_offset BIGINT, source_timestamp TIMESTAMP, raw BINARY")  # fmt: skip
CHANGES = StoreChanges(
    STORE, STATE_DDL, key=lambda: F.concat_ws("@", "patient_id", F.col("window_start_ms").cast("string")),
    rows=f"kind = '{CHANGE}'",
)  # fmt: skip

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("patient_id", T.StringType(), nullable=False),
        T.StructField("window_start", T.TimestampType(), nullable=False),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("heart_rate", T.LongType()),
    ]
)

_EMPTY = dict(source_partition=None, source_offset=None, source_timestamp=None, raw=None)


class PulseWindows(StatefulProcessor):
    """Per patient: open and closed windows until retention; emits every change, once per batch."""

    def __init__(self, window_ms: int, grace_ms: int, retention_ms: int, restored_watermark_ms: int = 0) -> None:
        self.window_ms, self.grace_ms, self.retention_ms = window_ms, grace_ms, retention_ms
        # A query started by a restore begins with watermark 0; stream time must not go back.
        self.restored_watermark_ms = restored_watermark_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.windows = handle.getMapState(STORE, "window_start_ms BIGINT", "beats BIGINT, closed BOOLEAN")

    # -- the window rules -------------------------------------------------------------------------
    def closes_at(self, start: int) -> int:
        return start + self.window_ms + self.grace_ms

    def evicted_at(self, start: int) -> int:
        return start + self.retention_ms

    def stream_time(self, timer_values) -> int:
        return max(timer_values.getCurrentWatermarkInMs(), self.restored_watermark_ms)

    def _arm(self, start: int, closed: bool) -> None:
        # Fire at the deadline whether Spark expires timers at "<= watermark" or "< watermark": the
        # handler re-checks the rule and re-arms when it fired a millisecond early.
        self.handle.registerTimer((self.evicted_at(start) if closed else self.closes_at(start)) - 1)

    # -- Spark's callbacks ------------------------------------------------------------------------
    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - Spark's processor API
        patient = key[0]
        watermark = self.stream_time(timerValues)
        current = {start[0]: [v[0], v[1]] for start, v in self.windows.iterator()}
        before = {s: tuple(v) for s, v in current.items()}
        for event in sorted(rows, key=lambda r: r.offset):  # one patient: one partition, offset order
            if event.type == CHECKED_OUT:
                current.clear()
                continue
            t = _millis(event.event_time)
            start = t - t % self.window_ms
            if (watermark > 0 and self.closes_at(start) <= watermark) or current.get(start, (0, False))[1]:
                yield Row(kind=LATE, tombstone=False, patient_id=patient, window_start_ms=start, beats=None,
                          closed=None, source_partition=event.partition, source_offset=event.offset,
                          source_timestamp=event.timestamp, raw=event.value)  # fmt: skip
                continue
            current.setdefault(start, [0, False])[0] += 1
        yield from self._write(patient, before, current)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: N802
        patient = key[0]
        watermark = self.stream_time(timerValues)
        current = {start[0]: [v[0], v[1]] for start, v in self.windows.iterator()}
        before = {s: tuple(v) for s, v in current.items()}
        closed_on_eviction = set()
        for start, value in list(current.items()):
            if self.evicted_at(start) <= watermark:
                if not value[1]:
                    closed_on_eviction.add(start)  # stream time jumped past both: still emit it, once
                del current[start]
            elif not value[1] and self.closes_at(start) <= watermark:
                value[1] = True
        yield from self._write(patient, before, current, rearm_after=watermark, emit_removed=closed_on_eviction)

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: N802
        row = initialState
        self.windows.updateValue((row.window_start_ms,), (row.beats, row.closed))
        self._arm(row.window_start_ms, row.closed)

    def close(self) -> None:
        pass

    def _write(self, patient: str, before: dict, current: dict, rearm_after: int | None = None,
               emit_removed: set = frozenset()):  # fmt: skip
        """Persist ``current`` over ``before`` and emit one change row per window that changed.

        A removed window is a tombstone; in ``emit_removed`` it also carries its final count
        (``closed``), so the output gets a window that closed and left the store in one batch.
        """
        for start in before.keys() - current.keys():
            self.windows.removeKey((start,))
            for t in (self.closes_at(start) - 1, self.evicted_at(start) - 1):
                self.handle.deleteTimer(t)
            final = start in emit_removed
            yield Row(kind=CHANGE, tombstone=True, patient_id=patient, window_start_ms=start,
                      beats=before[start][0] if final else None, closed=True if final else None, **_EMPTY)  # fmt: skip
        for start, (beats, closed) in current.items():
            if before.get(start) == (beats, closed):
                if rearm_after is not None and self._deadline(start, closed) - 1 <= rearm_after:
                    self.handle.registerTimer(self._deadline(start, closed))
                continue
            self.windows.updateValue((start,), (beats, closed))
            if start not in before or before[start][1] != closed:
                self._arm(start, closed)
            yield Row(kind=CHANGE, tombstone=False, patient_id=patient, window_start_ms=start, beats=beats,
                      closed=closed, **_EMPTY)  # fmt: skip

    def _deadline(self, start: int, closed: bool) -> int:
        return self.evicted_at(start) if closed else self.closes_at(start)


def window_changes(events: DataFrame, initial: DataFrame | None, store: StoreSpec, restored_watermark_ms: int,
                   processor: type[PulseWindows] | None = None) -> DataFrame:
    """The processor's output rows (``OUTPUT_DDL``: changes and late pulses) for watermarked ``events``,
    seeded with ``initial`` after a restore: through ``processor`` (Python) or, when None, the Java
    ``streamstate.jobs.PulseWindows`` with the same rules."""
    if processor is None:
        return jvm_changes("PulseWindows", events, "patient_id", initial, STORE, OUTPUT_DDL,
                           store.window_ms, store.grace_ms, store.retention_ms, restored_watermark_ms)  # fmt: skip
    return events.groupBy("patient_id").transformWithState(
        processor(store.window_ms, store.grace_ms, store.retention_ms, restored_watermark_ms),
        OUTPUT_DDL, "Append", "EventTime",
        initialState=initial.groupBy("patient_id") if initial is not None else None,
    )  # fmt: skip


def _millis(ts) -> int:
    return int(ts.timestamp() * 1000)


def classify(ctx: JobContext) -> DataFrame:
    return dead_letter.classify_events(ctx.kafka_source(), EVENT_SCHEMA, "patient_id", EVENT_TYPES,
                                       invalid=dead_letter.bad_event_time())  # fmt: skip


def build(ctx: JobContext):
    from delta.tables import DeltaTable

    store: StoreSpec = store_spec(ctx.spec, STORE)
    DeltaTable.createIfNotExists(ctx.spark).location(ctx.output_path).addColumns(OUTPUT_SCHEMA).execute()
    events = ctx.split_dead_letters(classify(ctx), "partition", "offset", "timestamp", "value")
    # Watermark on the event time, then group a copy of it: stream time advances, nothing is dropped.
    events = events.withWatermark("event_time", "0 seconds").withColumn(
        "event_time", F.col("event_time") + F.expr("INTERVAL 0 SECONDS")
    )
    changes = window_changes(events, ctx.initial_state(CHANGES), store, ctx.restored_watermark_ms())
    output_path, window_ms = ctx.output_path, store.window_ms
    app, bootstrap, source_topic = ctx.spec.application_id, ctx.settings.kafka, ctx.spec.source_topic

    def write_outputs(batch: DataFrame, _batch_id: int) -> None:
        closed = batch.where(f"kind = '{CHANGE}' AND closed AND beats IS NOT NULL").select(
            "patient_id",
            F.timestamp_millis("window_start_ms").alias("window_start"),
            F.timestamp_millis(F.col("window_start_ms") + window_ms).alias("window_end"),
            F.col("beats").alias("heart_rate"),
        )
        # Emit once: a closed window never changes, so insert-if-absent makes a replayed batch a no-op.
        (DeltaTable.forPath(batch.sparkSession, output_path).alias("t")
         .merge(closed.alias("s"), "t.patient_id = s.patient_id AND t.window_start = s.window_start")
         .whenNotMatchedInsertAll().execute())  # fmt: skip
        late = batch.where(f"kind = '{LATE}'").select(
            F.col("patient_id").cast("binary").alias("key"), F.col("raw").alias("value"), F.lit(source_topic).alias("topic"),
            F.col("source_partition").alias("partition"), F.col("source_offset").alias("offset"),
            F.col("source_timestamp").alias("timestamp"), F.lit(dead_letter.LATE).alias(dead_letter.ERROR_COLUMN),
        )  # fmt: skip
        if not late.isEmpty():
            dead_letter.write_dead_letters(late, app, bootstrap)

    return changes.writeStream.outputMode("append").foreachBatch(ctx.state_change_sink(CHANGES, write_outputs))
