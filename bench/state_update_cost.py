"""What a state update costs: Spark's built-in aggregation vs the transformWithState processors.

purchase_counts v1 kept its state in a built-in ``groupBy().agg()`` (all JVM); v2 kept it in a Python
``transformWithState`` processor, because a built-in aggregation cannot delete a key; v3 runs the same
rules as a Java processor. This measures the price of each: KEYS purchase events for KEYS distinct users (one state update per key) through each
stateful operator, same input, same session, side by side, REPEATS times, fresh checkpoints each time.
The sink only counts rows, so the figure is the stateful operator plus the Kafka read.

    .venv/bin/python bench/state_update_cost.py [--keys 20000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

from runtime.kafka_broker import LocalKafkaBroker
from runtime.process import free_port
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.generators import purchases
from spark_jobs.jobs.purchase_counts import EVENT_SCHEMA, PurchaseCounter, state_changes
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.session import build_spark_session

console = Console()
TOPIC = "bench-purchases"
BUILTIN, JAVA, PYTHON = ("built-in groupBy().agg()", "transformWithState (Java processor)",
                         "transformWithState (Python processor)")  # fmt: skip


def one_event_per_user(keys: int) -> list[dict]:
    events = list(purchases.generate(keys, users=keys, seed=9, close_rate=0))
    return [{**e, "user_id": f"u{n:07d}"} for n, e in enumerate(events)]


def measure(spark, settings: Settings, operator: str, checkpoint: Path) -> tuple[float, int]:
    from pyspark.sql import functions as F

    raw = (spark.readStream.format("kafka").options(**settings.kafka.spark_options())
           .option("subscribe", TOPIC).option("startingOffsets", "earliest").load())  # fmt: skip
    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"), "offset").select(
        "e.*", "offset")  # fmt: skip
    if operator == BUILTIN:
        state = events.groupBy("user_id").agg(F.count(F.lit(1)).alias("purchases"), F.sum("amount").alias("spent"),
                                              F.max("event_time").alias("last"))  # fmt: skip
    elif operator == PYTHON:
        state = state_changes(events, None, None, PurchaseCounter)
    else:
        state = state_changes(events, None, None)  # the Java processor
    rows = []
    started = time.monotonic()
    query = (state.writeStream.outputMode("update").option("checkpointLocation", str(checkpoint))
             .foreachBatch(lambda df, _id: rows.append(df.count())).trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination()
    return time.monotonic() - started, sum(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-state-"))
    ports = sorted({free_port() for _ in range(3)})
    settings = Settings(data_dir=data, kafka_port=ports[0], kafka_controller_port=ports[1], airflow_port=ports[2])
    broker = LocalKafkaBroker(settings)
    broker.start()
    try:
        ensure_topic(settings.kafka, TOPIC, 2)
        purchases.produce(settings.kafka, TOPIC, one_event_per_user(args.keys))
        spark = build_spark_session(settings, "bench-state-update-cost")
        operators = (BUILTIN, JAVA, PYTHON)
        seconds: dict[str, list[float]] = {op: [] for op in operators}
        for repeat in range(args.repeats):
            for op in operators:  # alternate, so drift on a shared machine hits both
                took, updates = measure(spark, settings, op, data / f"cp-{repeat}-{len(seconds[op])}-op{operators.index(op)}")
                assert updates == args.keys, f"{op}: {updates} state updates, expected {args.keys}"
                seconds[op].append(took)
                console.print(f"{op}: {took:.1f} s for {updates:,} state updates")
        report(args, seconds)
    finally:
        broker.stop()


def report(args, seconds: dict[str, list[float]]) -> None:
    builtin, java, python = (statistics.median(seconds[op]) for op in (BUILTIN, JAVA, PYTHON))
    lines = [
        f"## State update cost, {args.keys:,} keys (built-in aggregation vs transformWithState, Java and Python) "
        f"({dt.date.today().isoformat()})",
        "",
        f"Command: `.venv/bin/python bench/state_update_cost.py --keys {args.keys} --repeats {args.repeats}`",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; local KRaft broker, "
        "Spark local[*], RocksDB state store, 2 shuffle partitions. One micro-batch, one update per key.",
        "",
        f"| stateful operator | seconds, median (min-max) of {args.repeats} | ms per key |",
        "|---|---|---|",
        *[f"| {op} | {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f}) | {statistics.median(v) / args.keys * 1000:.2f} |"
          for op, v in seconds.items()],
        "",
        f"Ratios to built-in (same run, alternating): Java processor {java / builtin:.1f}, Python processor "
        f"{python / builtin:.1f}; Python / Java {python / java:.1f}.",
        "",
    ]  # fmt: skip
    text = "\n".join(lines)
    console.print(text)
    with open(PROJECT_ROOT / "BENCHMARKS.md", "a") as out:
        out.write("\n" + text)


if __name__ == "__main__":
    main()
