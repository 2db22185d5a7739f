"""What reading the input costs the platform: plain parsing vs the dead-letter classification.

The platform's purchase_counts spends most of its run in the "state" phase (BENCHMARKS.md), which is the
whole plan up to the processor: Kafka read, JSON decoding, the dead-letter classification, the shuffle
and the Java processor. bench/state_update_cost.py shows the processor costs about what the built-in
aggregation does; this measures the rest, over the same EVENTS purchase events (Zipf-like users, one
micro-batch's worth at the 1e7-event benchmark size), each variant written to Spark's ``noop`` sink so
that nothing is pruned, side by side, REPEATS times:

* **parse**: ``from_json`` of the value, what plain Spark does (bench/plain_spark_peer.py);
* **JSON object check**: the classification's "is this a JSON object" test alone
  (``try_parse_json``, UTF-8 and an opening brace);
* **classify, the processor's input**: the job's own classification (spark_jobs.jobs.purchase_counts.classify)
  as the job's query hands it to the processor: every record, valid ones decoded, rejected ones with their
  dead-letter records (spark_jobs.dead_letter.with_dead_letters): what the job's one query reads;
* **classify, valid rows** and **classify, dead letters**: the same classification's valid rows, and its
  rejected rows as dead-letter records: what the two queries of the platform before 2026-11-26 read (the
  main query and a companion dead-letter query, each classifying the whole input), in the same run;
* **classify, the processor's input, no unparsed() checks**: with the rules' ``unparsed()`` checks (a field
  of the parsed variant) taken out for the measurement: what they cost.

The report also counts ``from_json`` in the executed plan of the processor's input: how many times a
record is decoded.

    .venv/bin/python bench/input_cost.py [--events 800000] [--users 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
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
from spark_jobs import dead_letter  # noqa: E402
from spark_jobs.generators import purchases  # noqa: E402
from spark_jobs.jobs import purchase_counts  # noqa: E402
from spark_jobs.kafka_topics import ensure_topic  # noqa: E402
from spark_jobs.session import build_spark_session  # noqa: E402

console = Console()
TOPIC = "bench-purchases"
PARSE, OBJECT_CHECK = "parse (from_json, as plain Spark)", "JSON object check alone"
INPUT = "classify, the processor's input (valid rows and dead letters)"
VALID, DEAD = "classify, valid rows (the main query before)", "classify, dead letters (the companion query before)"
NO_UNPARSED = "classify, the processor's input, no unparsed() checks"


@contextlib.contextmanager
def unparsed_checks_off():
    """For one measurement: the classification without its ``unparsed()`` rule parts (what they cost)."""
    from pyspark.sql import functions as F

    real = dead_letter.unparsed
    dead_letter.unparsed = lambda field: F.lit(False)
    try:
        yield
    finally:
        dead_letter.unparsed = real


def variant(raw, name: str):
    from pyspark.sql import functions as F

    if name == PARSE:
        return raw.select(F.from_json(F.col("value").cast("string"), purchase_counts.EVENT_SCHEMA).alias("e")).select("e.*")
    if name == OBJECT_CHECK:
        text = F.col("value").cast("string").alias(dead_letter.TEXT_COLUMN)
        parsed = raw.select(text, F.expr("try_parse_json(CAST(value AS STRING))").alias(dead_letter.JSON_COLUMN))
        return parsed.select(dead_letter.is_json_object().alias("ok"))
    # The job's own rules: classify() only asks its context for the Kafka source.
    classified = purchase_counts.classify(types.SimpleNamespace(kafka_source=lambda: raw))
    if name in (INPUT, NO_UNPARSED):
        return dead_letter.with_dead_letters(classified, "bench", "user_id", "offset")
    if name == VALID:
        return dead_letter.valid(classified, "offset")
    return dead_letter.dead_letter_records(classified.where(F.col(dead_letter.ERROR_COLUMN).isNotNull()), "bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=800_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    with private_broker("bench-input-") as settings:
        ensure_topic(settings.kafka, TOPIC, 2)
        events = purchases.generate(args.events, users=args.users, seed=3, start=purchases.start_ending_by(args.events))
        purchases.produce(settings.kafka, TOPIC, events)
        spark = build_spark_session(settings, "bench-input-cost")
        raw = spark.read.format("kafka").options(**settings.kafka.spark_options()).option("subscribe", TOPIC).load()
        raw = raw.cache()  # the Kafka read itself is the same for every variant: measure what follows it
        assert raw.count() == args.events
        decodes = variant(raw, INPUT)._jdf.queryExecution().executedPlan().toString().count("from_json")
        names = (PARSE, OBJECT_CHECK, INPUT, VALID, DEAD, NO_UNPARSED)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):
            for name in names:  # alternate, so drift on a shared machine hits all
                with unparsed_checks_off() if name == NO_UNPARSED else contextlib.nullcontext():
                    started = time.monotonic()
                    variant(raw, name).write.format("noop").mode("overwrite").save()
                    seconds[name].append(time.monotonic() - started)
                console.print(f"{name}: {seconds[name][-1]:.1f} s")
        report(args, seconds, decodes)


def report(args, seconds: dict[str, list[float]], decodes: int) -> None:
    median = {name: statistics.median(v) for name, v in seconds.items()}
    before = median[VALID] + median[DEAD]
    lines = [
        f"## Input cost, {args.events:,} purchase events (plain parsing vs the dead-letter classification) "
        f"({dt.date.today().isoformat()})",
        "",
        f"Command: `.venv/bin/python bench/input_cost.py --events {args.events} --users {args.users} --repeats {args.repeats}`",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; Spark local[*]; the "
        "Kafka read is cached first, so each figure is what follows it; every variant written to the noop sink.",
        "",
        f"| over the same input | seconds, median (min-max) of {args.repeats} | µs per event | x parse |",
        "|---|---|---|---|",
        *[f"| {name} | {median[name]:.1f} ({min(v):.1f}-{max(v):.1f}) | {median[name] / args.events * 1e6:.1f} | "
          f"{median[name] / median[PARSE]:.1f} |" for name, v in seconds.items()],
        "",
        f"The platform's input per batch, one query: {median[INPUT]:.1f} s, {median[INPUT] / median[PARSE]:.1f}x "
        f"plain Spark's parse; with the two queries before (main + companion): {before:.1f} s, "
        f"{before / median[PARSE]:.1f}x (same run). The executed plan of the processor's input holds `from_json` "
        f"{decodes} times (plain Spark's: once).",
        "",
    ]  # fmt: skip
    append_section(lines, console)


if __name__ == "__main__":
    main()
