"""The demo's waits on Airflow give up, saying why, when Airflow's scheduler stays down (``airflow standalone`` does not
start a scheduler that died again: the run the demo triggered would stay queued for the whole wait)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamstate_cli.demo import SchedulerWatch, _wait


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_scheduler_unhealthy_past_the_grace_ends_the_wait_with_why():
    clock, health = Clock(), {"scheduler": {"status": "unhealthy"}}
    watch = SchedulerWatch(lambda: health, Path("/logs"), grace_s=120, clock=clock)
    assert watch() is None  # a late heartbeat on a busy machine: not yet
    clock.now = 119
    assert watch() is None
    health["scheduler"]["status"] = "healthy"  # it came back: the grace starts over
    assert watch() is None
    health["scheduler"]["status"] = "unhealthy"
    clock.now = 200
    assert watch() is None
    clock.now = 320
    assert "not been healthy for 120 s (status: unhealthy)" in watch() and "/logs" in watch()


def test_no_answer_counts_as_down_and_the_wait_stops_at_once():
    clock = Clock()
    watch = SchedulerWatch(lambda: None, Path("/logs"), grace_s=0, clock=clock)
    with pytest.raises(RuntimeError, match=r"stopped waiting for the driver to run: Airflow's scheduler has not been"):
        _wait(lambda: False, 600, "the driver to run", watch, poll_s=0)
    _wait(lambda: True, 0, "nothing", lambda: pytest.fail("a wait already over asks nothing"))
