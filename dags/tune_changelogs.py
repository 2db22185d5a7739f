"""Changelog compaction tuning: keep every changelog topic small enough that a restore replays
little more than the live keys, without anyone hand-editing topic configs.

``tune_changelog_compaction`` (hourly): measure every changelog of every registered job version
-> tune (recommend, validate with the broker, apply, verify) -> verify the effect of earlier changes
and tell on-call when a topic stays above its target. Scheduled runs follow
``STREAMSTATE_COMPACTION_SCHEDULED_MODE`` (default ``apply``); a manual run does what its form says
and is a dry run unless told otherwise. ``rollback`` restores exactly what a change replaced and
holds the topic until someone applies to it by name.

Measurements: ``_streamstate/changelog_measurements``; decisions: ``_streamstate/changelog_config_changes``.
Logic lives in spark_jobs/operations/changelog_tuning and plugins/streamstate/operators/changelog_tuning.py.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import Param, dag
from streamstate.operators.changelog_tuning import (
    MEASURE_TASK,
    MODES,
    MeasureChangelogsOperator,
    TuneChangelogsOperator,
    VerifyCompactionOperator,
)

from spark_jobs.operations.changelog_tuning.measure import changelog_targets

TOPICS = sorted({target.topic for target in changelog_targets()})


@dag(
    dag_id="tune_changelog_compaction",
    schedule="@hourly",
    # the platform's own housekeeping: scheduled from its first parse, nobody has to unpause it
    is_paused_upon_creation=False,
    start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
    catchup=False,
    max_active_runs=1,  # a rollback must not interleave with an apply
    tags=["streamstate", "changelog"],
    default_args={"retries": 0},  # the next run is the retry; a failed change is recorded as failed
    params={
        "mode": Param(
            "dry_run",
            type="string",
            enum=list(MODES),
            title="Mode",
            description="dry_run: measure and recommend, change nothing (the broker validates). apply: "
            "change the topic configs. rollback: restore what a change replaced. Scheduled runs use "
            "STREAMSTATE_COMPACTION_SCHEDULED_MODE.",
        ),
        "topics": Param(
            [],
            type="array",
            items={"type": "string", "enum": TOPICS},
            title="Topics",
            description="Only these changelog topics (default: all). Naming a held topic in an apply "
            "resumes its tuning.",
        ),
        "rollback_run_id": Param(
            None,
            type=["null", "string"],
            title="Run to roll back",
            description="rollback: the run whose changes to undo (default: each topic's newest change not undone yet).",
        ),
    },
    doc_md=__doc__,
)
def tune_changelog_compaction() -> None:
    measure = MeasureChangelogsOperator(task_id=MEASURE_TASK)
    # verify judges earlier runs' changes against this run's measurement, so it does not wait for tune
    measure >> [TuneChangelogsOperator(task_id="tune"), VerifyCompactionOperator(task_id="verify")]


tune_changelog_compaction()
