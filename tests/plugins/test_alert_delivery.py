"""Each provider notifier delivers an alert, fired and then resolved, to a local stand-in for the
provider, in the provider's own format, through the production path (``routing.send``): the Airflow
connections are the only configuration (``AIRFLOW_CONN_*`` variables), the provider packages do the
sending (tests/plugins/provider_endpoints.py has the stand-ins)."""

from __future__ import annotations

import dataclasses
import html
import json
import socket

import pytest
from streamstate.alerts import FIRING, RESOLVED, Alert, OpenAlert, reconcile
from streamstate.notifiers.routing import send
from streamstate.supervision import Condition

from runtime.alert_inbox import AlertInbox
from tests.plugins.provider_endpoints import (
    PAGERDUTY_EVENTS_HOST,
    PagerdutyEventsApi,
    SlackApi,
    SmtpServer,
    ThrowawayCa,
)

APP = "vote_counts-v1"
CONNECTIONS = ("WEBHOOK", "SLACK", "PAGERDUTY", "SMTP")


def fired_then_resolved() -> tuple[Alert, Alert]:
    """A crash-loop alert as a check fires it, and its resolve at the next check (``reconcile``)."""
    condition = Condition(
        "crash_loop",
        "critical",
        f"{APP} failed 3 times within 1800s; supervision stopped restarting it",
        {"restarts_in_window": 3, "window_s": 1800},
        "Fix the cause, then trigger start_streaming_job.",
    )
    links = {"dag": "http://airflow/dags/supervise__vote_counts"}
    (fired,), _ = reconcile("vote_counts", APP, {}, [condition], links)
    _, (resolved,) = reconcile("vote_counts", APP, {"crash_loop": OpenAlert.of(fired, "supervision")}, [], links)
    assert (fired.status, resolved.status) == (FIRING, RESOLVED)
    return fired, resolved


@pytest.fixture
def webhook(monkeypatch):
    """Only the connections a test sets exist; the webhook (always used) goes to a local inbox."""
    for name in CONNECTIONS:
        monkeypatch.delenv(f"AIRFLOW_CONN_STREAMSTATE_{name}", raising=False)
    inbox = AlertInbox()
    monkeypatch.setenv("AIRFLOW_CONN_STREAMSTATE_WEBHOOK", inbox.connection)
    yield inbox
    inbox.close()


@pytest.fixture
def ca(tmp_path, monkeypatch):
    authority = ThrowawayCa(tmp_path / "ca")
    monkeypatch.setenv("SSL_CERT_FILE", str(authority.ca_file))  # the clients trust the stand-ins, and only them
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return authority


def test_slack_notifier_posts_chat_post_message_with_channel_and_text(webhook, monkeypatch):
    slack = SlackApi()
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAMSTATE_SLACK",
        json.dumps(
            {
                "conn_type": "slack",
                "password": "xoxb-streamstate-test",
                "extra": {"base_url": slack.base_url, "channel": "#oncall-streams"},
            }
        ),
    )
    fired, resolved = fired_then_resolved()
    try:
        assert send(fired, {}) == {"webhook": "sent", "slack": "sent"}
        assert send(resolved, {}) == {"webhook": "sent", "slack": "sent"}
    finally:
        slack.close()

    assert [call["method"] for call in slack.calls] == ["chat.postMessage", "chat.postMessage"]
    assert {call["authorization"] for call in slack.calls} == {"Bearer xoxb-streamstate-test"}
    first, second = slack.messages()
    assert first["channel"] == second["channel"] == "#oncall-streams"
    assert first["text"] == fired.text()
    assert first["text"].startswith("[CRITICAL] vote_counts: crash loop\n")
    assert (
        "Next step: Fix the cause" in first["text"]
        and "dag: http://airflow/dags/supervise__vote_counts" in first["text"]
    )
    assert second["text"] == resolved.text() and second["text"].startswith("[RESOLVED] vote_counts: crash loop\n")
    assert webhook.of(APP) == [("crash_loop", "firing"), ("crash_loop", "resolved")]


