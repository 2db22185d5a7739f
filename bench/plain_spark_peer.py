"""The plain-Spark peer of the benchmarks: purchase counts, pulse or temperature windows as a bare Structured
Streaming query.

The same Kafka source, JSON parsing, RocksDB state store, shuffle partitions and Delta MERGE sink as the
platform's purchase_counts job, but a built-in ``groupBy().agg()`` instead of the ``transformWithState``
processor and none of the platform's features: no changelog, no snapshots, no dead letters, no lease or
status. What it costs to run the platform's job instead of this is the price of those features.

(A built-in aggregation cannot delete a key, so ``account_closed`` events are only filtered out here: the
state it keeps is every user ever seen. That is the query a user without the platform would write.)

``--workload pulses``: beats per patient per 60 s window, ``withWatermark(5 s)`` + ``window()`` count in
append mode (a window is written once, when the watermark passes its end: Kafka Streams' grace +
suppress-until-close), appended to a Delta table. Late beats are dropped silently and check-outs are
ignored: what the platform's job does about them (dead letters, deletes) is what it costs.

``--workload temperatures``: readings, average, minimum and maximum temperature per sensor in 5-minute
windows starting every minute (``window(event_time, "5 minutes", "1 minute")``), ``withWatermark(30 s)``,
append mode, appended to a Delta table, the same way.

``--workload sessions``: events and page views per user per session of activity, Spark's built-in
``session_window(event_time, "30 minutes")`` with ``withWatermark(5 min)`` in append mode (a session is
written once the watermark passes its last event + 30 min), the session's start and end its first and last
event times, appended to a Delta table. Late events are dropped silently and ``forget_me`` is ignored; the
watermark is the query's, not each partition's stream time.

Run by bench/compare.py in its own process (its memory is measured per process tree); prints one JSON
line: ``{"seconds": ..., "input_rows": ..., "batches": ..., "batch_seconds": ...}`` where seconds run from the
process start and batch_seconds is what its micro-batches took.

``--trigger SECONDS`` (bench/latency.py): instead of processing what the topic holds (available-now), run
until SIGTERM with a micro-batch every SECONDS (Spark's processingTime trigger; 0: as fast as possible),
printing ``{"event": "started"}`` once the query runs; the JSON line above follows the stop.

    .venv/bin/python bench/plain_spark_peer.py <topic> <work dir> [--max-offsets-per-trigger N] [--workload pulses|temperatures|sessions] [--trigger SECONDS]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

STARTED = time.monotonic()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from runtime.settings import Settings  # noqa: E402
from spark_jobs.session import build_spark_session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("topic")
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument("--workload", choices=("purchases", "pulses", "temperatures", "sessions"), default="purchases")
    parser.add_argument(
        "--trigger", type=float, default=None, help="run until SIGTERM, a batch every SECONDS (0: as fast as possible)"
    )
    args = parser.parse_args()

    settings = Settings.from_env()
    spark = build_spark_session(settings, "bench-plain-spark")
    source = (
        spark.readStream.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
    )
    if args.max_offsets_per_trigger:
        source = source.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    query_of = {
        "purchases": purchase_counts,
        "pulses": pulse_windows,
        "temperatures": temperature_windows,
        "sessions": user_sessions,
    }[args.workload]
    batches = {"n": 0, "seconds": 0.0}  # micro-batches, and the seconds their foreachBatch took (see _timed)
    writer = query_of(source.load(), str(args.work_dir / "output"), batches).option(
        "checkpointLocation", str(args.work_dir / "checkpoint")
    )
    if args.trigger is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        query = writer.trigger(processingTime=f"{args.trigger:g} seconds").start()
        print(json.dumps({"event": "started"}), flush=True)
        while not stop.is_set() and not query.awaitTermination(0.5):  # short waits: SIGTERM is seen between them
            pass
        if query.isActive:
            query.stop()
    input_rows = sum(p["numInputRows"] for p in query.recentProgress)
    report = {"seconds": time.monotonic() - STARTED, "input_rows": input_rows}
    print(json.dumps({**report, "batches": batches["n"], "batch_seconds": batches["seconds"]}))
    spark.stop()


def purchase_counts(raw, output: str, batches: dict):
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from spark_jobs.jobs.purchase_counts import COUNTS, EVENT_SCHEMA

    schema = COUNTS.output_schema("user_id")
    DeltaTable.createIfNotExists(raw.sparkSession).location(output).addColumns(schema).execute()
    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    counts = (
        events.where("type = 'purchase' AND user_id IS NOT NULL")
        .groupBy("user_id")
        .agg(
            F.count("*").alias("purchases"),
            F.sum("amount").alias("amount_spent"),
            F.max("event_time").alias("last_purchase_at"),
        )
    )

    @_timed(batches)
    def merge(batch, _batch_id: int) -> None:
        (
            DeltaTable.forPath(batch.sparkSession, output)
            .alias("t")
            .merge(batch.alias("s"), "t.user_id = s.user_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    return counts.writeStream.outputMode("update").foreachBatch(merge)


def pulse_windows(raw, output: str, batches: dict):
    from pyspark.sql import functions as F

    from spark_jobs.jobs.patient_heart_rate import EVENT_SCHEMA

    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    beats = (
        events.where("type = 'pulse' AND patient_id IS NOT NULL AND event_time IS NOT NULL")
        .withWatermark("event_time", "5 seconds")
        .groupBy("patient_id", F.window("event_time", "60 seconds"))
        .count()
        .select(
            "patient_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.col("count").alias("heart_rate"),
        )
    )

    return beats.writeStream.outputMode("append").foreachBatch(_appender(output, batches))


def temperature_windows(raw, output: str, batches: dict):
    from pyspark.sql import functions as F

    from spark_jobs.jobs.temperature_averages import EVENT_SCHEMA

    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    windows = (
        events.where(
            "type = 'reading' AND sensor_id IS NOT NULL AND event_time IS NOT NULL AND temperature IS NOT NULL"
        )
        .withWatermark("event_time", "30 seconds")
        .groupBy("sensor_id", F.window("event_time", "5 minutes", "1 minute"))
        .agg(
            F.count("*").alias("readings"),
            F.avg("temperature").alias("avg_temperature"),
            F.min("temperature").alias("min_temperature"),
            F.max("temperature").alias("max_temperature"),
        )
        .select(
            "sensor_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "readings",
            "avg_temperature",
            "min_temperature",
            "max_temperature",
        )
    )
    return windows.writeStream.outputMode("append").foreachBatch(_appender(output, batches))


def user_sessions(raw, output: str, batches: dict):
    from pyspark.sql import functions as F

    from spark_jobs.jobs.user_sessions import EVENT_SCHEMA

    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select("e.*")
    visits = (
        events.where("type IN ('click', 'page_view') AND user_id IS NOT NULL AND event_time IS NOT NULL")
        .withWatermark("event_time", "5 minutes")
        .groupBy("user_id", F.session_window("event_time", "30 minutes"))
        .agg(
            F.min("event_time").alias("session_start"),
            F.max("event_time").alias("session_end"),
            F.count("*").alias("events"),
            F.count(F.when(F.col("type") == "page_view", 1)).alias("page_views"),
        )
        .select("user_id", "session_start", "session_end", "events", "page_views")
    )
    return visits.writeStream.outputMode("append").foreachBatch(_appender(output, batches))


def _timed(batches: dict):
    """A ``foreachBatch`` function, counted and timed in ``batches``: what the query's batches took (the
    source read, the aggregation and the write all run inside it), apart from starting and stopping."""

    def timing(write):
        def timed(batch, batch_id: int) -> None:
            started = time.monotonic()
            write(batch, batch_id)
            batches["n"] += 1
            batches["seconds"] += time.monotonic() - started

        return timed

    return timing


def _appender(output: str, batches: dict):
    @_timed(batches)
    def append(batch, _batch_id: int) -> None:
        batch.write.format("delta").mode("append").save(output)

    return append


if __name__ == "__main__":
    main()
