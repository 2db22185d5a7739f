"""Kafka Streams' event-time windows in plain Python: the reference a windowed job is held to.

:func:`expected` replays events record by record as a Kafka Streams task would, for tumbling or hopping
windows (``TimeWindows.ofSizeAndGrace(size, grace).advanceBy(advance)``, ``withRetention``), with
``suppress(untilWindowCloses)`` (:attr:`Windows.emitted`) and without it (:attr:`Windows.updated`, the
latest update of every window, as a compacted output topic holds them). It is written for clarity, not
speed: every stream-time advance scans the partition's windows.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable

from spark_jobs.reference.generators.producer import kafka_partition

Values = tuple


@dataclasses.dataclass
class Windows:
    """What a windowed job must have produced after a sequence of events."""

    #: (key, window start ms) -> (values, closed) still in the store
    state: dict[tuple[str, int], tuple[Values, bool]]
    #: (key, window start ms) -> values, every window emitted when it closed
    emitted: dict[tuple[str, int], Values]
    #: (key, window start ms) -> values, the latest update of every window (open or closed, evicted or not;
    #: an open window that a delete removed is gone)
    updated: dict[tuple[str, int], Values]
    #: event id -> how many open windows a late event was still applied to
    late: dict[str, int]
    #: source partition -> its stream time (ms)
    stream_times: dict[int, int]


def millis(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def window_starts(t: int, window_ms: int, advance_ms: int) -> range:
    """The starts of the windows an event at ``t`` belongs to (Kafka Streams' ``TimeWindows.windowsFor``)."""
    return range(max(0, t - window_ms + advance_ms) // advance_ms * advance_ms, t + 1, advance_ms)


def expected(
    events: Iterable[dict],
    *,
    key: str,
    aggregate: Callable[[Values | None, dict], Values],
    applies: Callable[[dict], bool],
    deletes: Callable[[dict], bool] = lambda e: False,
    window_ms: int,
    advance_ms: int | None = None,
    grace_ms: int,
    retention_ms: int,
    partitions: int = 2,
    time: str = "event_time",
    event_id: str = "event_id",
) -> Windows:
    """Kafka Streams' answer for ``events`` (in the order produced), in plain Python.

    Each key's events go to partition ``kafka_partition(key, partitions)``, as the generators write them.
    ``applies``: the events aggregated; ``deletes``: the events that delete their key's windows (the others
    are not read at all). ``aggregate(values or None, event)``: a window's values after the event. Per
    partition, record by record: stream time becomes the largest event time seen so far; every window whose
    end + grace it has reached closes (emitted once) and every closed window whose start + retention it has
    reached leaves the store; then a delete removes every window of the key, and an aggregated event updates
    its open windows (and is late when any of its windows had closed).
    """
    advance_ms = advance_ms or window_ms
    state: dict[tuple[str, int], list] = {}
    emitted: dict[tuple[str, int], Values] = {}
    updated: dict[tuple[str, int], Values] = {}
    late: dict[str, int] = {}
    stream_times: dict[int, int] = {}
    partition_of: dict[str, int] = {}
    for event in events:
        if not (deletes(event) or applies(event)):
            continue
        k, t = event[key], millis(event[time])
        p = partition_of.setdefault(k, kafka_partition(k, partitions))
        if t > stream_times.get(p, -(2**63)):
            stream_times[p] = t
            for window, entry in list(state.items()):
                if partition_of[window[0]] != p:
                    continue
                if not entry[1] and window[1] + window_ms + grace_ms <= t:
                    entry[1] = True
                    emitted[window] = entry[0]
                if entry[1] and window[1] + retention_ms <= t:
                    del state[window]
        if deletes(event):
            for window in [w for w in state if w[0] == k]:
                if not state.pop(window)[1]:
                    updated.pop(window, None)
            continue
        closed_any, counted = False, 0
        for start in window_starts(t, window_ms, advance_ms):
            if start + window_ms + grace_ms <= stream_times[p]:
                closed_any = True
                continue
            entry = state.setdefault((k, start), [None, False])
            entry[0] = updated[(k, start)] = aggregate(entry[0], event)
            counted += 1
        if closed_any:
            late[event[event_id]] = counted
    return Windows({w: (v[0], v[1]) for w, v in state.items()}, emitted, updated, late, stream_times)
