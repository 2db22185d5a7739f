"""Input positions of a micro-batch, from the Structured Streaming checkpoint's offset log.

Spark writes ``<checkpoint>/offsets/<batch_id>`` (a write-ahead log) before it runs the batch: a
version line, a metadata line, then one JSON line per source with the batch's *end* offsets, which
are exclusive (the next offset to read). That file is the source of truth for "which input this
batch consumed"; this module only parses it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from runtime.object_store import Location

#: {topic: {partition: next offset to read}}
KafkaOffsets = dict[str, dict[int, int]]
#: a checkpoint's location (a path on the local disk, or in an object store with its connection)
Checkpoint = Location | Path | str
#: how a checkpoint's state store encodes rows: Avro state evolves in place (transformWithState only)
StateEncoding = Literal["avro", "unsaferow"]
#: the Spark conf that chooses it; Spark records it in a checkpoint's offset log at its first batch and
#: keeps it for the checkpoint's life, whatever the session says later
STATE_ENCODING_CONF = "spark.sql.streaming.stateStore.encodingFormat"


class CheckpointOffsetsError(RuntimeError):
    """The offset log of a checkpoint is missing or not in the expected format."""


def _offset_log_entry(checkpoint: Checkpoint, batch_id: int) -> tuple[Location, list[str]]:
    """The lines of ``batch_id``'s offset log entry: version, metadata, one line per source."""
    path = Location.of(checkpoint) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise CheckpointOffsetsError(f"no offset log entry for batch {batch_id} at {path}") from None
    if len(lines) < 3 or not lines[0].startswith("v"):
        raise CheckpointOffsetsError(f"{path}: unexpected offset log format ({len(lines)} lines)")
    return path, lines


def batch_end_offsets(checkpoint: Checkpoint, batch_id: int) -> KafkaOffsets:
    """End (exclusive) Kafka offsets of every source of ``batch_id``, merged over sources."""
    _, lines = _offset_log_entry(checkpoint, batch_id)
    offsets: KafkaOffsets = {}
    for line in lines[2:]:
        if not line.strip() or line.strip() == "-":
            continue
        for topic, partitions in json.loads(line).items():
            offsets.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return offsets


def records_between(start: KafkaOffsets, end: KafkaOffsets) -> int | None:
    """How many records lie between two positions of the same sources (offsets, so a bound: a compacted
    topic's or a transaction's markers count too), or None when ``start`` lacks a partition ``end`` has
    (a partition added since: where it started is not known here)."""
    total = 0
    for topic, partitions in end.items():
        for partition, offset in partitions.items():
            begin = start.get(topic, {}).get(partition)
            if begin is None:
                return None
            total += max(offset - begin, 0)
    return total


def batch_watermark_ms(checkpoint: Checkpoint, batch_id: int) -> int:
    """The event-time watermark ``batch_id`` ran with (0 when the query has none)."""
    path, lines = _offset_log_entry(checkpoint, batch_id)
    try:
        return int(json.loads(lines[1]).get("batchWatermarkMs", 0))
    except ValueError as err:
        raise CheckpointOffsetsError(f"{path}: unexpected offset log metadata ({err})") from None


def state_encoding(checkpoint: Checkpoint) -> StateEncoding | None:
    """The state encoding the checkpoint's query runs with (recorded at its first batch, kept for its
    life; a checkpoint from before Spark recorded it is UnsafeRow), or None before the first batch."""
    batch = latest_batch_id(checkpoint)
    if batch is None:
        return None
    path, lines = _offset_log_entry(checkpoint, batch)
    conf = json.loads(lines[1]).get("conf", {})
    encoding = conf.get(STATE_ENCODING_CONF, "unsaferow")
    if encoding not in ("avro", "unsaferow"):
        raise CheckpointOffsetsError(f"{path}: unknown state encoding {encoding!r}")
    return encoding


def latest_batch_id(checkpoint: Checkpoint) -> int | None:
    """The newest batch id in the offset log, or None when the checkpoint has none."""
    return _newest_entry(Location.of(checkpoint) / "offsets")


def latest_committed_batch_id(checkpoint: Checkpoint) -> int | None:
    """The newest batch in the commit log (finished, outputs written), or None."""
    return _newest_entry(Location.of(checkpoint) / "commits")


def _newest_entry(log: Location) -> int | None:
    ids = [int(entry.name) for entry in log.children() if entry.name.isdigit()]
    return max(ids) if ids else None


def committed_input_offsets(checkpoint: Checkpoint, topic: str) -> dict[int, int] | None:
    """partition -> next offset to read after the newest committed batch, or None before the first."""
    batch = latest_committed_batch_id(checkpoint)
    if batch is None:
        return None
    return batch_end_offsets(checkpoint, batch).get(topic, {})
