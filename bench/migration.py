"""A new version's state, migrated from the current version's versus recomputed from the source, at growing
sizes (purchase_counts, on a private local broker, Spark ``local[*]``, Delta on the local disk).

For each size: EVENTS purchases over EVENTS/10 users are produced; the current version (v3, the Java
processor) processes them and its store is snapshotted. Then, in one Spark session, timed by one clock:

- ``migrate (copy)``: ``migrate_state`` into a version whose store keeps v3's format (read v3's snapshot
  and changelog tail in Spark, write the new version's first snapshot);
- ``migrate (add_tier)``: the same through a migration function that adds a field to every value;
- ``recompute``: a new version with v3's rules (the Java processor: the fastest replay there is) processes
  every event from the source's beginning: what reprocessing side by side costs, and what is impossible
  once the source no longer holds the history.

Each new store must hold as many keys as v3's (the migrated snapshots' rows, the recompute's output rows)
before the times are reported.

    .venv/bin/python bench/migration.py [--sizes 1000000 10000000] [--batches 20] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import platform
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.private_stack import append_section, private_broker
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import StoreMigration, get_job
from spark_jobs.state.snapshotting import take_snapshot

console = Console()
STORE = "counts"
GOLD = 100


def add_tier(old):
    """The benchmark's migration function: every value gains ``tier`` (the tests' tiered_counts migration)."""
    from pyspark.sql import functions as F

    from spark_jobs.reference.jobs.purchase_counts import STATE_DDL

    v = F.from_json("value", STATE_DDL).alias("v")
    tier = F.when(F.col("v.amount_spent") >= GOLD, "gold").otherwise("standard").alias("tier")
    return old.select("key", v).select("key", F.to_json(F.struct("v.*", tier)).alias("value"))


def one_size(events: int, batches: int) -> dict:
    from spark_jobs.driver.run import run
    from spark_jobs.driver.session import build_spark_session
    from spark_jobs.state.migration import migrate_state
    from spark_jobs.state.snapshots import SnapshotStore

    users = max(1000, events // 10)
    with private_broker("bench-migration-") as base:
        settings = base.replace(max_offsets_per_trigger=max(1, events // batches))
        current = dataclasses.replace(
            get_job("purchase_counts", 3),
            name="bench_migration",
            source_topic="bench-migration-purchases",
            output_table="bench_migration",
        )
        ensure_topic(settings.kafka, current.source_topic, current.source_partitions)
        t = time.monotonic()
        with console.status(f"producing {events:,} events over {users:,} users"):
            generated = purchases.generate(events, users=users, seed=3, start=purchases.start_ending_by(events))
            assert purchases.produce(settings.kafka, current.source_topic, generated) == events
        console.print(f"produced {events:,} events in {time.monotonic() - t:.0f} s")
        spark = build_spark_session(settings, "bench-migration")
        timings: dict[str, float] = {}

        def timed(name: str, action):
            with console.status(f"{events:,} events: {name}"):
                started = time.monotonic()
                result = action()
                timings[name] = round(time.monotonic() - started, 1)
            console.print(f"{events:,} events: {name} {timings[name]} s")
            return result

        first = timed("v3 processes the events", lambda: run(current, settings, available_now=True, spark=spark))
        assert first.input_rows == events and not first.error, first
        layout = JobLayout.of(current, settings)
        snapshot = timed(
            "v3's snapshot",
            lambda: take_snapshot(
                SnapshotStore.of(layout, STORE), settings.kafka, layout.changelog_topic(STORE), spark=spark
            ),
        )
        keys = snapshot.rows
        copied = dataclasses.replace(current, version=4)
        tiered = dataclasses.replace(
            current, version=5, migrations=(StoreMigration(STORE, function="bench.migration:add_tier"),)
        )
        replayed = dataclasses.replace(current, version=6)
        migrated = {
            "migrate (copy)": timed("migrate (copy)", lambda: migrate_state(settings, current, copied, spark))[STORE],
            "migrate (add_tier)": timed("migrate (add_tier)", lambda: migrate_state(settings, current, tiered, spark))[
                STORE
            ],
        }
        replay = timed("recompute", lambda: run(replayed, settings, available_now=True, spark=spark))
        assert replay.input_rows == events and not replay.error, replay
        recomputed_keys = spark.read.format("delta").load(replay.output).count()
        rows = {name: info.rows for name, info in migrated.items()} | {"recompute": recomputed_keys}
        assert set(rows.values()) == {keys}, f"the new stores disagree with v3's {keys} keys: {rows}"
        spark.stop()
        return {"events": events, "users": users, "keys": keys, "batches": batches, "seconds": timings}


def section(results: list[dict], command: str) -> list[str]:
    lines = [
        f"## State migration versus recomputation ({dt.date.today().isoformat()})",
        "",
        (
            f"`{command}` on {platform.node()} ({platform.machine()}, 2 cores): purchase_counts v3 (Java processor) "
            "processes the events, its store is snapshotted, then a new version's state is migrated from it (a copy, "
            "and through a function adding a field to every value) or recomputed by a new version replaying every "
            "event with the same Java processor. One Spark session, one clock."
        ),
        "",
        (
            "| events | users (keys) | v3 run, s | migrate (copy), s | migrate (add_tier), s | recompute, s | "
            "recompute / migrate (add_tier) |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        s = r["seconds"]
        ratio = s["recompute"] / s["migrate (add_tier)"] if s["migrate (add_tier)"] else float("nan")
        lines.append(
            f"| {r['events']:,} | {r['keys']:,} | {s['v3 processes the events']} | {s['migrate (copy)']} | "
            f"{s['migrate (add_tier)']} | {s['recompute']} | {ratio:.1f}x |"
        )
    lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batches", type=int, default=20, help="micro-batches a run of all the events takes")
    parser.add_argument("--no-write", action="store_true", help="print the section; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    command = "python bench/migration.py --sizes " + " ".join(str(s) for s in args.sizes) + f" --batches {args.batches}"
    results = []
    for events in args.sizes:
        results.append(one_size(events, args.batches))
        console.print("\n".join(section(results, command)))  # partial results survive a long run
    lines = section(results, command)
    if args.no_write:
        console.print("\n".join(lines))
    else:
        append_section(lines, console)


if __name__ == "__main__":
    main()
