"""Job lifecycle: Kafka Streams' state listener for a Spark job (and for its warm standby), published where
Airflow can read it.

States and legal moves are explicit (:class:`StateMachine`, a table keyed by name); a driver's
:meth:`JobStatus.transition_to` and the standby's ``SnapshotFollower.transition_to`` are the only ways to
change state and raise :class:`IllegalTransition` on an illegal move. What a process publishes is a typed
document both sides share: the driver writes :class:`PublishedStatus` to ``<status_dir>/<application_id>.status.json``
(atomically: temp file + rename) and Airflow, the jobs page, the state API and the benchmarks read it back
with :func:`read_status`; the standby's is :class:`StandbyStatus`. The file is the source of truth for "what
is this job doing right now"; ``updated_at`` tells a reader how fresh it is (a killed driver stops updating
it), and :func:`published_by_holder` is the one rule that tells a live driver's word from a dead one's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from runtime.files import write_json_atomically
from spark_jobs.documents import from_json, to_json
from spark_jobs.layout import StatusFiles, spare_name, spare_status_file, standby_name, standby_status_file

if TYPE_CHECKING:
    from spark_jobs.driver.lease import LeaseHolder

S = TypeVar("S", bound=enum.Enum)
#: a status document a lease holder publishes (a driver's, a spare driver's, a warm standby's)
Published = TypeVar("Published")


class IllegalTransition(RuntimeError):
    """A lifecycle move its :class:`StateMachine` does not allow."""


class StateMachine(Generic[S]):
    """Named states and the moves between them: the one guard both the driver and the standby change state through."""

    def __init__(self, kind: str, moves: Mapping[S, Iterable[S]]) -> None:
        self.kind = kind
        self.moves: dict[S, frozenset[S]] = {state: frozenset(targets) for state, targets in moves.items()}

    def check(self, who: str, old: S, new: S) -> None:
        """Raise :class:`IllegalTransition` unless ``old -> new`` is a legal move."""
        if new not in self.moves[old]:
            raise IllegalTransition(f"{who}: illegal {self.kind} move {old.value} -> {new.value}")


class JobState(str, enum.Enum):
    CREATED = "CREATED"
    RESTORING = "RESTORING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


JOB_LIFECYCLE: StateMachine[JobState] = StateMachine(
    "lifecycle",
    {
        JobState.CREATED: {JobState.RESTORING, JobState.RUNNING, JobState.PENDING_SHUTDOWN, JobState.ERROR},
        JobState.RESTORING: {JobState.RUNNING, JobState.PENDING_SHUTDOWN, JobState.ERROR},
        JobState.RUNNING: {JobState.PENDING_SHUTDOWN, JobState.ERROR},
        JobState.PENDING_SHUTDOWN: {JobState.NOT_RUNNING, JobState.ERROR},
        JobState.ERROR: {JobState.PENDING_SHUTDOWN, JobState.NOT_RUNNING},
        JobState.NOT_RUNNING: set(),
    },
)


class FollowerState(str, enum.Enum):
    """The warm standby's states (spark_jobs/operations/standby): it catches up after a start, then follows the head."""

    CREATED = "CREATED"
    CATCHING_UP = "CATCHING_UP"  # reading the changelog backlog after a start
    FOLLOWING = "FOLLOWING"  # at the changelog's head, committing every interval
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


FOLLOWER_LIFECYCLE: StateMachine[FollowerState] = StateMachine(
    "standby",
    {
        FollowerState.CREATED: {FollowerState.CATCHING_UP, FollowerState.PENDING_SHUTDOWN, FollowerState.ERROR},
        FollowerState.CATCHING_UP: {FollowerState.FOLLOWING, FollowerState.PENDING_SHUTDOWN, FollowerState.ERROR},
        FollowerState.FOLLOWING: {FollowerState.CATCHING_UP, FollowerState.PENDING_SHUTDOWN, FollowerState.ERROR},
        FollowerState.PENDING_SHUTDOWN: {FollowerState.NOT_RUNNING, FollowerState.ERROR},
        FollowerState.ERROR: {FollowerState.NOT_RUNNING},
        FollowerState.NOT_RUNNING: set(),
    },
)


