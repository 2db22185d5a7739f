"""The reprocessing audit log: one row per DAG run (who, when, parameters, plan, outcome).

An append-only Delta table, ``<lake>/_streamstate/reprocess_audit``, written with delta-rs by the
DAGs' last task whatever happened before it. Appends never conflict, so concurrent runs are fine.
"""

from __future__ import annotations

import datetime as dt
import json

from runtime.settings import Settings
from spark_jobs.versions import append_rows, platform_table, read_rows

FIELDS = (
    "run_id",
    "dag_id",
    "job",
    "mode",
    "triggered_by",
    "started_at",
    "finished_at",
    "params",
    "plan",
    "outcome",
    "detail",
)


def audit_table(settings: Settings):
    return platform_table(settings, "reprocess_audit")


def _schema():
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([pa.field(name, ts if name.endswith("_at") else pa.string()) for name in FIELDS])


def record_run(
    settings: Settings,
    *,
    run_id: str,
    dag_id: str,
    job: str | None,
    mode: str | None,
    triggered_by: str | None,
    started_at: dt.datetime | None,
    params: dict,
    plan: dict | None,
    outcome: str,
    detail: str = "",
) -> dict:
    row = {
        "run_id": run_id,
        "dag_id": dag_id,
        "job": job,
        "mode": mode,
        "triggered_by": triggered_by,
        "started_at": started_at,
        "finished_at": dt.datetime.now(dt.timezone.utc),
        "params": json.dumps(params, sort_keys=True, default=str),
        "plan": json.dumps(plan, sort_keys=True, default=str) if plan else None,
        "outcome": outcome,
        "detail": detail,
    }
    append_rows(audit_table(settings), [row], _schema())
    return row


def audit_rows(settings: Settings, run_id: str | None = None) -> list[dict]:
    return [r for r in read_rows(audit_table(settings)) if run_id is None or r["run_id"] == run_id]
