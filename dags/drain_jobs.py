"""One manual DAG per registered job: process all input available now through spark-submit, then stop.

Used for catch-up runs and backfills on the embedded stack; the supervised long-running launch
DAGs build on the same submit description (spark_jobs.submit).
"""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import dag

from runtime.settings import Settings
from spark_jobs.registry import JOBS, JobSpec
from spark_jobs.submit import submit_spec

SETTINGS = Settings.from_env()



def drain_dag(job: JobSpec) -> None:
    @dag(
        dag_id=f"drain__{job.name}",
        schedule=None,
        catchup=False,
        tags=["streamstate", "drain", job.name],
        default_args={"retries": 0},
        doc_md=f"Process every record available in `{job.source_topic}` with **{job.application_id}**, then stop."
        f"\n\n{job.description}",
    )
    def drain() -> None:
        submit = submit_spec(job, SETTINGS, available_now=True)
        SparkSubmitOperator(
            task_id="spark_submit",
            conn_id="spark_default",
            application=submit.application,
            application_args=list(submit.application_args),
            conf=submit.conf,
            jars=submit.jars,
            py_files=submit.py_files,
            env_vars=submit.env,
            name=submit.name,
        )

    drain()


for _job in JOBS.values():
    drain_dag(_job)
