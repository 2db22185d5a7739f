"""Registers the streamstate UI with Airflow: the "Streaming jobs" page in the navigation."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from streamstate.ui.jobs_page import app


class StreamstatePlugin(AirflowPlugin):
    name = "streamstate"
    fastapi_apps = [{"app": app, "url_prefix": "/streamstate", "name": "Streaming jobs"}]
    external_views = [
        {"name": "Streaming jobs", "href": "/streamstate/", "destination": "nav", "category": "browse",
         "url_route": "streaming-jobs"},
    ]  # fmt: skip
