"""Clickstream events for the user-sessions job, and Kafka Streams' session windows in plain Python.

Events are JSON objects keyed by ``user_id``; a ``click`` or ``page_view`` is activity, ``forget_me``
deletes the user's sessions::

    {"event_id": "s-3-17", "type": "page_view", "user_id": "u007", "page": "/cart", "event_time": "2026-11-01T09:00:04.120Z"}

:func:`expected` replays events record by record as a Kafka Streams task would
(``SessionWindows.ofInactivityGapAndGrace(gap, grace)``, ``KStreamSessionWindowAggregate``, with
``suppress(untilWindowCloses)`` and without it): the reference the tests compare the job and the Kafka
Streams twin with. It is written for clarity, not speed: every stream-time advance scans the partition's
sessions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Callable, Iterable, Iterator

from runtime.kafka_connection import KafkaTarget
from spark_jobs.reference.generators.producer import kafka_partition, produce_keyed
from spark_jobs.reference.generators.windows import millis

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
CLICK, PAGE_VIEW, FORGET_ME = "click", "page_view", "forget_me"
PAGES = ("/", "/search", "/item", "/cart", "/checkout")
MINUTE = 60_000

Values = tuple


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generate(
    users: int = 10,
    seconds: int = 86_400,
    seed: int = 3,
    start: dt.datetime = START,
    forget_rate: float = 0.0005,
    disorder_ms: int = 3000,
) -> Iterator[dict]:
    """``seconds`` of visits of ``users`` users, in arrival order: visits of 3-20 events 10 s to 5 min apart,
    separated by 35 min to 2 h of inactivity (so a 30 min gap splits them), arriving up to ``disorder_ms``
    out of order; a few ``forget_me``."""
    rng = random.Random(seed)
    events = []
    end = start + dt.timedelta(seconds=seconds)
    for u in range(users):
        t = start + dt.timedelta(milliseconds=rng.randint(0, 3_600_000))
        while t < end:
            for _ in range(rng.randint(3, 20)):
                roll = rng.random()
                kind = FORGET_ME if roll < forget_rate else (CLICK if roll < 0.6 else PAGE_VIEW)
                arrival = t + dt.timedelta(milliseconds=rng.randint(0, disorder_ms))
                event = {"type": kind, "user_id": f"u{u:06d}", "page": rng.choice(PAGES), "event_time": _iso(t)}
                events.append((arrival, event))
                t += dt.timedelta(milliseconds=rng.randint(10_000, 300_000))
                if t >= end:
                    break
            t += dt.timedelta(milliseconds=rng.randint(35 * MINUTE, 120 * MINUTE))
    events.sort(key=lambda e: e[0])
    for n, (_, event) in enumerate(events):
        yield {"event_id": f"v-{seed}-{n:08d}", **event}


def adversarial(
    count: int, users: int = 6, seed: int = 5, start: dt.datetime = START, deletes: bool = True
) -> Iterator[dict]:
    """Events built to catch batch-dependent session results, for a 30 min gap and 5 min grace: bursts of
    activity per user separated by pauses around the gap, events out of order by up to 40 minutes (some
    within grace, bridging two sessions of their user into one; some past it: late), several users per
    partition closing each other's sessions, and, with ``deletes``, ``forget_me`` deleting a user."""
    rng = random.Random(seed)
    t = start
    for n in range(count):
        roll = rng.random()
        # Mostly short steps (a session goes on), sometimes a pause about the gap long (a new session).
        t += dt.timedelta(milliseconds=rng.choice([0, 20_000, 90_000, 4 * MINUTE, 12 * MINUTE, 29 * MINUTE]))
        lag_ms = rng.choice([0, 0, 0, 0, 0, 60_000, 20 * MINUTE, 34 * MINUTE, 35 * MINUTE, 36 * MINUTE, 40 * MINUTE])
        at = t - dt.timedelta(milliseconds=lag_ms)
        kind = FORGET_ME if deletes and roll > 0.97 else (CLICK if roll < 0.5 else PAGE_VIEW)
        yield {
            "event_id": f"s-{seed}-{n}",
            "type": kind,
            "user_id": f"u{rng.randrange(users):03d}",
            "page": rng.choice(PAGES),
            "event_time": _iso(at),
        }


