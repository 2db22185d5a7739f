"""Alert routing: the webhook always; provider notifiers only for the connections that exist."""

from __future__ import annotations

import json

from streamstate.alerts import FIRING, RESOLVED, Alert
from streamstate.notifiers.routing import notifiers_for


def alert(status: str) -> Alert:
    return Alert(
        "vote_counts",
        "vote_counts-v1",
        "crash_loop",
        status,
        "critical",
        "failed 3 times",
        {"restarts_in_window": 3},
        "fix it, then start_streaming_job",
        "streamstate/vote_counts-v1/crash_loop",
        "2026-11-22T00:00:00+00:00",
    )


def test_only_the_webhook_without_other_connections(monkeypatch):
    for name in ("SLACK", "PAGERDUTY", "SMTP"):
        monkeypatch.delenv(f"AIRFLOW_CONN_STREAMSTATE_{name}", raising=False)
    routed = notifiers_for(alert(FIRING))
    assert list(routed) == ["webhook"]
    assert routed["webhook"].payload["dedup_key"] == "streamstate/vote_counts-v1/crash_loop"
    assert routed["webhook"].payload["title"] == "[CRITICAL] vote_counts: crash loop"


def test_configured_connections_add_their_provider_notifiers(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAMSTATE_SLACK",
        json.dumps({"conn_type": "slack", "password": "xoxb-1", "extra": {"channel": "#oncall"}}),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAMSTATE_PAGERDUTY", json.dumps({"conn_type": "pagerduty_events", "password": "key"})
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAMSTATE_SMTP",
        json.dumps({"conn_type": "smtp", "host": "mail", "extra": {"to": "oncall@example.com"}}),
    )
    routed = notifiers_for(alert(FIRING))
    assert set(routed) == {"webhook", "slack", "pagerduty", "smtp"}
    assert routed["slack"].channel == "#oncall" and "Next step: fix it" in routed["slack"].text
    assert routed["pagerduty"].dedup_key == "streamstate/vote_counts-v1/crash_loop"
    assert routed["pagerduty"].action == "trigger" and routed["pagerduty"].severity == "critical"
    assert routed["smtp"].subject == "[CRITICAL] vote_counts: crash loop"
    resolved = notifiers_for(alert(RESOLVED))
    assert resolved["pagerduty"].action == "resolve"  # the same dedup key closes the incident
    assert resolved["pagerduty"].dedup_key == routed["pagerduty"].dedup_key
