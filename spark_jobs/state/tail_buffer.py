"""A short changelog range held by the driver as columns, and the changes a :class:`.cut_rules.CutPlan`
applies from it: the second pass of a Spark read of a short tail, done without a Spark job.

The driver reads a short range anyway, to summarize it for the planner
(:func:`.changelog_reader.summarize_range`). Kept as it is read, in flat buffers (about 37 bytes per
record besides its key and value, where Python objects would cost over 150), the range's changes go to
Spark as a small Arrow table instead of two reads of Kafka by Spark jobs: in a driver that has run nothing
yet (a restore's), each of those costs seconds whatever its size (BENCHMARKS.md, restore of a large store).
A range whose keys and values pass ``max_bytes`` is dropped as soon as it does, and its changes read by Spark.
"""

from __future__ import annotations

from array import array

from spark_jobs.state.cut_rules import CutPlan

#: the bytes of keys and values the driver holds of a tail before leaving its second pass to Spark
TAIL_IN_DRIVER_MAX_BYTES = 64 << 20


class TailBuffer:
    """The data records of a changelog range, in columns (appended in read order)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = TAIL_IN_DRIVER_MAX_BYTES if max_bytes is None else max_bytes
        #: True once the range outgrew ``max_bytes`` (or held a record without a key): the buffers are then
        #: empty and stay so
        self.dropped = False
        self._clear()

    def _clear(self) -> None:
        self._partitions = array("i")
        self._offsets = array("q")
        self._batches = array("q")  # -1: no batch header
        self._keys, self._key_ends = bytearray(), array("i", [0])
        self._values, self._value_ends = bytearray(), array("i", [0])
        self._deletes = array("b")

    def __len__(self) -> int:
        return len(self._offsets)

    def add(self, partition: int, offset: int, batch_id: int | None, key: bytes | None, value: bytes | None) -> None:
        if self.dropped:
            return
        if key is None:  # not the platform's writing: Spark's reader keeps it as it is
            self._drop()
            return
        self._partitions.append(partition)
        self._offsets.append(offset)
        self._batches.append(-1 if batch_id is None else batch_id)
        self._keys += key
        self._key_ends.append(len(self._keys))
        self._values += value or b""
        self._value_ends.append(len(self._values))
        self._deletes.append(value is None)
        if len(self._keys) + len(self._values) > self.max_bytes:
            self._drop()

    def _drop(self) -> None:
        self.dropped = True
        self._clear()

    def changes(self, plan: CutPlan):
        """pyarrow Table(key string, value string): the latest change per key of the records ``plan`` keeps,
        in its apply order (partition, absorbing marker, offset); a null value deletes the key. None when a
        key or value is not UTF-8 (Spark's reader casts such bytes as they are)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.dropped:
            raise ValueError("the buffer dropped its records: read the range's changes with Spark")
        partitions = np.frombuffer(self._partitions, dtype=np.int32)
        offsets = np.frombuffer(self._offsets, dtype=np.int64)
        batches = np.frombuffer(self._batches, dtype=np.int64)
        absorbed_at = np.full(len(self), -1, dtype=np.int64)  # -1: not applied
        if plan.offset_range_only:
            for partition, resume in plan.resume_offsets.items():
                hit = (partitions == partition) & (offsets < resume)
                absorbed_at[hit] = offsets[hit]
        else:
            for kept in plan.kept:
                batch = -1 if kept.batch_id is None else kept.batch_id
                hit = (partitions == kept.partition) & (batches == batch)
                hit &= (offsets >= kept.first_offset) & (offsets < kept.end_offset)
                absorbed_at[hit] = kept.absorbed_at
        applied = np.flatnonzero(absorbed_at >= 0)
        in_order = applied[np.lexsort((offsets[applied], absorbed_at[applied], partitions[applied]))]

        def binary(data: bytearray, ends: array):
            return pa.Array.from_buffers(pa.binary(), len(self), [None, pa.py_buffer(ends), pa.py_buffer(data)])

        deletes = pa.array(np.frombuffer(self._deletes, dtype=np.bool_))
        values = pc.if_else(deletes, pa.scalar(None, pa.binary()), binary(self._values, self._value_ends))
        records = pa.table({"key": binary(self._keys, self._key_ends), "value": values}).take(in_order)
        records = records.append_column("position", pa.array(np.arange(len(records), dtype=np.int64)))
        last = records.group_by("key").aggregate([("position", "max")]).column("position_max")
        latest = records.take(last)
        try:
            return pa.table({"key": latest["key"].cast(pa.string()), "value": latest["value"].cast(pa.string())})
        except pa.ArrowInvalid:
            return None
