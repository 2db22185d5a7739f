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
from spark_jobs.state.snapshots import SnapshotInfo, SnapshotStore

log = logging.getLogger("streamstate.restore")

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
        log.info(json.dumps({"event": "restore_start", "store": store, "topic": topic,
                             "starting_offsets": starting_offsets}))  # fmt: skip

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
    state: dict[bytes, bytes]
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
    #: the changelog batch id the next query must start at (above every id already in the changelog)
    next_batch_id: int = 0
    #: the event-time watermark (stream time) of ``batch_id``: windows older than it stay closed
    watermark_ms: int = 0
    #: rows read from the snapshot and the time that took (the rest of ``seconds`` is the changelog)
    snapshot_rows: int = 0
    snapshot_seconds: float = 0.0

    @property
    def full_replay(self) -> bool:
        return self.snapshot is None

    def summary(self) -> dict:
        return {
            "batch_id": self.batch_id, "keys": len(self.state), "full_replay": self.full_replay,
            "snapshot_version": self.snapshot.delta_version if self.snapshot else None,
            "snapshot_batch_id": self.snapshot.batch_id if self.snapshot else None,
            "changelog_records_read": self.changelog_records_read,
            "changelog_records_applied": self.changelog_records_applied,
            "input_offsets": self.input_offsets, "seconds": round(self.seconds, 3),
            "next_batch_id": self.next_batch_id, "watermark_ms": self.watermark_ms,
            "snapshot_rows": self.snapshot_rows, "snapshot_seconds": round(self.snapshot_seconds, 3),
        }  # fmt: skip


def restore_from_snapshot(
    snapshots: SnapshotStore,
    kafka: KafkaTarget,
    changelog_topic: str,
    listener: RestoreListener | None = None,
    *,
    use_snapshot: bool = True,
) -> RestoredState:
    """Latest snapshot (unless ``use_snapshot`` is False) + changelog tail -> state at the last complete batch."""
    listener = listener or LoggingRestoreListener(snapshots.application_id)
    started = time.monotonic()
    snapshot = snapshots.latest() if use_snapshot else None
    base = snapshots.read(snapshot) if snapshot else {}
    snapshot_seconds = time.monotonic() - started
    start = snapshot.changelog_offsets if snapshot else None
    listener.on_restore_start(snapshots.store, changelog_topic, start if start else "earliest")
    tail = read_changelog(
        kafka, changelog_topic, start, base_state=base,
        on_progress=lambda n: listener.on_batch_restored(snapshots.store, n),
    )  # fmt: skip
    if tail.cut_batch_id is not None:
        batch_id, input_offsets, watermark = tail.cut_batch_id, tail.input_offsets, tail.watermark_ms
    elif snapshot is not None:
        batch_id, input_offsets, watermark = snapshot.batch_id, snapshot.input_offsets, snapshot.watermark_ms
    else:
        batch_id, input_offsets, watermark = None, {}, 0
    result = RestoredState(
        store=snapshots.store, state=tail.state, batch_id=batch_id, input_offsets=input_offsets, snapshot=snapshot,
        changelog_resume_offsets=tail.resume_offsets, changelog_records_read=tail.records_read, changelog_records_applied=tail.records_applied,
        seconds=time.monotonic() - started,
        next_batch_id=1 + max((b for b in (tail.max_batch_seen, batch_id) if b is not None), default=-1),
        watermark_ms=watermark, snapshot_rows=len(base), snapshot_seconds=snapshot_seconds,
    )  # fmt: skip
    listener.on_restore_end(snapshots.store, result)
    return result


def take_snapshot(snapshots: SnapshotStore, kafka: KafkaTarget, changelog_topic: str) -> SnapshotInfo | None:
    """Write a new snapshot if the changelog has complete batches beyond the latest one.

    Returns the new snapshot, or the latest one when there was nothing new (None if neither exists).
    """
    restored = restore_from_snapshot(snapshots, kafka, changelog_topic, SilentRestoreListener())
    latest = restored.snapshot
    if restored.batch_id is None or (latest is not None and restored.batch_id <= latest.batch_id):
        return latest
    return snapshots.write(restored.state, restored.batch_id, restored.input_offsets, restored.changelog_resume_offsets,
                           restored.watermark_ms)  # fmt: skip


class SilentRestoreListener:
    """A restore listener that reports nothing (snapshots taken on a cadence, benchmarks)."""

    def on_restore_start(self, *args) -> None: ...
    def on_batch_restored(self, *args) -> None: ...
    def on_restore_end(self, *args) -> None: ...
