"""Recovery after kill -9 of a running driver: the spare driver vs the supervise DAG's watch task vs the
scheduled check.

A private stack: a Kafka broker, Airflow standalone (scheduler, triggerer, API server; SQLite) and three
copies of purchase_counts (bench/recovery_jobs.py) with steady input, 200 events/s. For each path in
turn its ``supervise__<job>`` DAG is unpaused (scheduled every ``--check-every`` s, as in production)
and starts the driver; then ``--kills`` times: wait a random 10-40 s, kill -9 the driver (the Python
process holding the lease), and measure (after each, ``start_streaming_job`` resets the crash-loop
window and the backoff, so every kill is a first crash)

* **to RUNNING**: a new driver holds the lease and publishes RUNNING (its state from the checkpoint);
* **to a batch**: that driver has completed a micro-batch after the kill (the backlog of the outage
  in it: the input lag falls).

``spare``: the job's spare driver (spark_jobs/driver/spare.py, warm, waiting) takes over; each kill waits until a
spare is READY again (the supervise DAG's next run starts it after a takeover); ``watched``: no spare, the
watch task restarts the driver (``SupervisionPolicy.watch``); ``scheduled``: only the next scheduled check
does (``watch=False``). Medians (min-max) go to BENCHMARKS.md, with the spare's memory (RSS of its process
tree while READY).

    .venv/bin/python bench/recovery.py [--kills 5] [--check-every 120] [--paths spare,watched,scheduled]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import random
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import append_section, private_broker
from runtime.airflow_standalone import AirflowApi, LocalAirflow
from runtime.process import free_port
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import (
    BatchProgress,
    SpareState,
    SpareStatus,
    observe_driver,
    read_spare_status,
    read_status,
)
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobDags, spare_name
from spark_jobs.reference.generators import purchases
from streamstate_cli.job_processes import stop_job_processes

console = Console()
EVENTS_PER_S = 200


def steady_input(settings: Settings, topic: str, stop: threading.Event) -> threading.Thread:
    def produce() -> None:
        seed = 0
        while not stop.is_set():
            seed += 1
            purchases.produce(settings.kafka, topic, purchases.generate(EVENTS_PER_S, users=2000, seed=seed))
            stop.wait(1.0)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    return thread


def spare_ready(settings: Settings, app: str) -> SpareStatus | None:
    """The job's spare driver, when it is READY and watching the running driver."""
    spare = read_spare_status(settings.status_dir, app)
    holder = JobLease(settings.status_dir, app).holder()
    ready = spare is not None and spare.state is SpareState.READY and holder is not None
    alive = JobLease(settings.status_dir, spare_name(app)).holder() is not None
    return spare if ready and alive and spare.watching_epoch == holder.epoch else None


def process_group_rss_mib(pid: int) -> float:
    """The resident memory of every process in ``pid``'s process group: for a spare launched by supervision (its
    own session), the launch's shell, spark-submit's JVM and the Python driver, the JVM's parent's child."""
    import psutil

    group = os.getpgid(pid)
    total = 0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == group:
                total += proc.memory_info().rss
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f}s")


