"""State-size audit: which store is growing, how long a restore would take today, and when a store
will break its budget, before that becomes an outage.

``audit_state_size`` (hourly): read the live state out of every checkpoint (a Spark application:
Spark's ``state-metadata`` and ``statestore`` readers) -> audit every store (snapshots, changelog as
measured by ``tune_changelog_compaction``, dead letters, restore estimates from measured restores,
growth, unbounded growth, budgets from the registry), alert on-call, write the report (Streaming jobs
page -> state-size report). The audit runs even when the checkpoint read fails (live rows then come
from the jobs' latest progress).

Rows: ``_streamstate/state_audit``, ``_streamstate/state_checkpoint_audit``. Logic lives in
spark_jobs/operations/state_audit and plugins/streamstate/operators/state_audit.py.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import dag
from streamstate.operators.state_audit import AuditStateSizeOperator, ReadCheckpointStateOperator


@dag(
    dag_id="audit_state_size",
    schedule="@hourly",
    # the platform's own housekeeping: scheduled from its first parse, nobody has to unpause it
    is_paused_upon_creation=False,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["streamstate", "state"],
    default_args={"retries": 0},  # the next run is the retry
    doc_md=__doc__,
)
def audit_state_size() -> None:
    read = ReadCheckpointStateOperator(task_id="read_checkpoints")
    read >> AuditStateSizeOperator(task_id="audit", trigger_rule="all_done")


audit_state_size()
