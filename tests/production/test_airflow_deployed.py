"""The main job as deployed, every process of it failing: Airflow on PostgreSQL (Debian's server, a data directory
of the test's own; the LocalExecutor; the API server, scheduler, DAG processor and triggerer each a process of its
own) launching and supervising the driver on a Spark standalone cluster (a master and two workers, separate
processes) whose checkpoint, snapshots and tables are in an S3-API object store (S3Proxy); the warm standby beside it.

The job is started and supervised through Airflow's API. Then, one after another, while it runs:

1. with the watch deferred on the triggerer, kill -9 of the scheduler and then of the triggerer, each started
   again: the watch resumes and no second driver is launched (the lease's epoch stays);
2. a worker lost (kill -9 of it and its executor) in the middle of a micro-batch: the driver held at
   ``before_outputs`` with the batch's state computed and cached on the executors (every batch goes through
   Spark: ``driver_output_max_rows=0``); the lost partitions are computed again on the other worker;
3. the master restarted: the running application keeps running, and the master takes it back (its recovery
   directory);
4. a third worker joins: the running application, which may use more cores than the two workers had
   (``spark.cores.max=3``), gets an executor there without a restart, and the next batch's tasks run on it;
5. kill -9 of the driver: the watch restarts it on the cluster, its state read back from the object store, and
   on-call hears of it once.

After each, the Delta outputs (read from the object store) equal the reference over every event so far; at the
end the state API answers from the live job and the standby keeps its snapshot in the object store, not on disk.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import os
import shutil
import signal
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

import pytest
from streamstate.supervision import read_record

from runtime.airflow_standalone import AirflowApi, LocalAirflow
from runtime.kafka_broker import LocalKafkaBroker
from runtime.postgres import LocalPostgres
from runtime.process import free_port, kill_process_group
from runtime.s3_server import LocalS3Server
from runtime.spark_standalone import LocalSparkStandalone
from spark_jobs.driver import failpoints
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import FollowerState, observe_driver, read_standby_status, read_status
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.versions import read_rows
from tests.conftest import PRIVATE_BROKER_JAVA_OPTIONS, RECOVERY_PROPERTY, stack_settings
from tests.helpers import driver_diagnosis, driver_pids, wait_for, wait_for_success
from tests.plugins.test_on_call_in_browser import _received

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.production]

JOB = get_job("purchase_counts")
SUPERVISE = f"supervise__{JOB.name}"
#: the driver's second micro-batch is held this long with its state computed (the worker is lost meanwhile)
HOLD_S = 10


class Deployed:
    """The stack's parts, for the test to break."""

    def __init__(self, settings, airflow: LocalAirflow, spark: LocalSparkStandalone, s3: LocalS3Server) -> None:
        self.settings, self.airflow, self.spark, self.s3 = settings, airflow, spark, s3
        self.api = AirflowApi(settings.airflow_url)
        self.layout = JobLayout.of(JOB, settings)
        self.events: list[dict] = []

    def produce(self, n: int, seed: int) -> None:
        chunk = list(purchases.generate(n, users=40, seed=seed))
        purchases.produce(self.settings.kafka, JOB.source_topic, chunk)
        self.events.extend(chunk)

    def last_batch(self) -> int:
        status = read_status(self.settings.status_dir, JOB.application_id)
        return status.batch_id if status and status.batch_id is not None else -1

    def outputs(self) -> dict:
        return {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in read_rows(self.layout.output_table)}

    def caught_up(self) -> bool:
        return self.outputs() == purchases.expected_counts(self.events)

    def diagnose(self) -> str:
        logs = "\n".join(f"{name}:\n{process.tail(15)}" for name, process in self.airflow.processes.items())
        spark = "\n".join(f"{w.name}:\n{w.tail(10)}" for w in [self.spark.master, *self.spark.workers])
        drivers = _who_launched(self.settings, driver_pids(JOB.application_id))
        return f"{driver_diagnosis(self.settings, JOB.application_id)}\n{drivers}\n{logs}\n{spark}"


def _who_launched(settings, pids: set[int]) -> str:
    """Who launched what: each of the driver processes ``pids`` with its parent, and the supervision record's
    latest launches."""
    lineage = "\n".join(_process_lineage(pid) for pid in sorted(pids))
    return (
        f"driver processes:\n{lineage}\nlaunches: {read_record(settings.status_dir, JOB.application_id).launches[-4:]}"
    )