class SpareState(str, enum.Enum):
    """The spare driver's states (spark_jobs/driver/spare.py): it warms its JVM up, then waits to take over."""

    CREATED = "CREATED"
    WARMING = "WARMING"  # waiting for the driver to settle, then starting Spark and running the warm-up
    READY = "READY"  # warm, watching the driver's lease
    TAKING_OVER = "TAKING_OVER"  # holds the driver's lease: from here on it is the driver (its own status)
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    ERROR = "ERROR"


SPARE_LIFECYCLE: StateMachine[SpareState] = StateMachine(
    "spare",
    {
        SpareState.CREATED: {SpareState.WARMING, SpareState.PENDING_SHUTDOWN, SpareState.ERROR},
        SpareState.WARMING: {SpareState.READY, SpareState.PENDING_SHUTDOWN, SpareState.ERROR},
        SpareState.READY: {SpareState.TAKING_OVER, SpareState.PENDING_SHUTDOWN, SpareState.ERROR},
        SpareState.TAKING_OVER: set(),
        SpareState.PENDING_SHUTDOWN: {SpareState.NOT_RUNNING, SpareState.ERROR},
        SpareState.ERROR: {SpareState.NOT_RUNNING},
        SpareState.NOT_RUNNING: set(),
    },
)


# -- what a driver publishes ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BatchProgress:
    """The numbers on-call staff and supervision need from one StreamingQueryProgress."""

    batch_id: int | None = None
    batch_duration_ms: int | None = None
    #: where the batch's time went (Spark's phases: getBatch, queryPlanning, addBatch, walCommit, ...)
    phase_ms: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: where ``addBatch`` went in the platform's batch function (state, dead_letters, outputs, changelog, snapshot;
    #: ``JobContext.state_change_sink``); empty for a batch it did not run
    sink_phase_ms: Mapping[str, int] = dataclasses.field(default_factory=dict)
    input_rows: int = 0
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    #: ``<topic>-<partition>`` -> records not yet read
    input_lag: Mapping[str, int] = dataclasses.field(default_factory=dict)
    state_rows: int = 0
    state_memory_bytes: int = 0
    rocksdb: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: when the batch's trigger began (ISO-8601; Spark's ``timestamp``): it ended ``batch_duration_ms`` later
    progress_at: str | None = None

    @classmethod
    def of(cls, progress: Mapping, sink_phase_ms: Mapping[str, int] | None = None) -> BatchProgress:
        """From Spark's StreamingQueryProgress as JSON (``json.loads(event.progress.json)``), and the batch
        function's own phases of that batch."""
        lag = input_lag_of(progress)
        operators = progress.get("stateOperators") or []
        rocksdb: dict[str, float] = {}
        for op in operators:
            for name, value in (op.get("customMetrics") or {}).items():
                if name.startswith("rocksdb"):
                    rocksdb[name] = rocksdb.get(name, 0) + value
        return cls(
            batch_id=progress.get("batchId"),
            batch_duration_ms=(progress.get("durationMs") or {}).get("triggerExecution"),
            phase_ms=dict(progress.get("durationMs") or {}),
            sink_phase_ms=dict(sink_phase_ms or {}),
            input_rows=progress.get("numInputRows", 0),
            input_rows_per_second=progress.get("inputRowsPerSecond"),
            processed_rows_per_second=progress.get("processedRowsPerSecond"),
            input_lag=lag,
            state_rows=sum(op.get("numRowsTotal", 0) for op in operators),
            state_memory_bytes=sum(op.get("memoryUsedBytes", 0) for op in operators),
            rocksdb=rocksdb,
            progress_at=progress.get("timestamp"),
        )

    @property
    def total_lag(self) -> int:
        return sum(self.input_lag.values())


def input_lag_of(progress: Mapping) -> dict[str, int]:
    """Records a query has not read yet, per ``<topic>-<partition>``, from its StreamingQueryProgress (as JSON)."""
    lag: dict[str, int] = {}
    for source in progress.get("sources") or []:
        end, latest = _offsets(source.get("endOffset")), _offsets(source.get("latestOffset"))
        for topic, parts in latest.items():
            for partition, offset in parts.items():
                lag[f"{topic}-{partition}"] = max(0, int(offset) - int(end.get(topic, {}).get(partition, 0)))
    return lag


