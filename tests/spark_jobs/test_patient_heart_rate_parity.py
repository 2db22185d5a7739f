"""patient_heart_rate's two window processors, Java (the job's default) and Python (the one to
subclass), run the same micro-batches from the same restored windows and must write the same rows:
window changes, tombstones (with the final count when a window closes and leaves in one step) and
late pulses."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.jobs.patient_heart_rate import EVENT_SCHEMA, STATE_DDL, PulseWindows, window_changes
from spark_jobs.registry import StoreSpec
from tests.helpers import collect_available_now, file_stream

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 11, 1, 12, 0, 0)
MINUTE = 60_000
T0_MS = int(T0.timestamp() * 1000)
STORE = StoreSpec("pulse-counts", kind="windowed", window_ms=MINUTE, grace_ms=5_000, retention_ms=3 * MINUTE)
SOURCE_SCHEMA = T.StructType([*EVENT_SCHEMA.fields, T.StructField("partition", T.IntegerType()),
                              T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
                              T.StructField("value", T.BinaryType())])  # fmt: skip


def _event(offset: int, kind: str, patient: str, seconds: float) -> Row:
    return Row(event_id=f"e{offset}", type=kind, patient_id=patient, event_time=T0 + dt.timedelta(seconds=seconds),
               partition=0, offset=offset, timestamp=T0, value=f"raw{offset}".encode())  # fmt: skip


# Stream time (the watermark) is the largest event time of the batches before; T0 is a window start.
BATCHES = [
    [  # p: window 0 gets 3 beats, window 1 one; q: a beat, checked out, then a beat in a fresh window 0
        _event(1, "pulse", "p", 0), _event(3, "pulse", "p", 59), _event(2, "pulse", "p", 10),
        _event(4, "pulse", "p", 61),
        _event(5, "pulse", "q", 5), _event(6, "checked_out", "q", 6), _event(7, "pulse", "q", 20),
    ],
    [  # stream time 61 s: window 0 still open until 65 s, so this beat counts; then stream time 130 s
        _event(8, "pulse", "p", 30), _event(9, "pulse", "p", 130),
        _event(10, "pulse", "r", 40),  # restored patient r: its window 0 counts on
    ],
    [  # stream time 130 s: window 0 has closed, so this beat is late; then stream time jumps to 400 s
        _event(11, "pulse", "p", 50), _event(12, "pulse", "p", 400),
    ],
]
RESTORED = [Row(patient_id="r", window_start_ms=T0_MS, beats=5, closed=False)]


def _rows(spark, tmp_path, name: str, processor) -> set[tuple]:
    events = (
        file_stream(spark, BATCHES, SOURCE_SCHEMA, tmp_path / f"events-{name}")
        .withWatermark("event_time", "0 seconds")  # as the job: a watermark, and a copy of the time grouped
        .withColumn("event_time", F.col("event_time") + F.expr("INTERVAL 0 SECONDS"))
    )
    initial = spark.createDataFrame(RESTORED, STATE_DDL)

    def row_of(row, _batch_id: int) -> tuple:
        return (row.kind, row.tombstone, row.patient_id, (row.window_start_ms - T0_MS) // MINUTE, row.beats,
                row.closed, row.source_offset)  # fmt: skip

    changes = window_changes(events, initial, STORE, 0, processor)
    return collect_available_now(changes, "append", tmp_path / f"checkpoint-{name}", row_of)


def test_java_and_python_window_processors_write_the_same_rows(spark, tmp_path):
    java = _rows(spark, tmp_path, "java", None)
    python = _rows(spark, tmp_path, "python", PulseWindows)
    assert java == python
    # The cases the batches were written for, so the comparison covers them:
    assert ("change", False, "p", 0, 4, False, None) in java  # the beat before the window closed counted
    assert ("change", False, "p", 0, 4, True, None) in java  # closed once stream time passed end + grace
    assert ("late", False, "p", 0, None, None, 11) in java  # after closing: late, with its source offset
    assert ("change", False, "q", 0, 1, False, None) in java  # the checkout deleted q's first beat
    assert ("change", False, "r", 0, 6, False, None) in java  # counted on from the restored window
    assert ("change", True, "p", 2, 1, True, None) in java  # closed and evicted in one step: final count kept
