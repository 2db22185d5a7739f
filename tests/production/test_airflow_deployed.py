"""Airflow as deployed: its metadata in PostgreSQL (Debian's server, a data directory of the test's own), the
LocalExecutor, the API server, scheduler, DAG processor and triggerer each a process of its own. The main job is
started and supervised through the API; with its watch deferred on the triggerer, the scheduler and then the
triggerer are killed with kill -9 and started again. The watch resumes, no second driver is launched (the lease's
epoch stays), and when the driver is then killed the watch restarts it and on-call hears of it once."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from runtime.airflow_standalone import AirflowApi, LocalAirflow
from runtime.postgres import LocalPostgres
from runtime.process import free_port, kill_process_group
from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.lease import JobLease
from spark_jobs.lifecycle import observe_driver
from spark_jobs.registry import get_job
from tests.helpers import driver_diagnosis, driver_pids, wait_for, wait_for_success
from tests.plugins.test_on_call_in_browser import _received

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.production]

JOB = get_job("purchase_counts")
SUPERVISE = f"supervise__{JOB.name}"


@pytest.fixture
def deployed(private_stack):
    """PostgreSQL and Airflow's four processes on it, for the test's own broker; stopped (and the drivers Airflow
    launched stopped) afterwards."""
    settings = private_stack.replace(spare_drivers=False)
    home = Path(tempfile.mkdtemp(prefix="streamstate-postgres-"))
    home.chmod(0o755)  # under root the server runs as the postgres user, which must reach it
    postgres = LocalPostgres(settings, free_port(), home=home / "postgres")
    postgres.start()
    # the runs the test triggers only, as the session's Airflow (tests/conftest.py): scheduled runs of every
    # job's supervision would compete for the two cores
    airflow = LocalAirflow(settings, {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False"}, database_url=postgres.url)
    try:
        airflow.start_processes()
        yield settings, airflow, AirflowApi(settings.airflow_url)
    finally:
        airflow.stop()
        for app in (JOB.application_id, f"{JOB.application_id}.standby"):
            if (holder := JobLease(settings.status_dir, app).holder()) is not None:
                os.kill(holder.pid, signal.SIGKILL)
        postgres.stop()
        shutil.rmtree(home, ignore_errors=True)


def test_the_watch_outlives_its_scheduler_and_triggerer_and_on_call_hears_once(deployed):
    settings, airflow, api = deployed
    app = JOB.application_id
    lease = JobLease(settings.status_dir, app)

    def diagnose() -> str:
        logs = "\n".join(f"{name}:\n{process.tail(15)}" for name, process in airflow.processes.items())
        return f"{driver_diagnosis(settings, app)}\n{logs}"

    ensure_topic(settings.kafka, JOB.source_topic, JOB.source_partitions)
    purchases.produce(settings.kafka, JOB.source_topic, purchases.generate(300, users=30, seed=8))
    wait_for_success(api, "start_streaming_job", api.trigger("start_streaming_job", {"job": JOB.name}), 300, diagnose)
    started = wait_for(
        lambda: observe_driver(settings.status_dir, app).state == "RUNNING" and lease.holder(),
        180,
        "the driver RUNNING",
        diagnose,
    )

    api.trigger(SUPERVISE)
    wait_for(lambda: "deferred" in api.task_states(SUPERVISE, "watch").values(), 180, "the watch to defer", diagnose)
    for name in ("scheduler", "triggerer"):  # each killed while the watch waits in the triggerer, then back
        kill_process_group(airflow.processes[name].pid())
        airflow.start_process(name)
    wait_for(lambda: "deferred" in api.task_states(SUPERVISE, "watch").values(), 180, "the watch resumed", diagnose)
    assert lease.holder().epoch == started.epoch and driver_pids(app) == {started.pid}, "no second driver"

    os.kill(started.pid, signal.SIGKILL)  # the watch restarts it
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
    received = wait_for(lambda: _received(settings, f"streamstate/{app}/down"), 120, "the alert", diagnose)
    assert [alert["status"] for alert in received] == ["firing"], received  # once, not once per process restart
