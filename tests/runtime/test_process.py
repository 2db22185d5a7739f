"""Process groups: a killed driver's whole group is gone, and its locks free, when the kill returns."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

from runtime.process import group_members, kill_process_group


def test_a_killed_group_has_let_go_of_its_grandchilds_lock_when_the_kill_returns(tmp_path):
    """As spark-submit's JVM starts the Python driver that holds the job's lease: the child starts a grandchild
    that takes a lock; after ``kill_process_group`` no process of the group runs and the lock is free."""
    lock, ready = tmp_path / "lease", tmp_path / "ready"
    holder = (
        "import fcntl, os, time; "
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
        f"open({str(ready)!r}, 'w').close(); time.sleep(600)"
    )
    child = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{holder}" & wait'], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline and child.poll() is None, "the grandchild never took its lock"
            time.sleep(0.02)
        assert len(group_members(child.pid)) == 2  # the child and the grandchild holding the lock

        kill_process_group(child.pid)

        assert group_members(child.pid) == []
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while a process of the group holds it
        finally:
            os.close(fd)
    finally:
        if child.poll() is None:
            kill_process_group(child.pid)
        child.wait(30)