def _offsets(value) -> dict:
    if isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


@dataclasses.dataclass(frozen=True)
class StoreRestore:
    """One store's restore in this run: its progress while it reads, then what it restored
    (``spark_jobs.state.restore.RestoredState.summary``)."""

    topic: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    records_read: int | None = None
    batch_id: int | None = None
    keys: int | None = None
    in_spark: bool | None = None
    full_replay: bool | None = None
    snapshot_version: int | None = None
    snapshot_batch_id: int | None = None
    changelog_records_read: int | None = None
    changelog_records_applied: int | None = None
    input_offsets: Mapping[str, Mapping[int, int]] = dataclasses.field(default_factory=dict)
    seconds: float | None = None
    next_batch_id: int | None = None
    watermark_ms: int | None = None
    snapshot_rows: int | None = None
    snapshot_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class SnapshotTaken:
    """The latest Delta state snapshot of a store this run took (``spark_jobs.state.snapshots.SnapshotInfo``)."""

    batch_id: int
    taken_at: str
    delta_version: int | None = None
    rows: int | None = None
    bytes: int = 0
    mode: str = "full"
    base_rows: int | None = None
    layer_rows: int = 0
    layers: int = 0
    #: the rows a reader of the snapshot reads (base and layers)
    rows_scanned: int | None = None

    @classmethod
    def of(cls, info) -> SnapshotTaken:
        """From a ``SnapshotInfo``."""
        return cls(
            batch_id=info.batch_id,
            taken_at=info.taken_at,
            delta_version=info.delta_version,
            rows=info.rows,
            bytes=info.bytes,
            mode=info.mode,
            base_rows=info.base_rows,
            layer_rows=info.layer_rows,
            layers=info.layers,
            rows_scanned=info.rows_scanned,
        )


@dataclasses.dataclass(frozen=True)
class PublishedStatus:
    """What a driver publishes on every change of its run (:class:`JobStatus`) and Airflow reads (:func:`read_status`)."""

    application_id: str
    state: JobState = JobState.CREATED
    error: str | None = None
    pid: int | None = None
    host: str | None = None
    started_at: str | None = None
    #: when the driver last published (a killed driver stops updating it)
    updated_at: str | None = None
    #: the latest micro-batch (None: none finished in this run yet)
    progress: BatchProgress | None = None
    #: store -> its restore in this run
    restore: Mapping[str, StoreRestore] = dataclasses.field(default_factory=dict)
    #: the single-instance lease epoch of this run (spark_jobs/driver/lease.py): which incarnation publishes
    lease_epoch: int | None = None
    #: store -> the latest Delta state snapshot this run took
    snapshots: Mapping[str, SnapshotTaken] = dataclasses.field(default_factory=dict)
    #: the driver's Spark UI, linked from the Airflow page
    spark_ui: str | None = None
    #: the pid of the driver's Spark JVM (a spare driver ends a dead driver's orphaned JVM: spark_jobs/driver/spare.py)
    jvm_pid: int | None = None
    #: the last time Spark reported the query idle (no new input): alive without progress events
    idle_at: str | None = None
    #: the first micro-batch of this run (it catches up after a start: supervision does not hold it to the budget)
    first_batch_id: int | None = None
    #: where this driver serves Prometheus metrics (spark_jobs/driver/metrics.py), None: not serving
    metrics_port: int | None = None
    #: dead letters this run wrote, by reason (spark_jobs/io/dead_letter.py)
    dead_letters: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: a job that re-keys its source (``JobSpec.repartition``): source records its re-keying stage has not
    #: read yet, per ``<topic>-<partition>`` (the progress's lag is the stateful stage's, in its repartition topic)
    rekeying_lag: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def batch_id(self) -> int | None:
        """The latest micro-batch's id (None: none finished in this run yet)."""
        return self.progress.batch_id if self.progress else None

    @property
    def input_lag(self) -> dict[str, int]:
        """Records not read yet per ``<topic>-<partition>``: the stateful stage's, and the re-keying stage's."""
        return {**(self.progress.input_lag if self.progress else {}), **self.rekeying_lag}

    @property
    def input_lag_records(self) -> int | None:
        """Every record of the job's input not read yet (None: no micro-batch reported yet)."""
        if self.progress is None and not self.rekeying_lag:
            return None
        return sum(self.input_lag.values())


