"""Purchase events: a few heavy buyers and a long tail, realistic amounts, increasing event times.

Events are JSON objects keyed by ``user_id``::

    {"event_id": "p-7-0000042", "type": "purchase", "user_id": "u00017", "item": "sku-0311",
     "amount": 23.75, "event_time": "2026-11-01T09:00:04.120Z"}
    {"event_id": "p-7-0000043", "type": "account_closed", "user_id": "u00017",
     "event_time": "2026-11-01T09:00:04.390Z"}

About ``close_rate`` of the events close an account (a user may come back and buy again: the
count starts over).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from decimal import Decimal

from runtime.kafka_connection import KafkaTarget
from spark_jobs.generators.producer import produce_keyed

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
MAX_STEP_MS = 400  # event times advance 5 to MAX_STEP_MS ms per event


def start_ending_by(count: int, end: dt.datetime = START) -> dt.datetime:
    """A start from which ``count`` events end no later than ``end``.

    For data that must lie in the past: 1e7 events span up to 46 days, and a consumer that stamps its
    output with event time (Kafka Streams does) has records more than an hour ahead of the broker's
    clock refused (``log.message.timestamp.after.max.ms``, 1 h by default since Kafka 4.0)."""
    return end - dt.timedelta(milliseconds=count * MAX_STEP_MS)


def generate(count: int, users: int = 1000, seed: int = 7, start: dt.datetime = START,
             close_rate: float = 0.01) -> Iterator[dict]:  # fmt: skip
    """Yield ``count`` events over ``users`` users (Zipf-like popularity), about ``close_rate`` of
    them ``account_closed``."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(users)]
    user_ids = rng.choices(range(users), weights=weights, k=count)
    t = start
    for n, user in enumerate(user_ids):
        t += dt.timedelta(milliseconds=rng.randint(5, MAX_STEP_MS))
        if rng.random() < close_rate:
            yield {"event_id": f"p-{seed}-{n:07d}", "type": "account_closed", "user_id": f"u{user:05d}",
                   "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z")}  # fmt: skip
            continue
        yield {
            "event_id": f"p-{seed}-{n:07d}",
            "type": "purchase",
            "user_id": f"u{user:05d}",
            "item": f"sku-{rng.randint(0, 4999):04d}",
            "amount": round(rng.lognormvariate(3.0, 0.8), 2),
            "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }


def expected_counts(events: Iterable[dict]) -> dict[str, tuple[int, Decimal]]:
    """user_id -> (purchases, amount spent): the job's answer computed in plain Python, no Spark.

    ``events`` in the order each user's events were written; ``account_closed`` forgets the user.
    """
    totals: dict[str, list] = defaultdict(lambda: [0, Decimal("0")])
    for event in events:
        if not event.get("user_id"):
            continue
        if event.get("type") == "purchase":
            totals[event["user_id"]][0] += 1
            totals[event["user_id"]][1] += Decimal(str(event["amount"]))
        elif event.get("type") == "account_closed":
            totals.pop(event["user_id"], None)
    return {user: (n, amount) for user, (n, amount) in totals.items()}


def produce(kafka: KafkaTarget, topic: str, events: Iterable[dict]) -> int:
    """Write events to ``topic`` keyed by user_id (same user, same partition). Returns the count acked."""
    return produce_keyed(kafka, topic, events, "user_id")
