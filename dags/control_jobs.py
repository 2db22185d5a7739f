"""Manual start and stop of any registered job, with a form (Airflow Params) in the UI.

- ``start_streaming_job``: start the job (no-op if it runs); clears a stop request and a crash-loop mark.
- ``stop_streaming_job``: stop it cleanly and keep it stopped; supervision leaves it alone.
"""

from __future__ import annotations

from airflow.sdk import Param, dag
from streamstate.operators.streaming_job import LaunchStreamingJobOperator, StopStreamingJobOperator

from spark_jobs.registry import registered_versions

JOBS = sorted(registered_versions())

JOB_PARAM = Param(JOBS[0], type="string", enum=JOBS, title="Job", description="The registered job.")


@dag(
    dag_id="start_streaming_job",
    schedule=None,
    catchup=False,
    tags=["streamstate", "control"],
    params={"job": JOB_PARAM},
    default_args={"retries": 0},
    doc_md="Start a streaming job (or make sure it runs). Clears a stop request and a crash-loop mark.",
)
def start_streaming_job() -> None:
    LaunchStreamingJobOperator(task_id="launch", job="{{ params.job }}", manual=True)


@dag(
    dag_id="stop_streaming_job",
    schedule=None,
    catchup=False,
    tags=["streamstate", "control"],
    params={
        "job": JOB_PARAM,
        "reason": Param(
            type="string", minLength=3, title="Reason", description="Shown on the jobs page and in the record."
        ),
        "force": Param(False, type="boolean", title="Force", description="SIGKILL instead of a clean stop."),
        "timeout_s": Param(
            180, type="integer", minimum=10, title="Timeout (s)", description="How long a clean stop may take."
        ),
    },
    default_args={"retries": 0},
    doc_md="Stop a streaming job cleanly and keep it stopped until `start_streaming_job` runs.",
)
def stop_streaming_job() -> None:
    StopStreamingJobOperator(
        task_id="stop",
        job="{{ params.job }}",
        reason="{{ params.reason }}",
        force="{{ params.force }}",
        timeout_s="{{ params.timeout_s }}",
    )


start_streaming_job()
stop_streaming_job()
