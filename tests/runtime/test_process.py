"""Process groups and services: a killed driver's whole group is gone, and its locks free, when the kill returns; a
stopped service has ended every thread."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from runtime.process import LocalService, group_members, kill_process_group, process_alive


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


def test_a_service_whose_main_thread_ended_runs_until_its_last_thread_has(tmp_path):
    """A JVM in its shutdown hooks shows as a zombie (its main thread has ended) while its other threads run and its
    ports are still bound: the service is not stopped until every thread has ended, so that a restart on the same
    ports finds them free. Here the main thread ends and a second thread lives on (it then waits for the GIL the
    ended thread held forever: only a signal ends the process)."""
    service = LocalService("half-exited", tmp_path, tmp_path / "half-exited.log")
    ended = "import ctypes, threading, time; threading.Thread(target=time.sleep, args=(600,)).start(); "
    ended += "time.sleep(0.2); ctypes.CDLL(None).pthread_exit(None)"
    service.start([sys.executable, "-c", ended], env=os.environ, ports={}, ready=lambda: True, timeout_s=10)
    pid = service.pid()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the main thread never ended"
        time.sleep(0.05)
    assert process_alive(pid) and service.pid() == pid, "a zombie main thread, a live process"
    assert service.stop(timeout_s=5)
    assert not process_alive(pid) and service.pid() is None
