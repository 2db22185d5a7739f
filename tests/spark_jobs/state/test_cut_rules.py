"""The cut planner against the record-by-record reader, on thousands of generated changelogs (pure logic).

Two families of logs: what the writer produces (batches, crashes mid-data and mid-markers, replays,
restores after a lost checkpoint with void ranges) and adversarial ones (random ids, voids, records
without a batch header). For each, :func:`plan_cut` must give the cut, resume offsets, cut marker,
state and counts of the record-by-record reader the project had before it (frozen below as the
oracle), and whenever it says the offset range alone is enough,
folding that range in offset order must give the same state.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.changelog_reader import BatchAssembler, CompleteBatches, _batch_of, apply_changes
from spark_jobs.state.cut_rules import BatchSpan, MarkerRecord, plan_cut

#: partition -> [(key, value, batch header)] in offset order
Log = dict[int, list[tuple[bytes, bytes | None, int | None]]]


@dataclasses.dataclass
class _Segment:
    batch_id: int
    records: list[tuple[bytes, bytes | None]]
    marker_offset: int
    marker: BatchMarker
    marker_time_ms: int = 0


class RecordByRecordAssembler:
    """The reader as it was before the planner (frozen here as the oracle). Groups changelog records into batches and releases the ones complete in every partition.

    Records wait in their partition until their batch's marker arrives; records of a batch a later
    marker declares void (half-written before a checkpoint loss) are dropped. The cut is the newest
    batch whose marker is in every partition: the writer marks every partition after every batch,
    so a partition without a newer marker means nothing newer is complete yet.
    """

    def __init__(self, partitions: list[int]) -> None:
        self.partitions = list(partitions)
        self.segments: dict[int, list[_Segment]] = {p: [] for p in self.partitions}
        self.pending: dict[int, list[tuple[int | None, bytes, bytes | None]]] = {p: [] for p in self.partitions}
        self.last_marked: dict[int, int] = {}
        self.records_dropped_void, self.max_batch_seen = 0, None

    def add(self, p: int, offset: int, key: bytes | None, value: bytes | None, headers, timestamp_ms: int = 0) -> None:
        if key == MARKER_KEY:
            marker = BatchMarker.from_bytes(value)
            seen = marker.batch_id
            # Records up to this marker belong to it, except those of void batches; later batches'
            # records wait for their own marker.
            records = [
                (k, v)
                for b, k, v in self.pending[p]
                if (b is None or b <= marker.batch_id) and not (b is not None and marker.is_void(b))
            ]
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
            len(records) for records in self.pending.values()
        )


def _assembler(log: Log, kind=None):
    assembler = (kind or RecordByRecordAssembler)(sorted(log))
    for p, records in log.items():
        for offset, (key, value, batch) in enumerate(records):
            headers = [(BATCH_HEADER, str(batch).encode())] if batch is not None and key != MARKER_KEY else []
            assembler.add(p, offset, key, value, headers, timestamp_ms=1000 + offset)
    return assembler


def writer_log(rnd: random.Random) -> Log:
    """What :class:`ChangelogWriter` leaves behind across crashes, replays and checkpoint losses."""
    log: Log = {p: [] for p in range(rnd.randint(1, 3))}
    partitions = len(log)

    def mark(p: int, marker: BatchMarker) -> None:
        log[p].append((MARKER_KEY, marker.to_bytes(), marker.batch_id))

    base, restored, batch = 0, None, 0
    for _ in range(rnd.randint(1, 12)):
        event = rnd.random()
        keys = rnd.sample(range(8), rnd.randint(0, 4))
        batch_id = base + batch
        for key in keys:
            value = rnd.choice([None, b"%d" % batch, b"v%d" % rnd.randint(0, 9)])
            log[key % partitions].append((f"k{key}".encode(), value, batch_id))
        void = {"void": ((restored, base),)} if base and restored is not None else {}
        if event < 0.3:  # a crash before or among the markers
            for p in range(rnd.randint(0, partitions)):
                mark(p, BatchMarker(batch_id, {}, 0, **void))
            if event < 0.15:
                continue  # the checkpoint survived: the batch is replayed with the same id
            # the checkpoint is lost: a restore from the log as it is, the next query above every id seen
            assembler = _assembler(log)
            restored, base, batch = assembler.cut(), (assembler.max_batch_seen or -1) + 1, 0
            continue
        for p in range(partitions):
            mark(p, BatchMarker(batch_id, {"in": {0: batch_id}}, len(keys), watermark_ms=batch_id, **void))
        batch += 1
    return log


def adversarial_log(rnd: random.Random) -> Log:
    log: Log = {p: [] for p in range(rnd.randint(1, 3))}
    for _ in range(rnd.randint(0, 40)):
        p = rnd.randrange(len(log))
        if rnd.random() < 0.3:
            after = rnd.choice([None, rnd.randint(0, 5)])
            before = None if after is None else after + rnd.randint(1, 4)
            marker = BatchMarker(rnd.randint(0, 9), {}, 0, void=((after, before),) if after is not None else ())
            log[p].append((MARKER_KEY, marker.to_bytes(), marker.batch_id))
        else:
            key = f"k{rnd.randint(0, 5) * len(log) + p}".encode()
            log[p].append((key, rnd.choice([None, b"x", b"y", b"z"]), rnd.choice([None, *range(10)])))
    return log


def _plan(log: Log):
    markers, spans = [], {}
    for p, records in log.items():
        for offset, (key, value, batch) in enumerate(records):
            if key == MARKER_KEY:
                markers.append(MarkerRecord(p, offset, BatchMarker.from_bytes(value), 1000 + offset))
            else:
                n, first, _ = spans.get((p, batch), (0, offset, offset))
                spans[(p, batch)] = (n + 1, first, offset)
    return plan_cut(log, markers, [BatchSpan(p, b, n, first, last) for (p, b), (n, first, last) in spans.items()])


def _fold_planned(log: Log, plan) -> tuple[dict, int, int]:
    """Apply the plan record by record: latest per key by (partition, absorbing marker, offset)."""
    latest, applied, tombstones = {}, 0, 0
    for p, records in log.items():
        for offset, (key, value, batch) in enumerate(records):
            at = plan.absorbed_at(p, offset, batch) if key != MARKER_KEY else None
            if at is None:
                continue
            applied += 1
            tombstones += value is None
            if key not in latest or (p, at, offset) > latest[key][0]:
                latest[key] = ((p, at, offset), value)
    return {k: v for k, (_, v) in latest.items() if v is not None}, applied, tombstones


def _fold_range(log: Log, plan) -> dict:
    state: dict = {}
    for p, records in log.items():
        data = [(k, v) for k, v, _ in records[: plan.resume_offsets.get(p, 0)] if k != MARKER_KEY]
        apply_changes(state, data)
    return state


@pytest.mark.parametrize("family", [writer_log, adversarial_log], ids=["writer", "adversarial"])
def test_the_plan_applies_what_the_record_by_record_reader_applies(family):
    range_only = 0
    for seed in range(4000):
        log = family(random.Random(seed))
        oracle = _assembler(log)
        expected: dict = {}
        complete = oracle.take_complete()
        tombstones = apply_changes(expected, complete.changes) if complete else 0
        plan = _plan(log)
        state, applied, planned_tombstones = _fold_planned(log, plan)
        where = f"seed {seed}: {log}"

        assert plan.cut == oracle.cut(), where
        assert plan.max_batch_seen == oracle.max_batch_seen, where
        assert state == expected, where
        assert (applied, planned_tombstones) == ((len(complete.changes), tombstones) if complete else (0, 0)), where
        assert plan.resume_offsets == (complete.resume_offsets if complete else {}), where
        if complete is not None and plan.marker is not None:
            assert (plan.marker, plan.marker_time_ms) == (complete.marker, complete.marker_time_ms), where
        assert (plan.marker is None) == (complete is None or complete.marker_time_ms == 0), where
        if plan.records_applied is not None:
            assert plan.records_applied == applied, where
        # (the assembler also counts void records a marker leaves pending, which only adversarial logs hold)
        if plan.records_dropped_void is not None and family is writer_log:
            assert plan.records_dropped_void == oracle.records_dropped_void, where
        if plan.offset_range_only:
            range_only += 1
            assert _fold_range(log, plan) == expected, where
    if family is writer_log:  # the common case (no checkpoint loss) must not need the keep table
        assert range_only > 2000, range_only


def test_a_batch_without_markers_everywhere_is_not_applied():
    log: Log = {
        0: [(b"a", b"1", 0), (MARKER_KEY, BatchMarker(0, {}, 1).to_bytes(), 0), (b"a", b"2", 1)],
        1: [(b"b", b"1", 0), (MARKER_KEY, BatchMarker(0, {}, 1).to_bytes(), 0), (b"b", b"2", 1)],
    }
    log[0].append((MARKER_KEY, BatchMarker(1, {}, 1).to_bytes(), 1))  # batch 1 marked in partition 0 only
    plan = _plan(log)
    assert plan.cut == 0 and plan.resume_offsets == {0: 2, 1: 2} and plan.offset_range_only
    assert _fold_planned(log, plan)[0] == {b"a": b"1", b"b": b"1"}
    assert plan.records_applied == 2


def test_records_of_a_void_batch_are_dropped_and_force_the_keep_table():
    void = BatchMarker(5, {}, 1, void=((0, 5),))
    log: Log = {
        0: [
            (b"a", b"1", 0),
            (MARKER_KEY, BatchMarker(0, {}, 1).to_bytes(), 0),
            (b"a", b"half", 1),
            (b"a", b"3", 5),
            (MARKER_KEY, void.to_bytes(), 5),
        ]
    }
    plan = _plan(log)
    assert plan.cut == 5 and not plan.offset_range_only
    assert _fold_planned(log, plan)[0] == {b"a": b"3"}
    assert (plan.records_applied, plan.records_dropped_void) == (2, 1)


def test_a_follower_counts_the_markers_it_read_before():
    plan = plan_cut([0, 1], [MarkerRecord(0, 7, BatchMarker(3, {}, 0))], [], last_marked={1: 3})
    assert plan.cut == 3 and plan.resume_offsets == {0: 8}


@pytest.mark.parametrize("family", [writer_log, adversarial_log], ids=["writer", "adversarial"])
def test_a_follower_releases_what_the_record_by_record_reader_released_at_every_poll(family):
    """:class:`BatchAssembler` (the planner over a buffer) polled at random points, against the oracle."""
    for seed in range(2000):
        rnd = random.Random(seed)
        log = family(rnd)
        queues = {p: list(enumerate(records)) for p, records in log.items()}
        reads = []  # partitions interleaved at random, each in offset order
        while any(queues.values()):
            p = rnd.choice([p for p, queue in queues.items() if queue])
            reads.append((p, *queues[p].pop(0)))
        follower, oracle = BatchAssembler(sorted(log)), RecordByRecordAssembler(sorted(log))
        for p, offset, (key, value, batch) in reads:
            headers = [(BATCH_HEADER, str(batch).encode())] if batch is not None and key != MARKER_KEY else []
            for assembler in (follower, oracle):
                assembler.add(p, offset, key, value, headers, timestamp_ms=1000 + offset)
            if rnd.random() < 0.3:
                got, expected = follower.take_complete(), oracle.take_complete()
                assert got == expected, f"seed {seed}: {log}"
        assert follower.take_complete() == oracle.take_complete(), f"seed {seed}: {log}"
        assert (follower.cut(), follower.max_batch_seen) == (oracle.cut(), oracle.max_batch_seen)
        assert follower.unfinished_records() == oracle.unfinished_records(), f"seed {seed}: {log}"
