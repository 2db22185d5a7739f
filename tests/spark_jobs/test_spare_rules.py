"""The spare driver's rules (spark_jobs/driver/spare.py), without Spark: when it takes over and when it stands down.

The "driver" here is a real process holding the real lease and publishing the real status document; the spare
watches it exactly as it watches a Spark driver (a warm-up is not part of these rules and is skipped).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runtime.settings import Settings
from spark_jobs.driver import spare as spare_module
from spark_jobs.driver.lease import JobLease, LeaseHolder
from spark_jobs.driver.lifecycle import (
    BatchProgress,
    JobState,
    PublishedStatus,
    SpareState,
    read_spare_status,
    read_status,
)
from spark_jobs.driver.spare import SpareDriver, driver_died, driver_settled, spare_driver_settings
from spark_jobs.registry import JobSpec

DRIVER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from spark_jobs.driver.lease import JobLease
    from spark_jobs.driver.lifecycle import JobState, JobStatus, status_path

    status_dir, app, ending = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    lease = JobLease(status_dir, app)
    status = JobStatus(app, status_path(status_dir, app), lease_epoch=lease.acquire())
    if ending != "dies_starting":
        status.transition_to(JobState.RUNNING)
    print("running", flush=True)
    if ending == "stops":
        sys.stdin.readline()
        status.transition_to(JobState.PENDING_SHUTDOWN)
        status.transition_to(JobState.NOT_RUNNING)
    elif ending == "fails":
        sys.stdin.readline()
        status.transition_to(JobState.ERROR, error="RuntimeError: boom")
    else:
        time.sleep(600)
    """
)


@pytest.mark.parametrize(
    ("state", "same_epoch", "died"),
    [
        (JobState.RUNNING, True, True),
        (JobState.RESTORING, True, True),
        (JobState.CREATED, True, True),
        (JobState.NOT_RUNNING, True, False),
        (JobState.PENDING_SHUTDOWN, True, False),
        (JobState.ERROR, True, False),
        (JobState.NOT_RUNNING, False, True),  # an earlier driver's goodbye says nothing of this one
    ],
)
def test_a_driver_died_unless_it_said_it_ended(state, same_epoch, died):
    status = PublishedStatus("job-v1", state=state, lease_epoch=5 if same_epoch else 4)
    assert driver_died(5, status) is died
    assert driver_died(5, None) is True  # gone before it published anything


@pytest.fixture
def settings(settings, tmp_path):
    """A status directory of each test's own: the lease epochs below count from 1."""
    return settings.replace(data_dir=tmp_path)


@pytest.fixture
def spec(settings) -> JobSpec:
    return JobSpec(
        name="spare_rules",
        version=1,
        source_topic="spare-rules-in",
        key_field="k",
        output_table="spare_rules",
        entrypoint="tests.nowhere:build",
    )


def _driver(settings, spec, ending: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(settings.status_dir), spec.application_id, ending],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "running"
    return proc


@pytest.fixture
def ready_spare(settings, spec, monkeypatch):
    monkeypatch.setattr(spare_module, "warm_up", lambda spark, spec, settings, run_job, stop_requested=None: None)
    settings.status_dir.mkdir(parents=True, exist_ok=True)
    spare = SpareDriver(spec, settings, run_job=lambda *args, **kwargs: pytest.fail("no rehearsal here"))
    spare.prepare(lambda: None)
    yield spare
    spare.own_lease.release()


def test_the_spare_takes_over_a_killed_driver_within_a_poll(settings, spec, ready_spare):
    driver = _driver(settings, spec, "killed")
    assert ready_spare.wait_for_takeover(timeout_s=0.5) is None  # it runs: the spare waits
    assert read_spare_status(settings.status_dir, spec.application_id).watching_epoch == 1
    killed_at = time.monotonic()
    os.kill(driver.pid, signal.SIGKILL)
    takeover = ready_spare.wait_for_takeover(timeout_s=10)
    took_s = time.monotonic() - killed_at
    driver.wait()
    assert takeover is not None and (takeover.from_epoch, takeover.epoch) == (1, 2)
    assert took_s < 2.0, took_s  # a poll (0.1 s), not a restart
    assert JobLease(settings.status_dir, spec.application_id).holder().pid == os.getpid()
    status = read_spare_status(settings.status_dir, spec.application_id)
    assert status.state is SpareState.TAKING_OVER and (status.took_over_from, status.took_over_epoch) == (1, 2)
    assert JobLease(settings.status_dir, f"{spec.application_id}.spare").holder() is None  # its own lease let go
    takeover.lease.release()


@pytest.mark.parametrize("ending", ["stops", "fails"])
def test_the_spare_stands_down_when_the_driver_ended_on_its_own(settings, spec, ready_spare, ending):
    driver = _driver(settings, spec, ending)
    assert ready_spare.wait_for_takeover(timeout_s=0.5) is None
    driver.stdin.write("end\n")
    driver.stdin.flush()
    driver.wait(10)
    assert ready_spare.wait_for_takeover(timeout_s=1.0) is None  # a stop stays a stop; a failure is supervision's
    assert JobLease(settings.status_dir, spec.application_id).holder() is None
    assert read_spare_status(settings.status_dir, spec.application_id).state is SpareState.READY
    assert read_status(settings.status_dir, spec.application_id).lease_epoch == 1  # nobody took the lease

    # the next driver supervision starts is the one it watches, and takes over when it dies
    second = _driver(settings, spec, "killed")
    assert ready_spare.wait_for_takeover(timeout_s=0.5) is None
    second.kill()
    second.wait()
    takeover = ready_spare.wait_for_takeover(timeout_s=10)
    assert takeover is not None and (takeover.from_epoch, takeover.epoch) == (2, 3)
    takeover.lease.release()


