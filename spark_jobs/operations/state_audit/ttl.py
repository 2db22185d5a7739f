"""Is a store's declared TTL enforced? Measured from its changelog, not taken on trust.

A key-value store declared with ``ttl_ms`` promises that a key idle that long leaves the store, with a
tombstone in its changelog. The changelog holds, per key, its latest write, and each record's
timestamp is the wall-clock time of that write (``CreateTime``, set by the driver's Kafka sink). With a
processing-time TTL (``StoreSpec.ttl_clock``'s default) that timestamp is when the key was last touched, a
batch's duration late at most. A key whose latest
write is a value (no tombstone after it) and is older than ``ttl_ms`` + a tolerance is a key the TTL
should have evicted: it is *overdue*.

Overdue is judged at the newest complete batch, not at the time of the audit: a job with a TTL runs
no empty micro-batches (see ``spark_jobs/reference/jobs/purchase_counts.py``), so while its source is idle
nothing is evicted, and that is not a broken TTL. The tolerance is one trigger interval plus the
job's batch-duration budget: a key expires when a batch starts, its tombstone is written when the
batch ends. Snapshots and the standby play no part: the changelog is read directly, so their lag does
not count.

An event-time TTL is judged on the latest snapshot instead (:func:`event_time_ttl_verdict`): each key
keeps its event time and each partition its stream time, and after a batch no key of a partition may be
``ttl_ms`` behind that partition's stream time.

Verdicts: ``ttl_not_enforced`` when more than a few keys per thousand are overdue; otherwise
``ttl_verified`` once the store's known history (its oldest changelog record or snapshot) covers the
TTL + tolerance, ``ttl_unverifiable`` before that (or without a complete batch): no key could be
overdue yet. Only a verified TTL lets the audit call a store bounded (:func:`.trends.unbounded_growth`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Final, Self

from confluent_kafka import Consumer

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.io.kafka_topics import BOUNDED_READ_PREFETCH, read_partition
from spark_jobs.operations.changelog_tuning.recommend import human_ms
from spark_jobs.operations.state_audit.rows import SnapshotEntry, TtlVerdict
from spark_jobs.registry import JobSpec, StoreSpec, trigger_interval_s
from spark_jobs.state.changelog_reader import BatchAssembler

VERIFIED: Final = "ttl_verified"
NOT_ENFORCED: Final = "ttl_not_enforced"
UNVERIFIABLE: Final = "ttl_unverifiable"
#: overdue keys up to this share of the live keys are noise (the clocks of the executors that wrote
#: the records differ by a little), not a processor that does not evict
OVERDUE_TOLERANCE_SHARE = 0.001


@dataclasses.dataclass(frozen=True)
class KeyWrite:
    """A key's latest change in the changelog."""

    key: bytes
    #: when it was written (the record's timestamp, epoch ms)
    written_ms: int
    #: False: the latest change is a tombstone (deleted or evicted)
    present: bool


@dataclasses.dataclass(frozen=True)
class TtlCheck:
    """What the audit found about one store's TTL."""

    verdict: TtlVerdict
    #: live keys whose idle time was measured
    keys_checked: int
    #: live keys idle longer than the TTL + tolerance at the newest batch
    keys_overdue: int
    #: how long the most overdue key had been idle at the newest batch (None: none overdue)
    oldest_overdue_ms: int | None
    reason: str


def tolerance_ms(spec: JobSpec) -> int:
    """How late an eviction may legitimately land: one trigger interval plus the batch-duration budget."""
    return int((trigger_interval_s(spec.trigger_interval) + spec.supervision.batch_duration_budget_s) * 1000)


def ttl_verdict(
    ttl_ms: int,
    writes: Iterable[KeyWrite],
    *,
    evaluated_at_ms: int | None,
    history_since_ms: int | None,
    tolerance_ms: int,
) -> TtlCheck:
    """The verdict over every key's latest change.

    Args:
        evaluated_at_ms: when the newest complete batch was written (None: no complete batch yet).
        history_since_ms: the oldest evidence that the store existed (its oldest changelog record or
            snapshot; None: none beyond ``writes``).
        tolerance_ms: added to the TTL before a key counts as overdue (:func:`tolerance_ms`).
    """
    writes = list(writes)
    live = [w for w in writes if w.present]
    if evaluated_at_ms is None:
        return TtlCheck(UNVERIFIABLE, len(live), 0, None, "no complete batch in the changelog yet")
    deadline = evaluated_at_ms - ttl_ms - tolerance_ms  # a key last written before this should be gone
    overdue = [w for w in live if w.written_ms < deadline]
    oldest = max((evaluated_at_ms - w.written_ms for w in overdue), default=None)
    promise = f"TTL {human_ms(ttl_ms)} (+ {human_ms(tolerance_ms)} tolerance)"
    if len(overdue) > int(len(live) * OVERDUE_TOLERANCE_SHARE):
        return TtlCheck(
            NOT_ENFORCED,
            len(live),
            len(overdue),
            oldest,
            f"{len(overdue):,} of {len(live):,} live keys were idle longer than the {promise} and were "
            f"never evicted (the longest for {human_ms(oldest)}): the job's processor does not enforce "
            "the TTL",
        )
    starts = [t for t in [history_since_ms, *(w.written_ms for w in writes)] if t is not None]
    known_ms = evaluated_at_ms - min(starts) if starts else 0
    if known_ms < ttl_ms + tolerance_ms:
        return TtlCheck(
            UNVERIFIABLE,
            len(live),
            len(overdue),
            oldest,
            f"the store's known history ({human_ms(max(known_ms, 0))}) is shorter than its {promise}: "
            "no key can be overdue yet",
        )
    within = f" ({len(overdue)} overdue, within the tolerance)" if overdue else ""
    return TtlCheck(
        VERIFIED,
        len(live),
        len(overdue),
        oldest,
        f"no live key of {len(live):,} idle beyond the {promise}{within} over "
        f"{human_ms(known_ms)} of history: keys are evicted",
    )


