"""Job lifecycle: Kafka Streams' state listener for a Spark job, published where Airflow can read it.

States and legal moves are explicit (a table keyed by name); :meth:`JobStatus.transition_to` is the
only way to change state and raises on an illegal move. The status, with the latest progress
numbers, is published as ``<status_dir>/<application_id>.status.json`` (written atomically: temp
file + rename), which Airflow's supervision reads. The file is the source of truth for "what is this
job doing right now"; ``updated_at`` tells a reader how fresh it is (a killed driver stops updating it).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from spark_jobs.layout import StatusFiles


class JobState(str, enum.Enum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


LEGAL_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.CREATED: frozenset({JobState.RESTORING, JobState.RUNNING, JobState.PENDING_SHUTDOWN, JobState.ERROR}),
    JobState.RESTORING: frozenset({JobState.RUNNING, JobState.PENDING_SHUTDOWN, JobState.ERROR}),
    JobState.RUNNING: frozenset({JobState.PENDING_SHUTDOWN, JobState.ERROR}),
    JobState.PENDING_SHUTDOWN: frozenset({JobState.NOT_RUNNING, JobState.ERROR}),
    JobState.ERROR: frozenset({JobState.PENDING_SHUTDOWN, JobState.NOT_RUNNING}),
    JobState.NOT_RUNNING: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A lifecycle move not in :data:`LEGAL_TRANSITIONS`."""


def progress_summary(progress: dict) -> dict:
    """The numbers on-call staff and supervision need from one StreamingQueryProgress (as JSON)."""
    lag: dict[str, int] = {}
    for source in progress.get("sources") or []:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for topic, parts in latest.items():
            for partition, offset in parts.items():
                lag[f"{topic}-{partition}"] = max(0, int(offset) - int(end.get(topic, {}).get(partition, 0)))
    operators = progress.get("stateOperators") or []
    rocksdb = {}
    for op in operators:
        for name, value in (op.get("customMetrics") or {}).items():
            if name.startswith("rocksdb"):
                rocksdb[name] = rocksdb.get(name, 0) + value
    return {
        "batch_id": progress.get("batchId"),
        "batch_duration_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
        # where the batch's time went (Spark's phases: getBatch, queryPlanning, addBatch, walCommit, ...)
        "phase_ms": dict(progress.get("durationMs") or {}),
        "input_rows": progress.get("numInputRows", 0),
        "input_rows_per_second": progress.get("inputRowsPerSecond"),
        "processed_rows_per_second": progress.get("processedRowsPerSecond"),
        "input_lag": lag,
        "state_rows": sum(op.get("numRowsTotal", 0) for op in operators),
        "state_memory_bytes": sum(op.get("memoryUsedBytes", 0) for op in operators),
        "rocksdb": rocksdb,
        "progress_at": progress.get("timestamp"),
    }


def _offsets(value) -> dict:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


@dataclasses.dataclass
class JobStatus:
    """The lifecycle of one run of a job version, published to a status file on every change."""

    application_id: str
    path: Path
    state: JobState = JobState.CREATED
    progress: dict = dataclasses.field(default_factory=dict)
    restore: dict = dataclasses.field(default_factory=dict)
    error: str | None = None
    #: the single-instance lease epoch of this run (spark_jobs/lease.py): which incarnation publishes
    lease_epoch: int | None = None
    #: store -> the latest Delta state snapshot this run took
    snapshots: dict = dataclasses.field(default_factory=dict)
    #: the driver's Spark UI, linked from the Airflow page
    spark_ui: str | None = None
    #: the last time Spark reported the query idle (no new input): alive without progress events
    idle_at: str | None = None
    #: the first micro-batch of this run (it catches up after a start: supervision does not hold it to the budget)
    first_batch_id: int | None = None
    #: where this driver serves Prometheus metrics (spark_jobs/metrics.py), None: not serving
    metrics_port: int | None = None
    #: dead letters this run wrote, by reason (spark_jobs/dead_letter.py)
    dead_letters: dict = dataclasses.field(default_factory=dict)
    listeners: list[Callable[[JobState, JobState], None]] = dataclasses.field(default_factory=list)
    #: called with every document published, under the status lock (the driver's metrics follow it)
    publish_listeners: list[Callable[[dict], None]] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at = _now()
        self.publish()

    def transition_to(self, new: JobState, error: str | None = None) -> None:
        with self._lock:
            old = self.state
            if new not in LEGAL_TRANSITIONS[old]:
                raise IllegalTransition(f"{self.application_id}: illegal lifecycle move {old.value} -> {new.value}")
            self.state = new
            if error:
                self.error = error
            self._publish_locked()
        for listener in self.listeners:  # outside the lock, as Kafka Streams does
            listener(old, new)

    def record_progress(self, progress: dict) -> None:
        with self._lock:
            self.progress = progress_summary(progress)
            if self.first_batch_id is None:
                self.first_batch_id = self.progress.get("batch_id")
            self._publish_locked()

    def record_idle(self, timestamp: str) -> None:
        with self._lock:
            self.idle_at = timestamp
            self._publish_locked()

    def record_restore_progress(self, store: str, **numbers: object) -> None:
        with self._lock:
            self.restore = {**self.restore, store: {**self.restore.get(store, {}), **numbers}}
            self._publish_locked()

    def record_dead_letters(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self.dead_letters = {
                r: self.dead_letters.get(r, 0) + counts.get(r, 0) for r in {*self.dead_letters, *counts}
            }
            self._publish_locked()

    def record_snapshot(self, store: str, snapshot: dict) -> None:
        with self._lock:
            self.snapshots = {**self.snapshots, store: snapshot}
            self._publish_locked()

    def publish(self) -> None:
        with self._lock:
            self._publish_locked()

    def _publish_locked(self) -> None:
        document = {
            "application_id": self.application_id,
            "state": self.state.value,
            "error": self.error,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": self.started_at,
            "updated_at": _now(),
            "progress": self.progress,
            "restore": self.restore,
            "lease_epoch": self.lease_epoch,
            "snapshots": self.snapshots,
            "spark_ui": self.spark_ui,
            "idle_at": self.idle_at,
            "first_batch_id": self.first_batch_id,
            "metrics_port": self.metrics_port,
            "dead_letters": self.dead_letters,
        }
        for listener in self.publish_listeners:
            listener(document)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(document, indent=2, sort_keys=True))
        tmp.replace(self.path)


