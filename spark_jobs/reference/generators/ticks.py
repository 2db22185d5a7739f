"""Stock price ticks over a few days: the input of the seeds' two-stage pattern (daily price change per
stock, then the day's top movers).

Each tick is a JSON object keyed by ``symbol``: how much the price moved since the symbol's previous tick::

    {"tick_id": "t42", "symbol": "S07", "change": -0.25, "event_time": "2026-03-01T09:14:10Z"}

Ticks arrive up to :data:`DISORDER` out of order (less than ``stock_price_changes``' grace, so none of them is
late by accident); after the last day, one tick per symbol a little into the next day closes every day in
every partition, then a few ticks for the first day arrive, late on purpose. Changes are multiples of 1/4,
so sums are exact in floating point whatever order they are added in.

:func:`daily_changes` is stage 1's answer (the change and ticks per symbol and closed day, as the windows
reference computes it), :func:`top_movers` the answer of a day's top N over it: the reference of both the
streaming job and the batch step ``daily_top_movers``.
"""

from __future__ import annotations

import datetime as dt
import random

from spark_jobs.reference.generators.windows import expected

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
DAY_MS = 86_400_000
GRACE_MS = 10 * 60_000
#: how far behind the latest tick a tick may arrive
DISORDER = dt.timedelta(minutes=5)


def _iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def generate(days: int = 3, symbols: int = 24, ticks_per_day: int = 12, seed: int = 7, start: dt.datetime = START):
    """Ticks of ``symbols`` symbols over ``days`` days from ``start``, in arrival order (see the module docstring)."""
    rng = random.Random(seed)
    names = [f"S{i:02d}" for i in range(symbols)]
    timed = []
    for day in range(days):
        for symbol in names:
            for _ in range(ticks_per_day):
                at = start + dt.timedelta(days=day, seconds=rng.randrange(60, 86_400 - 60))
                timed.append((at, symbol, rng.randint(-8, 8) / 4))
    timed.sort()
    # Arrival order: each tick may be overtaken by ticks of the next DISORDER.
    arrival = sorted(timed, key=lambda t: t[0] + rng.random() * DISORDER)
    ticks = [
        {"tick_id": f"t{i}", "symbol": s, "change": c, "event_time": _iso(at)} for i, (at, s, c) in enumerate(arrival)
    ]
    closing = start + dt.timedelta(days=days) + dt.timedelta(milliseconds=GRACE_MS) + dt.timedelta(minutes=1)
    ticks += [{"tick_id": f"close-{s}", "symbol": s, "change": 0.0, "event_time": _iso(closing)} for s in names]
    ticks += [
        {"tick_id": f"late-{s}", "symbol": s, "change": 100.0, "event_time": _iso(start + dt.timedelta(hours=12))}
        for s in names[:3]
    ]
    return ticks


def daily_changes(ticks: list[dict], partitions: int = 2) -> dict[tuple[str, int], tuple[float, int]]:
    """(symbol, day start ms) -> (change, ticks) of every day closed in its symbol's partition."""
    windows = expected(
        ticks,
        key="symbol",
        aggregate=lambda values, tick: (
            (values[0] if values else 0.0) + tick["change"],
            (values[1] if values else 0) + 1,
        ),
        applies=lambda tick: True,
        window_ms=DAY_MS,
        grace_ms=GRACE_MS,
        retention_ms=3 * DAY_MS,
        partitions=partitions,
        event_id="tick_id",
    )
    return dict(windows.emitted)


def top_movers(daily: dict[tuple[str, int], tuple[float, int]], day_ms: int, n: int = 10) -> list[tuple[str, float]]:
    """The day's ``n`` largest changes, (symbol, change), largest first; a tie goes to the smaller symbol."""
    day = [(symbol, change) for (symbol, start), (change, _) in daily.items() if start == day_ms]
    return sorted(day, key=lambda row: (-row[1], row[0]))[:n]
