"""Votes where voters change their minds and events arrive out of order (the seeds' voter5 case).

Events are JSON objects keyed by ``voter_id``; a voter's later vote may be delivered first::

    {"event_id": "v-5-0000042", "type": "vote", "voter_id": "voter5", "candidate": "blue",
     "event_time": "2026-11-01T09:02:10.000Z"}

:func:`expected` is the job's answer in plain Python: per voter the vote with the latest event time
(ties: the larger event id), and the counts per candidate.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Iterable, Iterator

from runtime.kafka_connection import KafkaTarget
from spark_jobs.reference.generators.producer import produce_keyed

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
CANDIDATES = ("red", "blue", "green", "yellow")


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generate(
    voters: int = 200, seed: int = 5, start: dt.datetime = START, max_votes: int = 4, shuffle_window: int = 50
) -> Iterator[dict]:
    """Each voter votes 1..``max_votes`` times over an hour; arrival order is event-time order
    shuffled within blocks of ``shuffle_window`` events, so later votes often arrive first."""
    rng = random.Random(seed)
    votes = []
    for v in range(voters):
        t = start + dt.timedelta(seconds=rng.randint(0, 600))
        for _ in range(rng.randint(1, max_votes)):
            votes.append(
                (
                    t,
                    {
                        "type": "vote",
                        "voter_id": f"voter{v}",
                        "candidate": rng.choice(CANDIDATES),
                        "event_time": _iso(t),
                    },
                )
            )
            t += dt.timedelta(seconds=rng.randint(1, 900))
    votes.sort(key=lambda x: x[0])
    arrival = []
    for i in range(0, len(votes), shuffle_window):
        block = votes[i : i + shuffle_window]
        rng.shuffle(block)
        arrival.extend(block)
    for n, (_, event) in enumerate(arrival):
        yield {"event_id": f"v-{seed}-{n:07d}", **event}


def produce(kafka: KafkaTarget, topic: str, events: list[dict]) -> int:
    return produce_keyed(kafka, topic, events, "voter_id")


def latest_votes(events: Iterable[dict]) -> dict[str, dict]:
    """voter -> the vote event that counts (latest event time; ties: larger event id)."""
    latest: dict[str, dict] = {}
    for e in events:
        if e.get("type") != "vote" or not e.get("voter_id"):
            continue
        current = latest.get(e["voter_id"])
        if current is None or (e["event_time"], e["event_id"]) > (current["event_time"], current["event_id"]):
            latest[e["voter_id"]] = e
    return latest


def expected_counts(events: Iterable[dict]) -> dict[str, int]:
    return dict(Counter(e["candidate"] for e in latest_votes(events).values()))
