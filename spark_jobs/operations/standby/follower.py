"""The warm standby: a snapshot follower that keeps each store's Delta snapshot close behind its changelog.

Kafka Streams keeps *standby replicas*: another instance applies a store's changelog continuously, so a
failover restores only the last few records and queries can read the replica while the active instance
restores. Here the replica is the store's Delta snapshot table itself. One follower process per job
version follows every store's changelog (:class:`~spark_jobs.state.changelog_reader.ChangelogTail`)
and, every ``standby_commit_interval_s``, appends the changes of the batches that became complete to
the snapshot table as a layer (delta-rs: no JVM, a commit costs the changed keys only), with the
same snapshot metadata a driver snapshot carries; once the layers outgrow their base it folds them
into a new one (which reads the whole state into this process). Therefore:

* a restore (``restore_from_snapshot``) starts from a snapshot at most about ``standby_max_lag_s`` old,
  so its changelog tail is short;
* the state API answers from the snapshot while the job is down or restoring.

The follower holds its own lease (``<application_id>.standby.lease``): one follower per job version.
While it holds it, the driver takes no snapshots of its own (two writers of one table would fight
over commits). It publishes ``<application_id>.standby.json`` (state, per-store lag) and Prometheus
gauges; the supervise DAG starts it and restarts it when it dies, like a job.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from confluent_kafka import KafkaException
from prometheus_client import Counter, Gauge

from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease, LeaseHolder
from spark_jobs.driver.lifecycle import (
    FOLLOWER_LIFECYCLE,
    FollowerState,
    StandbyStatus,
    StandbyStoreView,
    write_standby_status,
)
from spark_jobs.io.kafka_topics import is_transient
from spark_jobs.layout import JobLayout, standby_name
from spark_jobs.registry import JobSpec
from spark_jobs.state.changelog_reader import ChangelogMissing, ChangelogTail, CompleteBatches
from spark_jobs.state.snapshots import SnapshotConflict, SnapshotInfo, SnapshotStore

log = logging.getLogger("streamstate.standby")

STANDBY_LAG_MS = Gauge(
    "streamstate_standby_lag_ms",
    "How long the oldest change missing from the standby snapshot has waited",
    ["application_id", "store"],
)
STANDBY_LAG_RECORDS = Gauge(
    "streamstate_standby_lag_records", "Changelog records not yet read by the follower", ["application_id", "store"]
)
STANDBY_COMMITS = Counter(
    "streamstate_standby_commits", "Snapshot commits by the follower", ["application_id", "store"]
)


standby_id = standby_name  # the follower's lease and status name (spark_jobs.layout)


def standby_running(status_dir: Path, application_id: str) -> LeaseHolder | None:
    """The live follower's lease holder (pid, host, epoch), or None."""
    return JobLease(status_dir, standby_id(application_id)).holder()


def _now_ms() -> int:
    return int(time.time() * 1000)