def _process_lineage(pid: int) -> str:
    """``pid``'s command line and its parent's (which launcher or process started it), from ``/proc``."""

    def command(p: int) -> str:
        try:
            return Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
        except OSError:
            return "(gone)"

    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return f"  {pid}: (gone)"
    return f"  {pid}: {command(pid)}\n    parent {parent}: {command(parent)}"


@pytest.fixture(scope="module")
def deployed():
    """PostgreSQL, Airflow's four processes, a Spark master and two workers, an S3-API server and a broker, all of
    the test's own; stopped (and the drivers Airflow launched stopped) afterwards."""
    home = Path(tempfile.mkdtemp(prefix="streamstate-deployed-"))
    home.chmod(0o755)  # under root the database server runs as the postgres user, which must reach its directory
    base = stack_settings(home / "stack", kafka_broker_java_options=PRIVATE_BROKER_JAVA_OPTIONS)
    s3 = LocalS3Server(home / "s3", free_port())
    # two workers of one core: the driver's application has an executor on each, so a lost worker leaves it one,
    # and wants a third core (spark.cores.max=3) that only a joining worker gives it
    spark = LocalSparkStandalone(
        base, free_port(), free_port(), free_port(), worker_cores=1, worker_memory="2g", workers=2
    )
    settings = base.replace(
        spare_drivers=False,
        spark_master=spark.master_url,
        spark_cores_max=3,
        lake_uri="s3a://lake/tables",
        checkpoint_uri="s3a://lake/checkpoints",
        driver_output_max_rows=0,  # every batch's outputs by Spark, from the state the executors computed
        **s3.settings_fields(),
    )
    broker = LocalKafkaBroker(settings)
    postgres = LocalPostgres(settings, free_port(), home=home / "postgres")
    airflow = LocalAirflow(
        settings,
        # the runs the test triggers only, as the session's Airflow (tests/conftest.py); every driver Airflow
        # launches holds its second batch before its outputs
        {
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            failpoints.ENV: f"before_outputs:2:hold:{HOLD_S}",
        },
        database_url=postgres.url,
    )
    try:
        s3.start()
        s3.create_bucket("lake")
        broker.start()
        spark.start()
        postgres.start()
        airflow.start_processes()
        yield Deployed(settings, airflow, spark, s3)
    finally:
        airflow.stop()
        for app in (JOB.application_id, f"{JOB.application_id}.standby"):
            if (holder := JobLease(settings.status_dir, app).holder()) is not None:
                os.kill(holder.pid, signal.SIGKILL)
        for part in (postgres, spark, broker, s3):
            part.stop()
        shutil.rmtree(home, ignore_errors=True)


def _tasks_run(settings, executor_ids: set[str]) -> int:
    """How many tasks the running driver's executors ``executor_ids`` ran, those still alive and those that
    ended (the driver's REST API: ``allexecutors``)."""
    ui = read_status(settings.status_dir, JOB.application_id).spark_ui
    with urllib.request.urlopen(f"{ui}/api/v1/applications") as r:
        (application,) = json.loads(r.read())
    with urllib.request.urlopen(f"{ui}/api/v1/applications/{application['id']}/allexecutors") as r:
        return sum(e["totalTasks"] for e in json.loads(r.read()) if e["id"] in executor_ids)


def _restart_stages(settings, app: str, killed_at: float) -> dict[str, float]:
    """Where a restart by the watch spent its time after the kill (seconds, each stage from the end of the one
    before): until the watch launched the new driver, until that driver's process published, its restore, until
    its first batch began, and that batch (named with its longest phases). Read while the first batch is the
    driver's latest; a stage that left no record is left out."""
    launch = read_record(settings.status_dir, app).last_launch
    status = read_status(settings.status_dir, app)
    first = status.progress if status.progress and status.batch_id == status.first_batch_id else None
    began = _epoch_s(first.progress_at) if first else None
    # Spark's phases of the batch, then the platform's inside its addBatch (state, outputs, changelog, ...)
    phases = (
        [
            *sorted(first.phase_ms.items(), key=lambda phase: -phase[1])[:3],
            *sorted(first.sink_phase_ms.items(), key=lambda phase: -phase[1])[:3],
        ]
        if first
        else []
    )
    at = {
        "the watch's relaunch": launch.at if launch else None,
        "the new driver's start": _epoch_s(status.started_at),
        "its restore": max((_epoch_s(r.finished_at) or 0.0 for r in status.restore.values()), default=None),
        "until its first batch began": began,
        f"its first batch ({', '.join(f'{name} {ms / 1000:.1f} s' for name, ms in phases)})": (
            began + first.batch_duration_ms / 1000 if began and first.batch_duration_ms else None
        ),
    }
    stages, before = {}, killed_at
    for stage, moment in at.items():
        if moment:
            stages[stage] = round(moment - before, 1)
            before = moment
    return stages