def measure_path(settings: Settings, api: AirflowApi, job: str, kills: int, check_every_s: int) -> list[dict]:
    from spark_jobs.registry import get_job

    spec = get_job(job)
    app = spec.application_id
    lease = JobLease(settings.status_dir, app)
    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions)
    stop = threading.Event()
    producer = steady_input(settings, spec.source_topic, stop)
    api.trigger(JobDags(job).supervise)  # unpauses it: scheduled runs follow
    results = []
    results_memory: list[float] = []
    try:
        wait_for(lambda: observe_driver(settings.status_dir, app).state == "RUNNING", 600, f"{job} to run")
        for i in range(kills):
            time.sleep(random.uniform(10, 40))
            if spec.supervision.spare_driver:
                spare = wait_for(lambda: spare_ready(settings, app), check_every_s + 600, f"{job}'s spare driver READY")
                results_memory.append(process_group_rss_mib(spare.pid))
            holder = lease.holder()
            killed_at = time.time()
            os.kill(holder.pid, signal.SIGKILL)

            def running(epoch=holder.epoch):
                driver = observe_driver(settings.status_dir, app)
                return driver.state == "RUNNING" and driver.holder.epoch > epoch

            wait_for(running, check_every_s + 600, f"{job} RUNNING again")
            to_running = time.time() - killed_at

            def batch_after_kill(killed_at=killed_at) -> BatchProgress | None:
                status = read_status(settings.status_dir, app)
                at = status.progress.progress_at if status and status.progress else None
                return status.progress if at and dt.datetime.fromisoformat(at).timestamp() > killed_at else None

            first = wait_for(batch_after_kill, 600, f"{job}'s first batch after the kill")
            to_batch = time.time() - killed_at
            # the profile of the restart: where the first batch's time went (Spark's durationMs phases)
            phases = {name: ms for name, ms in first.phase_ms.items() if ms}
            sink_phases = {name: ms for name, ms in first.sink_phase_ms.items() if ms}  # where addBatch went
            took_over = read_status(settings.status_dir, app).pid == (
                spare.pid if spec.supervision.spare_driver else None
            )
            results.append(
                {
                    "to_running_s": to_running,
                    "to_batch_s": to_batch,
                    "first_batch_ms": phases,
                    "first_batch_sink_ms": sink_phases,
                    "took_over": took_over,
                }
            )
            console.print(
                f"{job} kill {i + 1}/{kills}: RUNNING after {to_running:.1f}s, a batch after {to_batch:.1f}s "
                f"(first batch {first.batch_id}: {phases}; addBatch: {sink_phases})"
            )
            # Each kill measures a first crash: a manual start (what on-call does after a fix) resets the
            # crash-loop window and the backoff, which three kills in 30 minutes would otherwise trip.
            api.wait_for_run("start_streaming_job", api.trigger("start_streaming_job", {"job": job}), 300)
        if results_memory:
            results[0]["spare_rss_mib"] = statistics.median(results_memory)
    finally:
        api.set_paused(JobDags(job).supervise, True)
        stop.set()
        producer.join(30)
        run = api.trigger("stop_streaming_job", {"job": job, "reason": "benchmark done"})
        api.wait_for_run("stop_streaming_job", run, 300)
        api.set_paused(JobDags(job).supervise, True)  # (trigger unpaused the stop DAG, not this one)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--check-every", type=int, default=120, help="the supervise DAGs' schedule, seconds")
    parser.add_argument("--paths", default="spare,watched,scheduled", help="which paths to measure, comma-separated")
    args = parser.parse_args()
    chosen = args.paths.split(",")
    os.environ["BENCH_RECOVERY_CHECK_EVERY_S"] = str(args.check_every)
    os.environ["STREAMSTATE_JOB_MODULES"] = "bench.recovery_jobs"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
    with private_broker("streamstate-recovery-") as broker_settings:
        ports = {free_port() for _ in range(6)} - {broker_settings.kafka_port, broker_settings.kafka_controller_port}
        ports = sorted(ports)
        settings = broker_settings.replace(
            job_modules="bench.recovery_jobs",
            airflow_port=ports[0],
            airflow_scheduler_health_port=ports[1],
            airflow_worker_log_port=ports[2],
            airflow_triggerer_log_port=ports[3],
        )
        airflow = LocalAirflow(settings)
        console.print(f"starting Airflow standalone on {settings.airflow_url} (data: {settings.data_dir})")
        airflow.start()
        api = AirflowApi(settings.airflow_url)
        try:
            wait_for(
                lambda: {JobDags(f"recovery_{name}").supervise for name in chosen} <= set(api.dag_ids()),
                300,
                "the supervise DAGs to be parsed",
            )
            paths = {
                name: measure_path(settings, api, f"recovery_{name}", args.kills, args.check_every)
                for name in ("spare", "watched", "scheduled")
                if name in chosen
            }
        finally:
            airflow.stop()
            stop_job_processes(settings)  # the warm standbys and spares the supervise DAGs started

    def fmt(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"

    lines = [
        f"## Recovery after kill -9 of a running driver ({dt.date.today().isoformat()})",
        "",
        (
            f"`.venv/bin/python bench/recovery.py --kills {args.kills} --check-every {args.check_every} "
            f"--paths {args.paths}` on "
            f"{platform.machine()}, {os.cpu_count()} cores: Airflow standalone (scheduler, triggerer; SQLite), "
            f"purchase_counts with {EVENTS_PER_S} events/s, a kill every 10-40 s after the driver runs again."
        ),
        "",
        "| path | kills | to RUNNING, median (min-max) | to a batch after the kill, median (min-max) |",
        "|---|---|---|---|",
    ]
    for name, results in paths.items():
        if not results:
            continue
        lines.append(
            f"| {name} | {len(results)} | {fmt([r['to_running_s'] for r in results])} | "
            f"{fmt([r['to_batch_s'] for r in results])} |"
        )
    spare_results = paths.get("spare") or []
    if spare_results:
        took = sum(r["took_over"] for r in spare_results)
        lines += [
            "",
            f"spare: the spare driver took over in {took} of {len(spare_results)} kills (else a restart was "
            f"quicker); its memory while READY (Python + Spark JVM, RSS): "
            f"{spare_results[0].get('spare_rss_mib', 0):,.0f} MiB median.",
        ]
    for key, what in (
        ("first_batch_ms", "per Spark phase (`durationMs`)"),
        ("first_batch_sink_ms", "per phase of the batch function (`addBatch`'s part; `sink_phase_ms`)"),
    ):
        profiled = [r[key] for results in paths.values() for r in results if r.get(key)]
        if profiled:
            phases = sorted(
                {name for p in profiled for name in p}, key=lambda n: -statistics.median(p.get(n, 0) for p in profiled)
            )
            lines += [
                "",
                f"The first micro-batch after a restart, median ms {what}: "
                + ", ".join(f"{n} {statistics.median(p.get(n, 0) for p in profiled):,.0f}" for n in phases)
                + ".",
            ]
    lines += [
        "",
        "watched: the supervise DAG's watch task (deferred in the triggerer between checks) restarts the",
        f"driver; scheduled: the next `supervise__<job>` run does (every {args.check_every} s).",
        "",
    ]
    append_section(lines, console)


if __name__ == "__main__":
    main()
