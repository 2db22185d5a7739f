"""At most one running driver per job version: an exclusive lease the driver holds while it lives.

Two drivers of one application id would share a checkpoint and changelog topics and write every
result twice: the classic duplicate of a retried or re-cleared Airflow task. Whoever launches a job
(a DAG run, a retry, a person with spark-submit), the driver itself takes the lease first and exits
with :data:`ALREADY_RUNNING` if another driver holds it.

The lease is an ``flock`` on ``<status_dir>/<application_id>.lease``. The kernel releases it when the
holder dies, even by kill -9, so there is no stale lease to expire and no window where a live holder
loses it. Each acquisition increments an epoch kept in the file (the fencing token): the status file
and the run report carry it, so a reader can tell which incarnation wrote what. ``flock`` needs the
status directory on one host's filesystem (the embedded stack; compose's shared volume); it is not
reliable on NFS. Across hosts, the writes themselves are fenced: :mod:`spark_jobs.state.fencing`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

from spark_jobs.documents import from_json, to_json
from spark_jobs.layout import JobLayout, StatusFiles

#: Exit code of a driver that found its job already running (spark_jobs/driver/run.py).
ALREADY_RUNNING = 3
#: Exit code of a driver another driver of its job version took over from, on any host (its writes were
#: refused: spark_jobs/state/fencing.py).
FENCED = 4
#: The lease record's size on disk: JSON padded with spaces (JSON allows trailing whitespace).
RECORD_BYTES = 512


@dataclasses.dataclass(frozen=True)
class LeaseHolder:
    """The lease record: who took the lease last (while the lease is held: who holds it)."""

    application_id: str = ""
    #: the fencing token: every acquisition takes the next one
    epoch: int = 0
    pid: int | None = None
    host: str | None = None
    acquired_at: str | None = None


class JobAlreadyRunning(RuntimeError):
    """Another driver of the same application id holds the lease."""

    def __init__(self, application_id: str, holder: LeaseHolder) -> None:
        self.holder = holder
        super().__init__(
            f"{application_id} is already running (pid {holder.pid} on {holder.host}, "
            f"epoch {holder.epoch}, since {holder.acquired_at}); not starting a second instance"
        )


def lease_path(status_dir: Path, application_id: str) -> Path:
    return StatusFiles(status_dir, application_id).lease


class JobLease:
    """The single-instance lease of one application id."""

    def __init__(self, status_dir: Path, application_id: str) -> None:
        self.application_id = application_id
        self.path = lease_path(status_dir, application_id)
        self._fd: int | None = None
        self.epoch: int | None = None

    def acquire(self) -> int:
        """Take the lease or raise :class:`JobAlreadyRunning`. Returns the new epoch."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise JobAlreadyRunning(self.application_id, holder) from None
        self.epoch = _read(fd).epoch + 1
        record = LeaseHolder(
            application_id=self.application_id,
            epoch=self.epoch,
            pid=os.getpid(),
            host=socket.gethostname(),
            acquired_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )
        # One fixed-size write in place, never truncate-then-write: a driver killed between the two would
        # leave an empty file and the next holder would start the epoch (the fencing token) over at 1.
        os.pwrite(fd, json.dumps(to_json(record)).encode().ljust(RECORD_BYTES), 0)
        if os.fstat(fd).st_size > RECORD_BYTES:  # a record written by an older version
            os.ftruncate(fd, RECORD_BYTES)
        os.fsync(fd)
        self._fd = fd
        return self.epoch

    def release(self) -> None:
        """Give the lease up (the file stays: it keeps the epoch)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def last_epoch(self) -> int:
        """The epoch of the latest acquisition (0: never acquired); the next holder's is higher."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return 0
        try:
            return _read(fd).epoch
        finally:
            os.close(fd)

    def holder(self) -> LeaseHolder | None:
        """Who holds the lease now, or None when nobody does (a supervisor's liveness check)."""
        if not self.path.exists():
            return None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def __enter__(self) -> JobLease:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> LeaseHolder:
    """The lease record (epoch 0: none written yet, or unreadable)."""
    try:
        return from_json(LeaseHolder, json.loads(os.pread(fd, 4096, 0) or b"{}"))
    except ValueError:
        return LeaseHolder()


@contextlib.contextmanager
def holding_version(layout: JobLayout) -> Iterator[None]:
    """Hold a job version's driver lease *and* its spare's and its standby's: nothing of the version can start
    or keep writing while the block runs (reset and purge delete what they write).

    Raises:
        JobAlreadyRunning: the driver, the spare or the standby runs (its ``application_id`` says which);
            nothing is held then.
    """
    with contextlib.ExitStack() as held:
        for name in (layout.spare.name, layout.driver.name, layout.standby.name):
            held.enter_context(JobLease(layout.status_dir, name))
        yield
