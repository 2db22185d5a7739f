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

* enrichment: (order partition, offset) -> a digest of the joined row (customer id, order id, amount, event time,
  name, tier). Kafka Streams: every record of its output topic (one per joined order); plain Spark and the
  platform: their Delta tables. Plain Spark's stream-static join joins every order at once; the other two hold an
  order until their stream time passes its time + the 1 min grace, so each partition's last minute of orders is
  still held when the input ends: plain Spark is compared on the orders the platform joined
  (:func:`check_enrichment_agree`).
* payments: (order partition and offset, payment partition and offset; None for the side an unmatched result
  lacks) -> (the result's time, a digest of its row). The matched pairs are compared exactly; an unmatched order
  or payment on the results every peer emitted, and one that a peer has not emitted must lie where that peer had
  not closed windows yet when the input ended (:func:`check_payments_agree`).
  A digest (Python's ``hash`` of the row, within one process) keeps 1e7 results per peer in memory.

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
from spark_jobs.io.kafka_topics import partition_offsets

#: how many differing keys a mismatch names
SHOWN_KEYS = 10


class AnswersDiffer(RuntimeError):
    """Two peers computed different answers for the same input: no throughput of theirs means anything."""


def _messages(connection: KafkaTarget, topic: str, stall_s: float) -> Iterator[tuple[int, object]]:
    """Every record of ``topic`` (all of it, every partition) as ``(partition, message)``, each partition to its
    end; a partition silent for ``stall_s`` before its end raises :class:`AnswersDiffer`."""
    settings = {"group.id": f"bench-answers-{topic}", "enable.auto.commit": False, "enable.partition.eof": True}
    consumer = Consumer(client_config(connection, settings))
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
                        yield partition, message
                    deadline = time.monotonic() + stall_s
                if not at_end and time.monotonic() > deadline:
                    raise AnswersDiffer(f"reading {topic}[{partition}] stalled before offset {high}")
    finally:
        consumer.close()


def latest_per_key(connection: KafkaTarget, topic: str, stall_s: float = 30.0) -> dict[str, bytes]:
    """The latest value of every key in ``topic`` (all of it, every partition), tombstoned keys left out."""
    latest = {message.key(): message.value() for _partition, message in _messages(connection, topic, stall_s)}
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


def all_records(connection: KafkaTarget, topic: str, stall_s: float = 30.0) -> Iterator[tuple[int, bytes]]:
    """Every record of ``topic`` (all of it, every partition): ``(partition, value)``, tombstones left out."""
    for partition, message in _messages(connection, topic, stall_s):
        if message.value() is not None:
            yield partition, message.value()


def iso_millis(text: str) -> int:
    """An ISO-8601 UTC time as the events write it (``...T10:56:40.071Z``) -> epoch milliseconds."""
    import datetime as dt

    return round(dt.datetime.fromisoformat(text).timestamp() * 1000)


def _millis(table, column: str) -> list[int | None]:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.cast(pc.cast(table[column], pa.timestamp("ms", tz="UTC")), pa.int64()).to_pylist()


def kafka_streams_enrichment(connection: KafkaTarget, topic: str) -> dict[tuple[int, int], int]:
    """(partition, offset of the order) -> :func:`enrichment_digest` of each row of the Kafka Streams app's output."""
    answer = {}
    for _, value in all_records(connection, topic):
        row = json.loads(value, parse_float=Decimal)
        place = (row["source_partition"], row["source_offset"])
        if place in answer:
            raise AnswersDiffer(f"Kafka Streams joined the order at {place} twice")
        answer[place] = enrichment_digest(
            row["customer_id"], row["order_id"], row["amount"], iso_millis(row["event_time"]), row["name"], row["tier"]
        )
    return answer


def table_enrichment(path: str) -> dict[tuple[int, int], int]:
    """(partition, offset of the order) -> :func:`enrichment_digest` of each row of an order-enrichment Delta
    table (the platform's, plain Spark's)."""
    from deltalake import DeltaTable

    columns = ["customer_id", "order_id", "amount", "name", "tier", "source_partition", "source_offset"]
    table = DeltaTable(path).to_pyarrow_table(columns=[*columns, "event_time"])
    rows = zip(*(table[c].to_pylist() for c in columns), _millis(table, "event_time"), strict=True)
    answer = {}
    for customer, order, amount, name, tier, partition, offset, at in rows:
        if (partition, offset) in answer:
            raise AnswersDiffer(f"{path}: the order at {(partition, offset)} joined twice")
        answer[partition, offset] = enrichment_digest(customer, order, amount, at, name, tier)
    return answer


def enrichment_digest(customer_id, order_id, amount: Decimal, event_time_ms: int, name, tier) -> int:
    """A joined order's row as one int (equal rows, equal ints, in one process; Decimal("1.5") == Decimal("1.50"))."""
    return hash((customer_id, order_id, Decimal(amount), event_time_ms, name, tier))


#: a payments result's key: the order's (partition, offset) and the payment's, None for the side it lacks
PaymentsKey = tuple[tuple[int, int] | None, tuple[int, int] | None]


def kafka_streams_payments(connection: KafkaTarget, topic: str) -> dict[PaymentsKey, tuple[int, int]]:
    """Each result of the Kafka Streams app's ``order_payments_*`` output -> (its time, :func:`payments_digest`)."""
    answer = {}
    for _, value in all_records(connection, topic):
        r = json.loads(value, parse_float=Decimal)
        order = None if r["order_offset"] is None else (r["order_partition"], r["order_offset"])
        payment = None if r["payment_offset"] is None else (r["payment_partition"], r["payment_offset"])
        order_ms = None if r["order_time"] is None else iso_millis(r["order_time"])
        payment_ms = None if r["payment_time"] is None else iso_millis(r["payment_time"])
        _put_result(answer, (order, payment), topic, r, order_ms, payment_ms)
    return answer


def table_payments(path: str) -> dict[PaymentsKey, tuple[int, int]]:
    """Each result of an order-payments Delta table (the platform's, plain Spark's: ``source_partition``,
    ``left_offset`` and ``right_offset``, -1 for the side a result lacks) -> (its time, :func:`payments_digest`)."""
    from deltalake import DeltaTable

    columns = ["order_id", "customer_id", "amount", "payment_id", "paid", "source_partition", "left_offset"]
    columns.append("right_offset")
    table = DeltaTable(path).to_pyarrow_table(columns=[*columns, "order_time", "payment_time"])
    rows = zip(
        *(table[c].to_pylist() for c in columns),
        _millis(table, "order_time"),
        _millis(table, "payment_time"),
        strict=True,
    )
    answer = {}
    for order_id, customer_id, amount, payment_id, paid, partition, left, right, order_ms, payment_ms in rows:
        key = (None if left < 0 else (partition, left), None if right < 0 else (partition, right))
        fields = {"order_id": order_id, "customer_id": customer_id, "amount": amount, "payment_id": payment_id}
        _put_result(answer, key, path, {**fields, "paid": paid}, order_ms, payment_ms)
    return answer


def _put_result(answer: dict, key: PaymentsKey, where: str, r: dict, order_ms, payment_ms) -> None:
    if key in answer:
        raise AnswersDiffer(f"{where}: the result {key} emitted twice")
    at = max(t for t in (order_ms, payment_ms) if t is not None)
    answer[key] = (at, payments_digest(r, order_ms, payment_ms))


def payments_digest(r: dict, order_ms: int | None, payment_ms: int | None) -> int:
    """A payments result's row (order id, customer, amount, order time, payment id, paid, payment time) as one int."""
    amounts = tuple(None if r[f] is None else Decimal(r[f]) for f in ("amount", "paid"))
    return hash((r["order_id"], r["customer_id"], amounts[0], order_ms, r["payment_id"], amounts[1], payment_ms))


def check_enrichment_agree(answers: dict[str, dict]) -> tuple[dict[str, int], str]:
    """:func:`check_agree` for the stream-table join, the first peer's answer the reference (the platform's): a
    peer that holds orders for the grace period (Kafka Streams) on every order, plain Spark's stream-static join
    (which holds none) on the orders the reference joined. Returns peer -> orders compared and what was left out."""
    reference = next(iter(answers.values()))
    held = "orders still held by the grace period when the input ended"
    scopes = {"plain_spark": Scope(lambda key: key in reference, why=f"the reference's orders; not the {held}")}
    compared = check_agree(answers, scopes)
    extra = len(answers.get("plain_spark", {}).keys() - reference.keys())
    return compared, f"plain Spark's {extra:,} further orders left out: the others' {held}"


def check_payments_agree(answers: dict[str, dict], slack_ms: int) -> tuple[dict[str, int], str]:
    """The windowed join's answers (:func:`table_payments`) against the first peer's, result by result.

    * The matched pairs: every peer's exactly, rows included.
    * The unmatched orders and payments: no peer emits one unmatched that the peers matched; those every peer
      emitted, rows included; one that some peer did not emit must be later than ``slack_ms`` before that peer's
      latest unmatched result in the partition: each peer emits an unmatched record only once its own clock has
      closed the record's window (Kafka Streams and the platform: a scan of the waiting records when stream time
      has moved past the last scan's by window + grace, per partition; plain Spark: the query's watermark after
      a micro-batch), so at the end of the input each has a different tail of records still waiting. Those are
      left out, counted.

    Returns peer -> results compared and what was left out; raises AnswersDiffer."""
    (reference, expected), *_ = answers.items()
    pairs = {peer: {k: v for k, v in got.items() if None not in k} for peer, got in answers.items()}
    alone = {peer: {k: v for k, v in got.items() if None in k} for peer, got in answers.items()}
    for peer, got in pairs.items():
        differing = [k for k in got.keys() | pairs[reference].keys() if got.get(k) != pairs[reference].get(k)]
        if differing:
            shown = ", ".join(f"{k!r}: {k in pairs[reference]} vs {k in got}" for k in sorted(differing)[:SHOWN_KEYS])
            raise AnswersDiffer(f"{peer} and {reference} differ on {len(differing)} matched pairs (in each): {shown}")
    matched = {("order", k[0]) for k in pairs[reference]} | {("payment", k[1]) for k in pairs[reference]}

    def record(key: PaymentsKey) -> tuple[str, tuple[int, int]]:
        return ("order", key[0]) if key[0] is not None else ("payment", key[1])

    for peer, got in alone.items():
        wrong = sorted(k for k in got if record(k) in matched)
        if wrong:
            raise AnswersDiffer(f"{peer} emitted {len(wrong)} records unmatched that are matched: {wrong[:SHOWN_KEYS]}")
    everyone = set.intersection(*(set(got) for got in alone.values()))
    differing = sorted(k for k in everyone if len({got[k] for got in alone.values()}) > 1)
    if differing:
        shown = ", ".join(f"{k!r}: {[got[k] for got in alone.values()]}" for k in differing[:SHOWN_KEYS])
        raise AnswersDiffer(f"the peers' unmatched results differ on {len(differing)} of {len(everyone)}: {shown}")
    left_out: dict[str, int] = {}
    for peer, got in alone.items():
        latest: dict[int, int] = {}
        for key, (at, _) in got.items():
            partition = record(key)[1][0]
            latest[partition] = max(at, latest.get(partition, at))
        missing = {k: v for other in alone.values() for k, v in other.items() if k not in got}
        early = sorted(
            k for k, (at, _) in missing.items() if at <= latest.get(record(k)[1][0], at + slack_ms) - slack_ms
        )
        if early:
            raise AnswersDiffer(
                f"{peer} did not emit {len(early)} unmatched records others emitted, before its latest unmatched "
                f"result: {early[:SHOWN_KEYS]}"
            )
        left_out[peer] = len(got) - len(everyone)
    if not everyone or not pairs[reference]:
        raise AnswersDiffer(f"nothing to compare: {len(pairs[reference])} pairs, {len(everyone)} unmatched in common")
    compared = {peer: len(pairs[peer]) + len(everyone) for peer in answers}
    tail = ", ".join(f"{peer} {n:,}" for peer, n in left_out.items())
    return compared, f"{len(everyone):,} unmatched results in common compared; left out, emitted by some only: {tail}"
