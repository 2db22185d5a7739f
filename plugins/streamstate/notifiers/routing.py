"""Where an alert goes: the webhook always; Slack, PagerDuty (Events v2) and e-mail when their
Airflow connections exist. The connection ids are the configuration, here in one place."""

from __future__ import annotations

import html
import logging
import socket

from streamstate.alerts import RESOLVED, Alert
from streamstate.notifiers.webhook import WEBHOOK_CONN_ID, WebhookNotifier

#: Slack API connection (``slack``); optional extra ``channel`` (default ``#streamstate-alerts``)
SLACK_CONN_ID = "streamstate_slack"
#: PagerDuty Events API v2 connection (``pagerduty_events``: the integration key)
PAGERDUTY_CONN_ID = "streamstate_pagerduty"
#: SMTP connection (``smtp``); extra ``to`` (comma-separated recipients), optional ``from_email``
#: (default ``streamstate@<this host>``: the provider's notifier refuses to send without a sender)
SMTP_CONN_ID = "streamstate_smtp"

log = logging.getLogger("streamstate.alerts")


def _connection(conn_id: str):
    """The connection, or None when it is not defined (the channel is then not used)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def notifiers_for(alert: Alert) -> dict[str, object]:
    """channel name -> a configured provider notifier for ``alert``."""
    notifiers: dict[str, object] = {"webhook": WebhookNotifier(payload=alert.to_dict(), http_conn_id=WEBHOOK_CONN_ID)}
    if (slack := _connection(SLACK_CONN_ID)) is not None:
        from airflow.providers.slack.notifications.slack import SlackNotifier

        notifiers["slack"] = SlackNotifier(
            slack_conn_id=SLACK_CONN_ID,
            text=alert.text(),
            channel=slack.extra_dejson.get("channel", "#streamstate-alerts"),
        )
    if _connection(PAGERDUTY_CONN_ID) is not None:
        from airflow.providers.pagerduty.notifications.pagerduty import PagerdutyNotifier

        notifiers["pagerduty"] = PagerdutyNotifier(
            summary=f"{alert.title}: {alert.summary}"[:1024],
            severity=alert.severity if alert.severity in ("critical", "error", "warning", "info") else "error",
            source=alert.application_id,
            action="resolve" if alert.status == RESOLVED else "trigger",
            dedup_key=alert.dedup_key,
            custom_details={"numbers": alert.numbers, "next_step": alert.next_step},
            component=alert.job,
            group="streamstate",
            class_type=alert.condition,
            pagerduty_events_conn_id=PAGERDUTY_CONN_ID,
        )
    if (smtp := _connection(SMTP_CONN_ID)) is not None and smtp.extra_dejson.get("to"):
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        notifiers["smtp"] = SmtpNotifier(
            to=smtp.extra_dejson["to"],
            from_email=smtp.extra_dejson.get("from_email") or f"streamstate@{socket.getfqdn()}",
            subject=alert.title,
            html_content=f"<pre>{html.escape(alert.text())}</pre>",
            smtp_conn_id=SMTP_CONN_ID,
        )
    return notifiers


def send(alert: Alert, context) -> dict[str, str]:
    """Deliver ``alert`` on every configured channel. One failing channel does not stop the others;
    returns channel -> "sent" | "error: ..." (the check task fails afterwards if nothing was sent)."""
    results = {}
    for channel, notifier in notifiers_for(alert).items():
        try:
            notifier(context)
            results[channel] = "sent"
        except Exception as err:
            log.error("alert %s via %s failed: %s", alert.dedup_key, channel, err)
            results[channel] = f"error: {err}"
    log.info("alert %s %s -> %s", alert.dedup_key, alert.status, results)
    return results
