"""Read a store's changelog from given offsets and cut it at the last complete micro-batch.

A batch is complete when its marker reached every partition (see :mod:`.changelog`). The reader
folds records batch by batch per partition (latest value wins, a tombstone removes the key) and
applies exactly the batches up to the cut, so a batch the writer did not finish is never restored.
It keeps no offsets of its own beyond the read: the result says where the next read starts.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Iterator, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.io.kafka_topics import BOUNDED_READ_PREFETCH, is_transient, partition_offsets, watermark_offsets
from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.checkpoint_offsets import KafkaOffsets
from spark_jobs.state.cut_rules import BatchSpan, MarkerRecord, cut_of, plan_cut

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
    #: with ``keep_changes``: key -> its last change in the complete batches (None: deleted), a layer's rows
    changes: dict[bytes, bytes | None] | None = None
    #: the marker of the cut batch, when one was released in the range read
    cut_marker: BatchMarker | None = None


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
    if headers and headers[0][0] == BATCH_HEADER:  # the writer's only header
        return int(headers[0][1])
    for name, value in headers or ():
        if name == BATCH_HEADER:
            return int(value)
    return None


#: A changelog record read and not yet released or dropped: ``(offset, key, value, batch_id, timestamp_ms,
#: marker)``, ``marker`` the BatchMarker of a marker record, else None. A plain tuple: a restore buffers one per
#: record, and Python's collector stops tracking a plain tuple of bytes and ints (not a NamedTuple's), so a
#: buffer of 800,000 records is not rescanned at every collection (2.6-2.8 s read without the collector, 4.0-4.3
#: with it and a NamedTuple).
_Read = tuple[int, bytes | None, bytes | None, int | None, int, BatchMarker | None]
_offset = operator.itemgetter(0)


class BatchAssembler:
    """Buffers changelog records and releases the batches complete in every partition.

    The rules (which batch is complete, which records a marker absorbs, which are void) are
    :mod:`.cut_rules`'; this class feeds them what it read and keeps what waits for a later marker.
    Records of complete batches come out in apply order, once.
    """

    def __init__(self, partitions: list[int]) -> None:
        self.partitions = list(partitions)
        #: per partition: records read and not released or dropped yet, in offset order
        self.buffer: dict[int, list[_Read]] = {p: [] for p in self.partitions}
        #: the newest marker batch per partition (kept after it is released)
        self.last_marked: dict[int, int] = {}
        self.records_dropped_void = 0
        #: the highest batch id seen (marked or not): a new query must continue above it
        self.max_batch_seen: int | None = None

    def add(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, headers, timestamp_ms: int = 0
    ) -> None:
        if key == MARKER_KEY:
            marker = BatchMarker.from_bytes(value)
            seen = marker.batch_id
            self.last_marked[partition] = seen
            self.buffer[partition].append((offset, key, value, seen, timestamp_ms, marker))
        else:
            seen = _batch_of(headers)
            self.buffer[partition].append((offset, key, value, seen, timestamp_ms, None))
        if seen is not None and (self.max_batch_seen is None or seen > self.max_batch_seen):
            self.max_batch_seen = seen

    def cut(self) -> int | None:
        return cut_of(self.partitions, self.last_marked)

    def take_complete(self) -> CompleteBatches | None:
        """Release every batch up to the cut (None when no new batch is complete); void records are dropped."""
        markers, spans = [], {}
        for p, records in self.buffer.items():
            for offset, _key, _value, batch_id, timestamp_ms, marker in records:
                if marker is not None:
                    markers.append(MarkerRecord(p, offset, marker, timestamp_ms))
                else:
                    n, first, _ = spans.get((p, batch_id), (0, offset, offset))
                    spans[(p, batch_id)] = (n + 1, first, offset)
        plan = plan_cut(
            self.partitions,
            markers,
            [BatchSpan(p, b, *span) for (p, b), span in spans.items()],
            last_marked=self.last_marked,
        )
        changes: list[tuple[bytes, bytes | None]] = []
        for p in self.partitions:
            applied, waiting = [], []
            resume = plan.resume_offsets.get(p, 0)
            records = self.buffer[p]
            if plan.offset_range_only:  # every data record before the resume offset, in offset order
                released = bisect.bisect_left(records, resume, key=_offset)
                changes.extend((read[1], read[2]) for read in records[:released] if read[5] is None)
                records = records[released:]
            for read in records:
                offset, key, value, batch_id, _timestamp_ms, marker = read
                if marker is not None:
                    if offset >= resume:  # not released yet
                        waiting.append(read)
                elif (at := plan.absorbed_at(p, offset, batch_id)) is not None:
                    applied.append((at, offset, key, value))
                elif plan.is_voided(p, offset, batch_id):
                    self.records_dropped_void += 1
                else:
                    waiting.append(read)
            # in the order their markers absorbed them (a key lives in one partition, so per-key order holds)
            applied.sort(key=lambda item: (item[0], item[1]))
            changes.extend((key, value) for _at, _offset, key, value in applied)
            self.buffer[p] = waiting
        if not plan.released:
            return None
        marker = plan.marker or BatchMarker(plan.cut, {}, 0)  # the cut batch itself was released earlier
        return CompleteBatches(changes, plan.cut, marker, plan.marker_time_ms, plan.resume_offsets)

    def unfinished_records(self) -> int:
        """Records read but not released: incomplete batches, and records without a marker yet."""
        return sum(1 for records in self.buffer.values() for read in records if read[5] is None)


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


def _consumer(kafka: KafkaTarget, topic: str, **overrides) -> Consumer:
    return Consumer(
        client_config(
            kafka,
            {
                "group.id": f"streamstate-restore-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 3,
                **BOUNDED_READ_PREFETCH,
                **overrides,
            },
        )
    )


#: records taken from librdkafka's queue per call, and how long a call waits for them: a batch read costs one
#: call where polling costs one per record (800,000 records: 0.93 s read against 1.25-1.38 s polled)
CONSUME_BATCH, CONSUME_WAIT_S = 1000, 0.05


def _read_range(
    consumer: Consumer, topic: str, start: Mapping[int, int], end: Mapping[int, int], poll_timeout_s: float
) -> Iterator[Message]:
    """The records of ``[start, end)`` per partition, in offset order per partition. The end of a partition
    is known by its EOF event too: a transaction's commit marker may hold its last offset and is never
    delivered. Raises TimeoutError when no record arrives for ``poll_timeout_s``."""
    remaining = {p for p in end if start.get(p, 0) < end[p]}
    if not remaining:
        return
    consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in sorted(remaining)])
    deadline = time.monotonic() + poll_timeout_s
    while remaining:
        messages = consumer.consume(CONSUME_BATCH, CONSUME_WAIT_S)
        if not messages:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading changelog {topic}: no data for {poll_timeout_s}s, partitions {remaining} unfinished"
                )
            continue
        deadline = time.monotonic() + poll_timeout_s
        for msg in messages:
            p = msg.partition()
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    remaining.discard(p)
                    continue
                raise RuntimeError(f"reading changelog {topic}[{p}]: {msg.error()}")
            if p not in remaining or msg.offset() >= end[p]:  # a batch may hold records past a partition's end
                remaining.discard(p)
                continue
            yield msg
            if msg.offset() + 1 >= end[p]:
                remaining.discard(p)


def summarize_range(
    kafka: KafkaTarget, topic: str, start: Mapping[int, int], end: Mapping[int, int], poll_timeout_s: float = 30.0
) -> tuple[list[MarkerRecord], list[BatchSpan]]:
    """Every batch marker of ``[start, end)`` and one span per (partition, batch header) of its data records:
    what :func:`.cut_rules.plan_cut` plans from. Values are read and dropped, so memory grows with the
    batches in the range, not its records (the first pass of a Spark read of a short tail, done here
    rather than by a Spark job). The consumer's prefetch queue is the read's memory
    (:data:`~spark_jobs.io.kafka_topics.BOUNDED_READ_PREFETCH`)."""
    consumer = _consumer(kafka, topic)
    markers: list[MarkerRecord] = []
    spans: dict[tuple[int, int | None], tuple[int, int, int]] = {}
    try:
        for msg in _read_range(consumer, topic, start, end, poll_timeout_s):
            p, offset = msg.partition(), msg.offset()
            if msg.key() == MARKER_KEY:
                markers.append(MarkerRecord(p, offset, BatchMarker.from_bytes(msg.value()), msg.timestamp()[1]))
            else:
                batch_id = _batch_of(msg.headers())
                n, first, _ = spans.get((p, batch_id), (0, offset, offset))
                spans[(p, batch_id)] = (n + 1, first, offset)
    finally:
        consumer.close()
    return markers, [BatchSpan(p, batch_id, *span) for (p, batch_id), span in spans.items()]


def read_changelog(
    kafka: KafkaTarget,
    topic: str,
    start_offsets: Mapping[int, int] | None = None,
    *,
    base_state: dict[bytes, bytes] | None = None,
    on_progress: Callable[[int], None] | None = None,
    poll_timeout_s: float = 30.0,
    keep_changes: bool = False,
) -> ChangelogRead:
    """Read ``topic`` from ``start_offsets`` (default: the beginning) to its current end.

    Args:
        base_state: state to apply the changelog on (a snapshot); copied, not modified.
        on_progress: called with the number of records read so far, every 10,000 records.
        keep_changes: also return each changed key's last change, deletes included (``changes``).
    """
    started = time.monotonic()
    consumer = _consumer(kafka, topic)
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=poll_timeout_s).topics[topic].partitions)
        start_offsets = dict(start_offsets or {})
        high, first = {}, {}
        for p in partitions:
            low, hi = watermark_offsets(consumer, TopicPartition(topic, p), poll_timeout_s)
            # a start below the log start (records deleted by retention) reads from the log start
            high[p], first[p] = hi, max(low, start_offsets.get(p, 0))
        assembler = BatchAssembler(partitions)
        result = ChangelogRead(topic, {}, None, {}, resume_offsets=dict(first))

        add, records_read = assembler.add, 0
        for msg in _read_range(consumer, topic, first, high, poll_timeout_s):
            records_read += 1
            if on_progress and records_read % 10_000 == 0:
                on_progress(records_read)
            add(msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers(), msg.timestamp()[1])
        result.records_read = records_read

        state = dict(base_state or {})
        complete = assembler.take_complete()
        if complete is not None:
            result.records_applied = len(complete.changes)
            result.tombstones_applied = apply_changes(state, complete.changes)
            if keep_changes:
                result.changes = dict(complete.changes)
            result.resume_offsets.update(complete.resume_offsets)
            result.input_offsets = complete.marker.input_offsets
            result.watermark_ms = complete.marker.watermark_ms
            result.cut_marker = complete.marker
        result.cut_batch_id = assembler.cut()
        result.records_dropped_incomplete = assembler.records_dropped_void + assembler.unfinished_records()
        result.max_batch_seen = assembler.max_batch_seen
        result.state = state
        result.seconds = time.monotonic() - started
        return result
    finally:
        consumer.close()


def last_complete_batch(
    kafka: KafkaTarget, topic: str, window: int = 4096, timeout_s: float = 30.0
) -> BatchMarker | None:
    """The marker of the newest batch complete in every partition of ``topic`` (None: no batch is).

    Read from the end: the last ``window`` records of each partition, a wider window while some partition
    has no marker in it. A driver's markers follow every batch, so one small read usually answers.
    ``timeout_s`` bounds the wait for the topic's metadata and offsets (an unreachable broker).
    """
    ends = partition_offsets(kafka, topic, timeout_s)
    while True:
        start = {p: max(low, high - window) for p, (low, high) in ends.items()}
        read = read_changelog(kafka, topic, start)
        if read.cut_batch_id is not None:
            if read.cut_marker is None:  # the cut is the newest marker of some partition: it is in the window
                raise RuntimeError(f"{topic}: batch {read.cut_batch_id} is complete but its marker was not read")
            return read.cut_marker
        if all(start[p] == low for p, (low, _high) in ends.items()):
            return None
        window *= 8


class ChangelogMissing(LookupError):
    """The changelog topic does not exist: the job never started here, or it was reset."""


class ChangelogTail:
    """Follows a changelog from given offsets, releasing batches as they complete (a standby's reader).

    Unlike :func:`read_changelog` it never ends: each :meth:`poll` reads what arrived and returns the
    batches that became complete. :meth:`lag` says how far behind the topic's end it is.
    """

    def __init__(
        self, kafka: KafkaTarget, topic: str, start_offsets: Mapping[int, int] | None = None, timeout_s: float = 30.0
    ) -> None:
        self.kafka, self.topic = kafka, topic
        self.consumer = _consumer(kafka, topic)
        metadata = self.consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None or not metadata.partitions:
            self.consumer.close()
            raise ChangelogMissing(f"changelog topic {topic} does not exist (yet): {metadata.error}")
        self.partitions = sorted(metadata.partitions)
        start_offsets = dict(start_offsets or {})
        self.assembler = BatchAssembler(self.partitions)
        #: per partition: the next offset to read (not below the log start: see read_changelog)
        self.position = {
            p: max(start_offsets.get(p, 0), watermark_offsets(self.consumer, TopicPartition(topic, p), timeout_s)[0])
            for p in self.partitions
        }
        self.consumer.assign([TopicPartition(topic, p, offset) for p, offset in self.position.items()])
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
                    # the end may lie past a transaction's commit marker, which is never delivered as a record
                    self.position[msg.partition()] = max(self.position[msg.partition()], msg.offset())
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
        """The topic's end offset per partition now.

        Raises:
            KafkaException: no answer (a transient error, see :func:`~spark_jobs.io.kafka_topics.is_transient`,
                retried for ``timeout_s``); after ``_UNKNOWN_PARTITION`` the tail has a new consumer
                (:meth:`reopen`) for the next call.
        """
        try:
            for p in self.partitions:
                self.high[p] = watermark_offsets(self.consumer, TopicPartition(self.topic, p), timeout_s)[1]
        except KafkaException as err:
            # A client whose metadata lost the partition while the broker was away may keep answering so until
            # its metadata cache expires (minutes; a live view stayed stale for over 90 s in CI, the standby
            # beside it recovered in 20): a new client asks the broker afresh.
            if err.args[0].code() == KafkaError._UNKNOWN_PARTITION:
                self.reopen()
            raise
        return dict(self.high)

    def reopen(self) -> None:
        """A new consumer, from the positions read so far (the batches being assembled are kept: nothing is
        read twice or skipped)."""
        self.consumer.close()
        self.consumer = _consumer(self.kafka, self.topic)
        self.consumer.assign([TopicPartition(self.topic, p, offset) for p, offset in self.position.items()])

    def has_read(self, offsets: Mapping[int, int]) -> bool:
        """Whether every record before ``offsets`` has been read."""
        return all(self.position[p] >= offsets.get(p, 0) for p in self.partitions)

    def lag_records(self, end_offsets: Mapping[int, int]) -> int:
        """Records between the positions read and ``end_offsets`` (Kafka Streams' offset lag)."""
        return sum(max(0, end_offsets.get(p, 0) - self.position[p]) for p in self.partitions)

    def close(self) -> None:
        self.consumer.close()
