"""Heart rate per patient: the seeds' windowed ``pulse-counts`` store, in Spark.

Each ``pulse`` event is one heartbeat; the heart rate of a 60 s tumbling window is its beat count.
Semantics are Kafka Streams' ``TimeWindows.ofSizeAndGrace(60 s, 5 s)`` with ``withRetention(6 h)`` and
``suppress(untilWindowCloses)``, decided **record by record**, as a Kafka Streams task decides them:

* **stream time** is per source partition (a Kafka Streams task): the largest event time of the valid
  events read so far from that partition, advanced by each record before it is applied;
* a window **closes** when stream time reaches its end + grace: it is emitted once, to the Delta
  table ``patient_heart_rate``, and never changes again;
* a pulse whose window has closed is **late**: it goes to the dead-letter topic (reason ``late``)
  instead of being dropped silently;
* a window is **evicted** from the store when stream time reaches its start + retention (tombstone);
* ``checked_out`` deletes all of the patient's windows (tombstones; open windows are not emitted,
  windows that closed before the check-out were).

None of this depends on how the input is cut into micro-batches (tests/spark_jobs/test_patient_heart_rate_parity.py
holds the processor to the plain-Python reference :func:`spark_jobs.generators.pulse.expected` under
several cuts). The store is the Java processor ``streamstate.jobs.PulseWindows`` of
``jvm/state-processors``, keyed by source partition. Its changelog ``…-pulse-counts-changelog`` is
keyed ``<patient>@<window start ms>``, plus one ``~stream-time@<partition>`` entry per partition so a
restore continues stream time exactly; it is ``compact,delete`` with ``retention.ms`` = the store's
retention plus Kafka Streams' extra day for windowed changelogs.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

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

#: A store entry: a window (patient, start, beats, closed, its source partition), or a partition's
#: stream time (patient_id and window_start_ms null).
STATE_DDL = ("patient_id STRING, window_start_ms BIGINT, beats BIGINT, closed BOOLEAN, source_partition INT, "
             "stream_time_ms BIGINT")  # fmt: skip
CHANGE, LATE = "change", "late"
#: Processor output: store changes (kind = change) and late pulses (kind = late, with their source
#: coordinates, raw bytes and the stream time that made them late, for the dead-letter record).
OUTPUT_DDL = (
    f"kind STRING, {TOMBSTONE} BOOLEAN, {STATE_DDL}, source_offset BIGINT, source_timestamp TIMESTAMP, raw BINARY"
)
#: The changelog key of a partition's stream time (a window's is ``<patient>@<window start ms>``).
STREAM_TIME_KEY_PREFIX = "~stream-time@"


def changelog_key():
    window_key = F.concat_ws("@", "patient_id", F.col("window_start_ms").cast("string"))
    stream_time_key = F.concat(F.lit(STREAM_TIME_KEY_PREFIX), F.col("source_partition").cast("string"))
    return F.when(F.col("patient_id").isNull(), stream_time_key).otherwise(window_key)


CHANGES = StoreChanges(STORE, STATE_DDL, key=changelog_key, rows=f"kind = '{CHANGE}'")

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("patient_id", T.StringType(), nullable=False),
        T.StructField("window_start", T.TimestampType(), nullable=False),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("heart_rate", T.LongType()),
    ]
)


def initial_windows(restored: DataFrame | None) -> DataFrame | None:
    """The restored store (``key`` + ``STATE_DDL`` rows) in the processor's initial-state shape: one row
    per patient (open windows, closed window starts) and one per partition's stream time."""
    if restored is None:
        return None
    windows = (
        restored.where("patient_id IS NOT NULL")
        .groupBy("source_partition", "patient_id")
        .agg(F.sort_array(F.collect_list(F.struct("window_start_ms", "beats", "closed"))).alias("w"))
        .select(
            "source_partition", "patient_id",
            F.expr("transform(filter(w, x -> NOT x.closed), x -> x.window_start_ms)").alias("open_starts"),
            F.expr("transform(filter(w, x -> NOT x.closed), x -> x.beats)").alias("open_beats"),
            F.expr("transform(filter(w, x -> x.closed), x -> x.window_start_ms)").alias("closed_starts"),
            F.lit(None).cast("bigint").alias("stream_time_ms"),
        )
    )  # fmt: skip
    no_windows = F.lit(None).cast("array<bigint>")
    times = restored.where("patient_id IS NULL").select(
        "source_partition", F.lit(None).cast("string").alias("patient_id"), no_windows.alias("open_starts"),
        no_windows.alias("open_beats"), no_windows.alias("closed_starts"), "stream_time_ms",
    )  # fmt: skip
    return windows.unionByName(times)


