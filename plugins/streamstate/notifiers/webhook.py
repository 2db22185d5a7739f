"""A generic webhook notifier: the alert as JSON, POSTed to the URL of an Airflow HTTP connection."""

from __future__ import annotations

from airflow.sdk import BaseNotifier

#: the connection whose host is the full webhook URL, e.g. {"conn_type": "http", "host": "https://alerts.example/hook"}
WEBHOOK_CONN_ID = "streamstate_webhook"


class WebhookNotifier(BaseNotifier):
    """POST ``payload`` (an :class:`~streamstate.alerts.Alert` as a dict) to the webhook connection."""

    template_fields = ()

    def __init__(
        self, *, payload: dict, http_conn_id: str = WEBHOOK_CONN_ID, timeout_s: float = 10.0, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.payload = payload
        self.http_conn_id = http_conn_id
        self.timeout_s = timeout_s

    def notify(self, context) -> None:
        from airflow.providers.http.hooks.http import HttpHook

        hook = HttpHook(method="POST", http_conn_id=self.http_conn_id)
        hook.run(
            endpoint=None,
            json=self.payload,
            headers={"Content-Type": "application/json"},
            extra_options={"timeout": self.timeout_s, "check_response": True},
        )
