"""The watch task's trigger on a real lease (flock): silent while the watched driver holds the lease (or a newer
one took it over: it watches that one), ``exited`` once the lease is free, ``timeout`` at the end of the window;
the operator's state rides in the event."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time

from streamstate.triggers.events import WaitOutcome
from streamstate.triggers.streaming_job import (
    LeaseTakenTrigger,
    StreamingJobExitedTrigger,
    StreamingJobStoppedTrigger,
)

from spark_jobs.driver.lease import JobLease, LeaseHolder

APP = "watched-v1"


def _first_event(trigger) -> WaitOutcome:
    """The trigger's first event, read back as a resumed operator reads it."""

    async def first():
        async for event in trigger.run():
            return event.payload

    payload = asyncio.run(first())
    assert json.loads(json.dumps(payload)) == payload  # what Airflow stores: JSON
    return WaitOutcome.of(payload)


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
    assert (event.state, event.epoch, event.carry) == ("exited", epoch, carry)
    assert time.monotonic() - released_at < 5

    newer = JobLease(tmp_path, APP)
    assert newer.acquire() == epoch + 1  # another driver took over (a spare driver): nothing to restart
    follows = StreamingJobExitedTrigger(APP, str(tmp_path), epoch, timeout_s=30, poll_s=0.1, carry=carry)
    assert follows.check() is None and follows.epoch == epoch + 1  # it watches the new driver
    threading.Timer(0.3, newer.release).start()
    assert _first_event(follows).epoch == epoch + 1  # and sees it exit
    newer.acquire()
    quiet = StreamingJobExitedTrigger(APP, str(tmp_path), epoch + 2, timeout_s=0.3, poll_s=0.1, carry=carry)
    assert _first_event(quiet) == WaitOutcome("timeout", timeout_s=0.3, carry=carry)
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
        assert (event.state, event.epoch, event.carry) == ("running", previous + 1, carry)
        lease.release()
    finally:
        launcher.kill()
        launcher.wait()
    exit_file.write_text("2")
    dead = LeaseTakenTrigger(APP, str(tmp_path), launcher.pid, str(exit_file), previous + 1, 30, 0.1)
    assert dead.check() == WaitOutcome("failed", exit_code=2)


def test_a_launch_its_task_never_waited_for_is_recorded_by_the_next_watch(tmp_path):
    """Airflow 3.3 can fail a watch that resumes from its deferral after it restarted the driver
    (apache/airflow#72716), so no task waits for that launch: the retried watch records its outcome from
    the lease and the driver's status, as the launch's trigger would have; a launch still starting is left."""
    import subprocess
    import sys

    from streamstate.hooks.streaming_job import StreamingJobHook
    from streamstate.operators.streaming_job import settle_unrecorded_launch
    from streamstate.supervision import Launch, locked_record, read_record

    from runtime.files import write_json_atomically
    from runtime.settings import Settings
    from spark_jobs.documents import to_json
    from spark_jobs.driver.lifecycle import JobState, PublishedStatus, status_path
    from spark_jobs.registry import get_job

    jobs = StreamingJobHook(get_job("purchase_counts"), Settings().replace(data_dir=tmp_path))
    app, status_dir = jobs.application_id, jobs.status_dir
    status_dir.mkdir(parents=True, exist_ok=True)
    previous = JobLease(status_dir, app).last_epoch()
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with locked_record(status_dir, app) as record:
            record.launches.append(
                Launch(at=time.time(), by="watch#1", launcher_pid=launcher.pid, exit_file=str(tmp_path / "x"))
            )
        assert settle_unrecorded_launch(jobs) is None  # launched, not running yet: its own wait is still due
        lease = JobLease(status_dir, app)
        epoch = lease.acquire()
        status = PublishedStatus(app, state=JobState.RUNNING, lease_epoch=epoch, pid=launcher.pid)
        write_json_atomically(status_path(status_dir, app), to_json(status))
        settled = settle_unrecorded_launch(jobs)
        assert settled is not None and (settled.outcome, settled.epoch) == ("running", previous + 1)
        assert read_record(status_dir, app).last_launch == settled
        assert settle_unrecorded_launch(jobs) is None  # recorded once
        lease.release()
    finally:
        launcher.kill()
        launcher.wait()


