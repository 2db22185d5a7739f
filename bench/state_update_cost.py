"""What a state update costs: Spark's built-in aggregation vs the transformWithState processors.

purchase_counts v1 kept its state in a built-in ``groupBy().agg()`` (all JVM); v2 kept it in a Python
``transformWithState`` processor, because a built-in aggregation cannot delete a key; v3 runs the same
rules as a Java processor; ``purchase_counts_in_memory`` runs them in Spark's in-memory state store
(``in-memory``: ``flatMapGroupsWithState``, no RocksDB). This measures the price of each: KEYS x EVENTS_PER_KEY purchase events (one per
user when 1; else Zipf-like users, as in the benchmarks' purchases, several events per key) through each
stateful operator in one micro-batch, same input, same session, side by side, REPEATS times, fresh
checkpoints each time. The sink only counts rows, so the figure is the stateful operator plus the Kafka
read. A built-in aggregation combines a key's events before the shuffle; a transformWithState processor
gets every event shuffled and sorted to it, so several events per key is where they part.

``--encodings`` also runs each processor with the other state encoding: the platform runs jobs with Avro
state (it evolves in place, see spark_jobs/driver/run.py), Spark's default is UnsafeRow; ``--batches`` cuts the
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
from spark_jobs.driver.session import build_spark_session, session_conf  # noqa: E402
from spark_jobs.io.kafka_topics import ensure_topic  # noqa: E402
from spark_jobs.primitives.pipeline import IN_MEMORY_QUERY_CONF  # noqa: E402
from spark_jobs.reference.generators import purchases  # noqa: E402
from spark_jobs.reference.jobs.purchase_counts import COUNTS, EVENT_SCHEMA, STORE, PurchaseCounter, state_changes  # noqa: E402
from spark_jobs.reference.jobs.recent_buyers import RECENT  # noqa: E402
from spark_jobs.registry import StoreSpec  # noqa: E402
from spark_jobs.state.checkpoint_offsets import STATE_ENCODING_CONF  # noqa: E402

console = Console()
TOPIC = "bench-purchases"
BUILTIN, JAVA, PYTHON, LRU, IN_MEMORY = (
    "built-in groupBy().agg()",
    "transformWithState (Java processor)",
    "transformWithState (Python processor)",
    "transformWithState (Java LRU processor)",
    "flatMapGroupsWithState (Java processor, in-memory state store)",
)


OPERATORS = {"built-in": BUILTIN, "java": JAVA, "python": PYTHON, "lru": LRU, "in-memory": IN_MEMORY}
#: operators whose state is UnsafeRow only (their operator refuses Avro)
UNSAFEROW_ONLY = ("built-in", "in-memory")
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


#: variant -> the memory its state store reported after its last micro-batch (bytes; Spark's
#: ``stateOperators[].memoryUsedBytes``: RocksDB's memtables and cache, or the in-memory store's maps)
STATE_MEMORY: dict[tuple[str, str], int] = {}


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
    elif operator == IN_MEMORY:  # purchase_counts_in_memory's store: Spark's in-memory state store
        state = COUNTS.changes(events, "user_id", None, StoreSpec(STORE, kind="in_memory"), job="bench")
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
    conf = IN_MEMORY_QUERY_CONF if operator == IN_MEMORY else {STATE_ENCODING_CONF: encoding}
    with session_conf(spark, conf):
        query = writer.start()
    query.awaitTermination()
    took = time.monotonic() - started
    operators = (query.lastProgress or {}).get("stateOperators") or []
    if operators:
        STATE_MEMORY[variant] = sum(o.get("memoryUsedBytes", 0) for o in operators)
    return took, sum(rows)


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
        help="state encodings of the processors (the built-in aggregation and the in-memory store: UnsafeRow only)",
    )
    parser.add_argument("--batches", type=int, default=1, help="micro-batches the input is cut into")
    parser.add_argument("--lru-entries", type=int, default=1000, help="the lru operator's max_entries per partition")
    parser.add_argument(
        "--restarts",
        action="store_true",
        help="then restart each operator's last query over two new events: its state loaded back from the checkpoint",
    )
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
            for encoding in (["unsaferow"] if name in UNSAFEROW_ONLY else args.encodings)
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
        restarts: dict[tuple[str, str], float] = {}
        for n, variant in enumerate(variants if args.restarts else []):
            # a new query over the last repeat's checkpoint (its state store loaded anew), two new events
            extra = [{**e, "user_id": f"restart-{n}-{i}"} for i, e in enumerate(events[:2])]
            purchases.produce(settings.kafka, TOPIC, extra)
            checkpoint = settings.data_dir / f"cp-{args.repeats - 1}-{n}"
            restarts[variant], _ = measure(spark, settings, variant, checkpoint, per_batch)
            console.print(f"{label(variant)}: restarted over {users:,} keys in {restarts[variant]:.1f} s")
        report(args, seconds, len(events), users, restarts)


def label(variant: tuple[str, str]) -> str:
    operator, encoding = variant
    return f"{operator}, {'Avro' if encoding == 'avro' else 'UnsafeRow'} state"


def short(variant: tuple[str, str]) -> str:
    """ "Java processor avro" for the ratios' lines."""
    operator, encoding = variant
    return f"{operator.split(' (')[-1].rstrip(')')} {encoding}"