def window_changes(events: DataFrame, initial: DataFrame | None, store: StoreSpec) -> DataFrame:
    """The processor's output rows (``OUTPUT_DDL``: changes, stream times, late pulses) for valid
    ``events`` (with their source ``partition`` and ``offset``), seeded with ``initial`` (restored
    ``key`` + ``STATE_DDL`` rows) after a restore."""
    return jvm_changes("PulseWindows", events, "partition", initial_windows(initial), STORE, OUTPUT_DDL,
                       store.window_ms, store.grace_ms, store.retention_ms)  # fmt: skip


def late_message():
    """Why a late pulse was refused, for the dead letter: its window and the stream time that closed it."""

    def at(millis):
        return F.date_format(F.timestamp_millis(millis), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")

    return F.concat(F.lit("window starting "), at(F.col("window_start_ms")),
                    F.lit(" had closed: stream time of partition "), F.col("source_partition").cast("string"),
                    F.lit(" was "), at(F.col("stream_time_ms")))  # fmt: skip


def classify(ctx: JobContext) -> DataFrame:
    return dead_letter.classify_events(ctx.kafka_source(), EVENT_SCHEMA, "patient_id", EVENT_TYPES,
                                       invalid=dead_letter.bad_event_time())  # fmt: skip


def build(ctx: JobContext):
    from delta.tables import DeltaTable

    store: StoreSpec = store_spec(ctx.spec, STORE)
    ctx.ensure_output_table(OUTPUT_SCHEMA)
    events = ctx.with_dead_letters(classify(ctx), "partition", "offset", "timestamp", "value")
    changes = window_changes(events, ctx.initial_state(CHANGES), store)
    output_path, window_ms = ctx.output_path, store.window_ms
    app, bootstrap, source_topic = ctx.spec.application_id, ctx.settings.kafka, ctx.spec.source_topic

    def write_outputs(batch: DataFrame, _batch_id: int) -> None:
        closed = batch.where(f"kind = '{CHANGE}' AND closed AND beats IS NOT NULL").select(
            "patient_id",
            F.timestamp_millis("window_start_ms").alias("window_start"),
            F.timestamp_millis(F.col("window_start_ms") + window_ms).alias("window_end"),
            F.col("beats").alias("heart_rate"),
        )
        # Emit once: a closed window never changes, so insert-if-absent makes a replayed batch a no-op. Most
        # batches close no window (a MERGE costs about a second even then).
        if not closed.isEmpty():
            (DeltaTable.forPath(batch.sparkSession, output_path).alias("t")
             .merge(closed.alias("s"), "t.patient_id = s.patient_id AND t.window_start = s.window_start")
             .whenNotMatchedInsertAll().execute())  # fmt: skip
        late = batch.where(f"kind = '{LATE}'").select(
            F.col("patient_id").cast("binary").alias("key"), F.col("raw").alias("value"), F.lit(source_topic).alias("topic"),
            F.col("source_partition").alias("partition"), F.col("source_offset").alias("offset"),
            F.col("source_timestamp").alias("timestamp"), F.lit(dead_letter.LATE).alias(dead_letter.ERROR_COLUMN),
            late_message().alias(dead_letter.MESSAGE_COLUMN),
        )  # fmt: skip
        if not late.isEmpty():
            dead_letter.write_dead_letters(late, app, bootstrap)

    return changes.writeStream.outputMode("append").foreachBatch(ctx.state_change_sink(CHANGES, write_outputs))
