"""What a state update costs: Spark's built-in aggregation vs the transformWithState processors.

purchase_counts v1 kept its state in a built-in ``groupBy().agg()`` (all JVM); v2 kept it in a Python
``transformWithState`` processor, because a built-in aggregation cannot delete a key; v3 runs the same
rules as a Java processor. This measures the price of each: KEYS x EVENTS_PER_KEY purchase events (one per
user when 1; else Zipf-like users, as in the benchmarks' purchases, several events per key) through each
stateful operator in one micro-batch, same input, same session, side by side, REPEATS times, fresh
checkpoints each time. The sink only counts rows, so the figure is the stateful operator plus the Kafka
read. A built-in aggregation combines a key's events before the shuffle; a transformWithState processor
gets every event shuffled and sorted to it, so several events per key is where they part.

``--encodings`` also runs each processor with the other state encoding: the platform runs jobs with Avro
state (it evolves in place, see spark_jobs/run.py), Spark's default is UnsafeRow; ``--batches`` cuts the
input into that many micro-batches, so that later ones read (decode) state the earlier ones wrote.

    .venv/bin/python bench/state_update_cost.py [--keys 20000] [--events-per-key 1] [--repeats 2]
    .venv/bin/python bench/state_update_cost.py --keys 100000 --events-per-key 8 --operators built-in java
    .venv/bin/python bench/state_update_cost.py --keys 100000 --events-per-key 8 --batches 4 \
        --operators java python --encodings unsaferow avro
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
from runtime.settings import Settings  # noqa: E402
from spark_jobs.generators import purchases  # noqa: E402
from spark_jobs.jobs.purchase_counts import EVENT_SCHEMA, PurchaseCounter, state_changes  # noqa: E402
from spark_jobs.jobs.recent_buyers import RECENT  # noqa: E402
from spark_jobs.kafka_topics import ensure_topic  # noqa: E402
from spark_jobs.registry import StoreSpec  # noqa: E402
from spark_jobs.session import build_spark_session, session_conf  # noqa: E402
from spark_jobs.state.checkpoint_offsets import STATE_ENCODING_CONF  # noqa: E402

console = Console()
TOPIC = "bench-purchases"
BUILTIN, JAVA, PYTHON, LRU = (
    "built-in groupBy().agg()",
    "transformWithState (Java processor)",
    "transformWithState (Python processor)",
    "transformWithState (Java LRU processor)",
)


OPERATORS = {"built-in": BUILTIN, "java": JAVA, "python": PYTHON, "lru": LRU}
#: ``--lru-entries``: the lru store's max_entries per source partition (recent_buyers' processor)
LRU_ENTRIES = {"value": 1000}
ENCODINGS = ["unsaferow", "avro"]


def purchase_events(keys: int, events_per_key: int) -> list[dict]:
    """One event per user (``events_per_key`` 1), or keys x events_per_key events of Zipf-like users."""
    if events_per_key > 1:
        count = keys * events_per_key
        return list(purchases.generate(count, users=keys, seed=9, close_rate=0, start=purchases.start_ending_by(count)))
    events = list(purchases.generate(keys, users=keys, seed=9, close_rate=0))
    return [{**e, "user_id": f"u{n:07d}"} for n, e in enumerate(events)]


def measure(spark, settings: Settings, variant: tuple[str, str], checkpoint: Path, per_batch: int) -> tuple[float, int]:
    """Seconds to run the input through ``variant`` (operator, state encoding), and the state updates."""
    from pyspark.sql import functions as F

    operator, encoding = variant
    raw = (
        spark.readStream.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_batch)
        .load()
    )
    events = raw.select(
        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"), "offset", "partition"
    ).select("e.*", "offset", "partition")
    if operator == BUILTIN:
        state = events.groupBy("user_id").agg(
            F.count(F.lit(1)).alias("purchases"), F.sum("amount").alias("spent"), F.max("event_time").alias("last")
        )
    elif operator == LRU:  # the same aggregates in an lru store: evicts once the store is full
        store = StoreSpec(RECENT.store, kind="lru", max_entries=LRU_ENTRIES["value"])
        state = RECENT.changes(events, "user_id", None, store, job="bench")
    elif operator == PYTHON:
        state = state_changes(events, None, None, PurchaseCounter)
    else:
        state = state_changes(events, None, None)  # the Java processor
    rows = []
    started = time.monotonic()
    writer = (
        state.writeStream.outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(lambda df, _id: rows.append(df.count()))
        .trigger(availableNow=True)
    )
    with session_conf(spark, {STATE_ENCODING_CONF: encoding}):
        query = writer.start()
    query.awaitTermination()
    return time.monotonic() - started, sum(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--events-per-key", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--operators", nargs="+", choices=list(OPERATORS), default=list(OPERATORS))
    parser.add_argument(
        "--encodings",
        nargs="+",
        choices=ENCODINGS,
        default=["unsaferow"],
        help="state encodings of the processors (the built-in aggregation has UnsafeRow only)",
    )
    parser.add_argument("--batches", type=int, default=1, help="micro-batches the input is cut into")
    parser.add_argument("--lru-entries", type=int, default=1000, help="the lru operator's max_entries per partition")
    args = parser.parse_args()
    LRU_ENTRIES["value"] = args.lru_entries

    with private_broker("bench-state-") as settings:
        ensure_topic(settings.kafka, TOPIC, 2)
        events = purchase_events(args.keys, args.events_per_key)
        purchases.produce(settings.kafka, TOPIC, events)
        users = len({e["user_id"] for e in events})  # each operator updates every user once per batch it is in
        per_batch = -(-len(events) // args.batches)
        spark = build_spark_session(settings, "bench-state-update-cost")
        variants = [
            (OPERATORS[name], encoding)
            for name in args.operators
            for encoding in (["unsaferow"] if name == "built-in" else args.encodings)
        ]
        seconds: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        updated: dict[str, int] = {}  # operator -> state updates (the same whatever the encoding)
        for repeat in range(args.repeats):
            for n, variant in enumerate(variants):  # alternate, so drift on a shared machine hits all
                took, updates = measure(spark, settings, variant, settings.data_dir / f"cp-{repeat}-{n}", per_batch)
                assert updates >= users, f"{variant}: {updates} state updates, expected {users} or more"
                assert updated.setdefault(variant[0], updates) == updates, f"{variant}: {updates} state updates"
                seconds[variant].append(took)
                console.print(f"{label(variant)}: {took:.1f} s for {len(events):,} events, {updates:,} state updates")
        report(args, seconds, len(events), users)


def label(variant: tuple[str, str]) -> str:
    operator, encoding = variant
    return f"{operator}, {'Avro' if encoding == 'avro' else 'UnsafeRow'} state"


def short(variant: tuple[str, str]) -> str:
    """ "Java processor avro" for the ratios' lines."""
    operator, encoding = variant
    return f"{operator.split(' (')[-1].rstrip(')')} {encoding}"


