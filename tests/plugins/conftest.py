"""Fixtures shared by the DAG tests."""

from __future__ import annotations

import pytest

from tests.helpers import WebhookReceiver


@pytest.fixture(scope="module")
def webhook():
    """A local alert webhook per test module (its alerts are asserted in order)."""
    receiver = WebhookReceiver()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture(scope="module")
def ui(settings, airflow):
    """Airflow's UI in headless Chromium (tests/plugins/airflow_ui.py), one browser per test module."""
    from tests.plugins.airflow_ui import AirflowUi, chromium

    with chromium() as browser:
        yield AirflowUi(browser, settings.airflow_url, settings.logs_dir / "ui-screenshots")


@pytest.fixture(autouse=True)
def _park_the_browser(request):
    """After a test that used the browser, its last page is left (it would go on polling Airflow)."""
    yield
    if "ui" in request.fixturenames:
        request.getfixturevalue("ui").park()
