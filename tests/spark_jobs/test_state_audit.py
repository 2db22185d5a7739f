"""State-size audit logic (pure): growth, projections, unbounded growth, the TTL verdict, budget and TTL
conditions, the report."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest

from spark_jobs.operations.state_audit import trends
from spark_jobs.operations.state_audit.collect import windows_beyond_retention
from spark_jobs.operations.state_audit.report import write_report
from spark_jobs.operations.state_audit.rows import SnapshotEntry, StoreAudit
from spark_jobs.operations.state_audit.ttl import KeyWrite, TtlCheck, ttl_verdict
from spark_jobs.registry import StateBudget, StoreSpec

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


def _audit(hours: float = 0, **fields) -> StoreAudit:
    identity = {"run_id": f"run-{hours}", "audited_at": _at(hours), "application_id": "a-v1", "store": "counts"}
    return StoreAudit(**identity | fields)


def _history(keys: list[int], tombstones: int = 0) -> list[StoreAudit]:
    return [_audit(i, state_rows=k, changelog_tombstones=tombstones) for i, k in enumerate(keys)]


def test_keys_only_added_is_unbounded_deletes_are_not():
    assert trends.unbounded_growth(KV, _history([10, 20, 35]), None).flagged
    assert "10 -> 35" in trends.unbounded_growth(KV, _history([10, 20, 35]), None).reason
    assert not trends.unbounded_growth(KV, _history([10, 20, 35], tombstones=3), None).flagged
    assert not trends.unbounded_growth(KV, _history([10, 20, 18]), None).flagged  # a key went away
    assert not trends.unbounded_growth(KV, _history([10, 20]), None).flagged  # too few audits to tell


TTL_MS, TOLERANCE_MS = 3_600_000, 65_000
NOW_MS = 1_800_000_000_000


def _writes(*rows: tuple[int, bool]) -> list[KeyWrite]:
    """(idle ms at NOW_MS, present) per key."""
    return [KeyWrite(f"u{i}".encode(), NOW_MS - idle, present) for i, (idle, present) in enumerate(rows)]


def _verdict(writes: list[KeyWrite], history_since_ms: int | None = None) -> TtlCheck:
    return ttl_verdict(
        TTL_MS, writes, evaluated_at_ms=NOW_MS, history_since_ms=history_since_ms, tolerance_ms=TOLERANCE_MS
    )


def test_ttl_verdict_over_each_keys_last_write():
    hours = 3_600_000
    # keys idle 3 h still present under a 1 h TTL: the processor does not evict
    stale = _verdict(_writes((3 * hours, True), (3 * hours, True), (60_000, True)))
    assert stale.verdict == "ttl_not_enforced"
    assert (stale.keys_checked, stale.keys_overdue, stale.oldest_overdue_ms) == (3, 2, 3 * hours)
    # the same keys tombstoned after their last write: evicted; the live key is recent
    evicted = _verdict(_writes((3 * hours, False), (3 * hours, False), (60_000, True)))
    assert (evicted.verdict, evicted.keys_checked, evicted.keys_overdue) == ("ttl_verified", 1, 0)
    # idle past the TTL but within the tolerance (trigger interval + batch budget): not overdue yet
    assert _verdict(_writes((TTL_MS + TOLERANCE_MS - 1, True)), NOW_MS - 2 * hours).verdict == "ttl_verified"
    assert _verdict(_writes((TTL_MS + TOLERANCE_MS + 1, True))).verdict == "ttl_not_enforced"
    # a store younger than its TTL (+ tolerance): no key can be overdue yet, nothing is proven
    young = _verdict(_writes((10 * 60_000, True), (60_000, True)), history_since_ms=NOW_MS - 10 * 60_000)
    assert young.verdict == "ttl_unverifiable" and young.keys_overdue == 0
    # older evidence of the store (a snapshot taken 2 h ago) covers the TTL: verified
    assert _verdict(_writes((10 * 60_000, True)), history_since_ms=NOW_MS - 2 * hours).verdict == "ttl_verified"
    # no complete batch in the changelog: nothing to judge
    nothing = ttl_verdict(
        TTL_MS, _writes((3 * hours, True)), evaluated_at_ms=None, history_since_ms=None, tolerance_ms=TOLERANCE_MS
    )
    assert nothing.verdict == "ttl_unverifiable"
    # one straggler per thousand live keys is noise; two are not
    many = [(60_000, True)] * 999
    assert _verdict(_writes((3 * hours, True), *many)).verdict == "ttl_verified"
    assert _verdict(_writes((3 * hours, True), (3 * hours, True), *many)).verdict == "ttl_not_enforced"


def test_only_a_verified_ttl_makes_a_store_bounded():
    ttl = StoreSpec("counts", ttl_ms=TTL_MS)
    growing = _history([10, 20, 35])
    verified = TtlCheck("ttl_verified", 35, 0, None, "none overdue")
    not_enforced = TtlCheck("ttl_not_enforced", 35, 20, 3 * TTL_MS, "20 of 35 live keys overdue")
    unverifiable = TtlCheck("ttl_unverifiable", 35, 0, None, "history shorter than the TTL")
    assert not trends.unbounded_growth(ttl, growing, None, verified).flagged
    assert "evicted" in trends.unbounded_growth(ttl, growing, None, verified).reason
    # not enforced: unbounded even while tombstones (deletes) are seen and the key count fell
    flagged = trends.unbounded_growth(ttl, _history([10, 20, 18], tombstones=3), None, not_enforced)
    assert flagged.flagged and "20 of 35 live keys overdue" in flagged.reason
    # declared but not verified (or not measured): judged as a store without a TTL
    for check in (unverifiable, None):
        judged = trends.unbounded_growth(ttl, growing, None, check)
        assert judged.flagged and "not verified" in judged.reason and "keys only ever added" in judged.reason
    assert not trends.unbounded_growth(ttl, _history([10, 20, 35], tombstones=3), None, unverifiable).flagged


def test_windows_older_than_their_retention_are_unbounded():
    horizon = 3_600_000  # the store's retention, counted from a window's start
    values = [SnapshotEntry(window_start_ms=0), SnapshotEntry(window_start_ms=10 * horizon), SnapshotEntry()]
    assert windows_beyond_retention(WINDOWED, values, stream_time_ms=10 * horizon + 1) == 1
    assert windows_beyond_retention(WINDOWED, values, stream_time_ms=horizon - 1) == 0
    assert trends.unbounded_growth(WINDOWED, [], 1).flagged
    assert not trends.unbounded_growth(WINDOWED, [], 0).flagged


def test_budget_checks_crossed_and_projected():
    checks = {
        c.measure: c
        for c in trends.budget_checks(
            KV.budget, {"rows": 1_200, "bytes": 5, "restore_s": 30}, {"rows": 10, "restore_s": 10}
        )
    }
    assert set(checks) == {"rows", "restore_s"}  # bytes has no budget here
    assert checks["rows"].crossed and checks["rows"].days_left == 0
    assert not checks["restore_s"].crossed and checks["restore_s"].days_left == pytest.approx(3)


def test_conditions_name_the_numbers_and_the_likely_cause():
    from streamstate.operators.state_audit import conditions_for

    def row(rows: float, per_day: float, unbounded: bool = False) -> StoreAudit:
        return _audit(
            budget_status=tuple(trends.budget_checks(KV.budget, {"rows": rows}, {"rows": per_day})),
            unbounded=unbounded,
            unbounded_reason="keys only ever added",
            rows_per_day=per_day,
            budget_warn_days=7,
        )

    crossed = conditions_for(row(1_500, 100, unbounded=True))
    assert [c.name for c in crossed] == ["state_budget_counts"] and "keys only ever added" in crossed[0].summary
    assert "1,500 rows > budget 1,000" in crossed[0].summary
    soon = conditions_for(row(900, 50))  # 2 days left
    assert [c.name for c in soon] == ["state_budget_forecast_counts"] and soon[0].numbers["days_left"] == 2.0
    assert conditions_for(row(100, 10)) == []  # 90 days away: nothing to say

    ttl = {
        "ttl_verdict": "ttl_not_enforced",
        "ttl_ms": TTL_MS,
        "ttl_keys_checked": 35,
        "ttl_keys_overdue": 20,
        "ttl_oldest_overdue_ms": 3 * TTL_MS,
        "ttl_reason": "20 of 35 live keys were idle longer than the TTL",
    }
    [alert] = conditions_for(dataclasses.replace(row(100, 10), **ttl))
    assert (alert.name, alert.severity) == ("state_ttl_not_enforced_counts", "warning")
    assert alert.numbers["keys_overdue"] == 20
    assert "20 of 35 live keys" in alert.summary
    assert conditions_for(dataclasses.replace(row(100, 10), **ttl | {"ttl_verdict": "ttl_verified"})) == []


def test_report_lists_every_store_with_a_chart(tmp_path):
    from runtime.settings import Settings

    settings = Settings(data_dir=tmp_path)
    rows = [
        _audit(
            i,
            kind="key_value",
            state_rows=10 * i,
            restore_snapshot_tail_s=1.0 + i,
            restore_full_replay_s=2.0 + i,
            budget_max_rows=50,
            budget_max_restore_s=10.0,
            unbounded=i == 2,
            unbounded_reason="keys only ever added",
            ttl_ms=60_000,
            ttl_verdict="ttl_not_enforced",
            ttl_keys_checked=30,
            ttl_keys_overdue=12,
            ttl_reason="12 of 30 live keys were idle longer than the TTL",
        )
        for i in range(3)
    ]
    other = dataclasses.replace(rows[0], application_id="b-v2", store="windows")
    page = write_report(settings, {("a-v1", "counts"): rows, ("b-v2", "windows"): [other]})
    text = page.read_text()
    assert "a-v1 / counts" in text and "b-v2 / windows" in text and "unbounded growth" in text
    assert "TTL not enforced</b>: 12 of 30 live keys" in text and "12 of 30 live keys overdue" in text
    for name in ("a-v1.counts.png", "b-v2.windows.png"):
        assert (page.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_audit_table_written_before_the_ttl_check_gains_its_columns(tmp_path):
    import pyarrow as pa

    from runtime.settings import Settings
    from spark_jobs.operations.state_audit.collect import audit_rows, audit_table, record_audit
    from spark_jobs.versions import append_rows

    settings = Settings(data_dir=tmp_path)
    before = pa.schema(
        [pa.field("audited_at", pa.timestamp("us", tz="UTC"))]
        + [pa.field(n, pa.string()) for n in ("run_id", "application_id", "store")]
    )
    append_rows(
        audit_table(settings),
        [{"audited_at": _at(0), "run_id": "old", "application_id": "a-v1", "store": "counts"}],
        before,
    )
    record_audit(settings, [_audit(1, run_id="new", ttl_verdict="ttl_verified", ttl_keys_checked=7)])
    rows = audit_rows(settings, "a-v1", "counts")
    assert [(r.run_id, r.ttl_verdict, r.ttl_keys_checked) for r in rows] == [
        ("old", None, None),
        ("new", "ttl_verified", 7),
    ]


def test_an_audit_row_round_trips_through_its_table_row():
    from spark_jobs.operations.state_audit.rows import PartitionState

    checks = tuple(trends.budget_checks(KV.budget, {"rows": 1_200, "restore_s": 30}, {"rows": 10, "restore_s": None}))
    audit = _audit(
        job="counts_job",
        version=1,
        kind="key_value",
        state_rows=1_200,
        state_rows_source="checkpoint",
        partitions={0: PartitionState(700, 7_000, 9_000), 1: PartitionState(500, 5_000, 6_000)},
        budget_status=checks,
        unbounded=False,
        unbounded_reason="keys are removed",
        ttl_verdict="ttl_verified",
    )
    row = audit.table_row()
    # the table's format as before: JSON text, partitions by their number as text, each check with ``crossed``
    assert json.loads(row["partitions"]) == {
        "0": {"rows": 700, "bytes": 7_000, "disk_bytes": 9_000},
        "1": {"rows": 500, "bytes": 5_000, "disk_bytes": 6_000},
    }
    assert json.loads(row["budget_status"]) == [c.__dict__ | {"crossed": c.crossed} for c in checks]
    assert row["audited_at"] == _at(0)  # a timestamp column takes the datetime itself
    assert StoreAudit.of(row) == audit
    assert StoreAudit.of(_audit().table_row()) == _audit()  # no partitions, no checks


def test_an_older_audit_row_still_reads():
    # as the audit wrote rows before the TTL check: no TTL columns, checks as its own json.dumps wrote them
    older = {
        "run_id": "old",
        "audited_at": _at(0),
        "application_id": "a-v1",
        "store": "counts",
        "kind": "key_value",
        "state_rows": 1_500,
        "largest": "a column this version does not know",
        "partitions": None,
        "budget_status": json.dumps(
            [
                {
                    "measure": "rows",
                    "current": 1500.0,
                    "limit": 1000.0,
                    "per_day": None,
                    "days_left": 0.0,
                    "crossed": True,
                }
            ]
        ),
    }
    audit = StoreAudit.of(older)
    assert (audit.run_id, audit.state_rows, audit.partitions, audit.ttl_verdict) == ("old", 1_500, None, None)
    [check] = audit.budget_status
    assert (check.measure, check.crossed, check.days_left) == ("rows", True, 0.0)
    assert StoreAudit.of({**older, "budget_status": None}).budget_status == ()  # a row written before budgets


def test_the_audit_tables_columns_are_the_rows_fields():
    from spark_jobs.operations.state_audit import checkpoint_state, collect
    from spark_jobs.operations.state_audit.rows import CheckpointStateRow

    assert set(collect._schema().names) == {f.name for f in dataclasses.fields(StoreAudit)}
    assert set(checkpoint_state._schema().names) == {f.name for f in dataclasses.fields(CheckpointStateRow)}


def test_checkpoint_rows_measurements_and_snapshot_entries_read_typed():
    from spark_jobs.documents import to_row
    from spark_jobs.operations.state_audit.rows import ChangelogMeasurement, CheckpointStateRow

    read = CheckpointStateRow("run", _at(0), "a-v1", 1, 7, "counts", operator_id=0, partition=2, rows=5, bytes=50)
    assert CheckpointStateRow.of(to_row(read)) == read
    failed = CheckpointStateRow.of(
        {"run_id": "run", "read_at": _at(0), "application_id": "a-v1", "version": 1, "batch_id": 7, "store": "counts"}
        | {"error": "state-metadata: boom", "partition": None}
    )
    assert (failed.error, failed.rows, failed.operator_id) == ("state-metadata: boom", None, None)
    # a tuning measurement row: the audit keeps what it reads, the tuner's other columns are ignored
    measured = ChangelogMeasurement.of(
        {"topic": "t", "measured_at": _at(0), "records": 9, "bytes": 90, "live_keys": 4, "tombstones": 1}
        | {"scan_complete": True, "run_id": "m1"}
    )
    assert measured == ChangelogMeasurement("t", _at(0), 9, 90, 4, 1)
    entry = SnapshotEntry.decode(b'{"user_id": "u1", "session_end_ms": 5, "source_partition": 1}')
    assert entry == SnapshotEntry(source_partition=1, session_end_ms=5)


def test_the_audit_tasks_result_round_trips():
    from streamstate.operators.state_audit import AuditResult, StoreSummary

    from spark_jobs.documents import to_json

    audit = _audit(state_rows=3, unbounded=True, days_to_budget=2.5, ttl_verdict="ttl_unverifiable")
    result = AuditResult("/status/state_audit/index.html", (StoreSummary.of(audit),))
    xcom = to_json(result)
    assert xcom == {
        "report": "/status/state_audit/index.html",
        "stores": [
            {
                "application_id": "a-v1",
                "store": "counts",
                "state_rows": 3,
                "unbounded": True,
                "days_to_budget": 2.5,
                "ttl_verdict": "ttl_unverifiable",
            }
        ],
    }
    assert AuditResult.of(xcom) == result
