"""The jobs page's own routes: the state-size report (the page and its charts, nothing else) and the
received alerts."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from streamstate.ui.jobs_page import app


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMSTATE_DATA_DIR", str(tmp_path))
    return TestClient(app), tmp_path / "status" / "state_audit"


def test_report_page_and_charts_are_served(client):
    http, folder = client
    missing = http.get("/state-audit/")  # no audit yet: a page that says what to do, not JSON
    assert missing.status_code == 404 and missing.headers["content-type"].startswith("text/html")
    assert "No report yet" in missing.text and 'href="/dags/audit_state_size"' in missing.text
    folder.mkdir(parents=True)
    (folder / "index.html").write_text("<h2>State size audit</h2>")
    (folder / "a-v1.counts.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (folder / "table_maintenance.json").write_text("{}")
    page = http.get("/state-audit/")
    assert page.status_code == 200 and "State size audit" in page.text
    # a browser asks again every time: a new audit's page replaces the old one at once
    assert page.headers["cache-control"] == "no-cache" and "etag" in page.headers
    (folder / "index.html").write_text("<h2>State size audit</h2> newer")
    assert http.get("/state-audit/", headers={"If-None-Match": page.headers["etag"]}).text.endswith("newer")
    assert http.get("/state-audit/a-v1.counts.png").content.startswith(b"\x89PNG")
    assert http.get("/state-audit/table_maintenance.json").status_code == 404  # only the page and its charts
    assert http.get("/state-audit/..%2F..%2Fsettings.png").status_code == 404


def test_received_alerts_are_a_page_with_their_next_step(client):
    from streamstate.alerts import FIRING, RESOLVED, Alert, dedup_key

    http, _ = client
    assert "No alert received yet" in http.get("/alerts").text
    down = Alert(
        job="purchase_counts",
        application_id="purchase_counts-v3",
        condition="down",
        status=FIRING,
        severity="critical",
        summary="the driver is gone",
        numbers={"lease_epoch": 4},
        next_step="read the driver log",
        dedup_key=dedup_key("purchase_counts-v3", "down"),
        at="2026-11-24T18:00:00Z",
    )
    for body in (down.to_dict(), {"not": "an alert"}, {**down.to_dict(), "status": RESOLVED}):
        assert http.post("/api/alerts", json=body).status_code == 200
    page = http.get("/alerts")
    assert page.headers["content-type"].startswith("text/html")
    assert page.text.index("[RESOLVED] purchase_counts: down") < page.text.index("[CRITICAL] purchase_counts: down")
    for shown in ("read the driver log", "lease_epoch=4", "streamstate/purchase_counts-v3/down"):
        assert shown in page.text
    assert len(http.get("/api/alerts").json()["alerts"]) == 3  # the JSON keeps every body as received


def _post_alerts(worker: int) -> list[int]:
    """One API server process's share of the posts (a child process: its own app and client)."""
    http = TestClient(app)
    bodies = [{"condition": f"c{worker}-{i}", "application_id": "a-v1", "status": "firing"} for i in range(15)]
    return [http.post("/api/alerts", json=body).status_code for body in bodies]


def test_concurrent_alerts_are_all_kept(client):
    """Notifiers post at the same time to an API server of several worker processes: every post is kept,
    none lost to another process's rewrite of the inbox."""
    import multiprocessing

    http, _ = client
    with multiprocessing.get_context("fork").Pool(4) as pool:
        codes = [code for worker in pool.map(_post_alerts, range(4)) for code in worker]
    assert codes == [200] * 60
    kept = [a["condition"] for a in http.get("/api/alerts").json()["alerts"]]
    assert sorted(kept) == sorted(f"c{w}-{i}" for w in range(4) for i in range(15))


def test_the_lookup_form_is_answered_as_a_page_with_or_without_a_window(client):
    http, _ = client
    # a browser sends the form's empty window field as window_start=: a lookup, not a 422 of FastAPI's
    unknown = http.get("/lookup", params={"target": "no_such_job/counts", "key": "u1", "window_start": ""})
    assert unknown.status_code == 422 and unknown.headers["content-type"].startswith("text/html")
    assert "State lookup: no_such_job/counts u1" in unknown.text and "no_such_job" in unknown.text.split("</form>")[1]
    bad = http.get("/lookup", params={"target": "no_such_job/counts", "key": "u1", "window_start": "soon"})
    assert bad.status_code == 422 and "a number of milliseconds" in bad.text
