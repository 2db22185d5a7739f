"""At most one running driver per job version, whoever launches it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from spark_jobs.driver.lease import ALREADY_RUNNING, RECORD_BYTES, JobAlreadyRunning, JobLease, lease_path
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.driver.submit import submit_spec
from spark_jobs.registry import get_job


def test_second_holder_is_refused_and_epochs_increase(tmp_path):
    first = JobLease(tmp_path, "app-v1")
    assert first.acquire() == 1
    assert first.holder().pid == os.getpid()
    with pytest.raises(JobAlreadyRunning, match=r"app-v1 is already running \(pid \d+ on .*epoch 1"):
        JobLease(tmp_path, "app-v1").acquire()
    first.release()
    assert first.holder() is None
    with JobLease(tmp_path, "app-v1") as second:
        assert second.epoch == 2


def test_the_record_is_rewritten_in_place_at_a_fixed_size(tmp_path):
    """Never truncated to empty on the way (a kill there would reset the epoch); an older, longer
    record is cut to size and the epoch still counts on from it."""
    path = lease_path(tmp_path, "app-v1")
    path.write_text('{"epoch": 41, "pid": 1234567, "host": "' + "h" * 900 + '"}')
    with JobLease(tmp_path, "app-v1") as lease:
        assert lease.epoch == 42
    assert path.stat().st_size == RECORD_BYTES
    with JobLease(tmp_path, "app-v1") as lease:
        assert lease.epoch == 43 and lease.holder().epoch == 43
    assert path.stat().st_size == RECORD_BYTES and JobLease(tmp_path, "app-v1").last_epoch() == 43


def test_the_lease_dies_with_its_holder_even_on_kill_9(tmp_path):
    code = (
        "import sys, time; from spark_jobs.driver.lease import JobLease; "
        f"JobLease({str(tmp_path)!r}, 'app-v1').acquire(); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert JobLease(tmp_path, "app-v1").holder().pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert JobLease(tmp_path, "app-v1").acquire() == 2  # no stale lease to wait out
    finally:
        holder.kill()


@pytest.mark.integration
def test_a_second_driver_of_a_running_job_exits_without_touching_it(settings, tmp_path):
    """A real spark-submit of a job whose lease is held (here by this test process, standing in for
    the running driver: the full running-driver race is in tests/plugins/test_supervise_dags.py)
    exits with code 3 before it touches the checkpoint, topics or status."""
    settings = settings.replace(data_dir=tmp_path)  # no broker needed: nothing runs before the lease
    spec = get_job("vote_counts")
    holder = JobLease(settings.status_dir, spec.application_id)
    epoch = holder.acquire()
    try:
        submit = submit_spec(spec, settings)
        second = subprocess.run(
            submit.command(), env={**os.environ, **submit.env}, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == ALREADY_RUNNING, second.stderr[-2000:]
        output = second.stdout + second.stderr
        assert f"{spec.application_id} is already running (pid {os.getpid()}" in output, output[-3000:]
        assert read_status(settings.status_dir, spec.application_id) is None  # nothing was published
        assert not (settings.checkpoints / spec.application_id).exists()  # nor written
    finally:
        holder.release()
    # Released: the next holder gets the next epoch (the fencing token).
    with JobLease(settings.status_dir, spec.application_id) as after:
        assert after.epoch == epoch + 1
