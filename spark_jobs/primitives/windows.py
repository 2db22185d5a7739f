"""The event-time windows primitive: per key, events counted in tumbling windows, with Kafka Streams'
``TimeWindows.ofSizeAndGrace(size, grace)``, ``withRetention`` and ``suppress(untilWindowCloses)`` semantics,
decided record by record as a Kafka Streams task decides them (``streamstate.primitives.WindowedCount``):

* **stream time** is per source partition: the largest event time of the events read so far from that
  partition, advanced by each record before it is applied;
* a window **closes** when stream time reaches its end + grace: emitted once to the outputs (key,
  ``window_start``, ``window_end`` and the count), never changed again;
* an event whose window has closed is **late**: a dead letter (reason ``late``), never dropped silently;
* a window is **evicted** from the store when stream time reaches its start + retention (a tombstone);
* an event for which ``delete_when`` holds deletes all of its key's windows (open ones are not emitted,
  windows that closed before it were).

None of this depends on how the input is cut into micro-batches. The window size, grace and retention
are the store's (``StoreSpec(kind="windowed", window_ms=..., grace_ms=..., retention_ms=...)``). The
changelog is keyed ``<key>@<window start ms>``, plus one ``~stream-time@<partition>`` entry per partition
so a restore continues stream time exactly. Hopping windows are not a primitive yet.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from spark_jobs import dead_letter
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.primitives.pipeline import DELETE_COLUMN, StoreDeclaration, processor_input
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

CHANGE, LATE = "change", "late"
#: The changelog key of a partition's stream time (a window's is ``<key>@<window start ms>``).
STREAM_TIME_KEY_PREFIX = "~stream-time@"


@dataclasses.dataclass(frozen=True)
class WindowedCount(StoreDeclaration):
    """A job that counts each key's events per event-time window (see the module docstring).

    Attributes:
        store: a ``windowed`` ``StoreSpec``: its ``window_ms``, ``grace_ms`` and ``retention_ms``.
        events: the job's input.
        time: the event field that is the event's time (a TIMESTAMP; records without one are dead letters).
        count: the stored name of a window's count.
        output_count: the outputs' name for a closed window's count.
        where: a Spark SQL condition over the event's fields: the events counted (default: all).
        delete_when: a Spark SQL condition over the event's fields: the events that delete their key's windows.
    """

    store: str
    events: JsonEvents
    time: str
    count: str = "count"
    output_count: str = "count"
    where: str | None = None
    delete_when: str | None = None
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    store_kinds: ClassVar[tuple[str, ...]] = ("windowed",)

    def state_ddl_for(self, key_field: str) -> str:
        """A store entry: a window (key, start, count, closed, its source partition), or a partition's
        stream time (key and start null)."""
        return (f"{key_field} STRING, window_start_ms BIGINT, {self.count} BIGINT, closed BOOLEAN, "
                "source_partition INT, stream_time_ms BIGINT")  # fmt: skip

    def output_ddl_for(self, key_field: str) -> str:
        """The processor's rows: store changes (kind = change) and late events (kind = late, with their
        source coordinates, raw bytes and the stream time that made them late, for the dead letter)."""
        return (f"kind STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl_for(key_field)}, source_offset BIGINT, "
                "source_timestamp TIMESTAMP, raw BINARY")  # fmt: skip

    def store_changes_for(self, key_field: str) -> StoreChanges:
        from pyspark.sql import functions as F

        def changelog_key():
            window_key = F.concat_ws("@", key_field, F.col("window_start_ms").cast("string"))
            stream_time_key = F.concat(F.lit(STREAM_TIME_KEY_PREFIX), F.col("source_partition").cast("string"))
            return F.when(F.col(key_field).isNull(), stream_time_key).otherwise(window_key)

        return StoreChanges(self.store, self.state_ddl_for(key_field), key=changelog_key, rows=f"kind = '{CHANGE}'")

    def output_schema(self, key_field: str):
        from pyspark.sql import types as T

        return T.StructType([
            T.StructField(key_field, T.StringType(), nullable=False),
            T.StructField("window_start", T.TimestampType(), nullable=False),
            T.StructField("window_end", T.TimestampType()),
            T.StructField(self.output_count, T.LongType()),
        ])  # fmt: skip

    def output_key(self, key_field: str) -> tuple[str, ...]:
        return (key_field, "window_start")

    def check_primitive(self, spec: JobSpec) -> None:
        if self.time not in self.events.schema.fieldNames():
            raise JobSpecError(f"time: {self.time!r} is not a field of the event schema")
        if self.events.schema[self.time].dataType.simpleString() != "timestamp":
            raise JobSpecError(f"time: {self.time!r} must be a TIMESTAMP field")
        for role, name in (("count", self.count), ("output_count", self.output_count)):
            if name in (spec.key_field, "window_start", "window_end", "window_start_ms", "closed", "kind", TOMBSTONE):
                raise JobSpecError(f"{role}: {name!r} is taken by the key or a window column")
        if self.summaries:
            raise JobSpecError("summaries: not supported by windows yet")

    def classify(self, source, key_field: str):
        rules = [(dead_letter.bad_event_time(self.time), f"{self.time} is not a time between 1970 and 2200")]
        return self.events.classify(source, key_field, extra_rules=rules)

    def changes(self, events, key_field: str, initial, store: StoreSpec, job: str = "?"):
        """The processor's rows (:meth:`output_ddl_for`) for ``events`` (the processor's input, with the
        source's ``partition``, ``offset``, ``timestamp`` and ``value``), seeded with ``initial`` (restored
        ``key`` + state rows) after a restore."""
        from pyspark.sql import DataFrame

        delete, kept, letter = processor_input(events, job, self.where, self.delete_when)
        needed = events.where(kept).select(key_field, self.time, delete.alias(DELETE_COLUMN), "partition", "offset",
                                           "timestamp", "value", *letter)  # fmt: skip
        spark = events.sparkSession
        jdf = spark._jvm.streamstate.primitives.WindowedCount.changes(
            needed._jdf, "partition", None if initial is None else _initial_windows(initial, key_field, self.count)._jdf,
            self.store, self.output_ddl_for(key_field), store.window_ms, store.grace_ms, store.retention_ms,
            key_field, self.time,
        )  # fmt: skip
        return DataFrame(jdf, spark)

    def build(self, ctx, processor=None):
        """The job's query: :class:`StoreDeclaration`'s pipeline, with the windows' sink (closed windows
        inserted once, late events to dead letters); no Python processor."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        if processor is not None:
            raise JobSpecError(f"job {ctx.spec.name}: windows run their Java processor only")
        spec = ctx.spec
        self.check(spec)
        key_field, store = spec.key_field, store_spec(spec, self.store)
        ctx.ensure_output_table(self.output_schema(key_field))
        events = ctx.with_dead_letters(self.classify(ctx.kafka_source(), key_field), "partition", "offset",
                                       "timestamp", "value", key=key_field)  # fmt: skip
        changes = self.store_changes_for(key_field)
        rows = self.changes(events, key_field, ctx.initial_state(changes), store, job=spec.name)
        output_path, window_ms, count, output_count = ctx.output_path, store.window_ms, self.count, self.output_count
        app, kafka, source_topic = spec.application_id, ctx.settings.kafka, spec.source_topic

        def write_outputs(batch, _batch_id: int) -> None:
            closed = batch.where(f"kind = '{CHANGE}' AND closed AND `{count}` IS NOT NULL").select(
                key_field,
                F.timestamp_millis("window_start_ms").alias("window_start"),
                F.timestamp_millis(F.col("window_start_ms") + window_ms).alias("window_end"),
                F.col(count).alias(output_count),
            )
            # Emit once: a closed window never changes, so insert-if-absent makes a replayed batch a no-op.
            # Most batches close no window (a MERGE costs about a second even then).
            if not closed.isEmpty():
                on = f"t.`{key_field}` = s.`{key_field}` AND t.window_start = s.window_start"
                DeltaTable.forPath(batch.sparkSession, output_path).alias("t").merge(
                    closed.alias("s"), on
                ).whenNotMatchedInsertAll().execute()
            late = batch.where(f"kind = '{LATE}'").select(
                F.col(key_field).cast("binary").alias("key"), F.col("raw").alias("value"), F.lit(source_topic).alias("topic"),
                F.col("source_partition").alias("partition"), F.col("source_offset").alias("offset"),
                F.col("source_timestamp").alias("timestamp"), F.lit(dead_letter.LATE).alias(dead_letter.ERROR_COLUMN),
                _late_message().alias(dead_letter.MESSAGE_COLUMN),
            )  # fmt: skip
            if not late.isEmpty():
                dead_letter.write_dead_letters(late, app, kafka)

        return rows.writeStream.outputMode("append").foreachBatch(ctx.state_change_sink(changes, write_outputs))


