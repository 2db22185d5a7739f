"""The plain-Spark peer of the benchmarks: purchase counts, pulse or temperature windows, sessions, order
enrichment or order payments as a bare Structured Streaming query.

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

``--workload enrichment`` (``<topic>`` is ``<orders>,<customer profiles>``): orders enriched with their customer
by Spark's stream-static join: the profiles topic read once as a batch table when the query starts (the latest
row of each key, by Kafka timestamp then offset; cached), each micro-batch of orders ``left``-joined with it on
the customer id, appended to a Delta table with the order's Kafka partition and offset. No versions, no grace: an
order sees the table as read at the start (bench/compare.py generates the input so that this is the row valid at
the order's time: see spark_jobs.reference.generators.orders.growing_customers).

``--workload payments`` (``<topic>`` is ``<orders>,<payments>``): orders and payments matched within 10 minutes,
Spark's stream-stream ``full_outer`` join of two Kafka sources on the order id and ``order_time BETWEEN
payment_time - 10 minutes AND payment_time + 10 minutes``, each side ``withWatermark(1 min)`` (the grace): a pair
is written when its second record arrives, an unmatched record once the watermark passes its window; appended to a
Delta table with both records' Kafka partitions and offsets (-1 for an absent side), the platform's columns.
``--max-offsets-per-trigger`` is shared by the two sources, half each (the two topics have as many records).

Run by bench/compare.py in its own process (its memory is measured per process tree); prints one JSON
line: ``{"seconds": ..., "input_rows": ..., "batches": ..., "batch_seconds": ...}`` where seconds run from the
process start and batch_seconds is what its micro-batches took.

``--trigger SECONDS`` (bench/latency.py): instead of processing what the topic holds (available-now), run
until SIGTERM with a micro-batch every SECONDS (Spark's processingTime trigger; 0: as fast as possible),
printing ``{"event": "started"}`` once the query runs; the JSON line above follows the stop.

    .venv/bin/python bench/plain_spark_peer.py <topic[,topic]> <work dir> [--max-offsets-per-trigger N] [--workload pulses|temperatures|sessions|enrichment|payments] [--trigger SECONDS]
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
from spark_jobs.driver.session import build_spark_session  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("topic")
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--max-offsets-per-trigger", type=int, default=None)
    parser.add_argument(
        "--workload",
        choices=("purchases", "pulses", "temperatures", "sessions", "enrichment", "payments"),
        default="purchases",
    )
    parser.add_argument(
        "--trigger", type=float, default=None, help="run until SIGTERM, a batch every SECONDS (0: as fast as possible)"
    )
    args = parser.parse_args()

    settings = Settings.from_env()
    spark = build_spark_session(settings, "bench-plain-spark")

    def read(topic: str, max_offsets: int | None = args.max_offsets_per_trigger):
        """The streaming Kafka source of ``topic``, from its start, at most ``max_offsets`` records a batch."""
        source = (
            spark.readStream.format("kafka")
            .options(**settings.kafka.spark_options())
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
        )
        if max_offsets:
            source = source.option("maxOffsetsPerTrigger", str(max_offsets))
        return source.load()

    batches = {"n": 0, "seconds": 0.0}  # micro-batches, and the seconds their foreachBatch took (see _timed)
    output = str(args.work_dir / "output")
    if args.workload == "enrichment":
        orders, profiles = args.topic.split(",")
        streaming = order_enrichment(read(orders), _latest_rows(spark, settings, profiles), output, batches)
    elif args.workload == "payments":
        orders, payments = args.topic.split(",")
        half = args.max_offsets_per_trigger and max(1, args.max_offsets_per_trigger // 2)
        streaming = order_payments(read(orders, half), read(payments, half), output, batches)
    else:
        query_of = {
            "purchases": purchase_counts,
            "pulses": pulse_windows,
            "temperatures": temperature_windows,
            "sessions": user_sessions,
        }[args.workload]
        streaming = query_of(read(args.topic), output, batches)
    writer = streaming.option("checkpointLocation", str(args.work_dir / "checkpoint"))
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

    from spark_jobs.reference.jobs.purchase_counts import COUNTS, EVENT_SCHEMA

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

    from spark_jobs.reference.jobs.patient_heart_rate import EVENT_SCHEMA

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

    from spark_jobs.reference.jobs.temperature_averages import EVENT_SCHEMA

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

    from spark_jobs.reference.jobs.user_sessions import EVENT_SCHEMA

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


def _latest_rows(spark, settings: Settings, topic: str):
    """The customer-profiles topic as a table, read once: each key's latest row (Kafka timestamp, then offset),
    cached before the stream starts (what a stream-static join reads each micro-batch)."""
    from pyspark.sql import functions as F

    from spark_jobs.reference.jobs.order_enrichment import CUSTOMER_SCHEMA

    records = (
        spark.read.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    rows = records.select(
        F.col("key").cast("string").alias("customer_id"),
        F.struct("timestamp", "offset").alias("at"),
        F.from_json(F.col("value").cast("string"), CUSTOMER_SCHEMA).alias("row"),
    )
    latest = rows.groupBy("customer_id").agg(F.max_by("row", "at").alias("row"))
    table = latest.select("customer_id", "row.name", "row.tier").persist()
    table.count()
    return table


def order_enrichment(raw, customers, output: str, batches: dict):
    from pyspark.sql import functions as F

    from spark_jobs.reference.jobs.order_enrichment import ORDER_SCHEMA

    orders = raw.select(
        F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o"),
        F.col("partition").alias("source_partition"),
        F.col("offset").alias("source_offset"),
    ).select("o.*", "source_partition", "source_offset")
    enriched = orders.join(customers, "customer_id", "left").select(
        "customer_id", "order_id", "amount", "event_time", "name", "tier", "source_partition", "source_offset"
    )
    return enriched.writeStream.outputMode("append").foreachBatch(_appender(output, batches))


def order_payments(raw_orders, raw_payments, output: str, batches: dict):
    from pyspark.sql import functions as F

    from spark_jobs.reference.jobs.order_payments import ORDER_SCHEMA, PAYMENT_SCHEMA

    def side(raw, schema, fields: dict[str, str]):
        parsed = raw.select(F.from_json(F.col("value").cast("string"), schema).alias("e"), "partition", "offset")
        return parsed.select(*(F.col(source).alias(name) for name, source in fields.items()))

    orders = side(
        raw_orders,
        ORDER_SCHEMA,
        {
            "o_order_id": "e.order_id",
            "customer_id": "e.customer_id",
            "amount": "e.amount",
            "order_time": "e.event_time",
            "o_partition": "partition",
            "o_offset": "offset",
        },
    ).withWatermark("order_time", "1 minute")
    payments = side(
        raw_payments,
        PAYMENT_SCHEMA,
        {
            "p_order_id": "e.order_id",
            "payment_id": "e.payment_id",
            "paid": "e.paid",
            "payment_time": "e.event_time",
            "p_partition": "partition",
            "p_offset": "offset",
        },
    ).withWatermark("payment_time", "1 minute")
    within = F.expr(
        "o_order_id = p_order_id AND order_time BETWEEN payment_time - INTERVAL 10 MINUTES "
        "AND payment_time + INTERVAL 10 MINUTES"
    )
    results = orders.join(payments, within, "full_outer").select(
        F.coalesce("o_order_id", "p_order_id").alias("order_id"),
        "customer_id",
        "amount",
        "order_time",
        "payment_id",
        "paid",
        "payment_time",
        F.coalesce("o_partition", "p_partition").alias("source_partition"),
        F.coalesce("o_offset", F.lit(-1)).alias("left_offset"),
        F.coalesce("p_offset", F.lit(-1)).alias("right_offset"),
    )
    return results.writeStream.outputMode("append").foreachBatch(_appender(output, batches))


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