def test_a_driver_that_dies_before_publishing_is_taken_over(settings, spec, ready_spare):
    driver = _driver(settings, spec, "dies_starting")
    assert ready_spare.wait_for_takeover(timeout_s=0.5) is None
    driver.kill()
    driver.wait()
    assert read_status(settings.status_dir, spec.application_id).state is JobState.CREATED
    takeover = ready_spare.wait_for_takeover(timeout_s=10)
    assert takeover is not None
    takeover.lease.release()


def test_a_spare_never_starts_a_job_that_is_not_running(settings, spec, ready_spare):
    assert ready_spare.wait_for_takeover(timeout_s=0.5) is None
    assert JobLease(settings.status_dir, spec.application_id).holder() is None


def test_one_spare_per_job_version_and_a_stop(settings, spec, ready_spare):
    from spark_jobs.driver.lease import JobAlreadyRunning

    with pytest.raises(JobAlreadyRunning):
        SpareDriver(spec, settings, run_job=lambda *a, **k: None).prepare(
            lambda: pytest.fail("a second spare must not start Spark")
        )
    ready_spare.stop()
    assert read_spare_status(settings.status_dir, spec.application_id).state is SpareState.NOT_RUNNING
    assert JobLease(settings.status_dir, f"{spec.application_id}.spare").holder() is None


def test_the_dead_drivers_orphaned_jvm_is_ended_and_nothing_else(tmp_path):
    import socket

    java = tmp_path / "java"  # a process whose command line says java, as a Spark JVM's does
    java.symlink_to("/bin/sleep")
    orphan, other = subprocess.Popen([str(java), "60"]), subprocess.Popen(["/bin/sleep", "60"])
    try:
        # Popen returns once the child's exec began; its /proc command line is empty until the kernel has set up
        # the new program's arguments, a window a loaded machine can stretch (this test failed in CI once so).
        deadline = time.monotonic() + 10
        while not all(Path(f"/proc/{p.pid}/cmdline").read_bytes() for p in (orphan, other)):
            assert time.monotonic() < deadline, "the children never showed their command lines"
            time.sleep(0.01)
        here = socket.gethostname()

        def status(pid, epoch=3, host=here):
            return PublishedStatus("job-v1", state=JobState.RUNNING, lease_epoch=epoch, jvm_pid=pid, host=host)

        assert spare_module.end_orphaned_jvm(3, status(other.pid)) is None  # not a JVM: a reused pid
        assert spare_module.end_orphaned_jvm(3, status(orphan.pid, epoch=2)) is None  # an older driver's word
        assert spare_module.end_orphaned_jvm(3, status(orphan.pid, host="elsewhere")) is None
        assert spare_module.end_orphaned_jvm(3, status(os.getpid())) is None  # never itself
        assert other.poll() is None and orphan.poll() is None
        assert spare_module.end_orphaned_jvm(3, status(orphan.pid)) == orphan.pid
        assert orphan.wait(5) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for proc in (orphan, other):
            proc.kill()
            proc.wait()


def test_a_spare_warms_up_once_the_driver_is_past_its_first_batches():
    holder = LeaseHolder("job-v1", epoch=4, pid=1)

    def status(state=JobState.RUNNING, epoch=4, first=10, batch=None, idle_at=None):
        progress = BatchProgress(batch_id=batch) if batch is not None else None
        return PublishedStatus(
            "job-v1", state=state, lease_epoch=epoch, first_batch_id=first, progress=progress, idle_at=idle_at
        )

    assert driver_settled(None, None)  # no driver: nothing to compete with
    assert not driver_settled(None, holder)  # started, not published yet
    assert not driver_settled(status(JobState.RESTORING), holder)
    assert not driver_settled(status(batch=10), holder)  # its first batch (a catch-up) just ended
    assert driver_settled(status(batch=11), holder)
    assert driver_settled(status(first=None, idle_at="2026-11-29T00:00:00+00:00"), holder)  # no input: idle
    assert not driver_settled(status(batch=11, epoch=3), holder)  # an earlier driver's word


def test_a_spare_drivers_jvm_commits_its_whole_heap_at_start_unless_the_deployment_says_otherwise():
    settings = Settings(spark_driver_memory="3g", spark_driver_java_options="-XX:+UseParallelGC")
    assert spare_driver_settings(settings).spark_driver_java_options == "-Xms3g -XX:+UseParallelGC"
    assert spare_driver_settings(Settings()).spark_driver_java_options == f"-Xms{Settings().spark_driver_memory}"
    # a deployment's own -Xms comes after the spare's on the JVM's command line, and the JVM takes the last
    options = shlex.split(
        spare_driver_settings(Settings(spark_driver_java_options="-Xms512m")).spark_driver_java_options
    )
    assert [o for o in options if o.startswith("-Xms")][-1] == "-Xms512m"
