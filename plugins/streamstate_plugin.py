"""Registers the streamstate UI with Airflow: the "Streaming jobs" page in the navigation, and the
state query API under ``/state-api`` (plugins/streamstate/state_api)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from streamstate.state_api.app import app as state_api
from streamstate.ui.jobs_page import app


class StreamstatePlugin(AirflowPlugin):
    name = "streamstate"
    fastapi_apps = [
        {"app": app, "url_prefix": "/streamstate", "name": "Streaming jobs"},
        {"app": state_api, "url_prefix": "/state-api", "name": "State queries"},
    ]
    external_views = [
        {
            "name": "Streaming jobs",
            "href": "/streamstate/",
            "destination": "nav",
            "category": "browse",
            "url_route": "streaming-jobs",
        },
    ]
