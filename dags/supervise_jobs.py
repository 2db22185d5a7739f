"""One supervision DAG per registered job: check it, alert on what changed, start it if it should run.

``supervise__<job>`` runs every ``SupervisionPolicy.check_every_s``. The check decides (restart with
backoff, give up on a crash loop, which alerts open and resolve); the launch task runs only when the
check says so and returns as soon as the driver is RUNNING; beside them, the job's warm standby (the
snapshot follower behind state queries and short restores) is kept running and watched for lag.
Logic lives in plugins/streamstate.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import dag, task
from streamstate.operators.standby import SuperviseStandbyOperator
from streamstate.operators.streaming_job import CheckStreamingJobOperator, LaunchStreamingJobOperator

from spark_jobs.registry import JobSpec, latest_jobs


def supervise_dag(job: JobSpec) -> None:
    @dag(
        dag_id=f"supervise__{job.name}",
        schedule=dt.timedelta(seconds=job.supervision.check_every_s),
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["streamstate", "supervision", job.name],
        default_args={"retries": 0},  # supervision itself is the retry loop, with backoff
        doc_md=f"Keep the current version of **{job.name}** running (the version pointer: `promote_job_version` "
        f"moves it) and tell on-call when it needs a human.\n\n{job.description}",
    )
    def supervise() -> None:
        check = CheckStreamingJobOperator(task_id="check", job=job.name)

        @task.short_circuit(trigger_rule="all_done")
        def should_start(assessment: dict | None) -> bool:
            return bool(assessment) and assessment["action"] in ("start", "restart")

        should_start(check.output) >> LaunchStreamingJobOperator(task_id="launch", job=job.name)
        if job.stores:
            SuperviseStandbyOperator(task_id="standby", job=job.name)

    supervise()


for _job in latest_jobs().values():
    supervise_dag(_job)
