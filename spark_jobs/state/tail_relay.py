"""The data records of a short changelog range, relayed to Spark by the driver's consumer in Arrow chunks
as it reads them: the input of the second pass of a Spark read (:mod:`.changelog_spark`) without a Kafka job.

The driver reads a short range anyway, to summarize it for the cut planner
(:func:`.changelog_reader.summarize_range`). Relayed as it is read, a chunk of ``CHUNK_RECORDS`` at a
time, the range reaches Spark as local data, where the same pass as for a range read from Kafka keeps and
reduces it: no Kafka job, which in a driver that has run nothing yet (a restore's) costs seconds whatever
its size (BENCHMARKS.md, restore of a large store). This process holds one chunk at a time; Spark's
driver holds the relayed chunks (as it holds a broadcast). A range whose keys and values pass
``TAIL_IN_DRIVER_MAX_BYTES`` stops being relayed as soon as it does, and is read from Kafka by Spark.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable

#: the bytes of keys and values relayed through the driver before a tail is left to Spark's Kafka reader
TAIL_IN_DRIVER_MAX_BYTES = 64 << 20
#: records per chunk: a few MB for this process to hold, few enough calls into Spark
CHUNK_RECORDS = 50_000
#: the columns of a chunk, as Spark's Kafka source names and types them (see ``changelog_spark._records``)
SCHEMA = "partition INT, offset BIGINT, batch_id BIGINT, key BINARY, value BINARY"


class TailRelay:
    """Collects data records in columns and hands each full chunk, as a pyarrow Table of :data:`SCHEMA`,
    to ``send``; :meth:`finish` sends the rest."""

    def __init__(self, send: Callable[[object], None], max_bytes: int | None = None) -> None:
        self._send = send
        self.max_bytes = TAIL_IN_DRIVER_MAX_BYTES if max_bytes is None else max_bytes
        #: True once the range outgrew ``max_bytes`` or held a record without a key (not the platform's
        #: writing): nothing more is sent, and what was sent must not be used
        self.dropped = False
        self.records = 0
        self.bytes = 0
        self._clear()

    def _clear(self) -> None:
        self._partitions = array("i")
        self._offsets = array("q")
        self._batches = array("q")
        self._has_batch = array("b")
        self._keys, self._key_ends = bytearray(), array("i", [0])
        self._values, self._value_ends = bytearray(), array("i", [0])
        self._has_value = array("b")

    def add(self, partition: int, offset: int, batch_id: int | None, key: bytes | None, value: bytes | None) -> None:
        if self.dropped:
            return
        self.bytes += len(key or b"") + len(value or b"")
        if key is None or self.bytes > self.max_bytes:
            self.dropped = True
            self._clear()
            return
        self.records += 1
        self._partitions.append(partition)
        self._offsets.append(offset)
        self._batches.append(batch_id or 0)
        self._has_batch.append(batch_id is not None)
        self._keys += key
        self._key_ends.append(len(self._keys))
        self._values += value or b""
        self._value_ends.append(len(self._values))
        self._has_value.append(value is not None)
        if len(self._offsets) >= CHUNK_RECORDS:
            self._flush()

    def finish(self) -> None:
        """Send the last chunk (an empty range sends one empty chunk, so Spark gets the columns)."""
        if not self.dropped and (len(self._offsets) or not self.records):
            self._flush()

    def _flush(self) -> None:
        import numpy as np
        import pyarrow as pa

        n = len(self._offsets)

        def validity(flags: array):  # a bitmap, as Arrow packs booleans
            return pa.array(np.frombuffer(flags, dtype=np.bool_)).buffers()[1]

        def column(arrow_type, data, flags=None, ends=None):
            buffers = [None if flags is None else validity(flags)]
            buffers += [pa.py_buffer(ends), pa.py_buffer(data)] if ends is not None else [pa.py_buffer(data)]
            return pa.Array.from_buffers(arrow_type, n, buffers)

        chunk = pa.table(
            {
                "partition": column(pa.int32(), self._partitions),
                "offset": column(pa.int64(), self._offsets),
                "batch_id": column(pa.int64(), self._batches, self._has_batch),
                "key": column(pa.binary(), self._keys, ends=self._key_ends),
                "value": column(pa.binary(), self._values, self._has_value, self._value_ends),
            }
        )
        self._send(chunk)
        self._clear()
