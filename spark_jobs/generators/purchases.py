"""Purchase events: a few heavy buyers and a long tail, realistic amounts, increasing event times.

Events are JSON objects keyed by ``user_id``::

    {"event_id": "p-000042", "type": "purchase", "user_id": "u00017", "item": "sku-0311",
     "amount": 23.75, "event_time": "2026-11-01T09:00:04.120Z"}
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator

from confluent_kafka import Producer

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)


def generate(count: int, users: int = 1000, seed: int = 7, start: dt.datetime = START) -> Iterator[dict]:
    """Yield ``count`` purchase events over ``users`` users (Zipf-like popularity)."""
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) ** 0.8 for rank in range(users)]
    user_ids = rng.choices(range(users), weights=weights, k=count)
    t = start
    for n, user in enumerate(user_ids):
        t += dt.timedelta(milliseconds=rng.randint(5, 400))
        yield {
            "event_id": f"p-{seed}-{n:07d}",
            "type": "purchase",
            "user_id": f"u{user:05d}",
            "item": f"sku-{rng.randint(0, 4999):04d}",
            "amount": round(rng.lognormvariate(3.0, 0.8), 2),
            "event_time": t.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }


def produce(bootstrap_servers: str, topic: str, events: list[dict]) -> int:
    """Write events to ``topic`` keyed by user_id (same user, same partition). Returns the count acked."""
    # murmur2 is the Java client's (and Spark's) partitioner: a key lands on the same partition number
    # in the source topic and in the changelog topics Spark writes.
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "enable.idempotence": True,
                         "partitioner": "murmur2_random", "log_level": 3})
    failures: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(str(err))

    for event in events:
        while True:
            try:
                producer.produce(topic, key=event["user_id"].encode(), value=json.dumps(event).encode(),
                                 on_delivery=on_delivery)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining} events unsent, {len(failures)} failed (first: {failures[:1]})")
    return len(events)