def test_pagerduty_notifier_triggers_then_resolves_one_incident_on_the_events_api(webhook, ca, monkeypatch):
    pagerduty = PagerdutyEventsApi(ca)
    monkeypatch.setenv("HTTPS_PROXY", pagerduty.proxy_url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")  # the webhook stays direct
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAMSTATE_PAGERDUTY",
        json.dumps({"conn_type": "pagerduty_events", "password": "R0UT1NGKEY0000000000000000000001"}),
    )
    fired, resolved = fired_then_resolved()
    try:
        assert send(fired, {}) == {"webhook": "sent", "pagerduty": "sent"}
        assert send(resolved, {}) == {"webhook": "sent", "pagerduty": "sent"}
    finally:
        pagerduty.close()

    assert set(pagerduty.tunnels) == {f"{PAGERDUTY_EVENTS_HOST}:443"}
    assert {event["host"] for event in pagerduty.events} == {PAGERDUTY_EVENTS_HOST}
    trigger, resolve = pagerduty.enqueued()
    assert trigger["routing_key"] == resolve["routing_key"] == "R0UT1NGKEY0000000000000000000001"
    assert (trigger["event_action"], resolve["event_action"]) == ("trigger", "resolve")
    # the same dedup key: the resolve closes the incident the trigger opened
    assert trigger["dedup_key"] == resolve["dedup_key"] == f"streamstate/{APP}/crash_loop"
    payload = trigger["payload"]
    assert payload["severity"] == "critical"
    assert (
        payload["summary"]
        == f"[CRITICAL] vote_counts: crash loop: {APP} failed 3 times within 1800s; supervision stopped restarting it"
    )
    assert payload["source"] == APP and payload["component"] == "vote_counts" and payload["class"] == "crash_loop"
    assert payload["group"] == "streamstate"
    assert payload["custom_details"] == {
        "numbers": {"restarts_in_window": 3, "window_s": 1800},
        "next_step": "Fix the cause, then trigger start_streaming_job.",
    }


def test_pagerduty_rejecting_an_event_is_reported_and_the_webhook_still_delivers(webhook, ca, monkeypatch):
    pagerduty = PagerdutyEventsApi(ca)
    monkeypatch.setenv("HTTPS_PROXY", pagerduty.proxy_url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    fired, _ = fired_then_resolved()
    try:
        monkeypatch.setenv(
            "AIRFLOW_CONN_STREAMSTATE_PAGERDUTY",
            json.dumps({"conn_type": "pagerduty_events", "password": "R0UT1NGKEY0000000000000000000001"}),
        )
        # a severity PagerDuty does not know would be rejected: routing sends "error" instead
        assert send(dataclasses.replace(fired, severity="page-everyone"), {}) == {
            "webhook": "sent",
            "pagerduty": "sent",
        }
        assert pagerduty.enqueued()[-1]["payload"]["severity"] == "error"
        monkeypatch.setenv(
            "AIRFLOW_CONN_STREAMSTATE_PAGERDUTY",
            json.dumps({"conn_type": "pagerduty_events", "password": "a-mistyped-key"}),
        )
        results = send(fired, {})
    finally:
        pagerduty.close()
    assert results["webhook"] == "sent"
    assert results["pagerduty"].startswith("error:") and "400" in results["pagerduty"]
    assert len(pagerduty.enqueued()) == 2  # the rejected event reached the API: rejected there, not lost on the way


def test_smtp_notifier_mails_every_recipient_over_starttls(webhook, ca, monkeypatch):
    smtp = SmtpServer(ca)
    monkeypatch.setenv(
        "AIRFLOW_CONN_STREAMSTATE_SMTP",
        json.dumps(
            {
                "conn_type": "smtp",
                "host": "localhost",
                "port": smtp.port,
                "extra": {
                    "to": "oncall@example.com, streams-team@example.com",
                    "from_email": "streamstate@example.com",
                    "disable_ssl": True,
                    "timeout": 10,
                },
            }
        ),
    )
    fired, resolved = fired_then_resolved()
    try:
        assert send(fired, {}) == {"webhook": "sent", "smtp": "sent"}
        assert send(resolved, {}) == {"webhook": "sent", "smtp": "sent"}
    finally:
        smtp.close()

    first, second = smtp.received
    assert first["tls"] and second["tls"]  # the relay refuses mail before STARTTLS
    assert first["mail_from"] == "streamstate@example.com"
    assert first["rcpt_tos"] == ["oncall@example.com", "streams-team@example.com"]
    message = first["message"]
    assert message["To"] == "oncall@example.com, streams-team@example.com"
    assert message["From"] == "streamstate@example.com"
    assert message["Subject"] == "[CRITICAL] vote_counts: crash loop"
    assert SmtpServer.html_body(message) == f"<pre>{html.escape(fired.text())}</pre>"
    assert second["message"]["Subject"] == "[RESOLVED] vote_counts: crash loop"
    assert html.escape(resolved.summary) in SmtpServer.html_body(second["message"])


def test_smtp_without_a_configured_sender_still_mails(webhook, ca, monkeypatch):
    smtp = SmtpServer(ca)
    extra = {"to": "oncall@example.com", "disable_ssl": True, "timeout": 10}  # no from_email
    connection = {"conn_type": "smtp", "host": "localhost", "port": smtp.port, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_STREAMSTATE_SMTP", json.dumps(connection))
    try:
        assert send(fired_then_resolved()[0], {}) == {"webhook": "sent", "smtp": "sent"}
    finally:
        smtp.close()
    assert smtp.received[0]["mail_from"] == f"streamstate@{socket.getfqdn()}"