def status_path(status_dir: Path, application_id: str) -> Path:
    return StatusFiles(status_dir, application_id).lifecycle


def read_status(status_dir: Path, application_id: str) -> dict | None:
    """What Airflow calls: the published status, or None when the job never ran here."""
    try:
        return json.loads(status_path(status_dir, application_id).read_text())
    except FileNotFoundError:
        return None


#: the state of a job version that has no status here: no driver of it ever published one
NEVER_RAN = "NEVER_RAN"


def published_by_holder(status: Mapping | None, holder: Mapping | None) -> bool:
    """The one liveness rule: ``status`` (a published status document) is the word of the driver that holds the
    job version's lease now (``holder``, see :meth:`spark_jobs.lease.JobLease.holder`). A killed driver's
    last status says RUNNING forever; the kernel drops its lease when it dies, and the lease's epoch tells a
    new driver's status from the one its predecessor left."""
    if not status or holder is None or status.get("lease_epoch") is None:
        return False
    return status.get("lease_epoch") == holder.get("epoch")


@dataclasses.dataclass(frozen=True)
class DriverView:
    """One look at a job version's driver: its published status and the lease's holder, read together."""

    #: the published status document (None: no driver ever published one here)
    status: Mapping | None
    #: the lease's holder (None: no driver runs)
    holder: Mapping | None

    @property
    def alive(self) -> bool:
        """The status is the running driver's own (:func:`published_by_holder`)."""
        return published_by_holder(self.status, self.holder)

    @property
    def state(self) -> str:
        """What the job is doing now: its published state while its driver holds the lease, else
        ``NOT_RUNNING`` (:data:`NEVER_RAN` without a status)."""
        if self.alive:
            return self.status.get("state") or JobState.CREATED.value
        return JobState.NOT_RUNNING.value if self.status else NEVER_RAN

    def summary(self) -> str:
        """The answer on-call reads: ``RUNNING at batch 12``; ``DOWN since <time>, last RUNNING at batch 12``
        when the driver is gone (never its last state as if current); ``STARTING`` when a new driver holds the
        lease and has not published yet."""
        if self.status is None:
            return NEVER_RAN if self.holder is None else "STARTING"
        batch = (self.status.get("progress") or {}).get("batch_id")
        at = f" at batch {batch}" if batch is not None else ""
        if self.alive:
            return f"{self.state}{at}"
        if self.holder is not None:
            return f"STARTING (the previous driver's last state: {self.status.get('state')}{at})"
        return f"DOWN since {self.status.get('updated_at')}, last {self.status.get('state')}{at}"


def observe_driver(status_dir: Path, application_id: str) -> DriverView:
    """The driver of ``application_id`` as a reader sees it now (status file and lease)."""
    from spark_jobs.lease import JobLease

    return DriverView(read_status(status_dir, application_id), JobLease(status_dir, application_id).holder())


def current_state(status_dir: Path, application_id: str) -> str:
    """What the job is doing now (:attr:`DriverView.state`)."""
    return observe_driver(status_dir, application_id).state


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
