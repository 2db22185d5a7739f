"""Restore and snapshots of a large store: in the driver process, by Spark's executors, and Kafka Streams',
at growing sizes.

For each size, a changelog of KEYS keys (inserts, then batches that each change CHURN_FRACTION of
the keys) is written to a private local broker, a snapshot is taken before the last TAIL_BATCHES
batches, and each restore runs in a fresh process of its own so its peak memory is its own:

- ``driver``: ``restore_from_snapshot`` as small stores use it (the state built as a Python dict);
- ``spark``: ``restore_from_snapshot(spark=...)`` (snapshot from Delta, tail from Kafka's batch source,
  cut by the same rules), evaluated with ``count()`` the way the job's first batch evaluates it;
- ``spare``: the same Spark restore in a session that first ran what a spare driver runs before it is READY
  (:func:`spark_jobs.driver.spare.warm_up` of purchase_counts over a few hundred purchases: a rehearsal of the job, a
  restore's and a micro-batch's code paths): what a lost checkpoint costs when the warm spare takes over;
- ``kafka_streams``: the Kafka Streams peer's purchase_counts store of the same KEYS users (one purchase
  each, then as many changes as the platform's tail holds), restored from its changelog after its state
  directory is wiped (a full replay: Kafka Streams has no snapshots), timed by its restore listener.

Reported per run: seconds (the Spark session's start excluded and shown apart), keys, the peak RSS
of the Python driver process and, for Spark, of its JVM (under ``local[*]`` the executors live in
that JVM: on a cluster that memory is the executors', not the driver's).

Then the snapshot write (``--modes snapshots``): the snapshot is brought up to the changelog's head by
Spark, one more batch changes CHURN_FRACTION of the keys, and a fresh process writes the snapshot of
that batch both ways, in one session, timed by the same clock: ``layered`` (``take_snapshot`` as the job
calls it between folds: the batch's changes read and appended as a layer) and ``full`` (the state
rebuilt by Spark from the snapshot and the batch, written whole into a new table: what a fold costs). The two tables must hold the same rows (a checksum of every key and
value, read the way a restore reads them) before the ratio is reported; that read is timed too,
since a layer makes every read resolve it.

    .venv/bin/python bench/state_scale.py [--sizes 1000000 10000000] [--churn-fraction 0.01] \
        [--modes driver spark snapshots] [--no-kafka-streams] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kafka_streams_peer import KafkaStreamsPeer
from bench.kafka_streams_peer import build as build_kafka_streams
from bench.private_stack import append_section, private_broker
from bench.restore_time import ChangelogSimulator
from runtime.settings import Settings
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import ChangelogTopic
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.state.restore import (
    SilentRestoreListener,
    restore_from_snapshot,
    tail_records,
)
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.snapshotting import LAYER_IN_DRIVER_MAX_RECORDS, take_snapshot

console = Console()
MODES = ("driver", "spark", "spare", "snapshots")
RESTORES = ("driver", "spark", "spare")
#: the job whose spare warm-up precedes the ``spare`` restore, and the purchases its source holds for it
SPARE_JOB, SPARE_SOURCE_EVENTS = "purchase_counts", 500


def measure(mode: str, settings: Settings, topic: str, snapshot_path: str) -> dict:
    """One restore in this process (run as a child of the benchmark): its numbers as a dict."""
    snapshots = SnapshotStore(snapshot_path, "bench-v1", "counts")
    result: dict = {"mode": mode}
    spark = None
    if mode in ("spark", "spare"):
        from spark_jobs.driver.session import build_spark_session
        from spark_jobs.driver.spare import spare_driver_settings

        if mode == "spare":  # the JVM a spark-submit of a spare driver starts (spark_jobs/driver/submit.py)
            settings = spare_driver_settings(settings)
        started = time.monotonic()
        spark = build_spark_session(settings, "bench-state-scale")
        result["session_seconds"] = round(time.monotonic() - started, 2)
    if mode == "spare":
        from spark_jobs.driver.run import run
        from spark_jobs.driver.spare import warm_up
        from spark_jobs.registry import get_job

        started = time.monotonic()
        # untimed for the restore: done while the spare waits; as for a job whose restore runs in Spark (this
        # one's own store is small), so the spare also rehearses a restore at scale (spare.rehearse_restore)
        warm_up(spark, get_job(SPARE_JOB), settings.replace(restore_in_spark_min_records=0), run)
        result["warm_up_seconds"] = round(time.monotonic() - started, 2)
    started = time.monotonic()
    restored = restore_from_snapshot(snapshots, settings.kafka, topic, SilentRestoreListener(), spark=spark)
    # in Spark, the call runs pass 1 (markers and batch summaries), reads a short tail's changes (the overlay holds
    # them in the driver) and plans; the count evaluates the rest
    result["plan_seconds"] = round(time.monotonic() - started, 2)
    result["keys"] = restored.keys if spark is None else restored.frame.count()
    result["seconds"] = round(time.monotonic() - started, 2)
    result["batch_id"] = restored.batch_id
    result["records_read"] = restored.snapshot_rows + restored.changelog_records_read
    result["python_peak_rss_mb"] = _peak_rss_mb("self")
    if spark is not None:
        # the same restore again in the now warm session (a job's JVM has run nothing before its restore;
        # this separates that first-job cost from the data's)
        started = time.monotonic()
        restore_from_snapshot(snapshots, settings.kafka, topic, SilentRestoreListener(), spark=spark).frame.count()
        result["warm_seconds"] = round(time.monotonic() - started, 2)
        result["jvm_peak_rss_mb"] = _peak_rss_mb(spark.sparkContext._gateway.proc.pid)
        spark.stop()
    return result


def kafka_streams_restore(settings: Settings, classpath: str, keys: int, changed: int) -> dict:
    """Kafka Streams' purchase_counts (bench/kafka_streams) with the same state as the platform's: a store
    of ``keys`` users (one purchase each, then ``changed`` more, as many as the platform's tail changed),
    restored after its state directory is wiped: its full changelog replay (Kafka Streams has no
    snapshots), timed by its restore listener (the JVM's start excluded, as the Spark session's is)."""
    input_topic, output_topic = f"ks-purchases-{keys}", f"ks-purchase-counts-{keys}"
    for topic in (input_topic, output_topic):  # the broker auto-creates nothing
        ensure_topic(settings.kafka, topic, 2)
    events, users = keys + changed, set()

    def tapped():
        generated = purchases.generate(
            events, users=keys, seed=3, start=purchases.start_ending_by(events), close_rate=0, every_user_first=True
        )
        for event in generated:
            users.add(event["user_id"])
            yield event

    purchases.produce(settings.kafka, input_topic, tapped())
    state_dir = settings.data_dir / f"kstreams-{keys}"

    def peer() -> KafkaStreamsPeer:
        return KafkaStreamsPeer(
            classpath, settings, "purchase_counts", f"kstreams-scale-{keys}", state_dir, input_topic, output_topic
        )

    first = peer()
    first.wait_caught_up()
    first.stop()
    shutil.rmtree(state_dir)
    restore = peer()
    restore.wait_running()
    restore.stop()
    return {
        "mode": "kafka_streams",
        "keys": len(users),
        "seconds": round(restore.restore_seconds(), 2),
        "records_read": restore.restored_records(),
        "jvm_peak_rss_mb": round(restore.peak_rss_bytes / 2**20),
    }


def catch_up_snapshot(settings: Settings, topic: str, snapshot_path: str) -> dict:
    """Bring the snapshot to the changelog's head with Spark (a layer of the tail): the base of :func:`snapshots`."""
    from spark_jobs.driver.session import build_spark_session

    spark = build_spark_session(settings, "bench-state-scale")
    snapshots = SnapshotStore(snapshot_path, "bench-v1", "counts")
    started = time.monotonic()
    written = take_snapshot(snapshots, settings.kafka, topic, spark=spark)
    spark.stop()
    return {"batch_id": written.batch_id, "mode": written.mode, "seconds": round(time.monotonic() - started, 2)}


def snapshots(settings: Settings, topic: str, snapshot_path: str) -> dict:
    """The snapshot of the changelog's last batch, written as a layer and in full in one session."""

    from spark_jobs.driver.session import build_spark_session

    spark = build_spark_session(settings, "bench-state-scale")
    store = SnapshotStore(snapshot_path, "bench-v1", "counts")
    before = store.latest()
    # the JVM's first jobs and the snapshot's first read, before either write is timed
    keys = restore_from_snapshot(store, settings.kafka, topic, SilentRestoreListener(), spark=spark).frame.count()
    short_tail = tail_records(settings.kafka, topic, before.changelog_offsets) < LAYER_IN_DRIVER_MAX_RECORDS
    bytes_before = sum(store.files())
    # a full write as take_snapshot folds: the state rebuilt by Spark (snapshot + tail), written whole
    full_store = SnapshotStore(f"{snapshot_path}-full", "bench-v1", "counts")
    started = time.monotonic()
    restored = restore_from_snapshot(store, settings.kafka, topic, SilentRestoreListener(), spark=spark)
    position = (restored.batch_id, restored.input_offsets, restored.changelog_resume_offsets, restored.watermark_ms)
    full = full_store.write_frame(restored.frame, *position)
    full_seconds = time.monotonic() - started
    # the layer, exactly as the job takes it
    started = time.monotonic()
    layered = take_snapshot(store, settings.kafka, topic, spark=spark)
    layered_seconds = time.monotonic() - started
    if layered.mode != "layered" or layered.batch_id != full.batch_id:
        raise SystemExit(f"take_snapshot wrote {layered}, not a layer of batch {full.batch_id}")

    def checksum(store_: SnapshotStore, info) -> tuple[tuple[int, int], float]:
        """(rows and a hash of every row, as a restore reads them; the read's seconds)"""
        began = time.monotonic()
        row = store_.frame(spark, info).selectExpr("count(*) AS n", "bit_xor(xxhash64(key, value)) AS h").first()
        return (row["n"], row["h"]), time.monotonic() - began

    (layered_sum, layered_read), (full_sum, full_read) = checksum(store, layered), checksum(full_store, full)
    # where the layer's time goes, measured after both writes: the batch's changes alone (the Kafka read
    # and the cut), and the snapshot table's reads around the commit (latest snapshot, committed batch)
    began = time.monotonic()
    if short_tail:
        read_changelog(settings.kafka, topic, before.changelog_offsets, keep_changes=True)
    else:
        restored.changes.count()
    changes_seconds = time.monotonic() - began
    began = time.monotonic()
    store.latest(), store._committed_batch(), store._committed(layered.batch_id)
    table_reads_seconds = time.monotonic() - began
    spark.stop()
    if layered_sum != full_sum or layered_sum[0] != keys or full.rows != keys:
        raise SystemExit(f"the layered and full snapshots differ: {layered} vs {full}")
    return {
        "mode": "snapshots",
        "keys": keys,
        "changed_keys": layered.layer_rows - before.layer_rows,
        "layered_seconds": round(layered_seconds, 2),
        "full_seconds": round(full_seconds, 2),
        "ratio": round(layered_seconds / full_seconds, 3),
        "layered_bytes": sum(store.files()) - bytes_before,
        "layer_written_by": "this process, delta-rs" if short_tail else "spark",
        "full_bytes": full.bytes,
        "layered_read_seconds": round(layered_read, 2),
        "full_read_seconds": round(full_read, 2),
        "layer_profile": {"changes_s": round(changes_seconds, 2), "table_reads_s": round(table_reads_seconds, 2)},
    }


def _peak_rss_mb(pid) -> int:
    """A process's peak resident memory (VmHWM: per address space, so not inherited across fork+exec
    the way ``ru_maxrss`` is)."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return round(int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--churn-fraction", type=float, default=0.01)
    parser.add_argument("--churn-batches", type=int, default=4)
    parser.add_argument("--tail-batches", type=int, default=2)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="what to measure")
    parser.add_argument("--no-kafka-streams", action="store_true", help="leave out Kafka Streams' restore")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument("--measure", choices=(*RESTORES, "catch-up", "snapshots"), help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        settings = Settings.from_env(json.loads(args.settings))
        steps = {"catch-up": catch_up_snapshot, "snapshots": snapshots}
        if args.measure in steps:
            print(json.dumps(steps[args.measure](settings, args.topic, args.snapshot)))
        else:
            print(json.dumps(measure(args.measure, settings, args.topic, args.snapshot)))
        return

    rows, snapshot_rows = [], []
    classpath = None if args.no_kafka_streams else build_kafka_streams()
    with private_broker("bench-state-scale-") as settings:
        for keys in args.sizes:
            topic = ChangelogTopic(f"bench-{keys}-v1", "counts", partitions=2)
            topic.ensure(settings.kafka)
            snapshot_path = str(settings.data_dir / f"snapshot-{keys}")
            batches = 3 + args.churn_batches  # ChangelogSimulator inserts over the first third
            churn = max(1, int(keys * args.churn_fraction))
            simulator = ChangelogSimulator(settings, topic, keys, batches, churn, seed=7)
            simulator.write(batches - args.tail_batches)
            take_snapshot(SnapshotStore(snapshot_path, "bench-v1", "counts"), settings.kafka, topic.name)
            simulator.write(args.tail_batches)

            if "spare" in args.modes:  # the spare's job has a source to rehearse on, as in production
                spare_job = get_job(SPARE_JOB)
                ensure_topic(settings.kafka, spare_job.source_topic, spare_job.source_partitions)
                purchases.produce(settings.kafka, spare_job.source_topic, purchases.generate(SPARE_SOURCE_EVENTS))
            for mode in (m for m in RESTORES if m in args.modes):
                row = {"keys_written": keys, **_child(mode, settings, topic.name, snapshot_path)}
                assert row["keys"] == keys and row["batch_id"] == batches - 1, row
                console.print(row)
                rows.append(row)
            if "snapshots" in args.modes:
                console.print({"catch_up": _child("catch-up", settings, topic.name, snapshot_path)})
                simulator.write(1)  # the batch whose snapshot is written both ways
                snapshot_rows.append(_child("snapshots", settings, topic.name, snapshot_path))
                console.print(snapshot_rows[-1])
            if not args.no_kafka_streams and any(m in args.modes for m in RESTORES):
                rows.append(kafka_streams_restore(settings, classpath, keys, churn * args.tail_batches))
                console.print(rows[-1])

    lines = (
        []
        if not rows
        else [
            f"## Restore of a large store: driver process vs Spark executors vs Kafka Streams ({dt.date.today().isoformat()})",
            "",
            (
                f"Command: `.venv/bin/python bench/state_scale.py --sizes {' '.join(map(str, args.sizes))} "
                f"--churn-fraction {args.churn_fraction} --churn-batches {args.churn_batches} --tail-batches {args.tail_batches}"
                f"{'' if args.modes == list(MODES) else ' --modes ' + ' '.join(args.modes)}"
                f"{' --no-kafka-streams' if args.no_kafka_streams else ''}`"
            ),
            (
                f"Machine: {platform.machine()}, 2 cores (shared); local KRaft broker, Spark `{settings.spark_master}` "
                f"(driver memory {settings.spark_driver_memory}), Delta on local disk. Each restore in a fresh process; "
                f"the snapshot before the last {args.tail_batches} batches, each batch changing "
                f"{args.churn_fraction:.0%} of the keys. Kafka Streams: bench/kafka_streams, 2 stream threads, -Xmx2g; "
                "the same keys, one purchase each then the tail's changes; seconds exclude the JVM's and the Spark "
                "session's start. Warm: the same Spark restore again in the same session. Spare: the Spark restore "
                f"in a session that first ran a spare driver's warm-up (`spark_jobs.driver.spare.warm_up` of {SPARE_JOB} as a "
                "job whose restore runs in Spark, so with its restore rehearsal at scale; its seconds are in the warm "
                "column's place, as warm-up)."
            ),
            "",
            (
                "| keys | restore | records read | seconds | of which the restore call (pass 1, a short tail), s | warm, s "
                "| Spark session start, s | Python driver peak RSS, MB | JVM peak RSS, MB |"
            ),
            "|---|---|---|---|---|---|---|---|---|",
        ]
    )
    for row in rows:
        spark_restore = row["mode"] in ("spark", "spare")
        warm = f"warm-up {row['warm_up_seconds']}" if row["mode"] == "spare" else row.get("warm_seconds", "-")
        lines.append(
            f"| {row['keys']:,} | {row['mode']} | {row['records_read']:,} | {row['seconds']:.1f} | "
            f"{row.get('plan_seconds', '-') if spark_restore else '-'} | {warm} | "
            f"{row.get('session_seconds', '-')} | {row.get('python_peak_rss_mb', '-')} | {row.get('jvm_peak_rss_mb', '-')} |"
        )
    if snapshot_rows:
        lines += _snapshot_section(args, snapshot_rows)
    if args.no_write:
        console.print("\n".join(lines))
    else:
        append_section([*lines, ""], console)


def _child(step: str, settings: Settings, topic: str, snapshot_path: str) -> dict:
    """Run one measurement in a fresh process of its own (its peak memory is its own): its result."""
    command = [sys.executable, __file__, "--measure", step, "--settings", json.dumps(settings.to_env())]
    command += ["--topic", topic, "--snapshot", snapshot_path]
    out = subprocess.run(command, check=False, capture_output=True, text=True, timeout=7200)
    if out.returncode != 0:
        raise SystemExit(f"{step} failed (exit {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _snapshot_section(args, rows: list[dict]) -> list[str]:
    lines = [
        "",
        f"## Snapshot of a large store after one batch: a layer vs a full write ({dt.date.today().isoformat()})",
        "",
        (
            f"Command: `.venv/bin/python bench/state_scale.py --sizes {' '.join(map(str, args.sizes))} "
            f"--churn-fraction {args.churn_fraction} --modes snapshots --no-kafka-streams`"
        ),
        (
            f"Machine: {platform.machine()}, 2 cores (shared), Spark `local[*]`, Delta on local disk. The batch "
            f"changed {args.churn_fraction:.0%} of the keys; both writes in one warm session, each timed from the "
            "snapshot before the batch: the layer is `take_snapshot` (the batch read from Kafka, its changed "
            "keys appended), the full write the state rebuilt by Spark and written whole. Target: a "
            "snapshot <= 5% of a full write. Read: a restore's read of the snapshot (count and checksum), "
            "which resolves the layer."
        ),
        "",
        (
            "| keys | changed keys | layer, s (written by) | full, s | layer / full | bytes written, layer "
            "| bytes written, full | read with the layer, s | read of the full table, s |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['keys']:,} | {row['changed_keys']:,} | {row['layered_seconds']:.1f} ({row['layer_written_by']}) "
            f"| {row['full_seconds']:.1f} "
            f"| {row['ratio']:.1%} | {row['layered_bytes']:,} | {row['full_bytes']:,} "
            f"| {row['layered_read_seconds']:.1f} | {row['full_read_seconds']:.1f} |"
        )
    return lines


if __name__ == "__main__":
    main()
