"""Taking a store's snapshot: the one place a snapshot is made, beside :class:`~.snapshots.SnapshotStore`
(which alone writes the table) and :mod:`.restore` (whose rebuild a full snapshot writes).

A snapshot is taken in three steps, in this order:

1. **where from**: the latest snapshot and the mode :meth:`SnapshotStore.next_mode` gives (``layered``: the
   keys changed since it; ``full``: the whole state, a fold or the first snapshot);
2. **a short tail as a layer**: fewer than :data:`LAYER_IN_DRIVER_MAX_RECORDS` changelog records since the
   latest snapshot are read here and committed by delta-rs (milliseconds, where a Spark job and a Spark
   Delta commit cost seconds whatever their size);
3. **otherwise, the rebuilt state**: the store restored as a restore would (:func:`.restore.restore_from_snapshot`,
   by Spark's executors when given ``spark``), written as a layer of its changes, or whole.

If another snapshot landed meanwhile (:class:`~.snapshots.SnapshotConflict`), the state is written whole.

A running job takes its snapshots off the micro-batch's path (:class:`SnapshotWorker`): a snapshot reads the
changelog's complete batches, never the batch in hand, so batches go on while it is taken.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from runtime.kafka_connection import KafkaTarget
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.state.restore import SilentRestoreListener, restore_from_snapshot, tail_records
from spark_jobs.state.snapshots import SnapshotConflict, SnapshotInfo, SnapshotStore

#: a snapshot's layer from a tail of fewer changelog records than this is read by this process and
#: committed by delta-rs (at most this many keys, tens of MB): faster than a Spark job and a Spark Delta
#: commit, which cost seconds whatever their size
LAYER_IN_DRIVER_MAX_RECORDS = 1_000_000


def take_snapshot(
    snapshots: SnapshotStore, kafka: KafkaTarget, changelog_topic: str, spark=None
) -> SnapshotInfo | None:
    """Write a new snapshot if the changelog has complete batches beyond the latest one (the steps of the
    module docstring). Returns the new snapshot, or the latest one when there was nothing new (None if
    neither exists)."""
    latest = snapshots.latest()
    mode = snapshots.next_mode(latest)
    if (
        mode == "layered"
        and tail_records(kafka, changelog_topic, latest.changelog_offsets) < LAYER_IN_DRIVER_MAX_RECORDS
    ):
        try:
            return layer_from_short_tail(snapshots, kafka, changelog_topic, latest)
        except SnapshotConflict:  # the state at the cut does not depend on the table: write it whole
            pass
    return snapshot_from_rebuilt_state(snapshots, kafka, changelog_topic, mode, spark)


def layer_from_short_tail(
    snapshots: SnapshotStore, kafka: KafkaTarget, changelog_topic: str, latest: SnapshotInfo
) -> SnapshotInfo:
    """Step 2: the changes since ``latest``, read by this process, appended as a layer by delta-rs (``latest``
    itself when no batch completed since).

    Raises:
        SnapshotConflict: another snapshot landed after ``latest``.
    """
    tail = read_changelog(kafka, changelog_topic, latest.changelog_offsets, keep_changes=True)
    if tail.cut_batch_id is None or tail.cut_batch_id <= latest.batch_id:
        return latest
    info = snapshots.new_info(tail.cut_batch_id, tail.input_offsets, tail.resume_offsets, tail.watermark_ms)
    return snapshots.append_layer(tail.changes, info, base=latest)


def snapshot_from_rebuilt_state(
    snapshots: SnapshotStore, kafka: KafkaTarget, changelog_topic: str, mode: str, spark=None
) -> SnapshotInfo | None:
    """Step 3: the store rebuilt as a restore would, written as a layer of its changes (``mode`` layered)
    or whole; by this process for a small store, by Spark's executors with ``spark``."""
    restored = restore_from_snapshot(snapshots, kafka, changelog_topic, SilentRestoreListener(), spark=spark)
    latest = restored.snapshot
    if restored.batch_id is None or (latest is not None and restored.batch_id <= latest.batch_id):
        return latest
    position = (restored.batch_id, restored.input_offsets, restored.changelog_resume_offsets, restored.watermark_ms)
    if restored.frame is None:
        return snapshots.write(restored.state, *position)
    if mode == "layered":
        try:
            return snapshots.append_layer_frame(restored.changes, latest, *position)
        except SnapshotConflict:
            pass
    return snapshots.write_frame(restored.frame, *position)


log = logging.getLogger("streamstate.snapshots")

#: the Spark scheduler pool of a running job's snapshot jobs (the session runs the FAIR scheduler: a
#: snapshot's tasks share the cores with the micro-batches' instead of queueing ahead of them)
SNAPSHOT_POOL = "snapshots"


class SnapshotWorker:
    """A job's snapshots, taken by a thread of their own while the micro-batches go on: at most one at a
    time (a snapshot due while one runs is skipped: the next due batch takes it, and a restore reads the
    longer tail meanwhile). A snapshot that failed is raised in the micro-batch's thread at the next
    :meth:`start`, failing the query as a snapshot taken in the batch did."""

    def __init__(self, spark=None) -> None:
        self._spark = spark
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, take: Callable[[], None]) -> bool:
        """Run ``take`` in the worker's thread unless a snapshot is running; returns whether it started.

        Raises:
            the exception of the previous snapshot, if it failed.
        """
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise RuntimeError(f"the job's last snapshot failed: {failure}") from failure
        if self.running:
            return False
        self._thread = threading.Thread(target=self._run, args=(take,), name="streamstate-snapshot", daemon=True)
        self._thread.start()
        return True

    def _run(self, take: Callable[[], None]) -> None:
        if self._spark is not None:  # this thread's Spark jobs in the snapshots' pool
            self._spark.sparkContext.setLocalProperty("spark.scheduler.pool", SNAPSHOT_POOL)
        try:
            take()
        except BaseException as err:  # noqa: BLE001 - kept for the batch thread, which fails the query with it
            log.exception("snapshot failed")
            self._failure = err

    def wait(self) -> None:
        """Until the running snapshot (if any) is committed or failed (a driver's run ends after it)."""
        if self._thread is not None:
            self._thread.join()
