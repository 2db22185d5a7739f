"""What each peer of bench/compare.py computed, read back from where it wrote it, and the check that the
peers agree key by key before a throughput of theirs is reported.

* purchases: user -> (purchases, amount spent). Kafka Streams: the latest record per user of its output
  topic (a deleted user's is a tombstone); plain Spark and the platform: their Delta tables.
* pulses: (patient, window start ms) -> beats of a closed window. Kafka Streams: its output topic (a window
  is emitted once, when it closes); plain Spark and the platform: their Delta tables.
* temperatures: (sensor, window start ms) -> (readings, average, minimum, maximum) of a closed hopping
  window, read the same ways; the averages are equal within a relative 1e-9 (:class:`Approximately`: plain
  Spark sums a window's readings in another order than the others, which changes their last bits, and
  rounding to a fixed decimal still tells apart two sums on either side of a rounding boundary).

Where a peer computes something else by design, its answer is compared on the keys both mean the same
by (``Scope``): plain Spark's built-in aggregation cannot delete, so purchases are compared on users who
never closed their account; Kafka Streams' and plain Spark's windows ignore check-outs and removals, which
delete a key's open windows in the platform, so windows are compared on keys never deleted; plain
Spark's watermark is the slowest partition's and only moves between micro-batches, so its closed windows
are a subset of the others' at the end of the input: compared on the windows it closed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal

from confluent_kafka import Consumer, KafkaError, TopicPartition

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.kafka_topics import partition_offsets

#: how many differing keys a mismatch names
SHOWN_KEYS = 10


class AnswersDiffer(RuntimeError):
    """Two peers computed different answers for the same input: no throughput of theirs means anything."""


def latest_per_key(connection: KafkaTarget, topic: str, stall_s: float = 30.0) -> dict[str, bytes]:
    """The latest value of every key in ``topic`` (all of it, every partition), tombstoned keys left out."""
    settings = {"group.id": f"bench-answers-{topic}", "enable.auto.commit": False, "enable.partition.eof": True}
    consumer = Consumer(client_config(connection, settings))
    latest: dict[bytes, bytes | None] = {}
    try:
        for partition, (low, high) in sorted(partition_offsets(connection, topic).items()):
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            at_end, deadline = False, time.monotonic() + stall_s
            while not at_end:
                # returns as soon as it has a message or the partition's end (never waits out the timeout
                # for a full batch: the end of a partition is an event of its own)
                for message in consumer.consume(10_000, timeout=1):
                    if message.error() and message.error().code() == KafkaError._PARTITION_EOF:
                        at_end = True
                    elif message.error():
                        raise AnswersDiffer(f"reading {topic}[{partition}] failed: {message.error()}")
                    else:
                        latest[message.key()] = message.value()
                    deadline = time.monotonic() + stall_s
                if not at_end and time.monotonic() > deadline:
                    raise AnswersDiffer(f"reading {topic}[{partition}] stalled before offset {high}")
    finally:
        consumer.close()
    return {key.decode(): value for key, value in latest.items() if value is not None}


def kafka_streams_purchases(connection: KafkaTarget, topic: str) -> dict[str, tuple[int, Decimal]]:
    answer = {}
    for user, value in latest_per_key(connection, topic).items():
        state = json.loads(value)
        answer[user] = (int(state["purchases"]), Decimal(state["amount_spent"]))
    return answer


def kafka_streams_pulses(connection: KafkaTarget, topic: str) -> dict[tuple[str, int], int]:
    answer = {}
    for key, value in latest_per_key(connection, topic).items():
        patient, _, start_ms = key.rpartition("@")
        answer[(patient, int(start_ms))] = int(json.loads(value)["beats"])
    return answer


def table_purchases(path: str) -> dict[str, tuple[int, Decimal]]:
    """user -> (purchases, amount spent) of a purchase-counts Delta table (the platform's, plain Spark's)."""
    from deltalake import DeltaTable

    rows = DeltaTable(path).to_pyarrow_table(columns=["user_id", "purchases", "amount_spent"]).to_pydict()
    return {
        u: (int(n), Decimal(a))
        for u, n, a in zip(rows["user_id"], rows["purchases"], rows["amount_spent"], strict=True)
    }


def table_pulses(path: str) -> dict[tuple[str, int], int]:
    """(patient, window start ms) -> beats of a heart-rate Delta table (the platform's, plain Spark's)."""
    rows = _windows(path, "patient_id", ["heart_rate"])
    return {window: int(beats) for window, (beats,) in rows.items()}


def kafka_streams_temperatures(connection: KafkaTarget, topic: str) -> dict[tuple[str, int], tuple]:
    answer = {}
    for key, value in latest_per_key(connection, topic).items():
        sensor, _, start_ms = key.rpartition("@")
        w = json.loads(value)
        answer[(sensor, int(start_ms))] = temperature_window(
            w["readings"], w["temperature_sum"] / w["readings"], w["min_temperature"], w["max_temperature"]
        )
    return answer


def table_temperatures(path: str) -> dict[tuple[str, int], tuple]:
    """(sensor, window start ms) -> a temperature_averages window of a Delta table (the platform's, plain Spark's)."""
    rows = _windows(path, "sensor_id", ["readings", "avg_temperature", "min_temperature", "max_temperature"])
    return {window: temperature_window(*values) for window, values in rows.items()}


def kafka_streams_sessions(connection: KafkaTarget, topic: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(user, session start ms) -> (end ms, events, page views) of the Kafka Streams app's closed sessions."""
    answer = {}
    for key, value in latest_per_key(connection, topic).items():
        user, _, start_ms = key.rpartition("@")
        session = json.loads(value)
        answer[(user, int(start_ms))] = (int(session["session_end_ms"]), session["events"], session["page_views"])
    return answer