class StoreFollower:
    """Keeps one store's snapshot table within a bounded lag of its changelog."""

    def __init__(self, spec: JobSpec, store: str, settings: Settings) -> None:
        self.application_id = spec.application_id
        self.store = store
        self.settings = settings
        layout = JobLayout.of(spec, settings)
        self.snapshots = SnapshotStore.of(layout, store)
        self.path = self.snapshots.path
        self.topic = layout.changelog_topic(store)
        self.commits = 0
        self.tail: ChangelogTail | None = None
        self._open()

    def _open(self) -> None:
        """(Re)start from the table's newest snapshot: its changelog offsets are where the tail resumes."""
        if self.tail is not None:
            self.tail.close()
        self.snapshot: SnapshotInfo | None = self.snapshots.latest()
        start = self.snapshot.changelog_offsets if self.snapshot else None
        try:
            self.tail = ChangelogTail(self.settings.kafka, self.topic, start)
        except ChangelogMissing:
            self.tail = None  # the job creates it when it first starts; :meth:`step` tries again
        except KafkaException as err:
            if not is_transient(err.args[0]):
                raise
            self.tail = None  # the broker is away; :meth:`step` tries again
        self.offsets = dict(start or {})
        #: key -> latest value (None: tombstone) of the complete batches not yet committed
        self.pending: dict[bytes, bytes | None] = {}
        self.pending_batch: CompleteBatches | None = None
        #: when the oldest uncommitted complete batch was written (epoch ms)
        self.pending_since_ms: int | None = None
        self.lag_records = 0
        #: the last time everything in the changelog had been read (epoch ms)
        self.caught_up_at_ms = 0
        self.opened_at_ms = _now_ms()
        self._at_head = False

    def step(self, max_wait_s: float) -> None:
        """Read what arrived; remember the changes of every batch that became complete."""
        if self.tail is None:
            time.sleep(max_wait_s)
            self._open()
            if self.tail is None:
                return
        # Everything written before ``checked_at`` has been read once the positions pass ``end``.
        checked_at, end = _now_ms(), self.tail.end_offsets()
        complete = self.tail.poll(max_wait_s)
        if complete is not None:
            for key, value in complete.changes:
                self.pending[key] = value
            self.offsets.update(complete.resume_offsets)
            if self.pending_batch is None:
                self.pending_since_ms = complete.marker_time_ms or _now_ms()
            if complete.marker.input_offsets or self.pending_batch is None:
                self.pending_batch = complete
        self.lag_records = self.tail.lag_records(end)
        self._at_head = self.tail.has_read(end)
        if self._at_head:
            self.caught_up_at_ms = checked_at

    @property
    def at_head(self) -> bool:
        """Whether the last step read everything the changelog had when it started."""
        return self._at_head

    def lag_ms(self, now_ms: int | None = None) -> int:
        """How long the oldest change missing from the snapshot has waited (0: none is missing)."""
        now_ms = now_ms or _now_ms()
        if self.pending_since_ms is not None:
            return max(0, now_ms - self.pending_since_ms)
        if not self._at_head:  # behind: at least since the last time it had everything
            return max(0, now_ms - (self.caught_up_at_ms or self.opened_at_ms))
        return 0

    def commit_due(self, now_ms: int | None = None) -> bool:
        if self.pending_batch is None:
            return False
        waited = (now_ms or _now_ms()) - (self.pending_since_ms or 0)
        return waited >= self.settings.standby_commit_interval_s * 1000 or len(self.pending) >= 200_000

    def commit(self) -> SnapshotInfo | None:
        """Append the pending changes to the snapshot table as a new layered snapshot (None: nothing pending).

        Raises:
            SnapshotConflict: a driver snapshot landed since the follower's last read.
        """
        batch = self.pending_batch
        if batch is None:
            return None
        previous = self.snapshot
        info = SnapshotInfo(
            delta_version=-1,
            application_id=self.application_id,
            store=self.store,
            batch_id=batch.batch_id,
            input_offsets=batch.marker.input_offsets or (previous.input_offsets if previous else {}),
            changelog_offsets=dict(self.offsets),
            rows=0,
            taken_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            watermark_ms=batch.marker.watermark_ms,
            as_of_ms=self.caught_up_at_ms if self.at_head else batch.marker_time_ms,
            writer="standby",
        )
        written = self.snapshots.append_layer(self.pending, info, base=previous)
        if self.snapshots.next_mode(written) == "full":  # the layers outgrew the base: fold them (reads the state)
            written = self.snapshots.fold(written)
        self.snapshot = written
        self.pending, self.pending_batch, self.pending_since_ms = {}, None, None
        self.commits += 1
        STANDBY_COMMITS.labels(self.application_id, self.store).inc()
        return self.snapshot

    def view(self) -> StandbyStoreView:
        snap = self.snapshot
        return StandbyStoreView(
            topic=self.topic,
            batch_id=snap.batch_id if snap else None,
            snapshot_version=snap.delta_version if snap else None,
            rows=snap.rows if snap else 0,
            as_of_ms=snap.as_of_ms if snap else 0,
            lag_ms=self.lag_ms(),
            lag_records=self.lag_records,
            pending_keys=len(self.pending),
            commits=self.commits,
            at_head=self.at_head,
        )

    def close(self) -> None:
        if self.tail is not None:
            self.tail.close()
            self.tail = None