def report(
    args, seconds: dict[tuple[str, str], list[float]], events: int, users: int, restarts: dict[tuple[str, str], float]
) -> None:
    median = {variant: statistics.median(v) for variant, v in seconds.items()}
    command = (
        f".venv/bin/python bench/state_update_cost.py --keys {args.keys} --events-per-key {args.events_per_key} "
        f"--repeats {args.repeats} --operators {' '.join(args.operators)}"
    )
    if args.encodings != ["unsaferow"] or args.batches != 1:
        command += f" --encodings {' '.join(args.encodings)} --batches {args.batches}"
    if LRU in (OPERATORS[name] for name in args.operators):
        command += f" --lru-entries {args.lru_entries}"
    if restarts:
        command += " --restarts"
    builtin = median.get((BUILTIN, "unsaferow"))
    ratios = [f"{short(v)} {m / builtin:.1f}" for v, m in median.items() if builtin and v[0] != BUILTIN]
    avro = [
        f"{short((op, ''))}{median[(op, 'avro')] / median[(op, 'unsaferow')]:.2f}"
        for op in OPERATORS.values()
        if (op, "avro") in median and (op, "unsaferow") in median
    ]
    if len(args.encodings) > 1:
        compared = "transformWithState with UnsafeRow vs Avro state"
    elif IN_MEMORY in (OPERATORS[name] for name in args.operators):
        compared = "RocksDB vs the in-memory state store"
    else:
        compared = "built-in aggregation vs transformWithState"
    in_memory, rocksdb = median.get((IN_MEMORY, "unsaferow")), median.get((JAVA, "unsaferow"))
    shape = (
        "one update per key"
        if args.events_per_key == 1
        else f"{events:,} events of {users:,} Zipf-like users ({events / users:.1f} events per updated key)"
    )
    lines: list[str] = [
        f"## State update cost, {args.keys:,} keys, {args.events_per_key} events per key ({compared}) "
        f"({dt.date.today().isoformat()})",
        "",
        f"Command: `{command}`",
        f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; local KRaft broker, "
        "Spark local[*], RocksDB state store (the in-memory store's operator: Spark's in-memory one), 2 shuffle "
        "partitions. "
        f"{'One micro-batch' if args.batches == 1 else f'{args.batches} micro-batches'}, {shape}.",
        "",
        f"| stateful operator | seconds, median (min-max) of {args.repeats} | µs per event | state memory, MiB |",
        "|---|---|---|---|",
        *[
            f"| {label(variant)} | {median[variant]:.1f} ({min(v):.1f}-{max(v):.1f}) | "
            f"{median[variant] / events * 1e6:.1f} | {STATE_MEMORY.get(variant, 0) / 2**20:.0f} |"
            for variant, v in seconds.items()
        ],
        "",
        "State memory: what the state store reported after the last micro-batch (`memoryUsedBytes`: RocksDB's "
        "memtables and block cache; the in-memory store's maps, every version it keeps).",
        "",
        "",
        (f"Ratios to built-in (same run, alternating): {', '.join(ratios)}." if ratios else ""),
        (
            f"In-memory store / RocksDB, the same Java rules (same run, alternating): {in_memory / rocksdb:.2f}."
            if in_memory and rocksdb
            else ""
        ),
        (f"Avro state / UnsafeRow state, same processor (same run, alternating): {', '.join(avro)}." if avro else ""),
        "",
    ]
    lines = [line for n, line in enumerate(lines) if line or (n and lines[n - 1])]  # no empty line twice
    if restarts:
        lines += [
            f"A restart of each operator's last query over 2 new events, its {users:,} keys loaded back from the "
            "checkpoint (one run each): "
            + ", ".join(f"{label(variant)} {took:.1f} s" for variant, took in restarts.items())
            + ".",
            "",
        ]
    append_section(lines, console)


if __name__ == "__main__":
    main()
