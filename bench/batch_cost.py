"""Where a steady micro-batch's time goes: the Spark jobs one batch of a job runs, and what each costs.

A private broker; ``--events`` purchases (or another workload's events) produced up front; the job run over
them available-now in micro-batches of ``--batch-events`` (Kafka's ``maxOffsetsPerTrigger``), in one fresh
driver with Spark's event log on. The event log says which Spark jobs each streaming batch ran, where in
the code each was started (PySpark's call site) and how long it took; the first ``--warm-up`` batches (a
cold driver's) are left out of the per-batch figures. ``--py4j`` also counts the driver's calls into the JVM
(each a round trip over py4j's socket), by the platform's function that made them, per batch of the run.

    .venv/bin/python bench/batch_cost.py [--job purchase_counts] [--events 20000] [--batch-events 1000] [--py4j]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import private_broker  # noqa: E402

#: the source events of each job this benchmark knows, by the generator that writes them
WORKLOADS = {
    "purchase_counts": "purchases",
    "purchase_counts_in_memory": "purchases",
    "user_sessions": "sessions",
}


def _produce(settings, spec, workload: str, events: int) -> None:
    from spark_jobs.io.kafka_topics import ensure_topic
    from spark_jobs.reference.generators import purchases, sessions
    from spark_jobs.reference.generators.producer import produce_keyed

    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions)
    if workload == "purchases":
        rows = purchases.generate(events, users=max(100, events // 10))
    else:  # visits of ~12 events an hour or two apart: ~200 events per user a day
        rows = itertools.islice(sessions.generate(max(10, events // 100), seconds=86_400), events)
    produce_keyed(settings.kafka, spec.source_topic, rows, spec.key_field)


def batch_jobs(event_log: Path) -> tuple[dict[int, list[dict]], dict[int, float]]:
    """The Spark jobs of each streaming batch (its ``streaming.sql.batchId``: call site and seconds), and each
    batch's duration in seconds (its progress event's ``triggerExecution``)."""
    started: dict[int, dict] = {}
    by_batch: dict[int, list[dict]] = collections.defaultdict(list)
    durations: dict[int, float] = {}
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        kind = event.get("Event")
        if kind.endswith("QueryProgressEvent"):
            progress = event["progress"]
            durations[progress["batchId"]] = progress["durationMs"].get("triggerExecution", 0) / 1000
        elif kind == "SparkListenerJobStart":
            props = event.get("Properties") or {}
            batch = props.get("streaming.sql.batchId")
            if batch is not None:
                site = props.get("callSite.short") or "?"
                started[event["Job ID"]] = {"batch": int(batch), "site": site, "start": event["Submission Time"]}
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in started:
            job = started.pop(event["Job ID"])
            job["seconds"] = (event["Completion Time"] - job["start"]) / 1000
            by_batch[job["batch"]].append(job)
    return by_batch, durations


class Py4jCalls:
    """Counts the calls into the JVM made while it is entered (every py4j connection's ``send_command``), each by
    the innermost frame of this repository's ``spark_jobs`` that led to it (else py4j's innermost caller, in
    parentheses: PySpark's callback of a batch or a listener, or py4j releasing a collected Java object's
    reference, ``_garbage_collect_object``)."""

    def __init__(self) -> None:
        self.by_caller: collections.Counter[str] = collections.Counter()
        self._patched: list[tuple[type, object]] = []

    def _caller(self) -> str:
        frame, outside = sys._getframe(2), None
        while frame is not None:
            path = frame.f_code.co_filename
            if "/spark_jobs/" in path and "site-packages" not in path:
                return f"{path.split('/spark_jobs/', 1)[1]}:{frame.f_code.co_name}"
            if outside is None and "/py4j/" not in path:  # the innermost caller of py4j, e.g. in pyspark
                outside = f"({'/'.join(Path(path).parts[-2:])}:{frame.f_code.co_name})"
            frame = frame.f_back
        return outside or "(py4j)"

    def __enter__(self) -> Py4jCalls:
        from py4j import clientserver, java_gateway

        for cls in (clientserver.ClientServerConnection, java_gateway.GatewayConnection):
            original = cls.send_command

            def counted(connection, *args, _original=original, **kwargs):
                self.by_caller[self._caller()] += 1
                return _original(connection, *args, **kwargs)

            self._patched.append((cls, original))
            cls.send_command = counted
        return self

    def __exit__(self, *exc) -> None:
        for cls, original in self._patched:
            cls.send_command = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default="purchase_counts", choices=sorted(WORKLOADS))
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch-events", type=int, default=1_000)
    parser.add_argument("--warm-up", type=int, default=3, help="first batches left out of the per-batch figures")
    parser.add_argument(
        "--output-topic", action="store_true", help="the job with an upsert output topic (JobSpec.output_topic)"
    )
    parser.add_argument("--py4j", action="store_true", help="count the driver's calls into the JVM, by caller")
    parser.add_argument(
        "--driver-java-options",
        help="more options for the driver JVM, e.g. -XX:StartFlightRecording=filename=/tmp/jfr/,settings=profile",
    )
    args = parser.parse_args()
    console = Console()

    from spark_jobs.driver.run import run
    from spark_jobs.driver.session import build_spark_session
    from spark_jobs.registry import get_job
    from spark_jobs.testing import close_spark_kafka_producers

    spec = get_job(args.job)
    if args.output_topic:
        spec = dataclasses.replace(spec, output_topic=f"{spec.source_topic}-out")
    with private_broker("streamstate-batch-cost-") as settings:
        settings = settings.replace(
            max_offsets_per_trigger=args.batch_events, spark_driver_java_options=args.driver_java_options
        )
        _produce(settings, spec, WORKLOADS[args.job], args.events)
        log_dir = Path(tempfile.mkdtemp(prefix="streamstate-eventlog-"))
        spark = build_spark_session(
            settings,
            "batch-cost",
            {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": str(log_dir),
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            },
        )
        calls = Py4jCalls()
        with calls if args.py4j else contextlib.nullcontext():
            report = run(spec, settings, available_now=True, spark=spark)
        close_spark_kafka_producers(spark)
        spark.stop()
        if report.error:
            raise SystemExit(report.error)
        (event_log,) = log_dir.iterdir()
        by_batch, durations = batch_jobs(event_log)
        console.print(f"Spark's event log: {event_log}")

    steady = {b: jobs for b, jobs in by_batch.items() if b >= args.warm_up}
    per_batch = [sum(j["seconds"] for j in jobs) for jobs in steady.values()]
    sites: dict[str, list[float]] = collections.defaultdict(list)
    for jobs in steady.values():
        for job in jobs:
            sites[job["site"]].append(job["seconds"])
    table = Table(title=f"{args.job}: Spark jobs of a steady batch of {args.batch_events} events")
    for column in ("call site", "jobs per batch", "seconds per batch"):
        table.add_column(column, justify="left" if column == "call site" else "right")
    for site, seconds in sorted(sites.items(), key=lambda item: -sum(item[1])):
        table.add_row(site, f"{len(seconds) / len(steady):.1f}", f"{sum(seconds) / len(steady):.3f}")
    console.print(table)
    batches = len(durations)
    phases = ", ".join(f"{phase} {seconds / batches:.3f}" for phase, seconds in report.phase_seconds.items())
    console.print(
        f"{batches} batches, {len(steady)} steady: {statistics.mean(len(j) for j in steady.values()):.1f} Spark jobs "
        f"per batch, {statistics.median(per_batch):.2f} s in them; a steady batch takes "
        f"{statistics.median(d for b, d in durations.items() if b >= args.warm_up):.2f} s (median). "
        f"Seconds per batch by phase, over the run: {phases}"
    )
    if args.py4j:
        table = Table(title=f"calls into the JVM per batch ({batches} batches, start and stop included)")
        table.add_column("caller (spark_jobs/...)")
        table.add_column("calls per batch", justify="right")
        for caller, count in calls.by_caller.most_common(25):
            table.add_row(caller, f"{count / batches:.1f}")
        console.print(table)
        console.print(f"in all: {sum(calls.by_caller.values()) / batches:.0f} calls per batch")


if __name__ == "__main__":
    main()