def event_time_ttl_verdict(ttl_ms: int, entries: Iterable[SnapshotEntry]) -> TtlCheck:
    """An event-time TTL (``streamstate.primitives.ExpiringAggregate``) judged on a snapshot's entries: a key
    (``event_time_ms``, ``source_partition``) is overdue when its event time + ``ttl_ms`` is not after its
    partition's stream time (the entry with ``stream_time_ms``). The processor expires such a key before the
    batch ends, so a snapshot, taken after a batch, holds none."""
    entries = list(entries)
    stream_times = {e.source_partition: e.stream_time_ms for e in entries if isinstance(e.stream_time_ms, int)}
    live = [e for e in entries if isinstance(e.event_time_ms, int) and e.stream_time_ms is None]
    if not stream_times:
        return TtlCheck(UNVERIFIABLE, len(live), 0, None, "no snapshot with the partitions' stream times yet")
    behind = [stream_times[e.source_partition] - e.event_time_ms for e in live if e.source_partition in stream_times]
    overdue = [b for b in behind if b >= ttl_ms]
    oldest = max(overdue, default=None)
    promise = f"event-time TTL {human_ms(ttl_ms)}"
    if len(overdue) > int(len(live) * OVERDUE_TOLERANCE_SHARE):
        return TtlCheck(
            NOT_ENFORCED,
            len(live),
            len(overdue),
            oldest,
            f"{len(overdue):,} of {len(live):,} live keys in the latest snapshot are at least the {promise} behind "
            f"their partition's stream time (the furthest by {human_ms(oldest)}): the job's processor does not "
            "enforce the TTL",
        )
    return TtlCheck(
        VERIFIED,
        len(live),
        len(overdue),
        oldest,
        f"no live key of {len(live):,} in the latest snapshot is the {promise} behind its partition's stream time",
    )


class _WrittenKey(bytes):
    """A changelog record's key that carries the record's timestamp through :class:`BatchAssembler`
    (which releases keys and values of complete batches only, without their timestamps)."""

    written_ms: int

    def __new__(cls, key: bytes, written_ms: int) -> Self:
        self = super().__new__(cls, key)
        self.written_ms = written_ms
        return self


@dataclasses.dataclass(frozen=True)
class ChangelogWrites:
    """A changelog read for the TTL check: every key's latest change in the complete batches."""

    writes: list[KeyWrite]
    #: when the newest complete batch's markers were written (None: no complete batch)
    newest_batch_ms: int | None
    #: the oldest record's timestamp in the topic, markers and tombstones included (None: empty)
    oldest_record_ms: int | None


def read_key_writes(kafka: KafkaTarget, topic: str, poll_timeout_s: float = 30.0) -> ChangelogWrites:
    """Read ``topic`` from its start to its current end: each key's latest change in the batches
    complete in every partition (a half-written or void batch never counts, as on restore)."""
    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": f"streamstate-ttl-audit-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 3,
                **BOUNDED_READ_PREFETCH,
            },
        )
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=poll_timeout_s).topics[topic].partitions)
        assembler = BatchAssembler(partitions)
        oldest: int | None = None
        for p in partitions:
            for msg in read_partition(consumer, topic, p, poll_timeout_s):
                written_ms = msg.timestamp()[1]
                oldest = written_ms if oldest is None else min(oldest, written_ms)
                assembler.add(
                    p, msg.offset(), _WrittenKey(msg.key() or b"", written_ms), msg.value(), msg.headers(), written_ms
                )
    finally:
        consumer.close()
    complete = assembler.take_complete()
    if complete is None:
        return ChangelogWrites([], None, oldest)
    latest: dict[bytes, KeyWrite] = {}
    for key, value in complete.changes:  # in apply order: the last change of a key wins
        latest[bytes(key)] = KeyWrite(bytes(key), key.written_ms, value is not None)
    return ChangelogWrites(list(latest.values()), complete.marker_time_ms, oldest)


def check_ttl(
    kafka: KafkaTarget, spec: JobSpec, store: StoreSpec, topic: str, *, snapshots_since_ms: int | None
) -> TtlCheck:
    """Measure whether ``store``'s TTL evicts keys, from its changelog ``topic``.
    ``snapshots_since_ms``: when the store's oldest snapshot still in its table was taken."""
    read = read_key_writes(kafka, topic)
    since = [t for t in (read.oldest_record_ms, snapshots_since_ms) if t is not None]
    return ttl_verdict(
        store.ttl_ms,
        read.writes,
        evaluated_at_ms=read.newest_batch_ms,
        history_since_ms=min(since) if since else None,
        tolerance_ms=tolerance_ms(spec),
    )
