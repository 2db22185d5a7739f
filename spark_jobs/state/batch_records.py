"""The records of a micro-batch's changelog transaction, as they are written and read: no I/O.

A batch ends, in each partition of each store's changelog, with a **batch marker** (key :data:`MARKER_KEY`):
the batch id, the input offsets it consumed, the ids earlier drivers left void. Its change records carry the
batch id in the :data:`BATCH_HEADER` header. :class:`OutputRecords` are records written in the same
transaction as the markers (a small batch's changes, the output topic's upserts).

Writers (:mod:`.changelog`, :mod:`.fencing`) and readers (:mod:`.changelog_reader`, :mod:`.cut_rules`,
:mod:`.changelog_spark`) import this vocabulary from here; it imports none of them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from spark_jobs.state.checkpoint_offsets import KafkaOffsets

MARKER_KEY = b"__streamstate.batch__"
BATCH_HEADER = "streamstate.batch"
#: the void ranges a marker carries at most (one per driver start that followed a complete batch)
MAX_VOID_RANGES = 64


@dataclasses.dataclass(frozen=True)
class BatchMarker:
    """The end of one micro-batch in one changelog partition.

    Changelog batch ids grow monotonically per application id: every driver continues at ids above
    every id an earlier driver used (a new generation, :mod:`.fencing`), and its markers declare the ids
    between the last batch complete when it started and its first id void. The records of a batch that
    was half-written by a killed driver, or written by a fenced one after the takeover, are never
    applied. Each marker carries the void ranges of earlier drivers too (the newest
    :data:`MAX_VOID_RANGES`): compaction keeps only the newest marker of a partition, and it must still
    void what older markers voided.
    """

    batch_id: int
    input_offsets: KafkaOffsets
    records: int
    #: (after, before): batch ids strictly between the two are void
    void: tuple[tuple[int, int], ...] = ()
    #: the event-time watermark the batch ran with (stream time, for jobs with windows)
    watermark_ms: int = 0

    def is_void(self, batch_id: int) -> bool:
        return any(after < batch_id < before for after, before in self.void)

    def to_bytes(self) -> bytes:
        offsets = {t: {str(p): o for p, o in parts.items()} for t, parts in self.input_offsets.items()}
        data = {"batch_id": self.batch_id, "input_offsets": offsets, "records": self.records}
        if self.watermark_ms:
            data["watermark_ms"] = self.watermark_ms
        if self.void:
            data["void"] = [list(r) for r in self.void]
        return json.dumps(data).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> BatchMarker:
        data = json.loads(raw)
        offsets = {t: {int(p): int(o) for p, o in parts.items()} for t, parts in data["input_offsets"].items()}
        void = [(int(a), int(b)) for a, b in data.get("void", ())]
        if data.get("void_after") is not None and data.get("void_before") is not None:  # as markers said it before
            void.append((int(data["void_after"]), int(data["void_before"])))
        return cls(
            batch_id=int(data["batch_id"]),
            input_offsets=offsets,
            records=int(data["records"]),
            void=tuple(void),
            watermark_ms=int(data.get("watermark_ms", 0)),
        )


@dataclasses.dataclass(frozen=True)
class MarkerRecords:
    """One batch marker as written: the same record (key :data:`MARKER_KEY`) to each of ``partitions``."""

    topic: str
    partitions: range
    value: bytes
    headers: list


def carried_void(previous: tuple[tuple[int, int], ...], after: int, before: int) -> tuple[tuple[int, int], ...]:
    """The void ranges of a new driver's markers: the newest of ``previous`` (the last complete batch's
    marker's) and its own ``(after, before)``."""
    ranges = sorted({*previous, (after, before)}, key=lambda r: r[1])
    return tuple(ranges[-MAX_VOID_RANGES:])


@dataclasses.dataclass(frozen=True)
class OutputRecords:
    """Records for one topic, written with a batch's markers (:meth:`WriterFence.commit_markers`)."""

    topic: str
    keys: Sequence[bytes]
    #: a value, or None: a tombstone
    values: Sequence[bytes | None]
    #: each record's partition; None: the producer's partitioner places them by key
    partitions: Sequence[int] | None = None
    #: headers every record carries (a changelog's batch header)
    headers: Sequence[tuple[str, bytes]] = ()
