"""How far the source had been read when an output write committed: the mark that lets a job append its
outputs instead of MERGEing them.

Every output write of a micro-batch (``JobContext.state_change_sink``) commits with Delta commit metadata
(``userMetadata``) naming the batch's end offsets in the source topic. A driver may re-derive outputs an
earlier driver already wrote only while it re-reads records before those offsets: the batch a killed
driver wrote outputs for but had not marked complete in the changelog, or the batch Spark replays from a
checkpoint. A batch that starts at or after the highest mark in every partition produces nothing that
was written before, so a primitive whose outputs are written once per key (closed windows) appends it;
any other batch gets the insert-if-absent MERGE that a repeat needs. Without a mark (a table written
before marks existed, a copied table) every batch is treated as a possible repeat.

Kafka Streams needs no such mark: its outputs are records on a topic, and exactly-once commits them
with the input offsets in one transaction. A Delta table and a Kafka offset cannot share a transaction,
so the table carries the offsets instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from runtime.object_store import Location

#: the prefix of the ``userMetadata`` of an output commit; the rest is ``{"<partition>": <end offset>}``
PREFIX = "streamstate:input-end="
#: how many of the table's newest commits are searched for marks (maintenance commits carry none)
HISTORY_LIMIT = 100


def commit_metadata(end_offsets: Mapping[int, int]) -> str:
    """The ``userMetadata`` of a batch's output commits: its end offsets (exclusive) per source partition."""
    return PREFIX + json.dumps({str(p): int(o) for p, o in sorted(end_offsets.items())})


def written_input_end(table: Location) -> dict[int, int] | None:
    """The highest source offset per partition any output write of ``table`` reached: ``{}`` when the table
    holds no data (nothing can repeat), None when it holds data but no commit among its newest carries a
    mark (anything may repeat)."""
    from deltalake import DeltaTable

    path, options = str(table), table.storage_options()
    if not DeltaTable.is_deltatable(path, storage_options=options):
        return {}
    delta = DeltaTable(path, storage_options=options)
    if not delta.file_uris():
        return {}
    highest: dict[int, int] = {}
    for commit in delta.history(HISTORY_LIMIT):
        metadata = commit.get("userMetadata") or ""
        if metadata.startswith(PREFIX):
            for partition, offset in json.loads(metadata[len(PREFIX) :]).items():
                highest[int(partition)] = max(highest.get(int(partition), -1), int(offset))
    return highest or None


def may_repeat(batch_start: Mapping[int, int] | None, written_end: Mapping[int, int] | None) -> bool:
    """Whether a batch that starts reading at ``batch_start`` (None: unknown, e.g. ``earliest``) may
    re-derive outputs written up to ``written_end`` (see :func:`written_input_end`)."""
    if written_end is not None and not written_end:
        return False
    if written_end is None or batch_start is None:
        return True
    return any(batch_start.get(partition, -1) < end for partition, end in written_end.items())
