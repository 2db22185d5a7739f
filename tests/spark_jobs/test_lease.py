"""At most one running driver per job version, whoever launches it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spark_jobs.generators import votes
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.lease import ALREADY_RUNNING, JobAlreadyRunning, JobLease
from spark_jobs.lifecycle import read_status
from spark_jobs.registry import get_job
from spark_jobs.submit import submit_spec


def test_second_holder_is_refused_and_epochs_increase(tmp_path):
    first = JobLease(tmp_path, "app-v1")
    assert first.acquire() == 1
    assert first.holder()["pid"] == os.getpid()
    with pytest.raises(JobAlreadyRunning, match=r"app-v1 is already running \(pid \d+ on .*epoch 1"):
        JobLease(tmp_path, "app-v1").acquire()
    first.release()
    assert first.holder() is None
    with JobLease(tmp_path, "app-v1") as second:
        assert second.epoch == 2


def test_the_lease_dies_with_its_holder_even_on_kill_9(tmp_path):
    code = ("import sys, time; from spark_jobs.lease import JobLease; "
            f"JobLease({str(tmp_path)!r}, 'app-v1').acquire(); print('held', flush=True); time.sleep(60)")  # fmt: skip
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert JobLease(tmp_path, "app-v1").holder()["pid"] == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        assert JobLease(tmp_path, "app-v1").acquire() == 2  # no stale lease to wait out
    finally:
        holder.kill()


@pytest.mark.integration
def test_a_second_driver_of_a_running_job_exits_without_touching_it(private_stack):
    settings = private_stack
    spec = get_job("vote_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    votes.produce(bootstrap, spec.source_topic, list(votes.generate(voters=50, seed=1)))
    submit = submit_spec(spec, settings)  # long-running
    env = {**os.environ, **submit.env}
    with open(settings.data_dir / "first-driver.log", "w") as log:
        first = subprocess.Popen(submit.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status = read_status(settings.status_dir, spec.application_id)
            if status and status["state"] == "RUNNING":
                break
            assert first.poll() is None, "first driver exited"
            time.sleep(1)
        before = read_status(settings.status_dir, spec.application_id)
        assert before["state"] == "RUNNING" and before["lease_epoch"] == 1

        # A retried task, a cleared task, an overlapping DAG run: all end up here.
        second = subprocess.run(submit.command(), env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode == ALREADY_RUNNING, second.stderr[-2000:]
        output = second.stdout + second.stderr
        assert f"{spec.application_id} is already running (pid" in output, output[-3000:]
        after = read_status(settings.status_dir, spec.application_id)
        assert after["pid"] == before["pid"] and after["lease_epoch"] == 1 and after["state"] == "RUNNING"
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(60)
    # Stopped cleanly (SIGTERM): the next start gets the lease with the next epoch.
    drain = submit_spec(spec, settings, available_now=True)
    proc = subprocess.run(drain.command(), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((settings.status_dir / f"{spec.application_id}.last-run.json").read_text())
    assert report["lease_epoch"] == 2