def produce(kafka: KafkaTarget, topic: str, events: list[dict]) -> int:
    return produce_keyed(kafka, topic, events, "user_id")


@dataclasses.dataclass
class Sessions:
    """What a session-windowed job must have produced after a sequence of events."""

    #: (key, session start ms) -> (end ms, values, closed) still in the store
    state: dict[tuple[str, int], tuple[int, Values, bool]]
    #: (key, session start ms) -> (end ms, values): the latest emission of every session start, as a
    #: compacted topic of suppress(untilWindowCloses)'s output holds them
    emitted: dict[tuple[str, int], tuple[int, Values]]
    #: (key, session start ms) -> (end ms, values): every update, sessions merged away removed, as a
    #: compacted topic of the table's updates holds them (deleted open sessions removed too)
    updated: dict[tuple[str, int], tuple[int, Values]]
    #: ids of the events refused as late
    late: set[str]
    #: ids of the late-but-in-grace events that merged two or more sessions into one
    bridges: set[str]
    #: source partition -> its stream time (ms)
    stream_times: dict[int, int]
    #: ids of the events that merged into a session already closed (and emitted): not late, since the
    #: merged session's end + gap + grace had not passed (Kafka Streams emits the merged session again)
    reopened: set[str] = dataclasses.field(default_factory=set)


def expected(
    events: Iterable[dict],
    *,
    key: str,
    aggregate: Callable[[Values | None, dict], Values],
    merge: Callable[[Values, Values], Values],
    applies: Callable[[dict], bool],
    deletes: Callable[[dict], bool] = lambda e: False,
    gap_ms: int,
    grace_ms: int,
    retention_ms: int,
    partitions: int = 2,
    time: str = "event_time",
    event_id: str = "event_id",
) -> Sessions:
    """Kafka Streams' session windows for ``events`` (in the order produced), in plain Python.

    Each key's events go to partition ``kafka_partition(key, partitions)``. ``applies``: the events
    aggregated; ``deletes``: the events that delete their key's sessions (others are not read at all).
    ``aggregate(values or None, event)``: values after the event; ``merge(earlier, later)``: two sessions'
    values as one (Kafka Streams' session merger). Per partition, record by record:

    1. stream time becomes the largest event time seen so far; every session whose end + gap + grace it
       reached closes (emitted: Kafka Streams' suppress emits a session once end <= stream time - gap -
       grace) and every closed session whose end + retention it reached leaves the store;
    2. a delete removes every session of its key (open ones leave the updates, closed ones stay);
    3. an event at t takes every session of its key with ``start - gap <= t <= end + gap``: the merged
       session spans them and t; if its end + gap + grace < stream time the event is late and nothing
       changes; otherwise the merged sessions leave the store (and the updates), the merged one (values:
       theirs merged in start order, then the event) enters, and closes at once if it is already due.
    """
    replay = _SessionReplay(aggregate, merge, gap_ms, grace_ms, retention_ms, partitions, event_id)
    for event in events:
        if not (deletes(event) or applies(event)):
            continue
        k, t = event[key], millis(event[time])
        p, now = replay.advance(k, t)
        if deletes(event):
            replay.delete(k)
        else:
            replay.add(k, t, event, p, now)
    return replay.sessions()