def table_sessions(path: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(user, session start ms) -> (end ms, events, page views) of a user-sessions Delta table (the platform's,
    plain Spark's)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(
        columns=["user_id", "session_start", "session_end", "events", "page_views"]
    )

    def millis(column: str) -> list[int]:
        return pc.cast(pc.cast(table[column], pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()

    return {
        (user, start): (end, int(events), int(views))
        for user, start, end, events, views in zip(
            table["user_id"].to_pylist(),
            millis("session_start"),
            millis("session_end"),
            table["events"].to_pylist(),
            table["page_views"].to_pylist(),
            strict=True,
        )
    }


def temperature_window(readings, average: float, low: float, high: float) -> tuple:
    return int(readings), Approximately(average), low, high


@dataclasses.dataclass(frozen=True, eq=False)
class Approximately:
    """A float equal to another within a relative ``1e-9``: one computed by summing in another order."""

    value: float

    def __eq__(self, other) -> bool:
        return isinstance(other, Approximately) and math.isclose(self.value, other.value, rel_tol=1e-9)

    __hash__ = None

    def __repr__(self) -> str:
        return repr(self.value)


def _windows(path: str, key_field: str, columns: list[str]) -> dict[tuple[str, int], tuple]:
    """(key, window start ms) -> ``columns`` of each row of a windowed Delta table."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable

    table = DeltaTable(path).to_pyarrow_table(columns=[key_field, "window_start", *columns])
    as_ms = pc.cast(table["window_start"], pa.timestamp("ms", tz="UTC"), safe=False)  # windows start on the minute
    starts = pc.cast(as_ms, pa.int64()).to_pylist()
    values = zip(*(table[c].to_pylist() for c in columns), strict=True)
    return {(k, s): v for k, s, v in zip(table[key_field].to_pylist(), starts, values, strict=True)}


@dataclasses.dataclass(frozen=True)
class Scope:
    """The keys on which a peer's answer is compared with the reference's: ``keys`` selects them (default:
    every key), ``only_its_own``: only the keys the peer has (a peer that leaves some out by design)."""

    keys: Callable[[object], bool] = lambda key: True
    only_its_own: bool = False
    why: str = ""


def check_agree(answers: dict[str, dict], scopes: dict[str, Scope] | None = None) -> dict[str, int]:
    """Every peer's answer against the first one's (the reference), key by key; returns peer -> keys
    compared. Raises AnswersDiffer naming the differing keys and both values."""
    scopes = scopes or {}
    (reference, expected), *others = answers.items()
    compared = {reference: len(expected)}
    for peer, got in others:
        scope = scopes.get(peer, Scope())
        keys = got.keys() if scope.only_its_own else got.keys() | expected.keys()
        keys = [key for key in keys if scope.keys(key)]
        differing = [key for key in keys if got.get(key) != expected.get(key)]
        if differing:
            shown = ", ".join(
                f"{k!r}: {reference} {expected.get(k)!r} vs {got.get(k)!r}" for k in sorted(differing)[:SHOWN_KEYS]
            )
            raise AnswersDiffer(f"{peer} and {reference} differ on {len(differing)} of {len(keys)} keys: {shown}")
        if not keys:
            raise AnswersDiffer(f"{peer}: no key to compare with {reference} ({scope.why or 'every key'})")
        compared[peer] = len(keys)
    return compared


def noting_keys(events: Iterable[dict], key_field: str, event_type: str, into: set[str]) -> Iterator[dict]:
    """``events`` passed through, the keys (``key_field``) of those of ``event_type`` added to ``into`` on the
    way (users who closed their account, patients who checked out: while the input is produced)."""
    for event in events:
        if event.get("type") == event_type:
            into.add(event[key_field])
        yield event
