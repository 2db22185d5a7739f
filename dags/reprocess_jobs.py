"""Reprocessing from the Airflow UI: ``reprocess_job`` (side by side, or reset in place) and
``promote_job_version``. Both are manual, dry-run by default, and audited (``_streamstate/reprocess_audit``).

- ``reprocess_job`` side_by_side: plan -> prepare -> launch the new version -> wait until it caught up
  -> compare outputs (report). The current version keeps serving.
- ``reprocess_job`` reset: plan -> stop -> reset (under the lease) -> restart.
- ``reprocess_job`` migrate: plan -> migrate the current version's state into the new version (its first
  snapshot, at the current version's input position) -> launch it -> wait until it caught up -> compare.
  For a state format change when the source no longer holds the history (or replaying it costs too much).
- ``promote_job_version``: switch readers and supervision to a version, stop and retire the old one.
- ``purge_retired_versions`` (daily): delete a retired version's data once the retention confirmed at
  its promotion has passed.

Logic lives in spark_jobs/operations/reprocess and plugins/streamstate/operators/reprocess.py.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Param, dag, task
from streamstate.operators.reprocess import (
    CompareOutputsOperator,
    MigrateStateOperator,
    PlanReprocessingOperator,
    PrepareSideBySideOperator,
    PromoteJobVersionOperator,
    PurgeRetiredVersionsOperator,
    RecordReprocessingOperator,
    ResetJobStateOperator,
    RetireJobVersionOperator,
    WaitForCatchUpOperator,
)
from streamstate.operators.streaming_job import LaunchStreamingJobOperator, StopStreamingJobOperator

from spark_jobs.registry import registered_versions

JOBS = sorted(registered_versions())
TARGET = "{{ ti.xcom_pull(task_ids='plan')['target_version'] }}"
SIDE_BY_SIDE_STEPS = ["plan", "prepare", "launch_new_version", "wait_caught_up", "compare"]
RESET_STEPS = ["plan", "stop", "reset", "restart"]
MIGRATE_STEPS = ["plan", "migrate_state", "launch_new_version", "wait_caught_up", "compare"]
FIRST_STEP = {"side_by_side": "prepare", "reset": "stop", "migrate": "migrate_state"}
#: the start_offsets form's JSON schema: partition -> offset, or topic -> (partition -> offset)
_OFFSET = {"type": "integer", "minimum": 0}
_PARTITION_OFFSETS = {"propertyNames": {"pattern": r"^\d+$"}, "additionalProperties": _OFFSET}
#: one run at a time per DAG (two reprocessings of one job must not interleave); retrying is a re-run
COMMON = {
    "catchup": False,
    "max_active_runs": 1,
    "tags": ["streamstate", "reprocessing"],
    "default_args": {"retries": 0},
}


@dag(
    dag_id="reprocess_job",
    schedule=None,
    **COMMON,
    params={
        "job": Param(JOBS[0], type="string", enum=JOBS, title="Job"),
        "mode": Param(
            "side_by_side",
            type="string",
            enum=["side_by_side", "reset", "migrate"],
            title="Mode",
            description="side_by_side: run a new version beside the current one and compare (safe). "
            "reset: reprocess the current version in place (deletes its state). "
            "migrate: start a new version from the current version's state, migrated (no replay; "
            "the start position does not apply).",
        ),
        "version": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="New version (side_by_side, migrate)",
            description="Default: the newest registered version.",
        ),
        "start_from": Param(
            "earliest", type="string", enum=["earliest", "datetime", "duration", "offsets"], title="Start position"
        ),
        # format: the UI's date-time picker; pattern: the check (jsonschema does not enforce formats)
        "start_datetime": Param(
            None,
            type=["null", "string"],
            format="date-time",
            title="Start date-time",
            pattern=r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2})?$",
            description="start_from=datetime: the first record at or after it (UTC if no zone).",
        ),
        "start_duration": Param(
            None,
            type=["null", "string"],
            pattern=r"^(\d+\s*[smhd]|P(\d+D)?(T(\d+H)?(\d+M)?(\d+S)?)?)$",
            title="Start duration",
            description="start_from=duration: e.g. 6h, 90m, 2d, PT6H.",
        ),
        "start_offsets": Param(
            None,
            type=["null", "object"],
            title="Start offsets",
            description='start_from=offsets: {"partition": offset}, e.g. {"0": 120, "1": 95}; for a job '
            'reading two streams (a join), per topic: {"orders": {"0": 120}, "payments": {"0": 95}}.',
            anyOf=[
                {"type": "null"},
                _PARTITION_OFFSETS,
                {"additionalProperties": {"type": "object", **_PARTITION_OFFSETS}},
            ],
        ),
        "truncate_outputs": Param(
            False,
            type="boolean",
            title="Truncate outputs (reset)",
            description="Delete the output rows (history kept) and dead letters before reprocessing.",
        ),
        "accept_history_gap": Param(
            False,
            type="boolean",
            title="Accept a history gap",
            description="When the source no longer holds the start (retention deleted it), "
            "proceed from what remains; the plan and report record the gap. "
            "Off: such a start is refused.",
        ),
        "dry_run": Param(True, type="boolean", title="Dry run", description="Print the plan; change nothing."),
        "confirm": Param(
            None,
            type=["null", "string"],
            title="Confirm (reset)",
            description="To run a reset for real, type the job name.",
        ),
        "catch_up_timeout_min": Param(120, type="integer", minimum=1, title="Catch-up timeout (min)"),
    },
    doc_md=__doc__,
)
def reprocess_job() -> None:
    plan = PlanReprocessingOperator(task_id="plan")

    @task.branch
    def choose(params: dict | None = None) -> list[str]:
        if params["dry_run"]:
            return ["audit"]
        return [FIRST_STEP[params["mode"]], "audit"]

    prepare = PrepareSideBySideOperator(task_id="prepare")
    migrate = MigrateStateOperator(task_id="migrate_state")
    # after prepare or migrate_state, whichever the branch chose (the other one is skipped)
    launch = LaunchStreamingJobOperator(
        task_id="launch_new_version",
        job="{{ params.job }}",
        version=TARGET,
        manual=True,
        trigger_rule="none_failed_min_one_success",
    )
    caught_up = WaitForCatchUpOperator(task_id="wait_caught_up", timeout_min="{{ params.catch_up_timeout_min }}")
    compare = CompareOutputsOperator(task_id="compare")
    stop = StopStreamingJobOperator(
        task_id="stop",
        job="{{ params.job }}",
        version=TARGET,
        stop_standby=True,
        reason="reprocessing reset {{ run_id }}",
    )
    reset = ResetJobStateOperator(task_id="reset")
    restart = LaunchStreamingJobOperator(task_id="restart", job="{{ params.job }}", version=TARGET, manual=True)
    audit = RecordReprocessingOperator(
        task_id="audit", steps={"side_by_side": SIDE_BY_SIDE_STEPS, "reset": RESET_STEPS, "migrate": MIGRATE_STEPS}
    )

    branch = choose()
    plan >> branch >> [prepare, stop, migrate]
    [prepare, migrate] >> launch
    launch >> caught_up >> compare >> audit
    stop >> reset >> restart >> audit
    branch >> audit


@dag(
    dag_id="promote_job_version",
    schedule=None,
    **COMMON,
    params={
        "job": Param(JOBS[0], type="string", enum=JOBS, title="Job"),
        "version": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            title="Version to promote",
            description="Default: the newest registered version.",
        ),
        "retain_days": Param(7, type="integer", minimum=0, title="Keep the old version's data (days)"),
        "dry_run": Param(True, type="boolean", title="Dry run"),
        "confirm": Param(None, type=["null", "string"], title="Confirm", description="Type the job name."),
    },
    doc_md="Make a version the one readers and supervision use; stop the old one and keep its data "
    "`retain_days`. Run `reprocess_job` side_by_side first and read its report.",
)
def promote_job_version() -> None:
    promote = PromoteJobVersionOperator(
        task_id="promote",
        job="{{ params.job }}",
        version="{{ params.version }}",
        dry_run="{{ params.dry_run }}",
        confirm="{{ params.confirm }}",
    )

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def changes(summary: dict) -> bool:
        return not summary["dry_run"] and summary["changed"]

    # the promoted version must run (a rollback promotes a version that was stopped when it was retired)
    start_new = LaunchStreamingJobOperator(
        task_id="start_new",
        job="{{ params.job }}",
        version="{{ ti.xcom_pull(task_ids='promote')['new_version'] }}",
        manual=True,
    )
    stop_old = StopStreamingJobOperator(
        task_id="stop_old",
        job="{{ params.job }}",
        stop_standby=True,
        version="{{ ti.xcom_pull(task_ids='promote')['old_version'] }}",
        reason="retired: v{{ ti.xcom_pull(task_ids='promote')['new_version'] }} promoted ({{ run_id }})",
    )
    retire = RetireJobVersionOperator(
        task_id="retire_old", job="{{ params.job }}", retain_days="{{ params.retain_days }}"
    )
    audit = RecordReprocessingOperator(
        task_id="audit", steps={"promote": ["promote", "start_new", "stop_old", "retire_old"]}, plan_task="promote"
    )
    changes(promote.output) >> start_new >> stop_old >> retire >> audit
    promote >> audit


@dag(
    dag_id="purge_retired_versions",
    schedule="@daily",
    # the platform's own housekeeping: scheduled from its first parse, nobody has to unpause it
    is_paused_upon_creation=False,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    **COMMON,
    params={
        "dry_run": Param(False, type="boolean", title="Dry run", description="List what is due without deleting it.")
    },
    doc_md="Delete the checkpoint, topics, snapshots and output tables of versions retired by "
    "`promote_job_version` whose `retain_days` have passed (that promotion, dry-run by default and "
    "confirmed, is the destructive decision; this DAG carries it out). Never the current version, "
    "never one with a live driver.",
)
def purge_retired_versions() -> None:
    purge = PurgeRetiredVersionsOperator(task_id="purge", dry_run="{{ params.dry_run }}")
    purge >> RecordReprocessingOperator(task_id="audit", steps={"purge": ["purge"]}, plan_task="purge")


reprocess_job()
promote_job_version()
purge_retired_versions()
