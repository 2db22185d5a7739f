"""Read a store's changelog from given offsets and cut it at the last complete micro-batch.

A batch is complete when its marker reached every partition (see :mod:`.changelog`). The reader
folds records batch by batch per partition (latest value wins, a tombstone removes the key) and
applies exactly the batches up to the cut, so a batch the writer did not finish is never restored.
It keeps no offsets of its own beyond the read: the result says where the next read starts.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.kafka_topics import is_transient, watermark_offsets
from spark_jobs.state.changelog import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.checkpoint_offsets import KafkaOffsets

log = logging.getLogger(__name__)


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
    #: when the marker was written (the record's CreateTime, ms)
    marker_time_ms: int = 0


@dataclasses.dataclass
class CompleteBatches:
    """Batches that became complete (their markers reached every partition), ready to apply in order."""

    #: (key, value) in apply order; value None is a tombstone
    changes: list[tuple[bytes, bytes | None]]
    #: the newest complete batch (the cut)
    batch_id: int
    marker: BatchMarker
    #: when the cut batch's last marker was written (ms)
    marker_time_ms: int
    #: per partition: the offset right after the cut batch's marker
    resume_offsets: dict[int, int]


def _batch_of(headers) -> int | None:
    for name, value in headers or ():
        if name == BATCH_HEADER:
            return int(value)
    return None


class BatchAssembler:
    """Groups changelog records into batches and releases the ones complete in every partition.

    Records wait in their partition until their batch's marker arrives; records of a batch a later
    marker declares void (half-written before a checkpoint loss) are dropped. The cut is the newest
    batch whose marker is in every partition: the writer marks every partition after every batch,
    so a partition without a newer marker means nothing newer is complete yet.
    """

    def __init__(self, partitions: list[int]) -> None:
        self.partitions = list(partitions)
        self.segments: dict[int, list[_Segment]] = {p: [] for p in self.partitions}
        self.pending: dict[int, list[tuple[int | None, bytes, bytes | None]]] = {p: [] for p in self.partitions}
        #: the newest marker batch per partition (kept after its segment is released)
        self.last_marked: dict[int, int] = {}
        self.records_dropped_void = 0
        #: the highest batch id seen (marked or not): a new query must continue above it
        self.max_batch_seen: int | None = None

    def add(self, partition: int, offset: int, key: bytes | None, value: bytes | None, headers, timestamp_ms: int = 0) -> None:
        p = partition
        if key == MARKER_KEY:
            marker = BatchMarker.from_bytes(value)
            seen = marker.batch_id
            # Records up to this marker belong to it, except those of void batches; later batches'
            # records wait for their own marker.
            records = [(k, v) for b, k, v in self.pending[p]
                       if (b is None or b <= marker.batch_id) and not (b is not None and marker.is_void(b))]  # fmt: skip
            self.records_dropped_void += sum(1 for b, _, _ in self.pending[p] if b is not None and marker.is_void(b))
            self.pending[p] = [(b, k, v) for b, k, v in self.pending[p] if b is not None and b > marker.batch_id]
            self.segments[p].append(_Segment(marker.batch_id, records, offset, marker, timestamp_ms))
            self.last_marked[p] = marker.batch_id
        else:
            seen = _batch_of(headers)
            self.pending[p].append((seen, key, value))
        if seen is not None and (self.max_batch_seen is None or seen > self.max_batch_seen):
            self.max_batch_seen = seen

    def cut(self) -> int | None:
        if not self.partitions or len(self.last_marked) < len(self.partitions):
            return None
        return min(self.last_marked.values())

    def take_complete(self) -> CompleteBatches | None:
        """Release every segment up to the cut (None when no new batch is complete)."""
        cut = self.cut()
        if cut is None or not any(s and s[0].batch_id <= cut for s in self.segments.values()):
            return None
        changes: list[tuple[bytes, bytes | None]] = []
        resume: dict[int, int] = {}
        marker, marker_time = None, 0
        # A key lives in one partition, so applying partitions one after another keeps per-key order.
        for p in self.partitions:
            while self.segments[p] and self.segments[p][0].batch_id <= cut:
                segment = self.segments[p].pop(0)
                changes.extend(segment.records)
                resume[p] = segment.marker_offset + 1
                if segment.batch_id == cut:
                    marker = segment.marker
                    marker_time = max(marker_time, segment.marker_time_ms)
        if marker is None:  # the cut batch itself was released earlier; only older segments were left
            return CompleteBatches(changes, cut, BatchMarker(cut, {}, 0), marker_time, resume)
        return CompleteBatches(changes, cut, marker, marker_time, resume)

    def unfinished_records(self) -> int:
        """Records read but not released: incomplete batches, and records without a marker yet."""
        return sum(len(s.records) for segs in self.segments.values() for s in segs) + sum(
            len(records) for records in self.pending.values())  # fmt: skip


def apply_changes(state: dict[bytes, bytes], changes: list[tuple[bytes, bytes | None]]) -> int:
    """Apply changes in order (a tombstone removes the key); returns the tombstones applied."""
    tombstones = 0
    for key, value in changes:
        if value is None:
            tombstones += 1
            state.pop(key, None)
        else:
            state[key] = value
    return tombstones


def _consumer(kafka: KafkaTarget, topic: str) -> Consumer:
    return Consumer(client_config(kafka, {"group.id": f"streamstate-restore-{topic}",
                     "enable.auto.commit": False, "enable.partition.eof": True, "log_level": 3,
                     "fetch.max.bytes": 64 * 1024 * 1024}))  # fmt: skip


def read_changelog(
    kafka: KafkaTarget,
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
    consumer = _consumer(kafka, topic)
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
        assembler = BatchAssembler(partitions)
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
            assembler.add(p, msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1])
            if msg.offset() + 1 >= high[p]:
                remaining.discard(p)

        state = dict(base_state or {})
        complete = assembler.take_complete()
        if complete is not None:
            result.records_applied = len(complete.changes)
            result.tombstones_applied = apply_changes(state, complete.changes)
            result.resume_offsets.update(complete.resume_offsets)
            result.input_offsets = complete.marker.input_offsets
            result.watermark_ms = complete.marker.watermark_ms
        result.cut_batch_id = assembler.cut()
        result.records_dropped_incomplete = assembler.records_dropped_void + assembler.unfinished_records()
        result.max_batch_seen = assembler.max_batch_seen
        result.state = state
        result.seconds = time.monotonic() - started
        return result
    finally:
        consumer.close()


class ChangelogMissing(LookupError):
    """The changelog topic does not exist: the job never started here, or it was reset."""


class ChangelogTail:
    """Follows a changelog from given offsets, releasing batches as they complete (a standby's reader).

    Unlike :func:`read_changelog` it never ends: each :meth:`poll` reads what arrived and returns the
    batches that became complete. :meth:`lag` says how far behind the topic's end it is.
    """

    def __init__(self, kafka: KafkaTarget, topic: str, start_offsets: Mapping[int, int] | None = None,
                 timeout_s: float = 30.0) -> None:  # fmt: skip
        self.topic = topic
        self.consumer = _consumer(kafka, topic)
        metadata = self.consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None or not metadata.partitions:
            self.consumer.close()
            raise ChangelogMissing(f"changelog topic {topic} does not exist (yet): {metadata.error}")
        self.partitions = sorted(metadata.partitions)
        start_offsets = dict(start_offsets or {})
        self.assembler = BatchAssembler(self.partitions)
        #: per partition: the next offset to read
        self.position = {p: start_offsets.get(p, 0) for p in self.partitions}
        self.consumer.assign([TopicPartition(topic, p, start_offsets.get(p, OFFSET_BEGINNING)) for p in self.partitions])
        self.high: dict[int, int] = {}
        #: consumer errors skipped as transient (a broker restart shows up here)
        self.transient_errors = 0

    def poll(self, max_wait_s: float = 1.0, max_records: int = 100_000) -> CompleteBatches | None:
        """Read what is there (waiting at most ``max_wait_s`` for the first record); the batches now complete."""
        deadline = time.monotonic() + max_wait_s
        read = 0
        while read < max_records:
            msg = self.consumer.poll(max(0.0, deadline - time.monotonic()) if read == 0 else 0)
            if msg is None:
                break
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    self.high[msg.partition()] = msg.offset()
                    if read == 0 and time.monotonic() < deadline:
                        continue
                    break
                if is_transient(msg.error()):  # the broker is restarting or slow: the consumer reconnects by itself
                    self.transient_errors += 1
                    log.info("following changelog %s: %s (transient, retrying)", self.topic, msg.error())
                    break
                raise RuntimeError(f"following changelog {self.topic}[{msg.partition()}]: {msg.error()}")
            read += 1
            self.position[msg.partition()] = msg.offset() + 1
            self.assembler.add(msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1])
        return self.assembler.take_complete()

    def end_offsets(self, timeout_s: float = 5.0) -> dict[int, int]:
        """The topic's end offset per partition now."""
        for p in self.partitions:
            self.high[p] = watermark_offsets(self.consumer, TopicPartition(self.topic, p), timeout_s)[1]
        return dict(self.high)

    def has_read(self, offsets: Mapping[int, int]) -> bool:
        """Whether every record before ``offsets`` has been read."""
        return all(self.position[p] >= offsets.get(p, 0) for p in self.partitions)

    def lag_records(self, end_offsets: Mapping[int, int]) -> int:
        """Records between the positions read and ``end_offsets`` (Kafka Streams' offset lag)."""
        return sum(max(0, end_offsets.get(p, 0) - self.position[p]) for p in self.partitions)

    def close(self) -> None:
        self.consumer.close()
