"""Read a store's changelog from given offsets and cut it at the last complete micro-batch.

A batch is complete when its marker reached every partition (see :mod:`.changelog`). The reader
folds records batch by batch per partition (latest value wins, a tombstone removes the key) and
applies exactly the batches up to the cut, so a batch the writer did not finish is never restored.
It keeps no offsets of its own beyond the read: the result says where the next read starts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from spark_jobs.kafka_topics import watermark_offsets
from spark_jobs.state.changelog import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.checkpoint_offsets import KafkaOffsets


@dataclasses.dataclass
class ChangelogRead:
    """What a read of a changelog produced."""

    topic: str
    #: key -> latest value after applying every complete batch (deleted keys absent)
    state: dict[bytes, bytes]
    #: the last batch applied (None: no complete batch in the range read)
    cut_batch_id: int | None
    #: input offsets the state corresponds to (from the cut batch's marker)
    input_offsets: KafkaOffsets
    #: the event-time watermark of the cut batch (0: none)
    watermark_ms: int = 0
    #: per partition: the offset right after the cut batch's marker (where a later read resumes)
    resume_offsets: dict[int, int] = dataclasses.field(default_factory=dict)
    records_read: int = 0
    records_applied: int = 0
    tombstones_applied: int = 0
    records_dropped_incomplete: int = 0
    #: the highest batch id seen in the range (marked or not): a new query must continue above it
    max_batch_seen: int | None = None
    seconds: float = 0.0


@dataclasses.dataclass
class _Segment:
    batch_id: int
    records: list[tuple[bytes, bytes | None]]
    marker_offset: int
    marker: BatchMarker


def _batch_of(headers) -> int | None:
    for name, value in headers or ():
        if name == BATCH_HEADER:
            return int(value)
    return None


def read_changelog(
    bootstrap_servers: str,
    topic: str,
    start_offsets: Mapping[int, int] | None = None,
    *,
    base_state: dict[bytes, bytes] | None = None,
    on_progress: Callable[[int], None] | None = None,
    poll_timeout_s: float = 30.0,
) -> ChangelogRead:
    """Read ``topic`` from ``start_offsets`` (default: the beginning) to its current end.

    Args:
        base_state: state to apply the changelog on (a snapshot); copied, not modified.
        on_progress: called with the number of records read so far, every 10,000 records.
    """
    started = time.monotonic()
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"streamstate-restore-{topic}",
                         "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 3,
                         "fetch.max.bytes": 64 * 1024 * 1024})  # fmt: skip
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=poll_timeout_s).topics[topic].partitions)
        start_offsets = dict(start_offsets or {})
        high = {}
        assignment = []
        for p in partitions:
            low, hi = watermark_offsets(consumer, TopicPartition(topic, p), poll_timeout_s)
            high[p] = hi
            start = start_offsets.get(p, OFFSET_BEGINNING)
            if (start if start >= 0 else low) < hi:
                assignment.append(TopicPartition(topic, p, start))
        segments: dict[int, list[_Segment]] = {p: [] for p in partitions}
        pending: dict[int, list[tuple[int | None, bytes, bytes | None]]] = {p: [] for p in partitions}
        result = ChangelogRead(topic, {}, None, {}, resume_offsets={p: start_offsets.get(p, 0) for p in partitions})

        remaining = {tp.partition for tp in assignment}
        if assignment:
            consumer.assign(assignment)
        while remaining:
            msg = consumer.poll(poll_timeout_s)
            if msg is None:
                raise TimeoutError(f"reading changelog {topic}: no data for {poll_timeout_s}s, partitions {remaining} unfinished")
            p = msg.partition()
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    remaining.discard(p)
                    continue
                raise RuntimeError(f"reading changelog {topic}[{p}]: {msg.error()}")
            if msg.offset() >= high[p]:
                remaining.discard(p)
                continue
            result.records_read += 1
            if on_progress and result.records_read % 10_000 == 0:
                on_progress(result.records_read)
            if msg.key() == MARKER_KEY:
                marker = BatchMarker.from_bytes(msg.value())
                seen = marker.batch_id
                # Records up to this marker belong to it, except those of batches declared void
                # (half-written before a checkpoint loss); later batches' records wait for their marker.
                records = [(k, v) for b, k, v in pending[p]
                           if (b is None or b <= marker.batch_id) and not (b is not None and marker.is_void(b))]  # fmt: skip
                result.records_dropped_incomplete += sum(1 for b, _, _ in pending[p] if b is not None and marker.is_void(b))
                pending[p] = [(b, k, v) for b, k, v in pending[p] if b is not None and b > marker.batch_id]
                segments[p].append(_Segment(marker.batch_id, records, msg.offset(), marker))
            else:
                seen = _batch_of(msg.headers())
                pending[p].append((seen, msg.key(), msg.value()))
            if seen is not None and (result.max_batch_seen is None or seen > result.max_batch_seen):
                result.max_batch_seen = seen
            if msg.offset() + 1 >= high[p]:
                remaining.discard(p)

        # The cut: the newest batch whose marker is in every partition. The writer marks every
        # partition after every batch, so a partition without a marker in the range read means
        # nothing after the starting offsets is complete yet.
        cut = min(segs[-1].batch_id for segs in segments.values()) if all(segments.values()) else None
        # A key lives in one partition, so applying partitions one after another keeps per-key order.
        state = dict(base_state or {})
        for p in partitions:
            for segment in segments[p]:
                if cut is None or segment.batch_id > cut:
                    result.records_dropped_incomplete += len(segment.records)
                    continue
                for key, value in segment.records:
                    result.records_applied += 1
                    if value is None:
                        result.tombstones_applied += 1
                        state.pop(key, None)
                    else:
                        state[key] = value
                result.resume_offsets[p] = segment.marker_offset + 1
                if segment.batch_id == cut:
                    result.input_offsets = segment.marker.input_offsets
                    result.watermark_ms = segment.marker.watermark_ms
            result.records_dropped_incomplete += len(pending[p])
        result.cut_batch_id = cut
        result.state = state
        result.seconds = time.monotonic() - started
        return result
    finally:
        consumer.close()

