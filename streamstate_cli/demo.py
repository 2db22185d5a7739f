"""The main job: the platform running, ending in a summary a person can check.

``make run`` (``streamstate demo``):

1. resolves the JVM jars, starts the local Kafka broker and Airflow standalone;
2. unpauses and triggers ``supervise__purchase_counts``: **Airflow launches the driver** (spark-submit,
   detached, one instance), watches it and restarts it if it dies, as in production;
3. produces realistic purchase events for a while (``--seconds``), as a live source would;
4. waits until the job has committed every event, then prints what the jobs page's API and the
   Delta output say (running under supervision, batches, lag, state, snapshot, standby) with a
   consistency check: the Delta table equals the per-user counts computed in plain Python over every
   event in the topic (closed accounts deleted), and the addresses of the UI.

The stack and the job keep running until ``make down``. Re-running is safe: each run adds new events
(a new seed) to the running job, so totals grow and the check still holds.

``--no-airflow`` is the quick path without Airflow: the job runs through ``spark-submit
--available-now`` until it has processed everything, then stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from runtime import jvm
from runtime.airflow_standalone import AirflowApi, LocalAirflow
from runtime.kafka_broker import LocalKafkaBroker
from runtime.kafka_connection import KafkaTarget
from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.documents import from_json
from spark_jobs.layout import JobDags

JOB = "purchase_counts"
console = Console(highlight=False, width=None if Console().is_terminal else 140)


def topic_record_count(kafka: KafkaTarget, topic: str) -> int:
    """Records currently in ``topic`` (sum over partitions of high minus low watermark)."""
    from spark_jobs.io.kafka_topics import partition_offsets

    return sum(high - low for low, high in partition_offsets(kafka, topic, 10).values())


def _next_seed(settings: Settings) -> int:
    counter = settings.status_dir / "demo-runs"
    counter.parent.mkdir(parents=True, exist_ok=True)
    runs = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(runs + 1))
    return 1000 + runs


def run_demo(settings: Settings, *, events: int, users: int, with_airflow: bool, seconds: float = 30.0) -> int:
    """``make run``: the platform path (Airflow supervises the job), or without Airflow the drained one."""
    if with_airflow:
        return run_supervised_demo(settings, events=events, users=users, seconds=seconds)
    return run_drained_demo(settings, events=events, users=users)


def run_drained_demo(settings: Settings, *, events: int, users: int) -> int:
    """Kafka, Spark and Delta only: the job drains its input with ``spark-submit --available-now``."""
    from spark_jobs.driver.run import report_path
    from spark_jobs.driver.submit import submit_spec
    from spark_jobs.io import kafka_topics
    from spark_jobs.io.dead_letter import dead_letter_topic
    from spark_jobs.layout import JobLayout
    from spark_jobs.reference.generators import purchases
    from spark_jobs.registry import get_job

    started = time.monotonic()
    spec = get_job(JOB)
    jvm.resolve(settings, log=console.print)

    with console.status("starting the Kafka broker…"):
        LocalKafkaBroker(settings).start()
    console.print(f"[green]✓[/green] Kafka broker at {settings.kafka}")

    created = kafka_topics.ensure_topic(
        settings.kafka, spec.source_topic, spec.source_partitions, settings.kafka_replication_factor
    )
    seed = _next_seed(settings)
    batch = list(purchases.generate(events, users=users, seed=seed))
    with console.status(f"producing {len(batch):,} purchase events to '{spec.source_topic}'…"):
        purchases.produce(settings.kafka, spec.source_topic, batch)
    console.print(
        f"[green]✓[/green] produced {len(batch):,} events (seed {seed}) to topic '{spec.source_topic}'"
        + (" (created)" if created else "")
    )

    submit = submit_spec(spec, settings, available_now=True)
    log_file = settings.logs_dir / f"{spec.application_id}.spark-submit.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with console.status(f"running {spec.application_id} with spark-submit (master {settings.spark_master})…"):
        with open(log_file, "w") as log:
            proc = subprocess.run(
                submit.command(), env={**os.environ, **submit.env}, stdout=log, stderr=subprocess.STDOUT
            )
    if proc.returncode != 0:
        console.print(f"[red]spark-submit failed ({proc.returncode}); see {log_file}[/red]")
        console.print("\n".join(log_file.read_text().splitlines()[-20:]))
        return 1
    report = json.loads(report_path(spec, settings).read_text())
    console.print(
        f"[green]✓[/green] {spec.application_id} processed {report['input_rows']:,} events "
        f"in {report['batches']} micro-batch(es)"
    )

    summary = _read_output(settings, report["output"])
    in_topic = topic_record_count(settings.kafka, spec.source_topic)
    # The check: Delta holds exactly what plain Python computes from every event in the topic.
    expected = purchases.expected_counts(kafka_topics.read_json_records(settings.kafka, spec.source_topic))
    summary["matches"] = summary.pop("state") == expected
    summary["changelogs"] = {
        name: topic_record_count(settings.kafka, name) for name in JobLayout.of(spec, settings).changelog_topics
    }
    dlq = dead_letter_topic(spec.application_id)
    summary["dead_letters"] = (dlq, topic_record_count(settings.kafka, dlq))
    _print_summary(settings, spec, report, summary, in_topic, time.monotonic() - started, log_file)
    return _check_outcome(summary["matches"], report["output"], in_topic, spec.source_topic)


def _read_output(settings: Settings, path: str) -> dict:
    """The output table's totals, top spenders and rows, read with delta-rs (no Spark session to start)."""
    from deltalake import DeltaTable

    with console.status("reading the Delta output…"):
        table = DeltaTable(path, storage_options=Location.of(path, settings.object_store).storage_options())
        rows = table.to_pyarrow_table(columns=["user_id", "purchases", "amount_spent", "last_purchase_at"]).to_pylist()
    top = sorted(rows, key=lambda r: r["amount_spent"], reverse=True)[:5]
    return {
        "keys": len(rows),
        "total_purchases": sum(r["purchases"] or 0 for r in rows),
        "top": top,
        "version": table.version(),
        "state": {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in rows},
    }


