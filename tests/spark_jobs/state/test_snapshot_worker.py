"""SnapshotWorker's rules (spark_jobs/state/snapshotting.py): one snapshot at a time, off the caller's thread;
a failure is raised in the caller's thread at the next start; wait() joins the running one."""

from __future__ import annotations

import threading

import pytest

from spark_jobs.state.snapshotting import SnapshotWorker


def test_one_snapshot_at_a_time_in_a_thread_of_its_own_and_wait_joins_it():
    worker = SnapshotWorker()
    release, ran_in = threading.Event(), []

    def take():
        ran_in.append(threading.current_thread().name)
        release.wait(10)

    assert worker.start(take)
    assert worker.running
    assert not worker.start(lambda: ran_in.append("second"))  # due while one runs: skipped
    release.set()
    worker.wait()
    assert not worker.running
    assert ran_in == ["streamstate-snapshot"]
    assert worker.start(lambda: ran_in.append("third"))  # the next due one runs
    worker.wait()
    assert ran_in == ["streamstate-snapshot", "third"]


def test_a_failed_snapshot_is_raised_in_the_caller_s_thread_at_the_next_start_once():
    worker = SnapshotWorker()

    def take():
        raise OSError("table unreachable")

    assert worker.start(take)
    worker.wait()  # a run's end waits for it, without raising (the failure was logged)
    with pytest.raises(RuntimeError, match="last snapshot failed: table unreachable") as raised:
        worker.start(lambda: None)
    assert isinstance(raised.value.__cause__, OSError)
    assert worker.start(lambda: None)  # raised once; the next snapshot is taken
    worker.wait()
