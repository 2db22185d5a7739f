"""Where a store's changelog is cut, and which of its records a restore applies: one planner for every reader.

A changelog (see :mod:`.changelog`) holds data records tagged with their batch id and, after each
batch, one marker per partition. The rules a reader follows:

1. **The cut** is the oldest of the partitions' *last* markers: nothing newer is complete in every
   partition. No marker in some partition: no cut.
2. **Absorption**: a data record of batch ``b`` belongs to the first marker after it in its partition
   whose batch id is ``>= b`` (a record without a batch header: the first marker after it). If that
   marker declares ``b`` void (half-written before a checkpoint loss), the record is dropped.
3. **Release**: per partition, markers are released in offset order while their batch id is ``<=``
   the cut. The records they absorbed are applied, in the order (partition, absorbing marker's offset,
   offset), the latest value per key wins, a null value deletes the key.
4. A later read **resumes** right after the last released marker of each partition; the cut batch's
   marker gives the input offsets and watermark the state corresponds to.

:func:`plan_cut` applies these rules to what a reader can gather cheaply in one pass: every marker,
and one :class:`BatchSpan` per (partition, batch header) (count, first and last offset). Its
:class:`CutPlan` says which offset ranges are kept. The Python reader (:mod:`.changelog_reader`)
applies it record by record, Spark's reader (:mod:`.changelog_spark`) as offset ranges, so the rules
live here once. No Kafka and no Spark in this module.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping

from spark_jobs.state.batch_records import BatchMarker


@dataclasses.dataclass(frozen=True)
class MarkerRecord:
    """A batch marker where it was read."""

    partition: int
    offset: int
    marker: BatchMarker
    #: the record's CreateTime (ms)
    timestamp_ms: int = 0


@dataclasses.dataclass(frozen=True)
class BatchSpan:
    """The data records of one batch (by header; None: no header) in one partition of the range read."""

    partition: int
    batch_id: int | None
    records: int
    first_offset: int
    last_offset: int


@dataclasses.dataclass(frozen=True)
class KeptRange:
    """Data records of ``batch_id`` in ``[first_offset, end_offset)`` of ``partition`` are applied, ordered
    at ``absorbed_at`` (the offset of the marker that released them)."""

    partition: int
    batch_id: int | None
    first_offset: int
    end_offset: int
    absorbed_at: int


@dataclasses.dataclass
class CutPlan:
    """What a read of a changelog range applies (see the module docstring)."""

    partitions: list[int]
    #: the newest batch complete in every partition (None: none)
    cut: int | None
    #: the cut batch's marker (None when no marker of the cut batch was released in this range)
    marker: BatchMarker | None
    #: when the cut batch's last released marker was written (ms)
    marker_time_ms: int
    #: per partition with a released marker: the offset right after the last one
    resume_offsets: dict[int, int]
    kept: list[KeptRange]
    #: data records absorbed by a marker that declared their batch void (dropped, released or not)
    voided: list[KeptRange]
    #: every data record before ``resume_offsets`` is kept, each absorbed by the next marker after it:
    #: a reader may apply the offset range ``[start, resume)`` in offset order, without ``kept``
    offset_range_only: bool
    #: data records kept (exact when every span is wholly kept or wholly dropped, else None)
    records_applied: int | None
    #: data records absorbed by a marker that declared their batch void
    records_dropped_void: int | None
    #: the highest batch id seen in the range (marked or not): a new query must continue above it
    max_batch_seen: int | None

    @property
    def released(self) -> bool:
        """Whether any marker was released (else the range adds nothing to a snapshot)."""
        return bool(self.resume_offsets)

    def absorbed_at(self, partition: int, offset: int, batch_id: int | None) -> int | None:
        """The offset of the marker that releases this data record, or None when it is not applied."""
        return _find(self._kept_by, partition, offset, batch_id)

    def is_voided(self, partition: int, offset: int, batch_id: int | None) -> bool:
        return _find(self._voided_by, partition, offset, batch_id) is not None

    def __post_init__(self) -> None:
        self._kept_by = _index(self.kept)
        self._voided_by = _index(self.voided)


def _index(ranges: list[KeptRange]) -> dict[tuple[int, int | None], list[KeptRange]]:
    by: dict[tuple[int, int | None], list[KeptRange]] = {}
    for kept in ranges:
        by.setdefault((kept.partition, kept.batch_id), []).append(kept)
    return by


def _find(by: dict, partition: int, offset: int, batch_id: int | None) -> int | None:
    for kept in by.get((partition, batch_id), ()):
        if kept.first_offset <= offset < kept.end_offset:
            return kept.absorbed_at
    return None


def cut_of(partitions: Iterable[int], last_marked: Mapping[int, int]) -> int | None:
    """Rule 1: the oldest of the partitions' last markers (None while some partition has none)."""
    partitions = list(partitions)
    if not partitions or any(p not in last_marked for p in partitions):
        return None
    return min(last_marked[p] for p in partitions)


