"""What reading the input costs the platform: plain parsing vs decoding and the dead-letter classification.

The platform's purchase_counts spends most of its run in the "state" phase (BENCHMARKS.md), which is the
whole plan up to the processor: Kafka read, JSON decoding, the dead-letter classification, the shuffle
and the Java processor. bench/state_update_cost.py shows the processor costs about what the built-in
aggregation does; this measures the rest, over the same EVENTS purchase events (Zipf-like users, one
micro-batch's worth at the 1e7-event benchmark size), each variant written to Spark's ``noop`` sink so
that nothing is pruned, side by side, REPEATS times:

* **parse**: ``from_json`` of the value, what plain Spark does (bench/plain_spark_peer.py);
* **decode, JVM decoder**: :func:`spark_jobs.io.dead_letter.decode_json` as the jobs run it: one pass over
  each record's bytes (``streamstate.primitives.JsonDecoder``) for the object check, the event and the
  fields as written;
* **decode, Spark's functions**: the same three columns from ``from_json`` and ``try_parse_json`` (two
  parses per record: how the jobs decoded before 2026-11-27, and how a schema the JVM decoder does not
  read is decoded);
* **classify, the processor's input**: the job's own classification (spark_jobs.reference.jobs.purchase_counts.classify)
  as the job's query hands it to the processor: every record, valid ones decoded, rejected ones with their
  dead-letter records (spark_jobs.io.dead_letter.with_dead_letters): what the job's one query reads; with
  either decoder.

The report also counts ``from_json`` in the executed plan of the processor's input: how many times Spark's
own decoder reads a record.

``--workload temperatures`` measures the same over temperature readings (spark_jobs.reference.jobs.temperature_averages:
a double, a time and three strings per event; ``--users`` is then the number of sensors).

    .venv/bin/python bench/input_cost.py [--workload purchases] [--events 800000] [--users 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time
import types
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import append_section, private_broker  # noqa: E402
from spark_jobs.driver.session import build_spark_session  # noqa: E402
from spark_jobs.io import dead_letter  # noqa: E402
from spark_jobs.io.kafka_topics import ensure_topic  # noqa: E402
from spark_jobs.reference.generators import purchases, temperatures  # noqa: E402
from spark_jobs.reference.jobs import purchase_counts, temperature_averages  # noqa: E402
from spark_jobs.testing import decoding_with  # noqa: E402

console = Console()
TOPIC = "bench-input"
#: workload -> (job module, key field)
WORKLOADS = {"purchases": (purchase_counts, "user_id"), "temperatures": (temperature_averages, "sensor_id")}
PARSE = "parse (from_json, as plain Spark)"
DECODE, DECODE_BY_SPARK = "decode, JVM decoder (one pass)", "decode, Spark's functions (from_json + try_parse_json)"
INPUT = "classify, the processor's input, JVM decoder"
INPUT_BY_SPARK = "classify, the processor's input, Spark's functions (as before)"
DECODER = {DECODE: "jvm", DECODE_BY_SPARK: "spark", INPUT: "jvm", INPUT_BY_SPARK: "spark"}


def variant(raw, name: str, workload: str):
    from pyspark.sql import functions as F

    job, key_field = WORKLOADS[workload]
    if name == PARSE:
        return raw.select(F.from_json(F.col("value").cast("string"), job.EVENT_SCHEMA).alias("e")).select("e.*")
    if name in (DECODE, DECODE_BY_SPARK):
        decoded = dead_letter.decode_json(raw, job.EVENT_SCHEMA, DECODER[name])
        return decoded.select(dead_letter.OBJECT_COLUMN, dead_letter.EVENT_COLUMN, dead_letter.WRITTEN_COLUMN)
    # The job's own rules: classify() only asks its context for the Kafka source.
    with decoding_with(DECODER[name]):
        classified = job.classify(types.SimpleNamespace(sources=types.SimpleNamespace(stream=lambda: raw)))
    return dead_letter.with_dead_letters(classified, "bench", key_field, "offset")


def generated(workload: str, events: int, keys: int):
    """``events`` of the workload over ``keys`` users or sensors, produced to TOPIC."""
    if workload == "purchases":
        return purchases.generate(events, users=keys, seed=3, start=purchases.start_ending_by(events))
    # one reading per sensor every 5 s or so
    return list(temperatures.generate(sensors=keys, seconds=events * 5 // keys, seed=3))[:events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=list(WORKLOADS), default="purchases")
    parser.add_argument("--events", type=int, default=800_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with private_broker("bench-input-") as settings:
        ensure_topic(settings.kafka, TOPIC, 2)
        events = list(generated(args.workload, args.events, args.users))
        args.events = len(events)
        (purchases if args.workload == "purchases" else temperatures).produce(settings.kafka, TOPIC, events)
        spark = build_spark_session(settings, "bench-input-cost")
        raw = spark.read.format("kafka").options(**settings.kafka.spark_options()).option("subscribe", TOPIC).load()
        raw = raw.cache()  # the Kafka read itself is the same for every variant: measure what follows it
        assert raw.count() == args.events
        decodes = variant(raw, INPUT, args.workload)._jdf.queryExecution().executedPlan().toString().count("from_json")
        names = (PARSE, DECODE, DECODE_BY_SPARK, INPUT, INPUT_BY_SPARK)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):
            for name in names:  # alternate, so drift on a shared machine hits all
                started = time.monotonic()
                variant(raw, name, args.workload).write.format("noop").mode("overwrite").save()
                seconds[name].append(time.monotonic() - started)
                console.print(f"{name}: {seconds[name][-1]:.1f} s")
        report(args, seconds, decodes)


def report(args, seconds: dict[str, list[float]], decodes: int) -> None:
    median = {name: statistics.median(v) for name, v in seconds.items()}
    lines = [
        f"## Input cost, {args.events:,} {args.workload} events (plain parsing vs decoding and the dead-letter "
        "classification) "
        f"({dt.date.today().isoformat()})",
        "",
        f"Command: `.venv/bin/python bench/input_cost.py --workload {args.workload} --events {args.events} "
        f"--users {args.users} --repeats {args.repeats}`",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; Spark local[*]; the "
        "Kafka read is cached first, so each figure is what follows it; every variant written to the noop sink.",
        "",
        f"| over the same input | seconds, median (min-max) of {args.repeats} | µs per event | x parse |",
        "|---|---|---|---|",
        *[
            f"| {name} | {median[name]:.1f} ({min(v):.1f}-{max(v):.1f}) | {median[name] / args.events * 1e6:.1f} | "
            f"{median[name] / median[PARSE]:.1f} |"
            for name, v in seconds.items()
        ],
        "",
        f"The platform's input per batch: {median[INPUT]:.1f} s, {median[INPUT] / median[PARSE]:.1f}x plain Spark's "
        f"parse; decoded by Spark's functions: {median[INPUT_BY_SPARK]:.1f} s, "
        f"{median[INPUT_BY_SPARK] / median[PARSE]:.1f}x (same run). The executed plan of the processor's input "
        f"holds `from_json` {decodes} times (plain Spark's: once).",
        "",
    ]
    append_section(lines, console)


if __name__ == "__main__":
    main()
