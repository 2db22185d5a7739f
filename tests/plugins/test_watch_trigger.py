"""The watch task's trigger on a real lease (flock): silent while the watched driver holds the lease (or a newer
one took it over: it watches that one), ``exited`` once the lease is free, ``timeout`` at the end of the window;
the operator's state rides in the event."""

from __future__ import annotations

import asyncio
import threading
import time

from streamstate.triggers.streaming_job import LeaseTakenTrigger, StreamingJobExitedTrigger

from spark_jobs.lease import JobLease

APP = "watched-v1"


def _first_event(trigger) -> dict:
    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(first())


def test_exits_are_seen_within_a_poll_and_the_carry_comes_back(tmp_path):
    lease = JobLease(tmp_path, APP)
    epoch = lease.acquire()
    carry = {"deadline": 1.0e9, "restarts": 2}
    trigger = StreamingJobExitedTrigger(APP, str(tmp_path), epoch, timeout_s=30, poll_s=0.1, carry=carry)
    assert trigger.check() is None  # the watched driver holds it
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("StreamingJobExitedTrigger") and StreamingJobExitedTrigger(**kwargs).carry == carry

    released_at = time.monotonic()
    threading.Timer(0.5, lease.release).start()
    event = _first_event(trigger)
    assert (event["state"], event["epoch"], event["carry"]) == ("exited", epoch, carry)
    assert time.monotonic() - released_at < 5

    newer = JobLease(tmp_path, APP)
    assert newer.acquire() == epoch + 1  # another driver took over (a spare driver): nothing to restart
    follows = StreamingJobExitedTrigger(APP, str(tmp_path), epoch, timeout_s=30, poll_s=0.1, carry=carry)
    assert follows.check() is None and follows.epoch == epoch + 1  # it watches the new driver
    threading.Timer(0.3, newer.release).start()
    assert _first_event(follows)["epoch"] == epoch + 1  # and sees it exit
    newer.acquire()
    quiet = StreamingJobExitedTrigger(APP, str(tmp_path), epoch + 2, timeout_s=0.3, poll_s=0.1, carry=carry)
    assert _first_event(quiet) == {"state": "timeout", "timeout_s": 0.3, "carry": carry}
    newer.release()


def test_a_started_process_is_seen_once_it_takes_the_lease_and_a_dead_launch_fails(tmp_path):
    """The standby's start: the triggerer waits for the follower's lease (a newer epoch than before the
    launch), and a launch that ended without it fails at once rather than at the timeout."""
    import subprocess
    import sys

    exit_file = tmp_path / "launch.exit"
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        previous = JobLease(tmp_path, APP).last_epoch()
        carry = {"launch_at": 12.5}
        trigger = LeaseTakenTrigger(APP, str(tmp_path), launcher.pid, str(exit_file), previous, 30, 0.1, carry)
        assert trigger.check() is None  # launched, not holding yet
        kwargs = trigger.serialize()[1]
        assert LeaseTakenTrigger(**kwargs).carry == carry and kwargs["previous_epoch"] == previous
        lease = JobLease(tmp_path, APP)
        threading.Timer(0.3, lease.acquire).start()
        event = _first_event(trigger)
        assert (event["state"], event["epoch"], event["carry"]) == ("running", previous + 1, carry)
        lease.release()
    finally:
        launcher.kill()
        launcher.wait()
    exit_file.write_text("2")
    dead = LeaseTakenTrigger(APP, str(tmp_path), launcher.pid, str(exit_file), previous + 1, 30, 0.1)
    assert dead.check() == {"state": "failed", "exit_code": 2}
