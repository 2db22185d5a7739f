"""The same job with its tables and checkpoint on the local disk and in an S3-API object store, side by side.

purchase_counts processes a pre-loaded topic from a cold start (``python -m spark_jobs.driver.run purchase_counts
--available-now``: outputs, changelog, snapshots, dead letters, status), once on the local disk and once
with ``STREAMSTATE_LAKE_URI`` and ``STREAMSTATE_CHECKPOINT_URI`` on a local S3Proxy (runtime/s3_server.py)
over the same disk, alternating which goes first, for REPEATS rounds. Before any figure is reported, the two output
tables must hold the same rows, key by key; a mismatch stops the run with the differing keys.

What the ratio measures is the object-store path (S3A and delta-rs over HTTP, SigV4, copy-on-rename),
not a network: the server is on loopback and stores on the same disk as the local runs.

    .venv/bin/python bench/object_store.py [--events 1000000] [--users 100000] [--repeats 2] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compare import run_measured
from bench.private_stack import append_section, private_broker
from runtime.object_store import Location
from runtime.process import free_port
from runtime.s3_server import LocalS3Server
from runtime.settings import Settings
from spark_jobs.io.kafka_topics import delete_topics, ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job

console = Console()
PLACES = ("local disk", "object store")


def output_rows(settings: Settings, table: str) -> dict[str, tuple]:
    """user -> (purchases, amount spent) of an output table, read with delta-rs."""
    from deltalake import DeltaTable

    location = Location.of(table, settings.object_store)
    rows = DeltaTable(table, storage_options=location.storage_options()).to_pyarrow_table(
        columns=["user_id", "purchases", "amount_spent"]
    )
    return {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in rows.to_pylist()}


def run_once(base: Settings, server: LocalS3Server, place: str, work: Path, round_no: int) -> dict:
    job = get_job("purchase_counts")
    settings = base.replace(data_dir=work)
    if place == "object store":
        settings = settings.replace(
            lake_uri=f"s3a://lake/r{round_no}",
            checkpoint_uri=f"s3a://lake/r{round_no}-checkpoints",
            **server.settings_fields(),
        )
    cmd = [sys.executable, "-m", "spark_jobs.driver.run", job.name, "--version", str(job.version), "--available-now"]
    run = run_measured(cmd, settings.to_env(), timeout_s=7200)
    answer = run.answer
    if answer.get("error") or answer.get("input_rows") is None:
        raise SystemExit(f"{place}: the run failed: {answer}")
    rows = output_rows(settings, answer["output"])
    delete_topics(settings.kafka, list(JobLayout.of(job, settings).topics))  # the next run starts cold
    return {
        "seconds": run.seconds,
        "input_rows": answer["input_rows"],
        "rows": rows,
        "lake_bytes": settings.lake.size_bytes(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print the section, do not append it")
    args = parser.parse_args()
    job = get_job("purchase_counts")
    results: dict[str, list[dict]] = {place: [] for place in PLACES}
    with private_broker("bench-object-store-") as base:
        root = Path(tempfile.mkdtemp(prefix="bench-object-store-runs-"))
        server = LocalS3Server(root / "s3", free_port(), settings=base)
        server.start()
        server.create_bucket("lake")
        try:
            ensure_topic(base.kafka, job.source_topic, job.source_partitions)
            started = time.monotonic()
            generated = purchases.generate(
                args.events, users=args.users, seed=5, start=purchases.start_ending_by(args.events)
            )
            purchases.produce(base.kafka, job.source_topic, generated)
            console.print(f"loaded {args.events:,} events in {time.monotonic() - started:.0f} s")
            for round_no in range(args.repeats):
                order = PLACES if round_no % 2 == 0 else PLACES[::-1]
                for place in order:
                    work = root / f"{place.replace(' ', '-')}-r{round_no}"
                    result = run_once(base, server, place, work, round_no)
                    results[place].append(result)
                    console.print(
                        f"round {round_no + 1}, {place}: {result['seconds']:.1f} s, "
                        f"{result['lake_bytes']:,} bytes of tables"
                    )
                    shutil.rmtree(work, ignore_errors=True)
                local, remote = (results[p][-1]["rows"] for p in PLACES)
                if local != remote:
                    differing = sorted(k for k in local.keys() | remote.keys() if local.get(k) != remote.get(k))
                    raise SystemExit(
                        f"the outputs differ on {len(differing)} keys, e.g. "
                        f"{[(k, local.get(k), remote.get(k)) for k in differing[:5]]}"
                    )
        finally:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)
    lines = section(args, results)
    if args.no_write:
        console.print("\n".join(lines))
    else:
        append_section(lines, console)


def section(args, results: dict[str, list[dict]]) -> list[str]:
    seconds = {p: [r["seconds"] for r in results[p]] for p in PLACES}
    median = {p: statistics.median(seconds[p]) for p in PLACES}
    rows = [
        f"| {p} | {median[p]:.1f} ({min(seconds[p]):.1f}-{max(seconds[p]):.1f}) | {args.events / median[p]:,.0f} "
        f"| {statistics.median(r['lake_bytes'] for r in results[p]):,.0f} |"
        for p in PLACES
    ]
    return [
        "",
        f"## One job, tables and checkpoint on the local disk vs in an S3-API object store ({dt.date.today().isoformat()})",
        "",
        (
            f"Command: `.venv/bin/python bench/object_store.py --events {args.events} --users {args.users} "
            f"--repeats {args.repeats}`"
        ),
        (
            f"Machine: {platform.machine()}, 2 cores (shared), Spark `local[*]`. purchase_counts over "
            f"{args.events:,} events of {args.users:,} users from a cold start, every platform feature on; the "
            "object store is S3Proxy on loopback over the same disk (what is measured is the S3 path: S3A and "
            "delta-rs over HTTP, not a network). The two output tables were checked equal key by key in every round."
        ),
        "",
        "| tables and checkpoint on | seconds, median (min-max) | events/s | bytes of tables |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Throughput on the object store: **{median['local disk'] / median['object store']:.2f}x** the local disk's.",
    ]


if __name__ == "__main__":
    main()
