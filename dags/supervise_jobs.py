"""One supervision DAG per registered job: check it, alert on what changed, start it if it should run.

``supervise__<job>`` runs every ``SupervisionPolicy.check_every_s``. The check decides (restart with
backoff, give up on a crash loop, which alerts open and resolve); the launch task runs only when the
check says so and returns as soon as the driver is RUNNING; the watch task then stays deferred until
shortly before the next run, and when the driver exits meanwhile (kill -9, OOM, a lost node) runs the
same check and restarts it within seconds instead of at the next run. Beside them, the job's spare
driver (warm, it takes over within seconds when the driver dies) and its warm standby (the snapshot
follower behind state queries and short restores) are kept running; the standby is watched for lag.
Logic lives in plugins/streamstate.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Param, dag, task
from streamstate.operators.spare import SuperviseSpareOperator
from streamstate.operators.standby import SuperviseStandbyOperator
from streamstate.operators.streaming_job import (
    CheckStreamingJobOperator,
    LaunchStreamingJobOperator,
    WatchStreamingJobOperator,
)
from streamstate.supervision import CheckResult

from spark_jobs.layout import JobDags
from spark_jobs.registry import JobSpec, latest_jobs


def supervise_dag(job: JobSpec) -> None:
    @dag(
        dag_id=JobDags(job.name).supervise,
        schedule=dt.timedelta(seconds=job.supervision.check_every_s),
        start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["streamstate", "supervision", job.name],
        default_args={"retries": 0},  # supervision itself is the retry loop, with backoff
        params={
            "watch_s": Param(
                None,
                type=["null", "integer"],
                minimum=0,
                title="Watch for (seconds)",
                description="How long this run's watch task restarts a driver that exits. Empty: until shortly "
                "before the next scheduled check; 0: no watch (the check and the launch only).",
            )
        },
        doc_md=f"Keep the current version of **{job.name}** running (the version pointer: `promote_job_version` "
        f"moves it) and tell on-call when it needs a human.\n\n{job.description}",
    )
    def supervise() -> None:
        check = CheckStreamingJobOperator(task_id="check", job=job.name)

        # ignore_downstream_trigger_rules=False: a skip reaches the launch only, the watch still runs
        @task.short_circuit(trigger_rule="all_done", ignore_downstream_trigger_rules=False)
        def should_start(check_result: dict | None) -> bool:
            return bool(check_result) and CheckResult.of(check_result).action in ("start", "restart")

        launch = LaunchStreamingJobOperator(task_id="launch", job=job.name)
        should_start(check.output) >> launch
        # After the launch (or when it was not needed): restart the driver within seconds if it exits
        # before the next run's check. After a failed launch it does not run, so the run fails (the
        # signal on-call sees) and the next run's check applies the backoff.
        # Retried: Airflow 3.3 fails a deferred task that resumes before the scheduler has seen its worker leave
        # the deferral (apache/airflow#72716: a driver killed as the watch defers); the watch is idempotent,
        # and its retry watches the driver the failed try restarted and records that launch.
        launch >> WatchStreamingJobOperator(
            task_id="watch",
            job=job.name,
            watch_s="{{ params.watch_s }}",
            trigger_rule="none_failed",
            retries=2,
            retry_delay=dt.timedelta(seconds=2),
        )
        SuperviseSpareOperator(task_id="spare", job=job.name)  # whether it is wanted is decided when it runs
        if job.stores:
            SuperviseStandbyOperator(task_id="standby", job=job.name)

    supervise()


for _job in latest_jobs().values():
    supervise_dag(_job)