def report(args, seconds: dict[tuple[str, str], list[float]], events: int, users: int) -> None:
    median = {variant: statistics.median(v) for variant, v in seconds.items()}
    command = (
        f".venv/bin/python bench/state_update_cost.py --keys {args.keys} --events-per-key {args.events_per_key} "
        f"--repeats {args.repeats} --operators {' '.join(args.operators)}"
    )
    if args.encodings != ["unsaferow"] or args.batches != 1:
        command += f" --encodings {' '.join(args.encodings)} --batches {args.batches}"
    if LRU in (OPERATORS[name] for name in args.operators):
        command += f" --lru-entries {args.lru_entries}"
    builtin = median.get((BUILTIN, "unsaferow"))
    ratios = [f"{short(v)} {m / builtin:.1f}" for v, m in median.items() if builtin and v[0] != BUILTIN]
    avro = [
        f"{short((op, ''))}{median[(op, 'avro')] / median[(op, 'unsaferow')]:.2f}"
        for op in OPERATORS.values()
        if (op, "avro") in median and (op, "unsaferow") in median
    ]
    compared = (
        "transformWithState with UnsafeRow vs Avro state"
        if len(args.encodings) > 1
        else "built-in aggregation vs transformWithState"
    )
    shape = (
        "one update per key"
        if args.events_per_key == 1
        else f"{events:,} events of {users:,} Zipf-like users ({events / users:.1f} events per updated key)"
    )
    lines = [
        f"## State update cost, {args.keys:,} keys, {args.events_per_key} events per key ({compared}) "
        f"({dt.date.today().isoformat()})",
        "",
        f"Command: `{command}`",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; local KRaft broker, "
        f"Spark local[*], RocksDB state store, 2 shuffle partitions. "
        f"{'One micro-batch' if args.batches == 1 else f'{args.batches} micro-batches'}, {shape}.",
        "",
        f"| stateful operator | seconds, median (min-max) of {args.repeats} | µs per event |",
        "|---|---|---|",
        *[
            f"| {label(variant)} | {median[variant]:.1f} ({min(v):.1f}-{max(v):.1f}) | {median[variant] / events * 1e6:.1f} |"
            for variant, v in seconds.items()
        ],
        "",
        (f"Ratios to built-in (same run, alternating): {', '.join(ratios)}." if ratios else ""),
        (f"Avro state / UnsafeRow state, same processor (same run, alternating): {', '.join(avro)}." if avro else ""),
        "",
    ]
    append_section(lines, console)


if __name__ == "__main__":
    main()