class SnapshotFollower:
    """The standby of one job version: a :class:`StoreFollower` per store, one lease, one status file."""

    def __init__(self, spec: JobSpec, settings: Settings, metrics_port: int | None = None) -> None:
        """``metrics_port``: where this process serves its Prometheus metrics (published in its status)."""
        self.metrics_port = metrics_port
        if not spec.stores:
            raise ValueError(f"job {spec.name} has no state stores: nothing to follow")
        self.spec = spec
        self.settings = settings
        self.state = FollowerState.CREATED
        self.error: str | None = None
        self.stores: dict[str, StoreFollower] = {}
        self.stop_requested = threading.Event()
        self.lease = JobLease(settings.status_dir, standby_id(spec.application_id))
        self.started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        #: Kafka errors waited out (see :meth:`step`)
        self.transient_errors = 0
        self._published = 0.0

    def transition_to(self, new: FollowerState, error: str | None = None) -> None:
        FOLLOWER_LIFECYCLE.check(standby_id(self.spec.application_id), self.state, new)
        log.info(
            json.dumps(
                {
                    "event": "standby_state",
                    "application_id": self.spec.application_id,
                    "from": self.state.value,
                    "to": new.value,
                }
            )
        )
        self.state = new
        self.error = error or self.error
        self.publish(force=True)

    def run(self, *, max_seconds: float | None = None) -> None:
        """Follow until stopped (SIGTERM, :attr:`stop_requested`) or ``max_seconds`` passed.

        Raises:
            JobAlreadyRunning: another follower of this job version holds the lease.
        """
        self.lease.acquire()
        try:
            self._run_leased(max_seconds)
        finally:
            for follower in self.stores.values():
                follower.close()
            self.lease.release()

    def _run_leased(self, max_seconds: float | None) -> None:
        deadline = time.monotonic() + max_seconds if max_seconds else None
        try:
            for s in self.spec.stores:
                self.stores[s.name] = StoreFollower(self.spec, s.name, self.settings)
            self.transition_to(FollowerState.CATCHING_UP)
            while not self.stop_requested.is_set() and (deadline is None or time.monotonic() < deadline):
                self.step()
            self.transition_to(FollowerState.PENDING_SHUTDOWN)
            for follower in self.stores.values():
                self._commit(follower)  # what was followed is not thrown away on a clean stop
            self.transition_to(FollowerState.NOT_RUNNING)
        except Exception as err:
            self.transition_to(FollowerState.ERROR, error=f"{type(err).__name__}: {str(err).splitlines()[0]}")
            self.transition_to(FollowerState.NOT_RUNNING)
            raise

    def step(self, max_wait_s: float = 0.5) -> None:
        """One round over every store: read, commit when due, publish."""
        for follower in self.stores.values():
            try:
                follower.step(max_wait_s / len(self.stores))
            except KafkaException as err:
                if not is_transient(err.args[0]):
                    raise
                # A broker restart or a timeout under load: the standby waits it out (its lag shows how
                # long); it does not give up the lease over it.
                self.transient_errors += 1
                log.warning(
                    json.dumps({"event": "standby_kafka_transient", "store": follower.store, "error": str(err)})
                )
                time.sleep(max_wait_s)
            if follower.commit_due():
                self._commit(follower)
            STANDBY_LAG_MS.labels(self.spec.application_id, follower.store).set(follower.lag_ms())
            STANDBY_LAG_RECORDS.labels(self.spec.application_id, follower.store).set(follower.lag_records)
        at_head = all(f.at_head for f in self.stores.values())
        if at_head and self.state is FollowerState.CATCHING_UP:
            self.transition_to(FollowerState.FOLLOWING)
        elif (
            not at_head
            and self.state is FollowerState.FOLLOWING
            and self._lag_ms() > self.settings.standby_max_lag_s * 1000
        ):
            self.transition_to(FollowerState.CATCHING_UP)
        self.publish()

    def _commit(self, follower: StoreFollower) -> None:
        try:
            written = follower.commit()
        except SnapshotConflict as err:
            # A driver snapshot landed (it started before this follower held the lease): start over from it.
            log.warning(json.dumps({"event": "standby_conflict", "store": follower.store, "reason": str(err)}))
            follower._open()
            return
        if written is not None:
            log.info(
                json.dumps(
                    {
                        "event": "standby_commit",
                        "application_id": self.spec.application_id,
                        "store": follower.store,
                        "batch_id": written.batch_id,
                        "rows": written.rows,
                        "delta_version": written.delta_version,
                    }
                )
            )

    def _lag_ms(self) -> int:
        return max((f.lag_ms() for f in self.stores.values()), default=0)

    def publish(self, *, force: bool = False) -> None:
        """Write ``<application_id>.standby.json`` (atomically; at most once a second unless forced)."""
        if not force and time.monotonic() - self._published < 1.0:
            return
        self._published = time.monotonic()
        status = StandbyStatus(
            application_id=self.spec.application_id,
            state=self.state,
            error=self.error,
            pid=os.getpid(),
            host=socket.gethostname(),
            lease_epoch=self.lease.epoch,
            started_at=self.started_at,
            updated_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds"),
            max_lag_ms=int(self.settings.standby_max_lag_s * 1000),
            lag_ms=self._lag_ms(),
            transient_kafka_errors=self.transient_errors,
            metrics_port=self.metrics_port,
            stores={name: f.view() for name, f in self.stores.items()},
        )
        write_standby_status(self.settings.status_dir, status)