def _check_row(matches: bool) -> tuple[str, str]:
    """The summary's row on the check: the Delta table against plain Python's counts over the topic."""
    return (
        "check",
        "[green]OK[/green]: Delta = plain-Python counts over every event in the topic"
        if matches
        else "[red]MISMATCH[/red]",
    )


def _check_outcome(matches: bool, output_table: str, in_topic: int, topic: str) -> int:
    """The demo's exit code: 0 when the check holds, else 1 after saying what differs."""
    if matches:
        return 0
    console.print(
        f"[red]check failed: the Delta table {output_table} differs from the counts computed "
        f"in plain Python over the {in_topic:,} events of '{topic}'[/red]"
    )
    return 1


def _print_summary_table(title: str, rows: list[tuple[str, str]], summary: dict) -> None:
    """The summary (key, value rows), then the top spenders of the output table."""
    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    top = Table(title="top spenders")
    for column in ("user_id", "purchases", "amount_spent", "last_purchase_at"):
        top.add_column(column)
    for row in summary["top"]:
        top.add_row(row["user_id"], str(row["purchases"]), str(row["amount_spent"]), str(row["last_purchase_at"]))
    console.print(top)


def _print_summary(settings, spec, report, summary, in_topic, elapsed, log_file) -> None:
    rows = [
        ("events in (this run)", f"{report['input_rows']:,}"),
        ("events in topic (all runs)", f"{in_topic:,}"),
        ("keys in state", f"{report['state_rows']:,} users ({report['state_memory_bytes']:,} bytes in RocksDB)"),
        ("outputs written", f"{summary['keys']:,} rows in Delta (table version {summary['version']})"),
        _check_row(summary["matches"]),
        ("purchases counted", f"{summary['total_purchases']:,} (closed accounts' purchases are deleted)"),
        ("input offsets", json.dumps(report["end_offsets"])),
        *[
            ("changelog", f"{name}: {count:,} records (compacted; latest value per key = state)")
            for name, count in summary["changelogs"].items()
        ],
        ("dead letters", f"{summary['dead_letters'][0]}: {summary['dead_letters'][1]:,} records"),
        ("status", str(settings.status_dir / f"{spec.application_id}.status.json")),
        ("Delta table", report["output"]),
        ("checkpoint", report["checkpoint"]),
        ("topic", f"{spec.source_topic} @ {settings.kafka}"),
        ("spark-submit log", str(log_file)),
        ("elapsed", f"{elapsed:.0f} s"),
    ]
    _print_summary_table(f"{spec.application_id}: summary", rows, summary)


