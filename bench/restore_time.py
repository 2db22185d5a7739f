"""Restore time for one store: latest Delta snapshot + changelog tail vs full changelog replay.

Builds a realistic changelog on a private local broker (the same records and batch markers the
ChangelogWriter writes): KEYS keys inserted over the first batches, then BATCHES of churn that each
update CHURN random keys. A snapshot is taken TAIL_BATCHES before the end. Then both restores run
REPEATS times, side by side, and the medians (min/max) are printed and appended to BENCHMARKS.md.

    .venv/bin/python bench/restore_time.py [--keys 100000] [--batches 12] [--churn 25000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console
from rich.progress import track

from runtime.kafka_broker import LocalKafkaBroker
from runtime.kafka_connection import client_config
from runtime.process import free_port
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.state.batch_records import BATCH_HEADER, BatchMarker
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.restore import SilentRestoreListener, restore_from_snapshot
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.snapshotting import take_snapshot

console = Console()


class ChangelogSimulator:
    """Writes batches as a running job would: inserts first, then random churn, values counting up."""

    def __init__(self, settings: Settings, topic: ChangelogTopic, keys: int, batches: int, churn: int, seed: int):
        self.settings, self.topic, self.keys, self.churn = settings, topic, keys, churn
        self.rng = random.Random(seed)
        self.insert_batches = max(1, batches // 3)
        self.counts = [0] * keys
        self.next_batch = 0
        self.producer = Producer(
            client_config(settings.kafka, {"linger.ms": 50, "partitioner": "murmur2_random", "log_level": 3})
        )
        self.writer = ChangelogWriter(topic, settings.kafka)

    def write(self, batches: int) -> int:
        """Write the next ``batches`` batches; returns the change records written."""
        written = 0
        first = self.next_batch
        for batch in track(
            range(first, first + batches), description=f"batches {first}..{first + batches - 1}", console=console
        ):
            if batch < self.insert_batches:
                n = self.insert_batches
                changed = range(batch * self.keys // n, (batch + 1) * self.keys // n)
            else:
                changed = self.rng.sample(range(self.keys), self.churn)
            for k in changed:
                self.counts[k] += 1
                value = json.dumps({"purchases": self.counts[k], "amount_spent": self.counts[k] * 12.5}).encode()
                while True:
                    try:
                        self.producer.produce(
                            self.topic.name,
                            key=f"u{k:07d}".encode(),
                            value=value,
                            headers=[(BATCH_HEADER, str(batch).encode())],
                        )
                        break
                    except BufferError:
                        self.producer.poll(0.05)
                written += 1
            assert self.producer.flush(120) == 0
            self.writer._write_markers(BatchMarker(batch, {"source": {0: (batch + 1) * 1000}}, len(changed)))
        self.next_batch += batches
        return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--churn", type=int, default=25_000)
    parser.add_argument("--tail-batches", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one snapshot + tail restore (cProfile, top functions by own time)",
    )
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-restore-"))
    settings = Settings(
        data_dir=data, kafka_port=free_port(), kafka_controller_port=free_port(), airflow_port=free_port()
    )
    broker = LocalKafkaBroker(settings)
    broker.start()
    try:
        topic = ChangelogTopic("bench-v1", "counts", partitions=2)
        topic.ensure(settings.kafka)
        snapshots = SnapshotStore(data / "snapshot", "bench-v1", "counts")
        head = args.batches - args.tail_batches
        simulator = ChangelogSimulator(settings, topic, args.keys, args.batches, args.churn, seed=7)
        written = simulator.write(head)
        t = time.monotonic()
        snap = take_snapshot(snapshots, settings.kafka, topic.name)
        snapshot_seconds = time.monotonic() - t
        # The tail: the remaining batches, continuing the same random churn.
        written_tail = simulator.write(args.tail_batches)

        runs = {"full replay": [], "snapshot + tail": []}
        snapshot_read: list[float] = []
        replayed = {}
        for _ in range(args.repeats):
            for name, use_snapshot in (("full replay", False), ("snapshot + tail", True)):
                result = restore_from_snapshot(
                    snapshots, settings.kafka, topic.name, SilentRestoreListener(), use_snapshot=use_snapshot
                )
                assert len(result.state) == args.keys and result.batch_id == args.batches - 1
                runs[name].append(result.seconds)
                replayed[name] = result.changelog_records_read
                if use_snapshot:
                    snapshot_read.append(result.snapshot_seconds)
        full, fast = statistics.median(runs["full replay"]), statistics.median(runs["snapshot + tail"])
        lines = [
            f"## Restore time, one store of {args.keys:,} keys ({dt.date.today().isoformat()})",
            "",
            f"Command: `.venv/bin/python bench/restore_time.py --keys {args.keys} --batches {args.batches} "
            f"--churn {args.churn} --tail-batches {args.tail_batches} --repeats {args.repeats}`",
            f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; local KRaft broker, "
            "Delta on local disk (delta-rs). Changelog not yet compacted (active segments).",
            f"Changelog: {written + written_tail:,} change records + markers over {args.batches} batches; snapshot at "
            f"batch {snap.batch_id} ({snap.rows:,} rows, written in {snapshot_seconds:.1f} s); tail "
            f"{args.tail_batches} batches ({written_tail:,} records).",
            "",
            "| restore | changelog records read | seconds, median (min-max) of " + str(args.repeats) + " |",
            "|---|---|---|",
        ]
        for name in runs:
            lines.append(
                f"| {name} | {replayed[name]:,} | {statistics.median(runs[name]):.2f} "
                f"({min(runs[name]):.2f}-{max(runs[name]):.2f}) |"
            )
        lines += [
            "",
            f"Ratio snapshot + tail / full replay: {fast / full:.2f} (same run, side by side). Of snapshot + "
            f"tail, the snapshot's read took {statistics.median(snapshot_read):.2f} s (median).",
            "",
        ]
        text = "\n".join(lines)
        console.print(text)
        if args.profile:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            profile.runcall(restore_from_snapshot, snapshots, settings.kafka, topic.name, SilentRestoreListener())
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
        if args.no_write:
            return
        out = PROJECT_ROOT / "BENCHMARKS.md"
        previous = (
            out.read_text() if out.exists() else "# Benchmarks\n\nEvery figure names the command that produced it.\n\n"
        )
        out.write_text(previous + text + "\n")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
