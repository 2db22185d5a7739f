"""What Spark's Kafka source costs per record, with the Java consumer's defaults and with the platform's fetch options.

Spark's Kafka source asks the broker for the partition's earliest and latest offsets (two ListOffsets round trips)
after **every** poll of its consumer (``InternalKafkaConsumer.fetch``: ``getAvailableOffsetRange``), and the Java
consumer returns at most ``max.poll.records`` (500) records a poll: about 8,000 round trips per million records
read, which a profile of the joins showed as the Kafka reads' largest part (BENCHMARKS.md). The platform's sources
read with :data:`spark_jobs.io.kafka_topics.SPARK_SOURCE_FETCH` (larger polls, larger fetches).

``--events`` purchase events on a 2-partition topic of a private broker, read whole by a Spark batch read (the same
consumer a micro-batch uses) into Spark's ``noop`` sink, read committed as the jobs read; the variants alternate,
``--repeats`` times each, so the machine's drift hits all of them:

    .venv/bin/python bench/kafka_read_cost.py [--events 1000000] [--repeats 4]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import append_section, private_broker  # noqa: E402
from spark_jobs.driver.session import build_spark_session  # noqa: E402
from spark_jobs.io.kafka_topics import SPARK_SOURCE_FETCH, ensure_topic  # noqa: E402
from spark_jobs.reference.generators import purchases  # noqa: E402

console = Console()
TOPIC = "bench-kafka-read"
#: variant -> the Kafka source's extra options
VARIANTS: dict[str, dict[str, str]] = {
    "the Java consumer's defaults (500 records a poll, 1 MiB fetches)": {},
    "the platform's (SPARK_SOURCE_FETCH)": SPARK_SOURCE_FETCH,
}


def read_all(spark, settings, options: dict[str, str]) -> None:
    (
        spark.read.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", TOPIC)
        .option("kafka.isolation.level", "read_committed")
        .options(**options)
        .load()
        .write.format("noop")
        .mode("overwrite")
        .save()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    with private_broker("bench-kafka-read-") as settings:
        ensure_topic(settings.kafka, TOPIC, 2)
        events = purchases.generate(args.events, users=100_000, seed=3, start=purchases.start_ending_by(args.events))
        produced = purchases.produce(settings.kafka, TOPIC, events)
        spark = build_spark_session(settings, "bench-kafka-read-cost")
        read_all(spark, settings, {})  # warm the JVM and the broker's page cache once, uncounted
        seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.repeats):
            for name, options in VARIANTS.items():
                started = time.monotonic()
                read_all(spark, settings, options)
                seconds[name].append(time.monotonic() - started)
                console.print(f"{name}: {seconds[name][-1]:.2f} s")
        spark.stop()
    report(args, produced, seconds)


def report(args, produced: int, seconds: dict[str, list[float]]) -> None:
    fastest = {name: min(v) for name, v in seconds.items()}
    default, platform_name = list(VARIANTS)
    options = ", ".join(f"`{k}={v}`" for k, v in SPARK_SOURCE_FETCH.items())
    lines = [
        f"## Spark's Kafka source: {produced:,} records read ({dt.date.today().isoformat()})",
        "",
        f"Command: `.venv/bin/python bench/kafka_read_cost.py --events {args.events} --repeats {args.repeats}`",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; Spark local[*], a batch "
        "read of a 2-partition topic (read committed) into the noop sink, the variants alternating.",
        "",
        "| consumer options | fastest s | median s | every run, s | µs per record (fastest) |",
        "|---|---:|---:|---|---:|",
        *[
            f"| {name} | {min(v):.2f} | {statistics.median(v):.2f} | {', '.join(f'{s:.2f}' for s in v)} | "
            f"{min(v) / produced * 1e6:.2f} |"
            for name, v in seconds.items()
        ],
        "",
        f"The platform's options ({options}): {fastest[platform_name] / fastest[default]:.2f}x the defaults' time "
        "(fastest runs, same invocation).",
    ]
    append_section(lines, console)


if __name__ == "__main__":
    main()