def _initial_windows(restored, key_field: str, count: str):
    """The restored store (``key`` + state rows) in the processor's initial-state shape
    (``WindowedCount.INITIAL_DDL``): one row per key and one per partition's stream time."""
    from pyspark.sql import functions as F

    windows = (
        restored.where(F.col(key_field).isNotNull())
        .groupBy("source_partition", key_field)
        .agg(F.sort_array(F.collect_list(F.struct("window_start_ms", F.col(count).alias("n"), "closed"))).alias("w"))
        .select(
            "source_partition", F.col(key_field).alias("key"),
            F.expr("transform(filter(w, x -> NOT x.closed), x -> x.window_start_ms)").alias("open_starts"),
            F.expr("transform(filter(w, x -> NOT x.closed), x -> x.n)").alias("open_counts"),
            F.expr("transform(filter(w, x -> x.closed), x -> x.window_start_ms)").alias("closed_starts"),
            F.lit(None).cast("bigint").alias("stream_time_ms"),
        )
    )  # fmt: skip
    no_windows = F.lit(None).cast("array<bigint>")
    times = restored.where(F.col(key_field).isNull()).select(
        "source_partition", F.lit(None).cast("string").alias("key"), no_windows.alias("open_starts"),
        no_windows.alias("open_counts"), no_windows.alias("closed_starts"), "stream_time_ms",
    )  # fmt: skip
    return windows.unionByName(times)


def _late_message():
    """Why a late event was refused, for the dead letter: its window and the stream time that closed it."""
    from pyspark.sql import functions as F

    def at(millis):
        return F.date_format(F.timestamp_millis(millis), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")

    return F.concat(F.lit("window starting "), at(F.col("window_start_ms")),
                    F.lit(" had closed: stream time of partition "), F.col("source_partition").cast("string"),
                    F.lit(" was "), at(F.col("stream_time_ms")))  # fmt: skip
