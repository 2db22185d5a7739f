"""Adversarial upsert records for a table read by :class:`~spark_jobs.primitives.TopN` (``top_movers``' input
shape: stage 1's closed days, keyed by symbol and day), and the plain-Python reference of its ranking.

A record is ``(key, value)`` bytes: the key the JSON object ``{"symbol": ..., "window_start": ...}``, the
value the row as JSON or None (a tombstone). The stream updates rows up and down (a leader falls out of the
top), deletes rows and brings some back, ties scores, leaves a score out (kept, not ranked) and mixes in
records a table must refuse: a value disagreeing with its key (``wrong_key``), a key that is not the key's
JSON object (``missing_key``), a value that is not JSON (``undecodable``).
"""

from __future__ import annotations

import datetime as dt
import json
import random

from confluent_kafka import Producer

from runtime.kafka_connection import KafkaTarget, client_config

START = dt.datetime(2026, 3, 2, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def _iso(t: dt.datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def key_of(symbol: str, day: int) -> bytes:
    return json.dumps({"symbol": symbol, "window_start": _iso(START + day * DAY)}).encode()


def row_of(symbol: str, day: int, change: float | None, ticks: int) -> dict:
    start = START + day * DAY
    return {
        "symbol": symbol,
        "window_start": _iso(start),
        "window_end": _iso(start + DAY),
        "change": change,
        "ticks": ticks,
    }


def adversarial(
    count: int = 300, symbols: int = 16, days: int = 3, seed: int = 11
) -> list[tuple[bytes | None, bytes | None]]:
    """``count`` upserts and tombstones over ``symbols`` x ``days`` rows, a tie at the top of day 0, then a few
    refused records."""
    rng = random.Random(seed)
    records: list[tuple[bytes | None, bytes | None]] = []
    for n in range(count):
        symbol, day = f"S{rng.randrange(symbols):02d}", rng.randrange(days)
        roll = rng.random()
        if roll < 0.12:
            records.append((key_of(symbol, day), None))
            continue
        change = None if roll < 0.15 else rng.randint(-12, 12) / 4  # few distinct values: ties
        records.append((key_of(symbol, day), json.dumps(row_of(symbol, day, change, n)).encode()))
    # a tie at the top where the symbols' order and their keys' JSON order disagree ("T" < "T!", but '"' > '!')
    records += [(key_of(symbol, 0), json.dumps(row_of(symbol, 0, 50.0, 7)).encode()) for symbol in ("T!", "T")]
    records += [
        (key_of("S00", 0), json.dumps(row_of("S01", 0, 99.0, 1)).encode()),  # wrong_key: another symbol
        (key_of("S00", 0), json.dumps(row_of("S00", 1, 99.0, 1)).encode()),  # wrong_key: another day
        (b"S00", json.dumps(row_of("S00", 0, 99.0, 1)).encode()),  # missing_key: not the key's JSON
        (None, json.dumps(row_of("S00", 0, 99.0, 1)).encode()),  # missing_key: none
        (key_of("S00", 0), b"{not json"),  # undecodable
    ]
    return records


def verdict(
    key: bytes | None, value: bytes | None, key_fields: tuple[str, ...] = ("symbol", "window_start")
) -> str | None:
    """Why an upsert table keyed by the JSON object of ``key_fields`` refuses a record (the reason of its dead
    letter), or None: it applies."""
    try:
        member = json.loads(key) if key is not None else None
    except ValueError:
        member = None
    if not isinstance(member, dict) or any(member.get(field) is None for field in key_fields):
        return "missing_key"
    if value is None:
        return None
    try:
        row = json.loads(value)
    except ValueError:
        return "undecodable"
    if not isinstance(row, dict):
        return "undecodable"
    if any(row.get(field) != member[field] for field in key_fields):
        return "wrong_key"
    return None


def refused(records) -> dict[str, int]:
    """How many of ``records`` a table refuses, by reason."""
    counts: dict[str, int] = {}
    for key, value in records:
        if reason := verdict(key, value):
            counts[reason] = counts.get(reason, 0) + 1
    return counts


def top_n(records, n: int = 10) -> dict[tuple[int, int], tuple[str, float, int]]:
    """(day start ms, rank) -> (symbol, change, ticks): each day's ``n`` largest changes over the rows'
    latest values (ties to the smaller symbol; a row without a change is not ranked; refused records skipped)."""
    table: dict[tuple[str, str], dict] = {}
    for key, value in records:
        if verdict(key, value):
            continue
        member = json.loads(key)
        ident = (member["symbol"], member["window_start"])
        if value is None:
            table.pop(ident, None)
        else:
            table[ident] = json.loads(value)
    days: dict[str, list[dict]] = {}
    for row in table.values():
        if row["change"] is not None:
            days.setdefault(row["window_start"], []).append(row)
    ranked = {}
    for day, rows in days.items():
        day_ms = int(dt.datetime.fromisoformat(day.replace("Z", "+00:00")).timestamp() * 1000)
        best = sorted(rows, key=lambda r: (-r["change"], r["symbol"]))[:n]
        for rank, row in enumerate(best, start=1):
            ranked[(day_ms, rank)] = (row["symbol"], row["change"], row["ticks"])
    return ranked


def produce(kafka: KafkaTarget, topic: str, records) -> None:
    """Write ``records`` to ``topic`` in order, partitioned by key (murmur2, as Kafka's Java clients)."""
    producer = Producer(
        client_config(
            kafka, {"linger.ms": 20, "enable.idempotence": True, "partitioner": "murmur2_random", "log_level": 3}
        )
    )
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    if producer.flush(30):
        raise RuntimeError(f"records to {topic} were not acknowledged")
