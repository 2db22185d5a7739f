"""RunBatchJobOperator: one data interval of a batch job (``spark_jobs/batch``), spark-submitted on
``spark_default``; and the callbacks that tell on-call when a batch job's run fails (once, through the alert
ledger, resolved by the next run that succeeds)."""

from __future__ import annotations

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from streamstate.alert_ledger import AlertLedger
from streamstate.operators.streaming_job import apply_submit
from streamstate.supervision import Condition

from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.batch.spec import get_batch_job
from spark_jobs.layout import batch_job_of

RUNNER = PROJECT_ROOT / "spark_jobs" / "batch" / "runner.py"
#: the one condition a batch job's runs decide
BATCH_FAILED = "batch_failed"


class RunBatchJobOperator(SparkSubmitOperator):
    """Run ``batch_job`` over the DAG run's data interval (``spark_jobs/batch/runner.py``)."""

    def __init__(self, *, batch_job: str, conn_id: str = "spark_default", **kwargs) -> None:
        super().__init__(conn_id=conn_id, application="", **kwargs)
        self.batch_job = batch_job

    def execute(self, context):
        from spark_jobs.driver.submit import application_submit_spec

        job = get_batch_job(self.batch_job)
        interval = (
            "--start",
            context["data_interval_start"].isoformat(),
            "--end",
            context["data_interval_end"].isoformat(),
        )
        apply_submit(
            self, application_submit_spec(Settings.from_env(), job.application_id, RUNNER, (job.name, *interval))
        )
        super().execute(context)


def _interval(context) -> str:
    return f"[{context['data_interval_start'].isoformat()}, {context['data_interval_end'].isoformat()})"


def batch_run_failed(context) -> None:
    """A task of a batch job's DAG failed: open ``batch_failed`` (sent once while it stays open)."""
    job = get_batch_job(batch_job_of(context["dag"].dag_id))
    task = context["task_instance"]
    failed = Condition(
        BATCH_FAILED,
        "error",
        f"batch job {job.name}: the run of interval {_interval(context)} failed in task {task.task_id}: "
        f"{context.get('exception') or 'see the task log'}",
        {"interval_start": context["data_interval_start"].isoformat(), "try": task.try_number},
        f"Read the task log of {job.dag_id}, fix the cause, then clear the failed run: a rerun replaces the "
        "interval's rows (nothing is duplicated).",
    )
    _reconcile(context, job, [failed])


def batch_run_succeeded(context) -> None:
    """A batch job's run succeeded: resolve its open ``batch_failed``, if any."""
    _reconcile(context, get_batch_job(batch_job_of(context["dag"].dag_id)), [])


def _reconcile(context, job, conditions: list[Condition]) -> None:
    AlertLedger(Settings.from_env().status_dir).reconcile_and_send(
        context, job=job.name, application_id=job.application_id, source="batch", conditions=conditions
    )
