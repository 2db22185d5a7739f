"""The driver's relay of a short tail to Spark: chunks of the records as read, nulls kept, bounded (pure logic)."""

from __future__ import annotations

from spark_jobs.state import tail_relay
from spark_jobs.state.tail_relay import TailRelay


def _rows(chunks) -> list[tuple]:
    return [tuple(row.values()) for chunk in chunks for row in chunk.to_pylist()]


def test_records_are_sent_in_chunks_as_read_with_their_nulls(monkeypatch):
    monkeypatch.setattr(tail_relay, "CHUNK_RECORDS", 3)
    chunks = []
    relay = TailRelay(chunks.append)
    records = [
        (i % 2, 10 + i, None if i == 4 else 3_000_000_000 + i, b"k%d" % i, None if i % 3 else b"v") for i in range(7)
    ]
    for record in records:
        relay.add(*record)
    assert [chunk.num_rows for chunk in chunks] == [3, 3]  # each sent once full: one chunk held at a time
    relay.finish()
    assert [chunk.num_rows for chunk in chunks] == [3, 3, 1] and not relay.dropped
    assert _rows(chunks) == records
    assert [str(t) for t in chunks[0].schema.types] == ["int32", "int64", "int64", "binary", "binary"]


def test_an_empty_range_sends_one_empty_chunk():
    chunks = []
    TailRelay(chunks.append).finish()
    assert [chunk.num_rows for chunk in chunks] == [0] and chunks[0].column_names == [
        "partition",
        "offset",
        "batch_id",
        "key",
        "value",
    ]


def test_a_range_past_its_bytes_or_with_a_keyless_record_is_dropped():
    chunks = []
    relay = TailRelay(chunks.append, max_bytes=100)
    for i in range(20):
        relay.add(0, i, 0, b"key", b"value")
    relay.finish()
    assert relay.dropped and chunks == []

    keyless = TailRelay(chunks.append)
    keyless.add(0, 0, 0, b"a", b"1")
    keyless.add(0, 1, 0, None, b"2")
    keyless.add(0, 2, 0, b"b", b"3")
    keyless.finish()
    assert keyless.dropped and chunks == []