def _epoch_s(iso: str | None) -> float | None:
    return dt.datetime.fromisoformat(iso).timestamp() if iso else None


# six faults in a row, each wait bounded on its own: 7 min alone, 10 beside the suite's other worker, more than the
# suite's 15-min default on a machine busier still (a run beside two other heavy ones on 2026-12-07 passed every fault
# but the last when the default stopped it)
@pytest.mark.timeout(1800)
def test_the_supervised_job_outlives_each_process_of_the_deployment(deployed, record_property):
    settings, api, app = deployed.settings, deployed.api, JOB.application_id
    lease = JobLease(settings.status_dir, app)
    diagnose = deployed.diagnose

    def recovered(fault: str, since: float, batch: int) -> None:
        wait_for(lambda: deployed.last_batch() > batch, 300, f"a batch after {fault}", diagnose)
        record_property(RECOVERY_PROPERTY + fault, round(time.monotonic() - since, 1))
        wait_for(deployed.caught_up, 180, f"the outputs equal to the reference after {fault}", diagnose)

    def outlived(fault: str) -> None:
        """The driver lived through ``fault``: not restarted by the watch (which would hide its death)."""
        holder = lease.holder()
        # a second driver process may be seen starting (a launch that finds the lease held exits): the lease says
        # whether the first was replaced; the processes are named for the diagnosis
        assert holder and (holder.epoch, holder.pid) == (started.epoch, started.pid), (
            f"the driver did not outlive {fault}: lease {holder}, drivers {driver_pids(app)} (started {started})\n"
            f"{diagnose()}"
        )
        if others := driver_pids(app) - {started.pid}:  # named in the suite's warnings: who launched them is open
            warnings.warn(f"after {fault}, besides {started.pid}: {_who_launched(settings, others)}", stacklevel=2)

    ensure_topic(settings.kafka, JOB.source_topic, JOB.source_partitions)
    deployed.produce(300, seed=8)
    wait_for_success(api, "start_streaming_job", api.trigger("start_streaming_job", {"job": JOB.name}), 300, diagnose)
    started = wait_for(
        lambda: observe_driver(settings.status_dir, app).state == "RUNNING" and lease.holder(),
        180,
        "the driver RUNNING",
        diagnose,
    )
    wait_for(deployed.caught_up, 180, "the first batch's outputs", diagnose)
    # the application runs on the cluster, an executor on each worker
    assert [a["name"] for a in deployed.spark.running_applications()] == [app]
    assert {p.parent.parent.name for p in deployed.spark.work_dir.glob("*/app-*/*")} == {
        w.name for w in deployed.spark.workers
    }

    # 1. Airflow's scheduler and triggerer, each killed while the watch waits in the triggerer, then back
    api.trigger(SUPERVISE, {"watch_s": 1800})  # a watch that lasts the whole test (else: until the next check)
    wait_for(lambda: "deferred" in api.task_states(SUPERVISE, "watch").values(), 180, "the watch to defer", diagnose)
    for name in ("scheduler", "triggerer"):
        kill_process_group(deployed.airflow.processes[name].pid())
        deployed.airflow.start_process(name)
    wait_for(lambda: "deferred" in api.task_states(SUPERVISE, "watch").values(), 180, "the watch resumed", diagnose)
    assert lease.holder().epoch == started.epoch and driver_pids(app) == {started.pid}, "no second driver"

    # 2. a worker lost while the driver holds a batch whose state its executor computed and keeps
    batch = deployed.last_batch()
    deployed.produce(200, seed=9)
    wait_for(
        lambda: (failpoints.read_marker(settings.status_dir, app) or {}).get("pid") == started.pid,
        120,
        "the second batch held before its outputs",
        diagnose,
    )
    deployed.spark.kill_worker(1)
    recovered("kill -9 of a Spark worker mid-batch", time.monotonic(), batch)
    outlived("the kill of a worker")
    deployed.spark.restart_worker(1)

    # 3. the master restarted under the running application: its batches need no master meanwhile, and the
    # master takes the application back
    batch = deployed.last_batch()
    since = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        restart = pool.submit(deployed.spark.restart_master)
        deployed.produce(200, seed=10)
        recovered("restart of the Spark master", since, batch)
        restart.result()  # the master ALIVE again (its error, if it never was)
    wait_for(
        lambda: [a["name"] for a in deployed.spark.running_applications()] == [app],
        120,
        "the master to take the application back",
        lambda: f"master: {deployed.spark.master_status()}\n{diagnose()}",
    )
    outlived("the master's restart")

    # 4. a third worker joins: the running application gets an executor there, and the next batch uses it
    joined = deployed.spark.add_worker()
    on_joined = f"spark-worker-{joined}/app-*/*"  # an executor's directory, named by its id
    wait_for(
        lambda: next(deployed.spark.work_dir.glob(on_joined), None),
        120,
        "an executor there",
        lambda: f"master: {deployed.spark.master_status()}\n{diagnose()}",
    )
    assert [a["cores"] for a in deployed.spark.running_applications()] == [3]
    batch = deployed.last_batch()
    deployed.produce(200, seed=12)
    wait_for(lambda: deployed.last_batch() > batch, 300, "a batch with the new worker", diagnose)
    wait_for(deployed.caught_up, 180, "the outputs equal to the reference with the new worker", diagnose)
    # every executor the worker ran: one that failed to start is replaced there under the next id (seen in a suite
    # run: the first directory's id was no executor the driver knew)
    executors = {d.name for d in deployed.spark.work_dir.glob(on_joined)}
    assert _tasks_run(settings, executors) > 0, f"no task of the batch ran on the new worker (executors {executors})"
    outlived("a worker joining")

    # 5. the driver: the watch restarts it on the cluster, and its state comes back from the object store
    batch = deployed.last_batch()
    since, killed_at = time.monotonic(), time.time()
    os.kill(started.pid, signal.SIGKILL)
    deployed.produce(200, seed=11)  # the new driver's first batch: its time from the kill is the recovery
    wait_for(
        lambda: (
            (driver := observe_driver(settings.status_dir, app)).alive
            and driver.holder.epoch == started.epoch + 1
            and driver.state == "RUNNING"
        ),
        180,
        "the watch to restart the driver",
        diagnose,
    )
    assert driver_pids(app) == {lease.holder().pid}
    wait_for(lambda: deployed.last_batch() > batch, 300, "the new driver's first batch", diagnose)
    stages = _restart_stages(settings, app, killed_at)  # read at its first batch, which the status then shows
    recovered("kill -9 of the driver (restarted by the watch)", since, batch)
    for stage, seconds in stages.items():
        record_property(f"{RECOVERY_PROPERTY}  of which {stage}", seconds)
    received = wait_for(lambda: _received(settings, f"streamstate/{app}/down"), 120, "the alert", diagnose)
    assert [alert["status"] for alert in received] == ["firing"], received  # once, not once per process restart

    # the state API (served by Airflow's API server) answers from the live job; the standby follows the changelog
    # into its snapshot in the object store
    user, (count, _amount) = next(iter(purchases.expected_counts(deployed.events).items()))
    with urllib.request.urlopen(f"{settings.airflow_url}/state-api/jobs/{JOB.name}/stores/counts/keys/{user}") as r:
        answer = json.loads(r.read())
    assert (answer["source"], answer["value"]["purchases"]) == ("live", count), answer
    standby = wait_for(
        lambda: (
            (status := read_standby_status(settings.status_dir, app))
            and status.state == FollowerState.FOLLOWING
            and status.stores["counts"].batch_id is not None
            and status
        ),
        180,
        "the standby following, a snapshot of its own written",
        diagnose,
    )
    assert standby.error is None

    # everything a driver on another host reads is in the object store; nothing of it on the local disk
    bucket = deployed.s3.blobs / "lake"
    assert (bucket / "checkpoints" / app / "commits").is_dir()
    assert (bucket / "tables" / "_state" / app / "counts" / "_delta_log").is_dir()
    assert not [p for p in (settings.data_dir / "lake", settings.data_dir / "checkpoints") if p.exists()]
