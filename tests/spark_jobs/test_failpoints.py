"""How a test arms the driver's failpoints (``STREAMSTATE_FAILPOINTS``)."""

from __future__ import annotations

import os
import time

import pytest

from spark_jobs.driver import failpoints


def test_a_point_is_armed_for_several_times_each_with_its_action(monkeypatch):
    armed = "before_outputs:1:pause,before_outputs:3:hold:2.5,restoring,before_snapshot:2"
    monkeypatch.setenv(failpoints.ENV, armed)
    Armed = failpoints.Armed
    assert failpoints.armed() == {
        "before_outputs": {1: Armed("pause"), 3: Armed("hold", 2.5)},
        "restoring": {1: Armed("stop")},
        "before_snapshot": {2: Armed("stop")},
    }


@pytest.mark.parametrize(
    "entry, error",
    [
        ("nowhere:1", "unknown failpoint 'nowhere'"),
        ("before_outputs:1:sleep", "unknown action 'sleep'"),
        ("before_outputs:1:hold", "hold takes its seconds"),
        ("before_outputs:1:stop:5", "only hold does"),
    ],
)
def test_an_unknown_point_or_action_is_refused_naming_it(monkeypatch, entry, error):
    monkeypatch.setenv(failpoints.ENV, entry)
    with pytest.raises(ValueError, match=error):
        failpoints.armed()


def test_a_hold_holds_the_thread_then_goes_on(monkeypatch, tmp_path):
    monkeypatch.setenv(failpoints.ENV, "before_snapshot:2:hold:0.3")
    monkeypatch.setattr(failpoints, "_reached", failpoints.Counter())
    failpoints.reached("before_snapshot", tmp_path, "app-v1")
    started = time.monotonic()
    failpoints.reached("before_snapshot", tmp_path, "app-v1")
    assert time.monotonic() - started >= 0.3
    assert failpoints.read_marker(tmp_path, "app-v1") == {
        "failpoint": "before_snapshot",
        "time": 2,
        "pid": os.getpid(),
        "action": "hold",
    }


def test_a_point_armed_for_another_time_lets_the_driver_pass(monkeypatch, tmp_path):
    monkeypatch.setenv(failpoints.ENV, "before_snapshot:5")
    monkeypatch.setattr(failpoints, "_reached", failpoints.Counter())
    for _ in range(4):
        failpoints.reached("before_snapshot", tmp_path, "app-v1")  # returns: not the 5th time
    assert failpoints.read_marker(tmp_path, "app-v1") is None