class _SessionReplay:
    """:func:`expected`'s store and outputs, with its steps (rules 1 to 3 of its docstring) as methods."""

    def __init__(
        self,
        aggregate: Callable[[Values | None, dict], Values],
        merge: Callable[[Values, Values], Values],
        gap_ms: int,
        grace_ms: int,
        retention_ms: int,
        partitions: int,
        event_id: str,
    ) -> None:
        self.aggregate, self.merge, self.event_id = aggregate, merge, event_id
        self.gap_ms, self.grace_ms, self.retention_ms, self.partitions = gap_ms, grace_ms, retention_ms, partitions
        self.state: dict[tuple[str, int], list] = {}  # (key, start) -> [end, values, closed]
        self.emitted: dict[tuple[str, int], tuple[int, Values]] = {}
        self.updated: dict[tuple[str, int], tuple[int, Values]] = {}
        self.late: set[str] = set()
        self.bridges: set[str] = set()
        self.reopened: set[str] = set()
        self.stream_times: dict[int, int] = {}
        self.partition_of: dict[str, int] = {}

    def advance(self, k: str, t: int) -> tuple[int, int]:
        """Rule 1 for an event of key ``k`` at ``t``: ``(its partition, the partition's stream time)``."""
        p = self.partition_of.setdefault(k, kafka_partition(k, self.partitions))
        if t > self.stream_times.get(p, -(2**63)):
            self.stream_times[p] = t
            self.close_and_evict(p, t)
        return p, self.stream_times[p]

    def close_and_evict(self, p: int, now: int) -> None:
        """Closes (emits) partition ``p``'s sessions due at stream time ``now``; drops the closed ones past
        retention."""
        for session, entry in list(self.state.items()):
            if self.partition_of[session[0]] != p:
                continue
            if not entry[2] and entry[0] + self.gap_ms + self.grace_ms <= now:
                entry[2] = True
                self.emitted[session] = (entry[0], entry[1])
            if entry[2] and entry[0] + self.retention_ms <= now:
                del self.state[session]

    def delete(self, k: str) -> None:
        """Rule 2: every session of ``k`` leaves the store, the open ones the updates too."""
        for session in [s for s in self.state if s[0] == k]:
            if not self.state.pop(session)[2]:
                self.updated.pop(session, None)

    def add(self, k: str, t: int, event: dict, p: int, now: int) -> None:
        """Rule 3: ``event`` (key ``k``, time ``t``, of partition ``p`` at stream time ``now``) merges its key's
        sessions in reach, unless it is late."""
        state, gap_ms, event_id = self.state, self.gap_ms, self.event_id
        merged = sorted(
            (s for s, entry in state.items() if s[0] == k and s[1] - gap_ms <= t <= entry[0] + gap_ms),
            key=lambda s: s[1],
        )
        start = min([t, *(s[1] for s in merged)])
        end = max([t, *(state[s][0] for s in merged)])
        if end + gap_ms + self.grace_ms < now:
            self.late.add(event[event_id])
            return
        if len(merged) > 1:
            self.bridges.add(event[event_id])
        if any(state[s][2] for s in merged):
            self.reopened.add(event[event_id])
        values = None
        for session in merged:
            old = state.pop(session)[1]
            values = old if values is None else self.merge(values, old)
            self.updated.pop(session, None)
        values = self.aggregate(values, event)
        state[(k, start)] = [end, values, False]
        self.updated[(k, start)] = (end, values)
        self.close_and_evict(p, now)

    def sessions(self) -> Sessions:
        return Sessions(
            {s: (v[0], v[1], v[2]) for s, v in self.state.items()},
            self.emitted,
            self.updated,
            self.late,
            self.bridges,
            self.stream_times,
            self.reopened,
        )


#: the reference job's values: (events, page_views, last_page)
def visit_values(values: Values | None, event: dict) -> Values:
    """user_sessions' values after ``event``: events and page views counted, the latest page."""
    events, views, page = values or (0, 0, None)
    return (events + 1, views + (event["type"] == PAGE_VIEW), event.get("page") or page)


def merge_visits(earlier: Values, later: Values) -> Values:
    """Two sessions' values as one (counts add; the later session's page, unless it had none)."""
    return (earlier[0] + later[0], earlier[1] + later[1], later[2] or earlier[2])


def expected_visits(
    events: Iterable[dict],
    gap_ms: int = 30 * MINUTE,
    grace_ms: int = 5 * MINUTE,
    retention_ms: int = 2 * 3600_000,
    partitions: int = 2,
) -> Sessions:
    """user_sessions' answer for ``events`` (:func:`expected` with its values, ``forget_me`` deleting)."""
    return expected(
        events,
        key="user_id",
        aggregate=visit_values,
        merge=merge_visits,
        applies=lambda e: e["type"] in (CLICK, PAGE_VIEW),
        deletes=lambda e: e["type"] == FORGET_ME,
        gap_ms=gap_ms,
        grace_ms=grace_ms,
        retention_ms=retention_ms,
        partitions=partitions,
    )
