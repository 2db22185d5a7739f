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