class JobStatus:
    """The lifecycle of one run of a job version, kept as the :class:`PublishedStatus` it publishes: each change
    makes the next document (under a lock) and publishes it, to ``publish_listeners`` (the driver's metrics)
    and then to ``path``. Its fields change only through its methods (an attribute set from outside is refused, never
    silently left out of the document)."""

    __slots__ = ("path", "listeners", "publish_listeners", "_lock", "_published")

    def __init__(
        self,
        application_id: str,
        path: Path,
        *,
        lease_epoch: int | None = None,
        metrics_port: int | None = None,
        started_at: str | None = None,
        listeners: Iterable[Callable[[JobState, JobState], None]] = (),
        publish_listeners: Iterable[Callable[[PublishedStatus], None]] = (),
    ) -> None:
        self.path = Path(path)
        #: called with (old, new) on every state change, outside the lock, as Kafka Streams does
        self.listeners = list(listeners)
        #: called with every document published, under the status lock
        self.publish_listeners = list(publish_listeners)
        self._lock = threading.Lock()
        self._published = PublishedStatus(
            application_id,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=started_at or _now(),
            lease_epoch=lease_epoch,
            metrics_port=metrics_port,
        )
        self.publish()

    def document(self) -> PublishedStatus:
        """What was published last."""
        return self._published

    @property
    def application_id(self) -> str:
        return self._published.application_id

    @property
    def state(self) -> JobState:
        return self._published.state

    @property
    def error(self) -> str | None:
        return self._published.error

    @property
    def lease_epoch(self) -> int | None:
        return self._published.lease_epoch

    @property
    def restore(self) -> Mapping[str, StoreRestore]:
        return self._published.restore

    def transition_to(self, new: JobState, error: str | None = None) -> None:
        with self._lock:
            old = self._published.state
            JOB_LIFECYCLE.check(self.application_id, old, new)
            self._publish_locked(state=new, error=error or self._published.error)
        for listener in self.listeners:  # outside the lock, as Kafka Streams does
            listener(old, new)

    def record_driver(self, spark_ui: str | None, jvm_pid: int | None) -> None:
        """Where the driver's Spark UI is, and its Spark JVM's pid."""
        self._update(spark_ui=spark_ui, jvm_pid=jvm_pid)

    def record_progress(self, progress: Mapping, sink_phase_ms: Mapping[str, int] | None = None) -> None:
        """Spark's StreamingQueryProgress (as JSON) of the latest micro-batch, and the batch function's phases."""
        with self._lock:
            batch = BatchProgress.of(progress, sink_phase_ms)
            first = self._published.first_batch_id
            self._publish_locked(progress=batch, first_batch_id=batch.batch_id if first is None else first)

    def record_rekeying_progress(self, progress: Mapping) -> None:
        """The re-keying stage's StreamingQueryProgress (as JSON): its lag in the source."""
        self._update(rekeying_lag=input_lag_of(progress))

    def record_idle(self, timestamp: str) -> None:
        self._update(idle_at=timestamp)

    def record_restore_progress(self, store: str, **numbers: object) -> None:
        """``numbers``: fields of :class:`StoreRestore` (a misspelt one raises)."""
        with self._lock:
            restore = self._published.restore
            updated = dataclasses.replace(restore.get(store, StoreRestore()), **numbers)
            self._publish_locked(restore={**restore, store: updated})

    def record_restores(self, summaries: Mapping[str, Mapping[str, object]]) -> None:
        """The restores this run made, store -> ``RestoredState.summary()`` (fields of :class:`StoreRestore`):
        they replace the progress recorded while reading; a store that restored nothing is not listed."""
        with self._lock:
            restore = self._published.restore
            self._publish_locked(
                restore={
                    store: dataclasses.replace(restore.get(store, StoreRestore()), **numbers)
                    for store, numbers in summaries.items()
                }
            )

    def record_dead_letters(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            so_far = self._published.dead_letters
            self._publish_locked(dead_letters={r: so_far.get(r, 0) + counts.get(r, 0) for r in {*so_far, *counts}})

    def record_snapshot(self, store: str, snapshot: SnapshotTaken) -> None:
        with self._lock:
            self._publish_locked(snapshots={**self._published.snapshots, store: snapshot})

    def publish(self) -> None:
        self._update()

    def _update(self, **changes: object) -> None:
        with self._lock:
            self._publish_locked(**changes)

    def _publish_locked(self, **changes: object) -> None:
        self._published = dataclasses.replace(self._published, updated_at=_now(), **changes)
        for listener in self.publish_listeners:
            listener(self._published)
        write_json_atomically(self.path, to_json(self._published))


def status_path(status_dir: Path, application_id: str) -> Path:
    return StatusFiles(status_dir, application_id).lifecycle


def read_status(status_dir: Path, application_id: str) -> PublishedStatus | None:
    """What Airflow calls: the published status, or None when the job never ran here."""
    try:
        return from_json(PublishedStatus, json.loads(status_path(status_dir, application_id).read_text()))
    except FileNotFoundError:
        return None


# -- what the standby publishes ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StandbyStoreView:
    """How far one store's snapshot is behind its changelog, as the standby last saw it."""

    topic: str
    #: the batch of the standby's newest snapshot (None: none yet)
    batch_id: int | None = None
    snapshot_version: int | None = None
    rows: int | None = 0
    as_of_ms: int = 0
    #: how long the oldest change missing from the snapshot has waited
    lag_ms: int = 0
    lag_records: int = 0
    pending_keys: int = 0
    commits: int = 0
    at_head: bool = False


@dataclasses.dataclass(frozen=True)
class StandbyStatus:
    """What the warm standby publishes (``<application_id>.standby.json``) and Airflow reads (:func:`read_standby_status`)."""

    application_id: str
    state: FollowerState = FollowerState.CREATED
    error: str | None = None
    pid: int | None = None
    host: str | None = None
    lease_epoch: int | None = None
    started_at: str | None = None
    updated_at: str | None = None
    #: the lag the standby keeps under (``standby_max_lag_s``)
    max_lag_ms: int = 0
    #: the largest of its stores' lags
    lag_ms: int = 0
    #: Kafka errors waited out
    transient_kafka_errors: int = 0
    metrics_port: int | None = None
    stores: Mapping[str, StandbyStoreView] = dataclasses.field(default_factory=dict)


def write_standby_status(status_dir: Path, status: StandbyStatus) -> None:
    write_json_atomically(standby_status_file(status_dir, status.application_id), to_json(status))


def read_standby_status(status_dir: Path, application_id: str) -> StandbyStatus | None:
    """The standby's last published status, or None when no standby of ``application_id`` ever ran here."""
    try:
        return from_json(StandbyStatus, json.loads(standby_status_file(status_dir, application_id).read_text()))
    except (FileNotFoundError, ValueError):
        return None


# -- what the spare driver publishes -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SpareStatus:
    """What the spare driver publishes (``<application_id>.spare.json``) and Airflow and the benchmarks read
    (:func:`read_spare_status`)."""

    application_id: str
    state: SpareState = SpareState.CREATED
    error: str | None = None
    pid: int | None = None
    host: str | None = None
    #: the epoch of the spare's own lease
    lease_epoch: int | None = None
    started_at: str | None = None
    updated_at: str | None = None
    #: how long the Spark session's start and the warm-up queries took
    warm_up_s: float | None = None
    #: the driver lease epoch it watches (None: no driver is running yet)
    watching_epoch: int | None = None
    #: the driver lease epoch it took over from, and the one it took (TAKING_OVER)
    took_over_from: int | None = None
    took_over_epoch: int | None = None


def write_spare_status(status_dir: Path, status: SpareStatus) -> None:
    write_json_atomically(spare_status_file(status_dir, status.application_id), to_json(status))


def read_spare_status(status_dir: Path, application_id: str) -> SpareStatus | None:
    """The spare's last published status, or None when no spare of ``application_id`` ever ran here."""
    try:
        return from_json(SpareStatus, json.loads(spare_status_file(status_dir, application_id).read_text()))
    except (FileNotFoundError, ValueError):
        return None


# -- how a reader sees a driver ------------------------------------------------------------------------------

#: what a driver, a spare driver and a warm standby publish: each says which lease epoch it was published in
LeasedStatus = PublishedStatus | SpareStatus | StandbyStatus

#: the state of a job version that has no status here: no driver of it ever published one
NEVER_RAN = "NEVER_RAN"


def published_in_epoch(status: LeasedStatus | None, epoch: int | None) -> bool:
    """``status`` is the word of the process that held (or holds) lease epoch ``epoch``: a status an earlier or a
    later holder left says nothing about that one."""
    return status is not None and epoch is not None and status.lease_epoch == epoch


def published_by_holder(status: LeasedStatus | None, holder: LeaseHolder | None) -> bool:
    """The one liveness rule, for drivers, spare drivers and warm standbys alike: ``status`` (a published status
    document) is the word of the process that holds the lease now (``holder``, see
    :meth:`spark_jobs.driver.lease.JobLease.holder`). A killed process's last status says RUNNING forever; the kernel
    drops its lease when it dies, and the lease's epoch tells a new process's status from the one its predecessor
    left."""
    return holder is not None and published_in_epoch(status, holder.epoch)


@dataclasses.dataclass(frozen=True)
class ProcessView(Generic[Published]):
    """One look at a process of a job version (its driver, spare driver or warm standby): its published status
    and its lease's holder, read together."""

    #: the published status (None: no such process ever published one here)
    status: Published | None
    #: the lease's holder (None: no such process runs)
    holder: LeaseHolder | None

    @property
    def alive(self) -> bool:
        """The status is the running process's own (:func:`published_by_holder`)."""
        return published_by_holder(self.status, self.holder)

    @property
    def live_status(self) -> Published | None:
        """The status while it is the running process's own, else None (never a dead process's last word)."""
        return self.status if self.alive else None


@dataclasses.dataclass(frozen=True)
class DriverView(ProcessView[PublishedStatus]):
    """One look at a job version's driver."""

    @property
    def state(self) -> str:
        """What the job is doing now: its published state while its driver holds the lease, else
        ``NOT_RUNNING`` (:data:`NEVER_RAN` without a status)."""
        if self.alive:
            return self.status.state.value
        return JobState.NOT_RUNNING.value if self.status else NEVER_RAN

    def summary(self) -> str:
        """The answer on-call reads: ``RUNNING at batch 12``; ``DOWN since <time>, last RUNNING at batch 12``
        when the driver is gone (never its last state as if current); ``STARTING`` when a new driver holds the
        lease and has not published yet."""
        if self.status is None:
            return NEVER_RAN if self.holder is None else "STARTING"
        batch = self.status.batch_id
        at = f" at batch {batch}" if batch is not None else ""
        if self.alive:
            return f"{self.state}{at}"
        if self.holder is not None:
            return f"STARTING (the previous driver's last state: {self.status.state.value}{at})"
        return f"DOWN since {self.status.updated_at}, last {self.status.state.value}{at}"


def observe_driver(status_dir: Path, application_id: str) -> DriverView:
    """The driver of ``application_id`` as a reader sees it now (status file and lease)."""
    from spark_jobs.driver.lease import JobLease

    return DriverView(read_status(status_dir, application_id), JobLease(status_dir, application_id).holder())


def observe_spare(status_dir: Path, application_id: str) -> ProcessView[SpareStatus]:
    """The spare driver of ``application_id`` as a reader sees it now (its status file and its own lease)."""
    from spark_jobs.driver.lease import JobLease

    holder = JobLease(status_dir, spare_name(application_id)).holder()
    return ProcessView(read_spare_status(status_dir, application_id), holder)


def observe_standby(status_dir: Path, application_id: str) -> ProcessView[StandbyStatus]:
    """The warm standby of ``application_id`` as a reader sees it now (its status file and its own lease)."""
    from spark_jobs.driver.lease import JobLease

    holder = JobLease(status_dir, standby_name(application_id)).holder()
    return ProcessView(read_standby_status(status_dir, application_id), holder)


def current_state(status_dir: Path, application_id: str) -> str:
    """What the job is doing now (:attr:`DriverView.state`)."""
    return observe_driver(status_dir, application_id).state


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
