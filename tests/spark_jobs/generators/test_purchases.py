"""The purchase generator's clock (pure logic)."""

from __future__ import annotations

import datetime as dt

from spark_jobs.reference.generators import purchases


def test_events_started_by_start_ending_by_end_by_then():
    end = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
    for count in (1, 1_000, 50_000):
        events = list(purchases.generate(count, users=100, seed=3, start=purchases.start_ending_by(count, end)))
        last = dt.datetime.fromisoformat(events[-1]["event_time"].replace("Z", "+00:00"))
        assert last <= end, f"{count} events end at {last}, after {end}"
