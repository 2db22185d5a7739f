"""One DAG per registered batch job (``spark_jobs/batch``): ``batch__<name>``, on the job's schedule.

A run covers its data interval: ``settle`` waits (deferred, no worker slot) until the interval's end + the
job's settle time, when the streaming outputs it reads are final; ``run`` spark-submits
``spark_jobs/batch/runner.py``, which reads the inputs as of that time (Delta time travel) and replaces
the interval's rows in the job's Delta table. Clearing a run, or a backfill (``airflow backfill create
--dag-id batch__<name> --from-date ... --to-date ...``), recomputes those intervals and replaces only them.

A manual run (Trigger DAG with a logical date) covers the interval that ended last before that date.
Scheduled from its first parse (nobody has to unpause it). A failed run opens ``batch_failed`` for
on-call (once, through the alert ledger); the next run that succeeds resolves it.
"""

from __future__ import annotations

from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import dag
from airflow.timetables.interval import CronDataIntervalTimetable
from streamstate.operators.batch_job import RunBatchJobOperator, batch_run_failed, batch_run_succeeded

from spark_jobs.batch.spec import BatchJob, batch_jobs


def batch_dag(job: BatchJob) -> None:
    @dag(
        dag_id=job.dag_id,
        # Data intervals, not trigger times (Airflow 3's default for a cron or preset): a run covers
        # [previous tick, tick), and a manual run the interval that ended last before its logical date.
        schedule=CronDataIntervalTimetable(job.schedule, timezone="UTC"),
        is_paused_upon_creation=False,
        start_date=job.start_date,
        catchup=False,  # a new deployment does not recompute history by itself: backfill what you need
        max_active_runs=1,
        tags=["streamstate", "batch"],
        default_args={"retries": job.retries, "on_failure_callback": batch_run_failed},
        doc_md=f"{job.description}\n\nInputs: {', '.join(job.inputs)}; settle {job.settle}.\n\n{__doc__}",
    )
    def run_batch_job() -> None:
        settle = DateTimeSensorAsync(
            task_id="settle",
            target_time=f"{{{{ (data_interval_end + macros.timedelta(seconds={job.settle.total_seconds():.0f})).isoformat() }}}}",
            # the trigger ends the task: a moment already past (a manual run, a late one) fires at once, and a task
            # resumed that soon may be failed by Airflow 3.3 (apache/airflow#67287, streamstate.operators.deferral)
            end_from_trigger=True,
        )
        # a task callback: it runs in the task's process, where the run succeeded (the DAG's own callbacks
        # run in the DAG processor, later, and not at all under `airflow dags test`)
        settle >> RunBatchJobOperator(task_id="run", batch_job=job.name, on_success_callback=batch_run_succeeded)

    run_batch_job()


for _job in batch_jobs().values():
    batch_dag(_job)
