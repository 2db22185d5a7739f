"""The jobs page serves the state-size report: the page and its charts, nothing else."""

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
    (folder / "open_alerts.json").write_text("{}")
    page = http.get("/state-audit/")
    assert page.status_code == 200 and "State size audit" in page.text
    assert http.get("/state-audit/a-v1.counts.png").content.startswith(b"\x89PNG")
    assert http.get("/state-audit/open_alerts.json").status_code == 404  # only the page and its charts
    assert http.get("/state-audit/..%2F..%2Fsettings.png").status_code == 404
