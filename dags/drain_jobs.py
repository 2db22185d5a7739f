"""One manual DAG per registered job: process all input available now through spark-submit, then stop.

Used for catch-up runs and backfills; a job that is running (supervised) is left alone (its lease
makes the drain's driver exit with code 3, and the task fails saying so).
"""

from __future__ import annotations

from airflow.sdk import dag
from streamstate.operators.streaming_job import DrainStreamingJobOperator

from spark_jobs.layout import JobDags
from spark_jobs.registry import JobSpec, latest_jobs


def drain_dag(job: JobSpec) -> None:
    @dag(
        dag_id=JobDags(job.name).drain,
        schedule=None,
        catchup=False,
        tags=["streamstate", "drain", job.name],
        default_args={"retries": 0},
        doc_md=f"Process every record available in `{'`, `'.join(job.input_topics)}` with **{job.application_id}**, "
        "then stop."
        f"\n\n{job.description}",
    )
    def drain() -> None:
        DrainStreamingJobOperator(task_id="spark_submit", job=job.name)

    drain()


for _job in latest_jobs().values():
    drain_dag(_job)
