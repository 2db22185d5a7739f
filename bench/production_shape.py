"""The main job on the production shape's Kafka beside the development shape's, side by side on one machine.

Two shapes, alternated round by round (this machine is shared and noisy: one round of each, then again):

* **development**: the embedded broker, one KRaft process, every topic with one copy;
* **production**: three KRaft processes (runtime/kafka_cluster.py), a quorum of three controllers, every topic
  (the source too, as its owner would create it) with three copies and ``min.insync.replicas=2``; every write of
  the job (changelog, markers' transaction, output topic, dead letters) waits for two of them (``acks=all``).

On each, two measurements of purchase_counts with an upsert output topic (bench/latency_jobs.py):

* **backlog**: ``--events`` purchases already in the topic, the driver started with ``--available-now``: events/s
  over its micro-batches (the run report's batch time; the driver's start is left out);
* **latency**: bench/latency.py's measurement of the platform at ``--rate`` events/s, trigger ``--trigger`` s:
  seconds from ``produce()`` to the answer in the Delta table and in the output topic, p50 / p99.

Spark stays ``local[*]`` and the lake on local disk in both shapes: the difference measured is Kafka's. Results
go to ``bench/results/production-shape-<UTC time>.json`` as each row is done, and a BENCHMARKS.md section::

    .venv/bin/python bench/production_shape.py --rounds 2 --events 200000 --rate 2000 --seconds 30
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from bench import latency  # noqa: E402
from bench.private_stack import append_section, private_broker  # noqa: E402
from runtime.kafka_cluster import LocalKafkaCluster  # noqa: E402
from runtime.process import free_service_ports  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402

console = Console(highlight=False)
SHAPES = ("development", "production")


@contextlib.contextmanager
def kafka_of(shape: str) -> Iterator[Settings]:
    """Settings for a fresh Kafka of ``shape`` on free ports; it runs inside."""
    if shape == "development":
        with private_broker("streamstate-shape-dev-") as settings:
            yield settings
        return
    own = Settings(data_dir=Path(tempfile.mkdtemp(prefix="streamstate-shape-prod-")), **free_service_ports())
    cluster = LocalKafkaCluster.on_free_ports(own)
    cluster.start()
    try:
        yield cluster.client_settings()
    finally:
        cluster.stop(timeout_s=5)


def backlog(settings: Settings, events: int, work: Path) -> dict:
    """``events`` purchases drained by one ``--available-now`` run: events/s over the run's micro-batches."""
    from bench import latency_jobs
    from spark_jobs.driver.run import report_path
    from spark_jobs.reference.generators import purchases

    run = f"backlog_{int(time.time()) % 100000}"
    spec = latency_jobs.spec(run, 0)
    latency.create_source(settings, spec.source_topic)
    produced = purchases.produce(settings.kafka, spec.source_topic, purchases.generate(events, users=10_000, seed=3))
    peer = settings.replace(data_dir=work / run, job_modules="bench.latency_jobs")
    env = {**os.environ, **peer.to_env(), "BENCH_LATENCY_RUN": run, "BENCH_LATENCY_TRIGGER_S": "0"}
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "spark_jobs.driver.run", spec.name, "--version", "1", "--available-now"],
        env={**env, "PYTHONPATH": str(PROJECT_ROOT)},
        cwd=PROJECT_ROOT,
        stdout=(work / f"{run}.log").open("wb"),
        stderr=subprocess.STDOUT,
        check=True,
    )
    wall = time.monotonic() - started
    report = json.loads(report_path(spec, peer).read_text())
    batch_seconds = sum(report.get("phase_seconds", {}).values())
    return {
        "events": produced,
        "input_rows": report.get("input_rows"),
        "batches": report.get("batches"),
        "batch_seconds": round(batch_seconds, 1),
        "wall_seconds": round(wall, 1),
        "events_per_s": round(produced / batch_seconds) if batch_seconds else None,
        "phase_seconds": report.get("phase_seconds"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--events", type=int, default=200_000, help="the backlog drained, purchases")
    parser.add_argument("--rate", type=int, default=2000, help="the latency measurement's events/s")
    parser.add_argument("--trigger", type=float, default=1.0, help="the latency measurement's trigger, seconds")
    parser.add_argument("--seconds", type=float, default=30, help="measured seconds of steady input")
    parser.add_argument("--warm-up", type=float, default=10)
    parser.add_argument("--drain", type=float, default=60)
    parser.add_argument("--no-report", action="store_true")
    args = parser.parse_args()
    args.users, args.poll_ms = 10_000, 50  # bench/latency.py's defaults
    command = " ".join(["python bench/production_shape.py", shlex.join(sys.argv[1:])]).rstrip()
    results = PROJECT_ROOT / "bench" / "results" / f"production-shape-{dt.datetime.now(dt.UTC):%Y%m%dT%H%MZ}.json"
    rows: list[dict] = []
    for round_ in range(1, args.rounds + 1):
        for shape in SHAPES:
            console.rule(f"round {round_}: {shape}")
            work = Path(tempfile.mkdtemp(prefix=f"streamstate-shape-{shape}-work-"))
            row: dict = {"round": round_, "shape": shape, "load_1m_before": round(os.getloadavg()[0], 1)}
            try:
                with kafka_of(shape) as settings:
                    row["replication_factor"] = settings.kafka_replication_factor
                    row["backlog"] = backlog(settings, args.events, work)
                    console.print(json.dumps(row["backlog"]))
                    measured = latency.measure(settings, args, work, "platform", args.rate, args.trigger, None)
                    row["latency"] = {
                        "produced_rate": measured["produced_rate"],
                        **measured["sinks"],
                        "batches": measured.get("batches"),
                        "seconds_per_batch": measured.get("seconds_per_batch"),
                    }
            except Exception as err:  # noqa: BLE001 - a failed row is recorded; the run goes on
                console.print(f"[red]{shape} failed: {err}[/]")
                row["error"] = f"{type(err).__name__}: {err}"
            rows.append(row)
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps({"command": command, "rows": rows}, indent=1) + "\n")
    lines = report_lines(rows, command, args)
    console.print("\n".join(lines))
    console.print(f"rows saved to {results.relative_to(PROJECT_ROOT)}")
    if not args.no_report:
        append_section(lines, console)


def _median(rows: list[dict], shape: str, pick) -> float | None:
    values = [v for r in rows if r["shape"] == shape and "error" not in r and (v := pick(r)) is not None]
    return statistics.median(values) if values else None


def report_lines(rows: list[dict], command: str, args) -> list[str]:
    def fmt(value, unit="") -> str:
        return "—" if value is None else f"{value:,.0f}{unit}" if value >= 100 else f"{value:.2f}{unit}"

    measures = {
        "backlog, events/s over the micro-batches": lambda r: r["backlog"]["events_per_s"],
        "backlog, driver wall seconds (start included)": lambda r: r["backlog"]["wall_seconds"],
        f"latency at {args.rate:,}/s, Delta p50 (s)": lambda r: r["latency"]["delta"]["p50"],
        f"latency at {args.rate:,}/s, Delta p99 (s)": lambda r: r["latency"]["delta"]["p99"],
        f"latency at {args.rate:,}/s, output topic p50 (s)": lambda r: r["latency"]["kafka"]["p50"],
        f"latency at {args.rate:,}/s, output topic p99 (s)": lambda r: r["latency"]["kafka"]["p99"],
    }
    lines = [
        f"## The main job on the production shape's Kafka, beside the development shape's ({dt.date.today()})",
        "",
        f"`{command}` on {os.cpu_count()} cores, shapes alternated round by round (medians of {args.rounds}): "
        "purchase_counts with an upsert output topic; development = one broker, one copy of every topic; "
        "production = three KRaft brokers, three copies, `min.insync.replicas=2` (runtime/kafka_cluster.py). "
        "Spark `local[*]` and the lake on local disk in both.",
        "",
        "| measure | development | production | production / development |",
        "|---|---|---|---|",
    ]
    for name, pick in measures.items():
        dev, prod = _median(rows, "development", pick), _median(rows, "production", pick)
        ratio = f"{prod / dev:.2f}x" if dev and prod else "—"
        lines.append(f"| {name} | {fmt(dev)} | {fmt(prod)} | {ratio} |")
    failed = [f"{r['shape']} round {r['round']}: {r['error'][:200]}" for r in rows if "error" in r]
    if failed:
        lines += ["", "Failed: " + "; ".join(failed)]
    lines += ["", "Where a latency run's micro-batch time went (seconds per batch, warm-up included):", ""]
    for r in rows:
        if (phases := r.get("latency", {}).get("seconds_per_batch")) is not None:
            spent = ", ".join(f"{name} {seconds:.3f}" for name, seconds in phases.items() if seconds)
            lines.append(f"- {r['shape']}, round {r['round']}: {r['latency']['batches']} batches; per batch {spent}")
    loads = ", ".join(f"{r['shape']} {r['round']}: {r['load_1m_before']}" for r in rows)
    lines += ["", f"Load average (1 min) as each row began: {loads}.", ""]
    return lines


if __name__ == "__main__":
    main()
