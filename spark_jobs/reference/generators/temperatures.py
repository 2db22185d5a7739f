"""Temperature readings for the temperature_averages job: sensors report every few seconds, devices
buffer, so readings arrive a little out of order; a decommissioned sensor sends ``sensor_removed``.

Events are JSON objects keyed by ``sensor_id``::

    {"event_id": "t-3-0000042", "type": "reading", "sensor_id": "s007", "temperature": 21.4,
     "event_time": "2026-11-01T09:00:04.120Z"}

:func:`expected` is the job's answer in plain Python (Kafka Streams' hopping windows, stream time per
partition advancing record by record): the reference the tests compare the job with.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterable, Iterator

from runtime.kafka_connection import KafkaTarget
from spark_jobs.reference.generators import windows
from spark_jobs.reference.generators.producer import produce_keyed

START = dt.datetime(2026, 11, 1, 9, 0, tzinfo=dt.timezone.utc)
READING, SENSOR_REMOVED = "reading", "sensor_removed"


def _iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generate(
    sensors: int = 10,
    seconds: int = 900,
    seed: int = 3,
    start: dt.datetime = START,
    period_s: float = 5.0,
    removal_rate: float = 0.0005,
    disorder_ms: int = 3000,
) -> Iterator[dict]:
    """``seconds`` of readings (one every ``period_s`` or so per sensor, a random walk around 15-25 °C),
    in arrival order."""
    rng = random.Random(seed)
    events = []
    for s in range(sensors):
        temperature = rng.uniform(15, 25)
        t = start + dt.timedelta(milliseconds=rng.randint(0, 1000))
        while t < start + dt.timedelta(seconds=seconds):
            arrival = t + dt.timedelta(milliseconds=rng.randint(0, disorder_ms))
            if rng.random() < removal_rate:
                event = {"type": SENSOR_REMOVED, "sensor_id": f"s{s:03d}", "event_time": _iso(t)}
            else:
                temperature += rng.uniform(-0.3, 0.3)
                event = {
                    "type": READING,
                    "sensor_id": f"s{s:03d}",
                    "temperature": round(temperature, 1),
                    "event_time": _iso(t),
                }
            events.append((arrival, event))
            t += dt.timedelta(milliseconds=int(period_s * 1000 * rng.uniform(0.8, 1.2)))
    events.sort(key=lambda e: e[0])
    for n, (_, event) in enumerate(events):
        yield {"event_id": f"t-{seed}-{n:07d}", **event}


def adversarial(
    count: int, sensors: int = 6, seed: int = 5, start: dt.datetime = START, removals: bool = True
) -> Iterator[dict]:
    """Readings built to catch batch-dependent hopping-window results: out of order by up to six minutes
    (so some land exactly at, before and past the grace boundary of some of their five windows but not
    others), windows closed by other sensors' readings, removals right after windows closed, duplicates,
    and gaps longer than a 2 h retention."""
    rng = random.Random(seed)
    t = start
    for n in range(count):
        roll = rng.random()
        t += dt.timedelta(hours=3) if roll < 0.01 else dt.timedelta(milliseconds=rng.choice([0, 1000, 7000, 25000]))
        at = t - dt.timedelta(milliseconds=rng.choice([0, 0, 0, 29_999, 30_000, 30_001, 90_000, 330_000, 360_000]))
        sensor = f"s{rng.randrange(sensors):03d}"
        if removals and roll > 0.96:
            yield {"event_id": f"x-{seed}-{n}", "type": SENSOR_REMOVED, "sensor_id": sensor, "event_time": _iso(at)}
        else:
            yield {
                "event_id": f"x-{seed}-{n}",
                "type": READING,
                "sensor_id": sensor,
                "temperature": round(rng.uniform(-5, 35), 1),
                "event_time": _iso(at),
            }


def produce(kafka: KafkaTarget, topic: str, events: list[dict]) -> int:
    return produce_keyed(kafka, topic, events, "sensor_id")


def _aggregate(values: tuple | None, event: dict) -> tuple:
    """(readings, temperature_sum, min_temperature, max_temperature) after ``event``."""
    readings, total, low, high = values or (0, 0.0, None, None)
    t = event["temperature"]
    return readings + 1, total + t, t if low is None else min(low, t), t if high is None else max(high, t)


def expected(
    events: Iterable[dict],
    window_ms: int = 300_000,
    advance_ms: int = 60_000,
    grace_ms: int = 30_000,
    retention_ms: int = 2 * 3600 * 1000,
    partitions: int = 2,
) -> windows.Windows:
    """The job's answer: per sensor and window, ``(readings, temperature_sum, min_temperature,
    max_temperature)`` (see :func:`average`), the job's store and outputs in Kafka Streams' semantics."""
    return windows.expected(
        events,
        key="sensor_id",
        aggregate=_aggregate,
        applies=lambda e: e["type"] == READING,
        deletes=lambda e: e["type"] == SENSOR_REMOVED,
        window_ms=window_ms,
        advance_ms=advance_ms,
        grace_ms=grace_ms,
        retention_ms=retention_ms,
        partitions=partitions,
    )


def average(values: tuple) -> dict:
    """A window's output row (after the key and window) from its stored values."""
    readings, total, low, high = values
    return {"readings": readings, "avg_temperature": total / readings, "min_temperature": low, "max_temperature": high}
