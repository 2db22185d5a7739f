"""The tuning's memory: two append-only Delta tables under ``<lake>/_streamstate`` (delta-rs).

- ``changelog_measurements``: one row per topic per run (what :mod:`.measure` saw). The state-size
  audit reads these instead of scanning the topics again.
- ``changelog_config_changes``: one row per topic and config per decision: ``dry_run`` (proposed,
  not applied), ``applied``, ``rolled_back``, ``failed``, with the previous value and whether it was
  a default, so a rollback restores exactly what was there.

A topic whose newest applied-or-rolled-back row is ``rolled_back`` is *held*: scheduled runs leave
it alone until someone applies to it by name.
"""

from __future__ import annotations

import datetime as dt
import json

from runtime.settings import Settings
from spark_jobs.operations.changelog_tuning.measure import ChangelogMeasurement, ChangelogTarget
from spark_jobs.versions import append_rows, platform_table, read_rows

DRY_RUN, APPLIED, ROLLED_BACK, FAILED = "dry_run", "applied", "rolled_back", "failed"

_MEASUREMENT_INTS = (
    "version",
    "partitions",
    "offset_span",
    "records",
    "live_keys",
    "live_bytes",
    "tombstones",
    "markers",
    "obsolete",
    "history_records",
    "oldest_obsolete_age_ms",
    "bytes",
    "segments",
    "active_segment_bytes",
)
_MEASUREMENT_FLOATS = ("dirty_ratio", "write_bytes_per_s", "scan_seconds", "replay_ratio", "excess_replay_ratio")
_MEASUREMENT_STRINGS = (
    "run_id",
    "topic",
    "job",
    "application_id",
    "store",
    "kind",
    "bytes_source",
    "dirty_ratio_source",
    "configs",
    "overridden",
)
_CHANGE_STRINGS = (
    "run_id",
    "topic",
    "job",
    "store",
    "config",
    "action",
    "previous_value",
    "new_value",
    "reason",
    "by",
    "detail",
)


def measurements_table(settings: Settings):
    return platform_table(settings, "changelog_measurements")


def changes_table(settings: Settings):
    return platform_table(settings, "changelog_config_changes")


def _measurement_schema():
    import pyarrow as pa

    return pa.schema(
        [pa.field("measured_at", pa.timestamp("us", tz="UTC")), pa.field("scan_complete", pa.bool_())]
        + [pa.field(n, pa.int64()) for n in _MEASUREMENT_INTS]
        + [pa.field(n, pa.float64()) for n in _MEASUREMENT_FLOATS]
        + [pa.field(n, pa.string()) for n in _MEASUREMENT_STRINGS]
    )


def _change_schema():
    import pyarrow as pa

    return pa.schema(
        [pa.field("at", pa.timestamp("us", tz="UTC")), pa.field("previous_is_default", pa.bool_())]
        + [pa.field(n, pa.string()) for n in _CHANGE_STRINGS]
    )


def measurement_row(run_id: str, target: ChangelogTarget, m: ChangelogMeasurement) -> dict:
    data = m.to_dict()
    data.update(
        run_id=run_id,
        measured_at=m.measured_at,
        job=target.spec.name,
        version=target.spec.version,
        application_id=target.spec.application_id,
        store=target.store.name,
        kind=target.store.kind,
        configs=json.dumps(m.configs, sort_keys=True),
        overridden=json.dumps(m.overridden),
    )
    return data


def record_measurements(settings: Settings, rows: list[dict]) -> None:
    if rows:
        append_rows(measurements_table(settings), rows, _measurement_schema())


def change_row(
    run_id: str,
    target: ChangelogTarget,
    *,
    config: str,
    action: str,
    previous_value: str | None,
    previous_is_default: bool | None,
    new_value: str | None,
    reason: str,
    by: str,
    detail: str = "",
) -> dict:
    return {
        "run_id": run_id,
        "at": dt.datetime.now(dt.timezone.utc),
        "topic": target.topic,
        "job": target.spec.name,
        "store": target.store.name,
        "config": config,
        "action": action,
        "previous_value": previous_value,
        "previous_is_default": previous_is_default,
        "new_value": new_value,
        "reason": reason,
        "by": by,
        "detail": detail,
    }


def record_changes(settings: Settings, rows: list[dict]) -> None:
    if rows:
        append_rows(changes_table(settings), rows, _change_schema())


def measurements(settings: Settings, topic: str | None = None) -> list[dict]:
    """Measurement rows, oldest first."""
    rows = [r for r in read_rows(measurements_table(settings)) if topic is None or r["topic"] == topic]
    return sorted(rows, key=lambda r: r["measured_at"])


def changes(settings: Settings, topic: str | None = None) -> list[dict]:
    """Decision rows, oldest first."""
    rows = [r for r in read_rows(changes_table(settings)) if topic is None or r["topic"] == topic]
    return sorted(rows, key=lambda r: r["at"])


def is_held(change_rows: list[dict]) -> bool:
    """True when the topic's newest applied-or-rolled-back decision is a rollback."""
    decisive = [r for r in change_rows if r["action"] in (APPLIED, ROLLED_BACK)]
    return bool(decisive) and decisive[-1]["action"] == ROLLED_BACK


def changes_to_roll_back(change_rows: list[dict], run_id: str | None = None) -> tuple[str | None, list[dict]]:
    """(run id, its applied rows) to undo for one topic: ``run_id``'s, or the newest run that applied
    something not rolled back since. (None, []) when there is nothing to undo."""
    applied_runs = [r["run_id"] for r in change_rows if r["action"] == APPLIED]
    undone = {r["detail"] for r in change_rows if r["action"] == ROLLED_BACK}  # detail = the run undone
    if run_id is None:
        candidates = [run for run in reversed(applied_runs) if run not in undone]
        if not candidates:
            return None, []
        run_id = candidates[0]
    if run_id in undone:
        return run_id, []
    return run_id, [r for r in change_rows if r["run_id"] == run_id and r["action"] == APPLIED]


def runs_above_target(history: list[dict], target: float) -> int:
    """How many of the newest measurements in a row have an excess replay ratio above ``target``."""
    streak = 0
    for row in reversed(history):
        if row["excess_replay_ratio"] <= target:
            break
        streak += 1
    return streak


def before_and_after(history: list[dict], change_rows: list[dict]) -> dict | None:
    """Records a restore would replay vs live keys when the newest config change was applied, and now."""
    applied = [r for r in change_rows if r["action"] in (APPLIED, ROLLED_BACK)]
    if not applied or not history:
        return None
    at = applied[-1]["at"]
    before = [m for m in history if m["measured_at"] <= at]
    if not before:
        return None
    b, now = before[-1], history[-1]
    return {
        "changed_at": at.isoformat(),
        "change": applied[-1]["action"],
        "run_id": applied[-1]["run_id"],
        "before": {"records": b["records"], "live_keys": b["live_keys"], "replay_ratio": b["replay_ratio"]},
        "now": {"records": now["records"], "live_keys": now["live_keys"], "replay_ratio": now["replay_ratio"]},
        "records_reduction": round(b["records"] / max(now["records"], 1), 2),
    }
