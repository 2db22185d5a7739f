"""Rebuild a store's state: the latest snapshot plus the changelog tail up to the last complete batch.

The restorer reads both artifacts and owns neither (snapshots belong to :class:`SnapshotStore`, the
changelog to :class:`ChangelogWriter`). With no snapshot it replays the changelog from the beginning,
like Kafka Streams restoring a store whose checkpoint offset is 0.

Restore events follow Kafka Streams' ``StateRestoreListener``: start (store, partitions, starting
offsets; ``earliest`` means full replay), progress per 10,000 records, end (records restored,
duration). :class:`LoggingRestoreListener` writes them as JSON log lines and Prometheus metrics.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Protocol

from prometheus_client import Counter, Gauge

from runtime.kafka_connection import KafkaTarget
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.state.checkpoint_offsets import KafkaOffsets
from spark_jobs.state.snapshots import BROADCAST_MAX_KEYS, SnapshotInfo, SnapshotStore, overlay

log = logging.getLogger("streamstate.restore")

#: a store as Spark sees it: the changelog's key and its JSON value (the snapshot table's columns)
STORE_SCHEMA = "key STRING, value STRING"

RESTORED_RECORDS = Counter(
    "streamstate_restore_records", "Changelog records read by restores", ["application_id", "store"]
)
RESTORE_SECONDS = Gauge("streamstate_restore_last_seconds", "Duration of the last restore", ["application_id", "store"])


class RestoreListener(Protocol):
    def on_restore_start(self, store: str, topic: str, starting_offsets: dict[int, int] | str) -> None: ...
    def on_batch_restored(self, store: str, records_so_far: int) -> None: ...
    def on_restore_end(self, store: str, result: RestoredState) -> None: ...


class LoggingRestoreListener:
    """Structured log lines and Prometheus metrics (labelled with the job version's ``application_id``)
    for every restore."""

    def __init__(self, application_id: str) -> None:
        self.application_id = application_id

    def on_restore_start(self, store, topic, starting_offsets) -> None:
        log.info(
            json.dumps({"event": "restore_start", "store": store, "topic": topic, "starting_offsets": starting_offsets})
        )

    def on_batch_restored(self, store, records_so_far) -> None:
        log.info(json.dumps({"event": "restore_progress", "store": store, "records": records_so_far}))

    def on_restore_end(self, store, result) -> None:
        RESTORED_RECORDS.labels(self.application_id, store).inc(result.changelog_records_read)
        RESTORE_SECONDS.labels(self.application_id, store).set(result.seconds)
        log.info(json.dumps({"event": "restore_end", "store": store, **result.summary()}))


@dataclasses.dataclass
class RestoredState:
    """The rebuilt state and exactly where the input must resume for it."""

    store: str
    #: the state in this process (None when it was restored in Spark: see ``frame``)
    state: dict[bytes, bytes] | None
    #: the last micro-batch the state includes (None: nothing to restore)
    batch_id: int | None
    #: the input offsets to start the new query at (end offsets of ``batch_id``)
    input_offsets: KafkaOffsets
    snapshot: SnapshotInfo | None
    #: per changelog partition: the offset after the last applied batch (a later tail starts here)
    changelog_resume_offsets: dict[int, int]
    changelog_records_read: int
    changelog_records_applied: int
    seconds: float
    #: the lowest batch id above every id in the changelog read (a driver's generation puts its ids above it)
    next_batch_id: int = 0
    #: the event-time watermark (stream time) of ``batch_id``: windows older than it stay closed
    watermark_ms: int = 0
    #: rows read from the snapshot and the time that took (the rest of ``seconds`` is the changelog)
    snapshot_rows: int = 0
    snapshot_seconds: float = 0.0
    #: the state as a DataFrame(key STRING, value STRING) when it was restored in Spark (the snapshot read lazily)
    frame: object | None = None
    #: restored in Spark: the tail's latest value per changed key (null: deleted), what ``frame`` adds to the snapshot
    changes: object | None = None

    @property
    def keys(self) -> int | None:
        """Keys in the state (None when restored in Spark: counting would cost a pass over the store)."""
        return len(self.state) if self.state is not None else None

    def store_frame(self, spark):
        """The state as DataFrame(key STRING, value STRING): the Spark restore's frame, or the rows of ``state``."""
        if self.frame is not None:
            return self.frame
        return spark.createDataFrame([(k.decode(), v.decode()) for k, v in self.state.items()], STORE_SCHEMA)

    @property
    def full_replay(self) -> bool:
        return self.snapshot is None

    def summary(self) -> dict:
        return {
            "batch_id": self.batch_id,
            "keys": self.keys,
            "in_spark": self.frame is not None,
            "full_replay": self.full_replay,
            "snapshot_version": self.snapshot.delta_version if self.snapshot else None,
            "snapshot_batch_id": self.snapshot.batch_id if self.snapshot else None,
            "changelog_records_read": self.changelog_records_read,
            "changelog_records_applied": self.changelog_records_applied,
            "input_offsets": self.input_offsets,
            "seconds": round(self.seconds, 3),
            "next_batch_id": self.next_batch_id,
            "watermark_ms": self.watermark_ms,
            "snapshot_rows": self.snapshot_rows,
            "snapshot_seconds": round(self.snapshot_seconds, 3),
        }


def restore_from_snapshot(
    snapshots: SnapshotStore,
    kafka: KafkaTarget,
    changelog_topic: str,
    listener: RestoreListener | None = None,
    *,
    use_snapshot: bool = True,
    spark=None,
) -> RestoredState:
    """Latest snapshot (unless ``use_snapshot`` is False) + changelog tail -> state at the last complete batch.

    With ``spark`` the state is built by Spark's executors (the snapshot read from Delta lazily, the tail from
    Kafka, by this call when its changes are few, see :func:`~spark_jobs.state.snapshots.overlay`) and never
    enters this process: ``frame`` holds it and ``state`` is None.
    """
    listener = listener or LoggingRestoreListener(snapshots.application_id)
    started = time.monotonic()
    snapshot = snapshots.latest() if use_snapshot else None
    start = snapshot.changelog_offsets if snapshot else None
    if spark is None:
        base = snapshots.read(snapshot) if snapshot else {}
        snapshot_rows, snapshot_seconds = len(base), time.monotonic() - started
        listener.on_restore_start(snapshots.store, changelog_topic, start if start else "earliest")
        tail = read_changelog(
            kafka,
            changelog_topic,
            start,
            base_state=base,
            on_progress=lambda n: listener.on_batch_restored(snapshots.store, n),
        )
        state, frame, changes = tail.state, None, None
        applied, max_seen = tail.records_applied, tail.max_batch_seen
    else:
        from spark_jobs.state.changelog_spark import read_changelog_frame

        base = snapshots.frame(spark, snapshot) if snapshot else None
        snapshot_rows, snapshot_seconds = (snapshot.rows_scanned if snapshot else 0), time.monotonic() - started
        listener.on_restore_start(snapshots.store, changelog_topic, start if start else "earliest")
        tail = read_changelog_frame(spark, kafka, changelog_topic, start)
        changes = tail.changes
        if base is None:  # the state is the tail's live values
            frame = changes.where("value IS NOT NULL")
        else:  # a tail of few keys is broadcast: the snapshot is not shuffled
            frame = overlay(base, changes, broadcast=tail.records_read <= BROADCAST_MAX_KEYS)
        state, applied, max_seen = None, tail.plan.records_applied or 0, tail.max_batch_seen
    if tail.cut_batch_id is not None:
        batch_id, input_offsets, watermark = tail.cut_batch_id, tail.input_offsets, tail.watermark_ms
    elif snapshot is not None:
        batch_id, input_offsets, watermark = snapshot.batch_id, snapshot.input_offsets, snapshot.watermark_ms
    else:
        batch_id, input_offsets, watermark = None, {}, 0
    result = RestoredState(
        store=snapshots.store,
        state=state,
        batch_id=batch_id,
        input_offsets=input_offsets,
        snapshot=snapshot,
        changelog_resume_offsets=tail.resume_offsets,
        changelog_records_read=tail.records_read,
        changelog_records_applied=applied,
        seconds=time.monotonic() - started,
        next_batch_id=1 + max((b for b in (max_seen, batch_id) if b is not None), default=-1),
        watermark_ms=watermark,
        snapshot_rows=snapshot_rows,
        snapshot_seconds=snapshot_seconds,
        frame=frame,
        changes=changes,
    )
    listener.on_restore_end(snapshots.store, result)
    return result


def restore_size(snapshots: SnapshotStore, kafka: KafkaTarget, changelog_topic: str) -> int:
    """The records a restore would read: the latest snapshot's rows (base and layers) plus the changelog after it."""
    snapshot = snapshots.latest()
    return (snapshot.rows_scanned if snapshot else 0) + tail_records(
        kafka, changelog_topic, snapshot.changelog_offsets if snapshot else None
    )


#: a tail spanning up to this many offsets is counted by reading it (see :func:`tail_records`)
EXACT_TAIL_MAX_OFFSETS = 10_000


def tail_records(kafka: KafkaTarget, changelog_topic: str, start_offsets: dict[int, int] | None) -> int:
    """The changelog records from ``start_offsets`` (None: the beginning) to the topic's end (0: no topic yet).

    Offsets overcount records: every batch's transaction leaves a commit marker that takes an offset in
    each partition it wrote and is never delivered. A span of up to ``EXACT_TAIL_MAX_OFFSETS`` is read and
    counted (so a snapshot at the end of the changelog leaves a tail of 0, not one marker per partition);
    a longer one is counted by offsets, over by one per batch and partition."""
    from spark_jobs.state.changelog_spark import topic_range

    try:
        start, end = topic_range(kafka, changelog_topic, start_offsets)
    except LookupError:  # no changelog yet
        return 0
    span = sum(end[p] - start[p] for p in end)
    if 0 < span <= EXACT_TAIL_MAX_OFFSETS:
        return read_changelog(kafka, changelog_topic, start).records_read
    return span


class SilentRestoreListener:
    """A restore listener that reports nothing (snapshots taken on a cadence, benchmarks)."""

    def on_restore_start(self, *args) -> None: ...
    def on_batch_restored(self, *args) -> None: ...
    def on_restore_end(self, *args) -> None: ...
