"""The job processes running on this host: every driver, spare driver and warm standby of a registered job version
(``make down`` stops them before the stack; so does the production shape's)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time

from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.layout import spare_name, standby_name
from spark_jobs.registry import registered_versions


def stop_job_processes(settings: Settings, timeout_s: float = 90.0) -> list[str]:
    """Stop every driver, spare driver and warm standby of a registered job version that runs on this host: SIGTERM
    (a driver stops its queries cleanly), SIGKILL what still holds its lease after ``timeout_s``.
    Their supervision records are left as they are: started again, Airflow resumes supervising them.
    Returns the names stopped."""
    names = [
        name
        for versions in registered_versions().values()
        for spec in versions.values()
        # the spares first: a spare that outlived its driver's stop would stand down anyway, but never race it
        for name in (spare_name(spec.application_id), spec.application_id, standby_name(spec.application_id))
    ]
    running = {}
    for name in names:
        holder = JobLease(settings.status_dir, name).holder()
        if holder is not None and holder.host == socket.gethostname():
            running[name] = holder.pid
    for pid in running.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(JobLease(settings.status_dir, n).holder() for n in running):
        time.sleep(0.5)
    for name, pid in running.items():
        if JobLease(settings.status_dir, name).holder() is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return sorted(running)