def test_an_operator_waits_in_its_worker_first_and_defers_only_for_the_rest(tmp_path):
    """Airflow 3.3 fails a deferred task whose trigger fires before the scheduler saw its worker leave the deferral
    (apache/airflow#67287): an operator waits for what its trigger waits for in its worker first, resumes at once
    when it comes (or the trigger's timeout passes) within the window, and defers only for what is left."""
    import pytest
    from airflow.sdk import BaseOperator
    from airflow.sdk.exceptions import TaskDeferred
    from streamstate.operators import deferral

    class Stopping(BaseOperator):
        def stopped(self, context, event):
            return {"resumed_with": event}

    operator = Stopping(task_id="stop")
    lease = JobLease(tmp_path, APP)
    lease.acquire()
    threading.Timer(0.3, lease.release).start()
    trigger = StreamingJobStoppedTrigger(APP, str(tmp_path), timeout_s=30, poll_s=0.1)
    result = deferral.defer_unless_settled(operator, {}, trigger, "stopped", within_s=5.0)
    assert result == {"resumed_with": {"state": "stopped"}}  # no deferral: the payload a resumed task gets

    lease.acquire()
    short = StreamingJobStoppedTrigger(APP, str(tmp_path), timeout_s=0.3, poll_s=0.1)
    assert deferral.defer_unless_settled(operator, {}, short, "stopped", within_s=5.0) == {
        "resumed_with": {"state": "timeout", "timeout_s": 0.3}
    }

    long = StreamingJobStoppedTrigger(APP, str(tmp_path), timeout_s=30, poll_s=0.1)
    with pytest.raises(TaskDeferred) as deferred:
        deferral.defer_unless_settled(operator, {}, long, "stopped", within_s=0.3)
    assert deferred.value.trigger is long and deferred.value.method_name == "stopped"
    assert 29 < long.timeout_s <= 29.7  # the deferral waits what is left of the 30 s, not 30 s more
    deferred_at = time.time()
    assert deferred_at - 1 < long.fires_after - deferral.DEFERRED_AT_LEAST_S <= deferred_at  # set as it deferred
    revived = StreamingJobStoppedTrigger(**long.serialize()[1])  # as the triggerer builds it
    assert (revived.timeout_s, revived.fires_after) == (long.timeout_s, long.fires_after)
    lease.release()


def test_a_deferred_trigger_fires_no_sooner_than_its_fires_after(tmp_path):
    """What the trigger waits for has happened, but the scheduler may not have seen the deferral yet
    (streamstate.operators.deferral): the event waits for ``fires_after``, and the wait counts towards the
    timeout."""
    fires_after = time.time() + 1.0
    gone = StreamingJobStoppedTrigger(APP, str(tmp_path), timeout_s=30, poll_s=0.1, fires_after=fires_after)
    assert gone.check() == WaitOutcome("stopped")  # it could fire now
    assert _first_event(gone) == WaitOutcome("stopped")
    assert time.time() >= fires_after

    lease = JobLease(tmp_path, APP)
    lease.acquire()
    started = time.monotonic()
    held = StreamingJobStoppedTrigger(APP, str(tmp_path), timeout_s=1.0, poll_s=0.1, fires_after=time.time() + 1.0)
    assert _first_event(held) == WaitOutcome("timeout", timeout_s=1.0)
    assert time.monotonic() - started < 1.8  # not 1 s of waiting, then the 1 s timeout
    lease.release()


def test_a_stopped_driver_is_stopped_once_its_process_has_exited(tmp_path):
    """A driver lets go of its lease before its interpreter has exited: on the driver's host the trigger waits for
    the process signalled as well, so that a stop that succeeded left no driver behind."""
    exiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    here = StreamingJobStoppedTrigger(
        APP, str(tmp_path), timeout_s=30, poll_s=0.1, pid=exiting.pid, host=socket.gethostname()
    )
    elsewhere = StreamingJobStoppedTrigger(APP, str(tmp_path), timeout_s=30, poll_s=0.1, pid=exiting.pid, host="b")
    assert here.check() is None, "the lease is free but the process lives"
    assert elsewhere.check() == WaitOutcome("stopped")  # another host's pid means nothing here
    assert _first_event(here) == WaitOutcome("stopped")  # exited: a zombie until reaped
    assert exiting.wait(timeout=1) == 0
    revived = StreamingJobStoppedTrigger(**here.serialize()[1])
    assert (revived.pid, revived.host) == (exiting.pid, socket.gethostname())


def test_an_outcome_survives_the_trip_through_airflow_and_reads_older_events():
    """A trigger's outcome is stored as JSON by the triggerer and read back by the resumed task: every field comes
    back typed (the holder a LeaseHolder again), and an event a trigger of the previous release stored (the same keys,
    ``final_state`` None spelled out, a key this release does not know) reads the same."""
    holder = LeaseHolder(APP, epoch=3, pid=42, host="a", acquired_at="2026-12-07T00:00:00+00:00")
    outcome = WaitOutcome("already_running", holder=holder, launch_at=1.5, version=2, carry={"launch_at": 1.5})
    payload = json.loads(json.dumps(outcome.payload()))
    assert WaitOutcome.of(payload) == outcome and WaitOutcome.of(payload).holder.epoch == 3
    caught_up = WaitOutcome("caught_up", committed={"purchases": {"0": 7, "1": 9}})
    assert WaitOutcome.of(json.loads(json.dumps(caught_up.payload()))) == caught_up
    older = {"state": "stopped", "final_state": None, "error": None, "from_a_newer_trigger": True}
    assert WaitOutcome.of(older) == WaitOutcome("stopped")
