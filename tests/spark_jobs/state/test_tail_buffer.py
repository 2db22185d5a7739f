"""The driver's columns of a short tail give the changes the cut planner applies (pure logic, no Kafka).

The logs are the generated ones of test_cut_rules.py; the oracle is the record-by-record reader frozen there.
"""

from __future__ import annotations

import random

import pytest

from spark_jobs.state.changelog import MARKER_KEY
from spark_jobs.state.changelog_reader import apply_changes
from spark_jobs.state.tail_buffer import TailBuffer
from tests.spark_jobs.state.test_cut_rules import Log, _assembler, _plan, adversarial_log, writer_log


def _buffer(log: Log, **kwargs) -> TailBuffer:
    buffer = TailBuffer(**kwargs)
    for p, records in log.items():
        for offset, (key, value, batch) in enumerate(records):
            if key != MARKER_KEY:
                buffer.add(p, offset, batch, key, value)
    return buffer


def _latest_changes(log: Log, plan) -> dict:
    """Each applied key's last change (None: deleted), by (partition, absorbing marker, offset)."""
    latest = {}
    for p, records in log.items():
        for offset, (key, value, batch) in enumerate(records):
            at = plan.absorbed_at(p, offset, batch) if key != MARKER_KEY else None
            if at is not None and (key not in latest or (p, at, offset) > latest[key][0]):
                latest[key] = ((p, at, offset), value)
    return {key.decode(): None if value is None else value.decode() for key, (_, value) in latest.items()}


@pytest.mark.parametrize("family", [writer_log, adversarial_log], ids=["writer", "adversarial"])
def test_the_buffered_changes_are_what_the_plan_applies(family):
    for seed in range(1500):
        log = family(random.Random(seed))
        plan = _plan(log)
        table = _buffer(log).changes(plan)
        changes = dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
        where = f"seed {seed}: {log}"
        assert len(changes) == table.num_rows, where  # one row per key
        assert changes == _latest_changes(log, plan), where
        oracle = _assembler(log)
        expected: dict = {}
        if (complete := oracle.take_complete()) is not None:
            apply_changes(expected, complete.changes)
        state: dict = {}
        apply_changes(state, [(k.encode(), None if v is None else v.encode()) for k, v in changes.items()])
        assert state == expected, where


def test_a_range_past_its_bytes_or_with_keyless_or_non_utf8_records_is_left_to_spark():
    log: Log = {0: [(b"k%d" % i, b"v" * 10, 0) for i in range(100)] + [(MARKER_KEY, b"", 0)]}
    assert not _buffer(log, max_bytes=10_000).dropped
    too_long = _buffer(log, max_bytes=1_000)
    assert too_long.dropped and len(too_long) == 0
    with pytest.raises(ValueError, match="dropped"):
        too_long.changes(_plan({0: []}))

    keyless = TailBuffer()
    keyless.add(0, 0, 0, b"a", b"1")
    keyless.add(0, 1, 0, None, b"2")
    keyless.add(0, 2, 0, b"b", b"3")
    assert keyless.dropped and len(keyless) == 0

    from spark_jobs.state.changelog import BatchMarker

    marked: Log = {0: [(b"\xff\xfe", b"1", 0), (MARKER_KEY, BatchMarker(0, {}, 1).to_bytes(), 0)]}
    assert _buffer(marked).changes(_plan(marked)) is None