class EmbeddedStack:
    """``make run``'s stack: the local broker and Airflow standalone on SQLite."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def start(self) -> None:
        with console.status("starting the Kafka broker…"):
            LocalKafkaBroker(self.settings).start()
        console.print(f"[green]✓[/green] Kafka broker at {self.settings.kafka}")
        with console.status("starting Airflow standalone (a first start migrates its database)…"):
            LocalAirflow(self.settings).start()
        console.print(f"[green]✓[/green] Airflow at {self.settings.airflow_url}")

    def uis(self) -> list[tuple[str, str]]:
        """Where the stack's UIs are, beyond Airflow's (the summary's rows)."""
        return []


def run_supervised_demo(settings: Settings, *, events: int, users: int, seconds: float, stack=None) -> int:
    """The platform path: Airflow's ``supervise__purchase_counts`` launches and watches the driver while
    events flow in; the summary comes from the jobs page's API and the Delta output. ``stack``: what runs it
    (:class:`EmbeddedStack` by default; the production shape's: streamstate_cli/production.py)."""
    from spark_jobs.io import kafka_topics
    from spark_jobs.layout import JobLayout
    from spark_jobs.reference.generators import purchases
    from spark_jobs.registry import get_job

    started = time.monotonic()
    spec = get_job(JOB)
    layout = JobLayout.of(spec, settings)
    dag_id = JobDags(spec.name).supervise
    jvm.resolve(settings, log=console.print)
    stack = stack or EmbeddedStack(settings)
    stack.start()
    kafka_topics.ensure_topic(
        settings.kafka,
        spec.source_topic,
        spec.source_partitions,
        settings.kafka_replication_factor,
        {"min.insync.replicas": str(settings.kafka_min_insync_replicas)},
    )
    _launch_under_airflow(settings, spec, dag_id)
    produced = _produce_while_running(settings, spec, events=events, users=users, seconds=seconds)
    _wait_caught_up(settings, spec, layout)

    view = _job_row(settings, spec.name)
    summary = _read_output(settings, str(layout.output_table))
    in_topic = topic_record_count(settings.kafka, spec.source_topic)
    expected = purchases.expected_counts(kafka_topics.read_json_records(settings.kafka, spec.source_topic))
    matches = summary.pop("state") == expected
    rows = [
        *_supervised_job_rows(view, spec, dag_id, produced=produced, in_topic=in_topic),
        ("outputs", f"{summary['keys']:,} rows in Delta (table version {summary['version']})"),
        _check_row(matches),
        *_supervised_link_rows(settings, spec, summary),
        *stack.uis(),
        ("Delta table", str(layout.output_table)),
        ("elapsed", f"{time.monotonic() - started:.0f} s"),
    ]
    _print_summary_table(f"{spec.application_id}: the platform running", rows, summary)
    console.print(f"The job keeps running under {dag_id}; `make down` stops the stack and the job.")
    return _check_outcome(matches, str(layout.output_table), in_topic, spec.source_topic)


def _launch_under_airflow(settings: Settings, spec, dag_id: str) -> None:
    """Has Airflow launch the driver (a trigger, or an unpause when it already runs) and waits until it runs."""
    from spark_jobs.driver.lease import JobLease
    from spark_jobs.driver.lifecycle import observe_driver

    api = AirflowApi(settings.airflow_url)
    with console.status(f"waiting for Airflow to parse {dag_id}…"):
        _wait(lambda: dag_id in api.dag_ids(), 300, f"{dag_id} to be parsed")
    lease = JobLease(settings.status_dir, spec.application_id)
    if lease.holder() is None:
        run_id = api.trigger(dag_id)  # unpauses it: scheduled checks follow every check_every_s
        console.print(f"[green]✓[/green] triggered {dag_id} (run {run_id}); it launches the driver")
    else:
        api.set_paused(dag_id, False)
        console.print(f"[green]✓[/green] {spec.application_id} already runs under {dag_id}")

    def running() -> bool:
        return observe_driver(settings.status_dir, spec.application_id).state == "RUNNING"

    scheduler_down = SchedulerWatch(LocalAirflow(settings).health, settings.logs_dir)
    with console.status(f"waiting for Airflow to launch {spec.application_id} (spark-submit, a JVM start)…"):
        _wait(running, 600, f"{spec.application_id} to run (see {settings.logs_dir / 'jobs'})", scheduler_down)
    launched_by = _job_row(settings, spec.name).supervision.launched_by
    console.print(f"[green]✓[/green] {spec.application_id} RUNNING, launched by {launched_by}")


def _produce_while_running(settings: Settings, spec, *, events: int, users: int, seconds: float) -> int:
    """Produces a new seed's purchase events in one-second chunks over ``seconds``, as a live source would,
    showing the job's input lag; returns how many it produced."""
    from spark_jobs.driver.lifecycle import read_status
    from spark_jobs.reference.generators import purchases

    seed = _next_seed(settings)
    batch = list(purchases.generate(events, users=users, seed=seed))
    steps = max(1, int(seconds))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"producing {len(batch):,} events over {steps} s", total=len(batch))
        for i in range(steps):
            chunk = batch[i * len(batch) // steps : (i + 1) * len(batch) // steps]
            purchases.produce(settings.kafka, spec.source_topic, chunk)
            status = read_status(settings.status_dir, spec.application_id)
            lag = status.progress.total_lag if status and status.progress else 0
            progress.update(task, advance=len(chunk), description=f"producing (the job's input lag: {lag:,})")
            time.sleep(1)
    console.print(
        f"[green]✓[/green] produced {len(batch):,} events (seed {seed}) over {steps} s to '{spec.source_topic}'"
    )
    return len(batch)


def _wait_caught_up(settings: Settings, spec, layout) -> None:
    """Waits until the job's checkpoint has committed every record now in its source topic."""
    from spark_jobs.io import kafka_topics
    from spark_jobs.state.source_position import committed_source_offsets

    ends = {p: high for p, (_, high) in kafka_topics.partition_offsets(settings.kafka, spec.source_topic).items()}

    def caught_up() -> bool:
        committed = (committed_source_offsets(layout, settings.kafka) or {}).get(spec.source_topic, {})
        return all(committed.get(p, 0) >= end for p, end in ends.items())

    with console.status("waiting for the job to commit every event…"):
        _wait(caught_up, 600, f"{spec.application_id} to catch up")


def _supervised_job_rows(view, spec, dag_id: str, *, produced: int, in_topic: int) -> list[tuple[str, str]]:
    """The summary's rows on the job itself, from its row of the jobs page."""
    snapshot = view.snapshots.get(spec.stores[0].name)
    return [
        (
            "job",
            f"{view.lifecycle_state} under {dag_id} (desired {view.supervision.desired}); "
            f"driver pid {view.driver.pid if view.driver else None}, launched by {view.supervision.launched_by}",
        ),
        ("events produced (this run)", f"{produced:,}"),
        ("events in topic (all runs)", f"{in_topic:,}"),
        ("micro-batches", f"latest {view.batch_id}, input lag {view.input_lag_records or 0:,} records"),
        ("keys in state", f"{view.state_rows or 0:,} users ({view.state_memory_bytes or 0:,} bytes in RocksDB)"),
        ("snapshot", f"batch {snapshot.batch_id}, {snapshot.rows} rows" if snapshot else "none yet"),
        ("spare driver", view.spare or "not running"),
        ("warm standby", view.standby.state),
    ]


def _supervised_link_rows(settings: Settings, spec, summary: dict) -> list[tuple[str, str]]:
    """The addresses of Airflow's UI, the jobs page and (when the output has a row) a state query of its top user."""
    rows = [("Airflow UI", settings.airflow_url), ("Streaming jobs page", f"{settings.airflow_url}/streamstate/")]
    if summary["top"]:
        rows.append(
            (
                "state query",
                f"{settings.airflow_url}/state-api/jobs/{spec.name}/stores/{spec.stores[0].name}/keys/"
                f"{summary['top'][0]['user_id']}",
            )
        )
    return rows


def _job_row(settings: Settings, job: str):
    """The job's row of the Streaming jobs page (what on-call's page shows), as Airflow's API server serves it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugins"))  # as in every Airflow process
    from streamstate.ui.view_model import JobRow

    with urllib.request.urlopen(f"{settings.airflow_url}/streamstate/api/jobs", timeout=30) as response:
        rows = [from_json(JobRow, row) for row in json.loads(response.read())["jobs"]]
    return next(row for row in rows if row.job == job)


def _wait(predicate, timeout_s: float, what: str, gave_up=None, poll_s: float = 1.0) -> None:
    """Wait until ``predicate()``; TimeoutError after ``timeout_s``, or at once with what ``gave_up()`` says when it
    says something (a wait that can no longer end well)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if gave_up is not None and (why := gave_up()):
            raise RuntimeError(f"stopped waiting for {what}: {why}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(poll_s)


class SchedulerWatch:
    """Says why a wait on Airflow can no longer end when its scheduler has not been healthy for ``grace_s`` (its
    health endpoint: a heartbeat older than Airflow's threshold, or no answer): ``airflow standalone`` does not start
    a scheduler that died again, and nothing a run waits for happens without one. The grace covers a heartbeat
    late on a busy machine."""

    def __init__(self, health, logs_dir: Path, grace_s: float = 120.0, clock=time.monotonic) -> None:
        self.health, self.logs_dir, self.grace_s, self.clock = health, logs_dir, grace_s, clock
        self.unhealthy_since: float | None = None

    def __call__(self) -> str | None:
        status = ((self.health() or {}).get("scheduler") or {}).get("status")
        if status == "healthy":
            self.unhealthy_since = None
            return None
        now = self.clock()
        self.unhealthy_since = self.unhealthy_since if self.unhealthy_since is not None else now
        if now - self.unhealthy_since < self.grace_s:
            return None
        return (
            f"Airflow's scheduler has not been healthy for {now - self.unhealthy_since:.0f} s (status: {status}); "
            f"see its log in {self.logs_dir}, then `make down` and start the stack again"
        )
