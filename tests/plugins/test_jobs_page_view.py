"""The jobs page's rows from the files a driver, its standby, the alert ledger and the tuning DAG publish, without
a stack: what each cell says, the JSON read back as the same typed rows, and text from a file never executed as
HTML. (The pages in a real Airflow and a browser: test_jobs_page_browser.py.)"""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient
from streamstate.alert_ledger import AlertLedger
from streamstate.supervision import Condition
from streamstate.ui import jobs_page
from streamstate.ui.view_model import JobRow, job_row

from spark_jobs.documents import from_json
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import (
    FollowerState,
    JobState,
    JobStatus,
    SnapshotTaken,
    StandbyStatus,
    StandbyStoreView,
    status_path,
    write_standby_status,
)
from spark_jobs.layout import standby_name
from spark_jobs.operations.changelog_tuning.latest import LatestMeasurement, write_latest
from spark_jobs.registry import latest_jobs


def test_a_running_job_with_a_standby_an_alert_and_a_measured_changelog(settings, tmp_path, monkeypatch):
    settings = settings.replace(data_dir=tmp_path)  # its own status directory: nothing left for other tests
    spec = latest_jobs()["purchase_counts"]
    app = spec.application_id
    lease, standby = JobLease(settings.status_dir, app), JobLease(settings.status_dir, standby_name(app))
    status = JobStatus(app, status_path(settings.status_dir, app), lease_epoch=lease.acquire())
    try:
        status.transition_to(JobState.RUNNING)
        status.record_progress({"batchId": 2_000_000_034, "numInputRows": 5, "durationMs": {"triggerExecution": 950}})
        status.record_snapshot(
            "counts", SnapshotTaken(batch_id=2_000_000_030, taken_at="2026-11-28T10:00:00", rows=1234)
        )
        standby.acquire()
        write_standby_status(
            settings.status_dir,
            StandbyStatus(
                app,
                FollowerState.FOLLOWING,
                lease_epoch=1,
                stores={"counts": StandbyStoreView("t", 2_000_000_033, lag_ms=1500)},
            ),
        )
        monkeypatch.setattr("streamstate.notifiers.routing.send", lambda alert, context: {"webhook": "sent"})
        summary = "<script>alert('not from a file')</script>"
        AlertLedger(settings.status_dir).reconcile_and_send(
            {},
            job=spec.name,
            application_id=app,
            source="state_audit",
            conditions=[Condition("state_budget_counts", "error", summary, {}, "")],
            scope={"state_budget_counts"},
        )
        write_latest(
            settings,
            {"t": LatestMeasurement(app, "counts", 9000, 1000, 9.0, 8.0, 1, "2026-11-28T10:00:00", 2.0)},
        )

        row = job_row(spec, settings)
        assert row.lifecycle_summary == "RUNNING at batch 2000000034" and row.driver.lease_epoch == 1
        assert row.standby.running and row.standby.stores["counts"].lag_ms == 1500
        assert [(a.source, a.condition) for a in row.open_alerts] == [("state_audit", "state_budget_counts")]
        assert row.changelogs["counts"].above_target

        monkeypatch.setenv("STREAMSTATE_DATA_DIR", str(settings.data_dir))
        client = TestClient(jobs_page.app)
        served = client.get("/api/jobs").json()["jobs"]
        (read,) = [from_json(JobRow, r) for r in served if r["job"] == spec.name]
        assert read == dataclasses.replace(row, other_versions_running=read.other_versions_running)
        page = client.get("/").text
        assert "batch 30 (generation 2), 1,234 rows" in page  # batch ids as users count them
        assert "standby counts: batch 33 (generation 2)" in page and "lag 1.5 s" in page
        assert "counts: 9,000 / 1,000" in page and 'class="sev-warning">(9.0x)' in page
        assert summary not in page and "&lt;script&gt;" in page  # escaped, never run
    finally:
        lease.release()
        standby.release()
