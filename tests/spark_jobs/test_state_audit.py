"""State-size audit logic (pure): growth, projections, unbounded growth, budget conditions, the report."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from spark_jobs.registry import StateBudget, StoreSpec
from spark_jobs.state_audit import trends
from spark_jobs.state_audit.collect import windows_beyond_retention
from spark_jobs.state_audit.report import write_report

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
KV = StoreSpec("counts", budget=StateBudget(max_rows=1_000, max_restore_s=60, warn_days=7))
WINDOWED = StoreSpec("windows", kind="windowed", window_ms=60_000, grace_ms=5_000, retention_ms=3_600_000)


def _at(hours: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=hours)


def test_growth_per_day_and_days_until_a_budget():
    points = [(_at(0), 100), (_at(12), 150), (_at(24), 200)]
    assert trends.growth_per_day(points) == pytest.approx(100)
    assert trends.days_until(200, 1_000, 100) == pytest.approx(8)
    assert trends.days_until(1_200, 1_000, 100) == 0.0  # already crossed
    assert trends.days_until(200, 1_000, -5) is None and trends.growth_per_day(points[:1]) is None
    # only the last week counts: an old jump does not dominate the trend
    assert trends.growth_per_day([(_at(-24 * 30), 0)] + points) == pytest.approx(100)
    # after a cleanup the old growth no longer projects anything
    assert trends.growth_per_day(points + [(_at(36), 0)]) is None
    assert trends.growth_per_day(points + [(_at(36), 0), (_at(48), 50)]) == pytest.approx(100)


def _history(keys: list[int], tombstones: int = 0) -> list[dict]:
    return [{"audited_at": _at(i), "state_rows": k, "changelog_tombstones": tombstones} for i, k in enumerate(keys)]


def test_keys_only_added_is_unbounded_deletes_or_ttl_are_not():
    assert trends.unbounded_growth(KV, _history([10, 20, 35]), None).flagged
    assert "10 -> 35" in trends.unbounded_growth(KV, _history([10, 20, 35]), None).reason
    assert not trends.unbounded_growth(KV, _history([10, 20, 35], tombstones=3), None).flagged
    assert not trends.unbounded_growth(KV, _history([10, 20, 18]), None).flagged  # a key went away
    assert not trends.unbounded_growth(KV, _history([10, 20]), None).flagged  # too few audits to tell
    ttl = StoreSpec("counts", ttl_ms=60_000)
    assert not trends.unbounded_growth(ttl, _history([10, 20, 35]), None).flagged


def test_windows_older_than_their_retention_are_unbounded():
    horizon = 3_600_000  # the store's retention, counted from a window's start
    values = [{"window_start_ms": 0}, {"window_start_ms": 10 * horizon}, {"other": 1}]
    assert windows_beyond_retention(WINDOWED, values, stream_time_ms=10 * horizon + 1) == 1
    assert windows_beyond_retention(WINDOWED, values, stream_time_ms=horizon - 1) == 0
    assert trends.unbounded_growth(WINDOWED, [], 1).flagged
    assert not trends.unbounded_growth(WINDOWED, [], 0).flagged


def test_budget_checks_crossed_and_projected():
    checks = {c.measure: c for c in trends.budget_checks(KV.budget, {"rows": 1_200, "bytes": 5, "restore_s": 30},
                                                        {"rows": 10, "restore_s": 10})}  # fmt: skip
    assert set(checks) == {"rows", "restore_s"}  # bytes has no budget here
    assert checks["rows"].crossed and checks["rows"].days_left == 0
    assert not checks["restore_s"].crossed and checks["restore_s"].days_left == pytest.approx(3)


def test_conditions_name_the_numbers_and_the_likely_cause():
    from streamstate.operators.state_audit import conditions_for

    def row(rows: float, per_day: float, unbounded: bool = False) -> dict:
        checks = trends.budget_checks(KV.budget, {"rows": rows}, {"rows": per_day})
        return {"store": "counts", "budget_status": json.dumps([c.__dict__ | {"crossed": c.crossed} for c in checks]),
                "unbounded": unbounded, "unbounded_reason": "keys only ever added", "rows_per_day": per_day,
                "budget_warn_days": 7}  # fmt: skip

    crossed = conditions_for(row(1_500, 100, unbounded=True))
    assert [c.name for c in crossed] == ["state_budget_counts"] and "keys only ever added" in crossed[0].summary
    assert "1,500 rows > budget 1,000" in crossed[0].summary
    soon = conditions_for(row(900, 50))  # 2 days left
    assert [c.name for c in soon] == ["state_budget_forecast_counts"] and soon[0].numbers["days_left"] == 2.0
    assert conditions_for(row(100, 10)) == []  # 90 days away: nothing to say


def test_report_lists_every_store_with_a_chart(tmp_path):
    from runtime.settings import Settings

    settings = Settings(data_dir=tmp_path)
    rows = [{"audited_at": _at(i), "application_id": "a-v1", "store": "counts", "kind": "key_value", "state_rows": 10 * i,
             "restore_snapshot_tail_s": 1.0 + i, "restore_full_replay_s": 2.0 + i, "budget_max_rows": 50,
             "budget_max_restore_s": 10.0, "unbounded": i == 2, "unbounded_reason": "keys only ever added"}
            for i in range(3)]  # fmt: skip
    page = write_report(settings, {("a-v1", "counts"): rows, ("b-v2", "windows"): [{**rows[0], "application_id": "b-v2",
                                                                                       "store": "windows"}]})  # fmt: skip
    text = page.read_text()
    assert "a-v1 / counts" in text and "b-v2 / windows" in text and "unbounded growth" in text
    for name in ("a-v1.counts.png", "b-v2.windows.png"):
        assert (page.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
