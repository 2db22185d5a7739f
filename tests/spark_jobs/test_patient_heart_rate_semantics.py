"""patient_heart_rate's window processor against the plain-Python reference of Kafka Streams'
semantics (spark_jobs.reference.generators.pulse.expected), on the same events cut into micro-batches in
different ways: emitted windows, the store, and late pulses must be the same whatever the cut.

The named events cover what a per-batch stream time got wrong: a pulse exactly at the grace
boundary, a window closed by another patient's pulse earlier in the same batch, a window closed
before a check-out in the same batch, a window closed and evicted in one step after a gap longer
than retention, and a partition whose stream time lags the other's.
"""

from __future__ import annotations

import datetime as dt
import os

import pytest

from spark_jobs.reference.generators import pulse
from spark_jobs.reference.jobs.patient_heart_rate import EVENT_SCHEMA, LATE, STREAM_TIME_KEY_PREFIX, window_changes
from spark_jobs.registry import StoreSpec
from tests.helpers import collect_available_now, file_stream, source_rows, with_source_columns

pytestmark = pytest.mark.integration

PARTITIONS = 2
MINUTE = 60_000
STORE = StoreSpec("pulse-counts", kind="windowed", window_ms=MINUTE, grace_ms=5_000, retention_ms=3 * MINUTE)
SOURCE_SCHEMA = with_source_columns(EVENT_SCHEMA)
T0 = pulse.START
SEEDS = [int(s) for s in os.environ.get("WINDOW_SEEDS", "1").split(",")]


def _at(seconds: float) -> str:
    return (T0 + dt.timedelta(seconds=seconds)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _pulse(n: int, patient: str, seconds: float, kind: str = pulse.PULSE) -> dict:
    return {"event_id": f"e{n}", "type": kind, "patient_id": patient, "event_time": _at(seconds)}


# Patients "a", "b", "p" live in partition 0, "d", "q" in partition 1 (Kafka's murmur2, 2 partitions).
NAMED = [
    _pulse(1, "a", 10),
    _pulse(2, "a", 50),
    _pulse(3, "b", 30),
    _pulse(4, "b", 64.999),  # stream time 64.999 s: window [0, 60) closes at 65 s, not yet
    _pulse(5, "a", 20),  # counted: window 0 still open
    _pulse(6, "b", 65),  # stream time 65 s closes window 0 of a and b (emitted) ...
    _pulse(7, "a", 40),  # ... so this pulse, in the same batch, is late
    _pulse(8, "p", 66),
    _pulse(9, "a", 70),
    _pulse(10, "b", 126),  # closes window 60 s of a, b, p (b's pulse closes a's and p's window) ...
    _pulse(11, "p", 127, pulse.CHECKED_OUT),  # ... before p checks out: p's window was emitted
    _pulse(12, "d", 20),
    _pulse(13, "q", 30),  # partition 1 is behind: its window 0 is open
    _pulse(14, "d", 21),
    _pulse(14, "d", 21),  # a duplicate counts twice (Kafka Streams does too)
    _pulse(15, "q", 90),  # partition 1: closes window 0 of d and q
    _pulse(16, "a", 130),
    _pulse(17, "a", 131),
    _pulse(18, "b", 10 * 60),  # a gap past retention (3 min): a's window 120 closes and leaves in one step
    _pulse(19, "a", 10 * 60 + 1),
    _pulse(20, "a", 100),  # late, long past
    # partition 1: q's check-out at 185 s closes q's window [60 s, 120 s) by its own time, which emits it,
    # then deletes q (a Kafka Streams suppress buffer would drop it: README, "Known differences")
    _pulse(21, "q", 185, pulse.CHECKED_OUT),
]


def _run(spark, tmp_path, events: list[dict], cut: int, name: str) -> pulse.Expected:
    """The processor over ``events`` in micro-batches of ``cut`` records; what it emitted, kept and
    refused, in the reference's terms."""
    rows = source_rows(events, EVENT_SCHEMA, "patient_id", PARTITIONS, T0)
    batches = [rows[i : i + cut] for i in range(0, len(rows), cut)]
    stream = file_stream(spark, batches, SOURCE_SCHEMA, tmp_path / f"events-{name}")
    changes = window_changes(stream, None, STORE)

    def row_of(row, batch_id: int) -> tuple:
        return (
            batch_id,
            row.kind,
            row.tombstone,
            row.patient_id,
            row.window_start_ms,
            row.beats,
            row.closed,
            row.source_partition,
            row.stream_time_ms,
            bytes(row.raw) if row.raw else None,
        )

    seen = sorted(collect_available_now(changes, "append", tmp_path / f"checkpoint-{name}", row_of), key=lambda r: r[0])
    state, emitted, late, stream_times = {}, {}, set(), {}
    for _, kind, tombstone, patient, start, beats, closed, partition, stream_time, raw in seen:
        if kind == LATE:
            late.add(raw.decode())
            assert start + STORE.window_ms + STORE.grace_ms <= stream_time, "late by the stream time it carries"
        elif patient is None:
            stream_times[partition] = stream_time
        else:
            if closed and beats is not None:
                assert (patient, start) not in emitted, f"window {patient}@{start} emitted twice"
                emitted[(patient, start)] = beats
            if tombstone:
                state.pop((patient, start), None)
            else:
                state[(patient, start)] = (beats, closed)
    return pulse.Expected(state, emitted, late, stream_times)


def _reference(events: list[dict]) -> pulse.Expected:
    return pulse.expected([events], STORE.window_ms, STORE.grace_ms, STORE.retention_ms, PARTITIONS)


def test_named_cases_match_kafka_streams_semantics_whatever_the_batching(spark, tmp_path):
    want = _reference(NAMED)
    ms = int(T0.timestamp() * 1000)
    assert want.emitted[("a", ms)] == 3 and want.emitted[("b", ms)] == 1 and {"e7", "e20"} <= want.late
    assert want.emitted[("p", ms + MINUTE)] == 1  # closed before the check-out
    assert want.emitted[("d", ms)] == 3 and "e12" not in want.late  # partition 1's own stream time
    assert want.emitted[("a", ms + 2 * MINUTE)] == 2  # closed and evicted in one step
    assert want.emitted[("q", ms + MINUTE)] == 1  # closed by its own delete's time: emitted, then deleted
    assert not any(patient == "q" for patient, _ in want.state)
    for cut in (len(NAMED), 4, 1):
        assert _run(spark, tmp_path, NAMED, cut, f"named-{cut}") == want, f"micro-batches of {cut}"


@pytest.mark.parametrize("seed", SEEDS)
def test_generated_adversarial_pulses_match_the_reference_whatever_the_batching(spark, tmp_path, seed):
    events = list(pulse.adversarial(150, patients=5, seed=seed))
    want = _reference(events)
    assert want.late and want.emitted  # the input really tests lateness and closing
    for cut in (len(events), 7):
        assert _run(spark, tmp_path, events, cut, f"gen{seed}-{cut}") == want, f"micro-batches of {cut}"


def test_the_stream_time_entry_is_what_restores_it(spark, tmp_path):
    got = _run(spark, tmp_path, NAMED[:6], 6, "stream-time")
    assert got.stream_times == {0: int(T0.timestamp() * 1000) + 65_000}
    assert STREAM_TIME_KEY_PREFIX.endswith("@")