def plan_cut(
    partitions: Iterable[int],
    markers: Iterable[MarkerRecord],
    spans: Iterable[BatchSpan],
    last_marked: Mapping[int, int] | None = None,
) -> CutPlan:
    """The plan for a range whose markers and data spans are given.

    Args:
        last_marked: per partition, the batch id of the last marker read *before* this range (a
            follower's earlier reads): rule 1 counts it for a partition with no marker in the range.
    """
    partitions = sorted(partitions)
    by_partition: dict[int, list[MarkerRecord]] = {p: [] for p in partitions}
    for record in markers:
        by_partition[record.partition].append(record)
    for records in by_partition.values():
        records.sort(key=lambda r: r.offset)
    spans = list(spans)
    marker_offsets = {p: [r.offset for r in records] for p, records in by_partition.items()}

    last = dict(last_marked or {})
    last.update({p: records[-1].marker.batch_id for p, records in by_partition.items() if records})
    cut = cut_of(partitions, last)

    # rule 3: per partition, how many leading markers are released
    released: dict[int, int] = {}
    for p, records in by_partition.items():
        n = 0
        while cut is not None and n < len(records) and records[n].marker.batch_id <= cut:
            n += 1
        released[p] = n
    resume = {p: by_partition[p][n - 1].offset + 1 for p, n in released.items() if n}
    marker, marker_time = None, 0
    for p in partitions:  # the last released marker of the cut batch, as the partitions are applied
        for record in by_partition[p][: released[p]]:
            if record.marker.batch_id == cut:
                marker, marker_time = record.marker, max(marker_time, record.timestamp_ms)

    kept: list[KeptRange] = []
    voided: list[KeptRange] = []
    exact, applied, void = True, 0, 0
    offset_range_only = True
    for span in spans:
        records = by_partition[span.partition]
        offsets = marker_offsets[span.partition]
        gaps = kept_gaps = void_gaps = 0
        # gap i: the offsets between marker i-1 and marker i (gap 0 before the first, the last after the last)
        for gap in range(bisect.bisect_left(offsets, span.first_offset), len(records) + 1):
            gap_first = records[gap - 1].offset + 1 if gap else -1
            gap_end = records[gap].offset if gap < len(records) else 1 << 62
            if gap_first > span.last_offset:
                break
            gaps += 1
            absorber = next((j for j in range(gap, len(records)) if _absorbs(records[j], span.batch_id)), None)
            if absorber is None:  # waits for a later marker
                offset_range_only &= gap_first >= resume.get(span.partition, 0)
                continue
            at = KeptRange(span.partition, span.batch_id, gap_first, gap_end, records[absorber].offset)
            if span.batch_id is not None and records[absorber].marker.is_void(span.batch_id):
                void_gaps += 1
                voided.append(at)
                offset_range_only &= gap_first >= resume.get(span.partition, 0)
            elif absorber < released[span.partition]:
                kept_gaps += 1
                kept.append(at)
                offset_range_only &= absorber == gap
            else:
                offset_range_only &= gap_first >= resume.get(span.partition, 0)
        # a span split between kept and not kept gaps needs a count of the records themselves
        exact &= kept_gaps in (0, gaps) and void_gaps in (0, gaps)
        applied += span.records if kept_gaps == gaps else 0
        void += span.records if void_gaps == gaps else 0
    max_seen = max(
        [r.marker.batch_id for rs in by_partition.values() for r in rs]
        + [s.batch_id for s in spans if s.batch_id is not None],
        default=None,
    )
    return CutPlan(
        partitions=partitions,
        cut=cut,
        marker=marker,
        marker_time_ms=marker_time,
        resume_offsets=resume,
        kept=kept,
        voided=voided,
        offset_range_only=offset_range_only,
        records_applied=applied if exact else None,
        records_dropped_void=void if exact else None,
        max_batch_seen=max_seen,
    )


def _absorbs(record: MarkerRecord, batch_id: int | None) -> bool:
    """Rule 2: a marker absorbs the records before it of its own batch or an older one."""
    return batch_id is None or record.marker.batch_id >= batch_id
