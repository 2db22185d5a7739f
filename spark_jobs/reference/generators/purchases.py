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
import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator
from decimal import Decimal

from runtime.kafka_connection import KafkaTarget
from spark_jobs.reference.generators.producer import produce_keyed

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
MAX_STEP_MS = 400  # event times advance 5 to MAX_STEP_MS ms per event


def start_ending_by(count: int, end: dt.datetime = START) -> dt.datetime:
    """A start from which ``count`` events end no later than ``end``.

    For data that must lie in the past: 1e7 events span up to 46 days, and a consumer that stamps its
    output with event time (Kafka Streams does) has records more than an hour ahead of the broker's
    clock refused (``log.message.timestamp.after.max.ms``, 1 h by default since Kafka 4.0)."""
    return end - dt.timedelta(milliseconds=count * MAX_STEP_MS)


def generate(
    count: int,
    users: int = 1000,
    seed: int = 7,
    start: dt.datetime = START,
    close_rate: float = 0.01,
    every_user_first: bool = False,
) -> Iterator[dict]:
    """Yield ``count`` events over ``users`` users (Zipf-like popularity), about ``close_rate`` of
    them ``account_closed``. With ``every_user_first``, the first ``users`` events are one per user in
    turn (with no closes, a store of exactly ``users`` keys) and the rest are drawn by popularity."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(users)]
    first = range(min(users, count)) if every_user_first else range(0)
    user_ids = itertools.chain(first, rng.choices(range(users), weights=weights, k=count - len(first)))
    t = start
    for n, user in enumerate(user_ids):
        t += dt.timedelta(milliseconds=rng.randint(5, MAX_STEP_MS))
        if rng.random() < close_rate:
            yield {
                "event_id": f"p-{seed}-{n:07d}",
                "type": "account_closed",
                "user_id": f"u{user:05d}",
                "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            }
            continue
        yield {
            "event_id": f"p-{seed}-{n:07d}",
            "type": "purchase",
            "user_id": f"u{user:05d}",
            "item": f"sku-{rng.randint(0, 4999):04d}",
            "amount": round(rng.lognormvariate(3.0, 0.8), 2),
            "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }


#: Amounts that test the "never rounded" rule: ones the job takes exactly, and ones it must refuse.
EXACT_AMOUNTS = (0, 0.01, 12.5, 99.99, "12.50", 1.5e2, 9999999999.99)
REFUSED_AMOUNTS = (2.995, -0.001, -1, 1e-30, 12345678901.5, "ten")


def adversarial(count: int, users: int = 12, seed: int = 7, start: dt.datetime = START) -> Iterator[dict]:
    """Events built to catch batch-dependent or lossy results: few users (so a user is often created
    and closed inside one micro-batch), closes of users that never bought, duplicated events, event
    times out of order, amounts at and past what ``DECIMAL(12,2)`` holds exactly, purchases without a
    time. Some are invalid on purpose: :func:`is_valid` says which."""
    rng = random.Random(seed)
    t = start
    previous: dict | None = None
    for n in range(count):
        t += dt.timedelta(milliseconds=rng.randint(0, 2000))
        at = t - dt.timedelta(seconds=rng.choice([0, 0, 0, 5, 65, 3600]))  # out of order, sometimes far
        user = f"a{rng.randrange(users):03d}"
        roll = rng.random()
        if previous is not None and roll < 0.05:
            event = dict(previous)  # a duplicate: counted again, as Kafka Streams counts it
        elif roll < 0.20:
            event = {"event_id": f"a-{seed}-{n}", "type": "account_closed", "user_id": user}
            if rng.random() < 0.7:
                event["event_time"] = _iso(at)
        else:
            amount = rng.choice(REFUSED_AMOUNTS) if rng.random() < 0.1 else rng.choice(EXACT_AMOUNTS)
            event = {
                "event_id": f"a-{seed}-{n}",
                "type": "purchase",
                "user_id": user,
                "item": "sku",
                "amount": amount,
                "event_time": _iso(at),
            }
            if rng.random() < 0.03:
                del event["event_time"]
        previous = event
        yield event


def is_valid(event: dict) -> bool:
    """purchase_counts' validation rules in plain Python (the reference for the dead letters)."""
    if not event.get("user_id") or event.get("type") not in ("purchase", "account_closed"):
        return False
    if event["type"] == "account_closed":
        return True
    if "event_time" not in event or not isinstance(event.get("amount"), (int, float, str)):
        return False
    try:
        amount = Decimal(str(event["amount"]))
    except ArithmeticError:
        return False
    return amount >= 0 and amount == amount.quantize(Decimal("0.01")) and abs(amount) < Decimal(10) ** 10


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
