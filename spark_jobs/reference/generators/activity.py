"""User activity with a TTL counted in event time: clicks (with a quantity), views and logouts keyed by
``user``, moving forward in time with records out of order (some far behind) and pauses longer than the
TTL, so users expire, come back, and old clicks arrive for users that are gone.

Events are JSON objects keyed by ``user``::

    {"event_id": "e42", "user": "u3", "type": "click", "qty": 2, "event_time": "2026-03-01T00:04:10Z"}

:func:`expected` is the answer of a keyed aggregate (clicks, quantity, latest click time) whose store
expires a user ``ttl_ms`` of event time after its latest click, in plain Python, record by record: the
reference the platform's processor (tests/spark_jobs/test_event_time_ttl.py) and the Kafka Streams peer
(tests/bench/test_kafka_streams_peer.py) are both held to.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random

from spark_jobs.reference.generators.producer import kafka_partition
from spark_jobs.reference.generators.windows import millis

START = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
CLICK, VIEW, LOGOUT = "click", "view", "logout"


def generate(count: int, seed: int, start: dt.datetime = START, users: int = 6) -> list[dict]:
    """``count`` events of ``users`` users in arrival order (views are never aggregated: they move no
    stream time)."""
    rng = random.Random(seed)
    t, events = 0, []
    for i in range(count):
        # steps and lags of whole 5 s: users often expire, or arrive late, exactly at the TTL's boundary
        t += rng.choice((0, 5_000, 5_000, 15_000, 20_000, 60_000, 70_000))
        at = max(0, t - rng.choice((0, 0, 0, 30_000, 60_000, 120_000)))  # out of order, sometimes far behind
        kind = rng.choices((CLICK, VIEW, LOGOUT), (85, 8, 7))[0]
        time = (start + dt.timedelta(milliseconds=at)).isoformat().replace("+00:00", "Z")
        events.append(
            {
                "event_id": f"e{i}",
                "user": f"u{rng.randrange(users)}",
                "type": kind,
                "qty": rng.choice((None, 1, 2, 5)),
                "event_time": time,
            }
        )
    return events


@dataclasses.dataclass
class Outcome:
    """What the store holds at the end, and what happened on the way."""

    #: user -> (clicks, qty, latest click time in epoch ms, the user's event time in epoch ms)
    state: dict[str, tuple]
    #: source partition -> its stream time
    stream_times: dict[int, int]
    #: event ids refused as late
    late: set[str]
    #: how often a user expired, came back after expiring, got a click older than its event time, and
    #: expired or was refused exactly at the TTL's boundary (stream time = event time + TTL)
    expired: int = 0
    restarted: int = 0
    old_but_alive: int = 0
    on_the_boundary: int = 0

    def final(self) -> Outcome:
        """The outcome without the counts of what happened on the way (what a processor's rows show)."""
        return dataclasses.replace(self, expired=0, restarted=0, old_but_alive=0, on_the_boundary=0)


def expected(events: list[dict], ttl_ms: int, partitions: int) -> Outcome:
    """The documented semantics (``spark_jobs.primitives.keyed_aggregate``), record by record: per source
    partition, stream time advances first, then due users expire, then the event deletes its user, is
    refused as late, or is aggregated."""
    out, partition_of, gone = Outcome({}, {}, set()), {}, set()
    for e in events:
        if e["type"] == VIEW:
            continue
        user, t = e["user"], millis(e["event_time"])
        p = partition_of.setdefault(user, kafka_partition(user, partitions))
        if t > out.stream_times.get(p, -(2**63)):
            out.stream_times[p] = t
            for key in [k for k, v in out.state.items() if partition_of[k] == p and v[3] + ttl_ms <= t]:
                out.on_the_boundary += out.state[key][3] + ttl_ms == t
                del out.state[key]
                out.expired += 1
                gone.add(key)
        if e["type"] == LOGOUT:
            out.state.pop(user, None)
            continue
        current = out.state.get(user)
        if current is None and t + ttl_ms <= out.stream_times[p]:
            out.late.add(e["event_id"])
            out.on_the_boundary += t + ttl_ms == out.stream_times[p]
            continue
        if current is None:
            out.restarted += user in gone
            current = (0, 0, None, t)
        elif t < current[3]:
            out.old_but_alive += 1
        clicks, qty, last_at, event_time = current
        out.state[user] = (clicks + 1, qty + (e["qty"] or 0), max(last_at or t, t), max(event_time, t))
    return out
