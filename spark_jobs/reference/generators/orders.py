"""Orders and a customers change stream for ``order_enrichment`` (a stream-table join,
:class:`~spark_jobs.primitives.StreamTableJoin`), and the plain-Python reference of the join.

Both topics are keyed by the customer's id as text (``c01``): an order's Kafka key is its ``customer_id``, a
customer record's key the same id (a CDC connector configured to key by the id), so a customer's orders and rows
share a partition number (co-partitioned, as a join needs). An order's time is its ``event_time``; a customer
record's time is its Kafka timestamp (the database's commit time), set explicitly here.

Every record has an **arrival** time: its own time plus a delay up to ``max_delay_ms`` (or, for a few late
orders, far more); each topic is written in arrival order, so both arrive out of order. The reference
(:func:`expected_enrichment`) is Kafka Streams' task, record by record: per partition, both topics' records in
timestamp order (each topic's in offset order; on a tie the topic not taken last, the orders' when none was
taken yet); the versioned table's versions;
each order held until stream time passes its time + grace, then joined with the row valid at its time; an order
already later than that joined at once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
from collections.abc import Iterator
from decimal import Decimal

from confluent_kafka import Producer

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.reference.generators.producer import kafka_partition

#: an output row's fields, in order (spark_jobs/reference/jobs/order_enrichment.py): the order's, then the customer's
FIELDS = ("customer_id", "order_id", "amount", "event_time", "name", "tier")
TIERS = ("bronze", "silver", "gold")


@dataclasses.dataclass(frozen=True)
class Record:
    """A record of either topic: its key, JSON value (None: a tombstone), time (ms) and arrival (ms)."""

    key: str
    value: dict | None
    time_ms: int
    arrival_ms: int


def iso_time(ms: int) -> str:
    """Epoch milliseconds as the events write a time: ISO-8601 UTC with milliseconds."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def adversarial(
    orders: int = 300,
    customers: int = 10,
    seed: int = 11,
    start_ms: int | None = None,
    span_ms: int = 30 * 60_000,
    max_delay_ms: int = 20_000,
    late_orders: int = 6,
) -> tuple[list[Record], list[Record]]:
    """``(orders, customer records)`` over ``span_ms`` from ``start_ms`` (default: two hours ago), each list in
    arrival order: customers created, updated (some several times within seconds of an order), deleted and
    brought back, a few customers that never order and orders of a customer that never exists, duplicated
    orders (a producer's retry), orders at the same time as their customer's update, changes seconds before an
    order written after it, and ``late_orders`` orders arriving minutes after their time."""
    rng = random.Random(seed)
    start_ms = start_ms if start_ms is not None else (int(dt.datetime.now(dt.UTC).timestamp()) - 2 * 3600) * 1000
    ids = [f"c{n:02d}" for n in range(customers)]
    table: list[Record] = []
    for customer in ids[:-1]:  # the last id never exists as a customer
        t = start_ms + rng.randrange(span_ms // 4)
        while t < start_ms + span_ms:
            if rng.random() < 0.12:
                value = None
            else:
                value = {
                    "customer_id": customer,
                    "name": f"{customer}-{rng.randrange(1000)}",
                    "tier": rng.choice(TIERS),
                }
            table.append(Record(customer, value, t, t + rng.randrange(max_delay_ms)))
            t += rng.randrange(30_000, span_ms // 3)
    stream: list[Record] = []
    buyers = ids[2:]  # the first two customers never order
    for n in range(orders):
        customer = rng.choice(buyers)
        t = start_ms + rng.randrange(span_ms)
        if rng.random() < 0.08:  # at the time of one of the customer's updates exactly
            times = [r.time_ms for r in table if r.key == customer]
            t = rng.choice(times) if times else t
        amount = Decimal(rng.randint(100, 500_000)) / 100
        value = {"order_id": f"o{n:04d}", "customer_id": customer, "amount": float(amount), "event_time": iso_time(t)}
        delay = rng.randrange(max_delay_ms)
        stream.append(Record(customer, value, t, t + delay))
        if customer != ids[-1] and rng.random() < 0.1:
            # a change of the customer just before the order, written after the order (within the grace)
            changed = {"customer_id": customer, "name": f"{customer}-{rng.randrange(1000)}", "tier": rng.choice(TIERS)}
            table.append(Record(customer, changed, t - rng.randrange(1, 5_000), t + delay + rng.randrange(1, 10_000)))
        if rng.random() < 0.04:  # a retry: the same order again, a little later
            stream.append(Record(customer, value, t, t + delay + rng.randrange(1, 2_000)))
    for n in range(late_orders):
        customer = rng.choice(buyers)
        t = start_ms + rng.randrange(span_ms // 2)
        value = {"order_id": f"late{n}", "customer_id": customer, "amount": 1.0, "event_time": iso_time(t)}
        stream.append(Record(customer, value, t, t + span_ms // 2 + rng.randrange(60_000)))
    by_arrival = lambda r: (r.arrival_ms, r.time_ms)  # noqa: E731
    return sorted(stream, key=by_arrival), sorted(table, key=by_arrival)


def tie_then_late(after_ms: int, partitions: int) -> tuple[list[Record], list[Record]]:
    """``(orders, customer records)`` to write after everything else (times from ``after_ms`` on, in one partition
    of ``partitions``), where the order in which a task breaks a tie between the topics decides a result: the
    table's record before the tie was taken last, so Kafka Streams takes the order of the tie first, then a late
    order of customer K (joined at once: two minutes behind stream time, past the minute of grace), and only then
    the tie's customer change and K's next version, valid from before the late order's time. So the late order
    joins K's **first** version; a task that took the table first on the tie would have read K's next version
    before it (``"late-k"`` in :func:`expected_enrichment` tells which)."""
    ids = iter(f"t{n:03d}" for n in range(1000))
    k, a, b, c = (next(i for i in ids if kafka_partition(i, partitions) == 0) for _ in range(4))
    t = after_ms + 600_000

    def customer(key: str, version: str, at: int) -> Record:
        return Record(key, {"customer_id": key, "name": f"{key}-{version}", "tier": "gold"}, at, t + 10_000)

    def order(key: str, order_id: str, at: int) -> Record:
        value = {"order_id": order_id, "customer_id": key, "amount": 5.0, "event_time": iso_time(at)}
        return Record(key, value, at, t + 10_000)

    table = [
        customer(k, "first", t - 200_000),
        customer(c, "v", t - 1),
        customer(b, "v", t),
        customer(k, "next", t - 130_000),
    ]
    stream = [order(a, "before-tie", t - 2), order(a, "at-tie", t), order(k, "late-k", t - 120_000)]
    return stream, table


def arrival_chunks(*topics: list[Record], chunks: int) -> list[tuple[int, ...]]:
    """Topics' records (each list in arrival order) as they arrive in ``chunks`` chunks of about the same number
    of records: ``(bound, each topic's)``, each chunk the records that arrived before ``bound`` and after the
    previous one, each list's order kept."""
    arrivals = sorted(r.arrival_ms for records in topics for r in records)
    bounds = [arrivals[n * len(arrivals) // chunks] for n in range(1, chunks)] + [arrivals[-1] + 1]
    cut, lower = [], None
    for bound in bounds:
        in_chunk = [
            [r for r in records if r.arrival_ms < bound and (lower is None or r.arrival_ms >= lower)]
            for records in topics
        ]
        cut.append((bound, *in_chunk))
        lower = bound
    return cut


def produce(kafka: KafkaTarget, topic: str, records: list[Record], partitions: int) -> None:
    """Write ``records`` to ``topic`` in list order, each to its key's partition (murmur2, as the Java client's
    default partitioner puts it), with its time as the Kafka timestamp."""
    producer = Producer(client_config(kafka, {"linger.ms": 20, "enable.idempotence": True, "log_level": 3}))
    for r in records:
        value = None if r.value is None else json.dumps(r.value).encode()
        partition = kafka_partition(r.key, partitions)
        producer.produce(topic, key=r.key.encode(), value=value, partition=partition, timestamp=r.time_ms)
    if producer.flush(30):
        raise RuntimeError(f"records to {topic} were not acknowledged")


class Versions:
    """One versioned table of a task (Kafka Streams' versioned store): each key's versions, kept for
    ``retention_ms`` of the table's time (the largest record time it took)."""

    def __init__(self, retention_ms: int) -> None:
        self.retention_ms = retention_ms
        self.versions: dict[str, list[tuple[int, dict | None]]] = {}
        self.table_time: int | None = None

    def update(self, record: Record) -> None:
        if self.table_time is not None and record.time_ms < self.table_time - self.retention_ms:
            return  # older than the history kept
        self.table_time = record.time_ms if self.table_time is None else max(self.table_time, record.time_ms)
        history = [v for v in self.versions.get(record.key, []) if v[0] != record.time_ms]
        self.versions[record.key] = sorted([*history, (record.time_ms, record.value)], key=lambda v: v[0])

    def lookup(self, key: str, at: int) -> dict | None:
        """The row valid at ``at`` (None: none, or older than the history kept)."""
        if self.table_time is not None and at < self.table_time - self.retention_ms:
            return None
        found = None
        for valid_from, row in self.versions.get(key, []):
            if valid_from > at:
                break
            found = row
        return found


class _Task:
    """One partition of the join, as Kafka Streams' task runs it (see the module docstring)."""

    def __init__(self, grace_ms: int, retention_ms: int, join: str) -> None:
        self.grace_ms, self.join = grace_ms, join
        self.table = Versions(retention_ms)
        self.stream_time: int | None = None
        self.held: list[tuple[int, str, int, tuple[int, int], Record]] = []
        self.results: dict[tuple[int, int], tuple] = {}

    def update(self, record: Record) -> None:
        self.table.update(record)

    def arrive(self, offset: int, place: tuple[int, int], record: Record) -> None:
        """An order at ``offset`` of the task's input, ``place`` its place in the source (the result's key)."""
        late = self.stream_time is not None and record.time_ms < self.stream_time - self.grace_ms
        if self.grace_ms == 0 or late:
            self.emit(place, record)
            return
        self.held.append((record.time_ms, record.key, offset, place, record))
        self.stream_time = record.time_ms if self.stream_time is None else max(self.stream_time, record.time_ms)
        self.held.sort(key=lambda h: h[:3])
        while self.held and self.held[0][0] <= self.stream_time - self.grace_ms:
            *_, due_place, due = self.held.pop(0)
            self.emit(due_place, due)

    def emit(self, place: tuple[int, int], record: Record) -> None:
        row = self.table.lookup(record.key, record.time_ms)
        if row is None and self.join == "inner":
            return
        self.results[place] = enriched(record, row)


def enriched(order: Record, customer: dict | None) -> tuple:
    """An order joined with its customer's row (None: none) as an output row (:data:`FIELDS`)."""
    value = order.value
    return (
        order.key,
        value["order_id"],
        Decimal(str(value["amount"])),
        value["event_time"],
        customer["name"] if customer else None,
        customer["tier"] if customer else None,
    )


def expected_enrichment(
    orders: list[Record],
    customers: list[Record],
    partitions: int,
    grace_ms: int,
    retention_ms: int,
    join: str = "left",
) -> dict[tuple[int, int], tuple]:
    """(partition, offset of the order) -> the output row (:data:`FIELDS`; a Decimal amount, an ISO time) of
    each joined order, both lists written in their order to fresh topics of ``partitions`` partitions (see the
    module docstring for the rules)."""
    per_partition = [[r for r in orders if kafka_partition(r.key, partitions) == p] for p in range(partitions)]
    placed = [[((p, offset), r) for offset, r in enumerate(stream)] for p, stream in enumerate(per_partition)]
    return expected_rekeyed_enrichment(placed, customers, grace_ms, retention_ms, join)


def expected_rekeyed_enrichment(
    repartitioned: list[list[tuple[tuple[int, int], Record]]],
    customers: list[Record],
    grace_ms: int,
    retention_ms: int,
    join: str = "left",
) -> dict[tuple[int, int], tuple]:
    """As :func:`expected_enrichment`, for orders re-keyed by customer before the join (``repartition=True``, Kafka
    Streams' ``selectKey``): ``repartitioned[p]`` is partition ``p`` of the repartition topic, its orders in offset
    order, each with its place in the source (``(partition, offset)``, the result's key); ``customers`` written in
    their order to a topic of as many partitions."""
    results: dict[tuple[int, int], tuple] = {}
    for p, stream in enumerate(repartitioned):
        table = [r for r in customers if kafka_partition(r.key, len(repartitioned)) == p]
        task = _Task(grace_ms, retention_ms, join)
        s = u = 0
        table_last = None  # the topic taken last: on a tie the task takes the other
        while s < len(stream) or u < len(table):
            if (
                s == len(stream)
                or u < len(table)
                and (
                    table[u].time_ms < stream[s][1].time_ms
                    or (table[u].time_ms == stream[s][1].time_ms and table_last is False)
                )
            ):
                task.update(table[u])
                u += 1
                table_last = True
            else:
                task.arrive(s, *stream[s])
                s += 1
                table_last = False
        results.update(task.results)
    return results


#: an encoded record, as :func:`spark_jobs.reference.generators.producer.produce_encoded` writes it: key, JSON value, time
Encoded = tuple[str, bytes, int]
#: the scaled generators' rate: one order every 8 ms, at least two hours of orders (so that the minute the
#: grace period holds back at the end is a small part of the input at every size); 1e7 orders span 22 h, within
#: the day Kafka Streams keeps a window store's changelog records past the window (their time is event time)
SCALED_STEP_MS, SCALED_MIN_SPAN_MS = 8, 2 * 3600 * 1000
#: records formatted at a time (numpy arrays of this many times and draws)
CHUNK = 100_000


def iso_times(ms) -> list[str]:
    """Epoch milliseconds (a numpy array) as :func:`iso_time` writes them, vectorized."""
    import numpy as np

    return [f"{s}Z" for s in np.datetime_as_string(np.asarray(ms, dtype="datetime64[ms]"), unit="ms")]


def scaled_span_ms(orders: int) -> int:
    return max(SCALED_MIN_SPAN_MS, orders * SCALED_STEP_MS)


def growing_customers(
    orders: int, customers: int, end_ms: int, seed: int = 3, unknown_rate: float = 0.01, margin: float = 0.1
) -> tuple[Iterator[Encoded], Iterator[Encoded]]:
    """``(orders, customer records)`` for a benchmark of the stream-table join at any size (1e7 orders in about a
    minute), both in time order, ending at ``end_ms``: every customer's profile written once, the orders of a
    growing customer base.

    Customer ``c`` (``c0000042``) signs up at ``start + (c - first) * span * (1 - margin) / customers`` (the first
    ``first`` = 1% before the first order), its profile's Kafka timestamp; order ``i`` (one every
    :data:`SCALED_STEP_MS`) is of a customer drawn uniformly from those signed up by the fraction ``(i / orders) *
    (1 - margin)`` of the customers, or (``unknown_rate``) of one of 1,000 ids with no profile (``x0042``); the
    last ``margin`` of the customers never order. So every customer's only row is valid from before each of its
    orders: the row valid at an order's time (a versioned table), the latest row (a table read once) and the
    row current when a time-ordered task reaches the order are the same one, and a left join gives the same
    answer in each. And an order's customer is always at most the fraction ``(1 - margin)`` of the way through the
    customer topic that the order is through the orders topic: a micro-batch that cuts both topics at the same
    fraction of their offsets (Spark's ``maxOffsetsPerTrigger``) holds the profile no later than the order, so
    few orders wait for the profiles' topic (docs/writing-jobs/stream-table-join.md, "The task model")."""
    import numpy as np

    span = scaled_span_ms(orders)
    start = end_ms - span
    first = max(1, customers // 100)

    def table() -> Iterator[Encoded]:
        for low in range(0, customers, CHUNK):
            ids = np.arange(low, min(customers, low + CHUNK))
            times = start + (ids - first) * int(span * (1 - margin)) // customers
            for c, t in zip(ids.tolist(), times.tolist(), strict=True):
                key = f"c{c:07d}"
                value = f'{{"customer_id": "{key}", "name": "name-{c}", "tier": "{TIERS[c % 3]}"}}'
                yield key, value.encode(), t

    def stream() -> Iterator[Encoded]:
        rng = np.random.default_rng(seed)
        for low in range(0, orders, CHUNK):
            index = np.arange(low, min(orders, low + CHUNK))
            times = start + index * span // orders
            signed_up = np.maximum(first, (customers * (index / orders) * (1 - margin)).astype(np.int64))
            drawn = (rng.random(len(index)) * signed_up).astype(np.int64)
            unknown = rng.random(len(index)) < unknown_rate
            strangers = rng.integers(0, 1000, len(index))
            cents = rng.integers(100, 500_000, len(index))
            rows = zip(
                index.tolist(),
                drawn.tolist(),
                unknown.tolist(),
                strangers.tolist(),
                cents.tolist(),
                iso_times(times),
                times.tolist(),
                strict=True,
            )
            for i, c, stranger, x, amount, iso, t in rows:
                key = f"x{x:04d}" if stranger else f"c{c:07d}"
                value = (
                    f'{{"order_id": "o{i:08d}", "customer_id": "{key}", "amount": {amount // 100}.{amount % 100:02d}, '
                    f'"event_time": "{iso}"}}'
                )
                yield key, value.encode(), t

    return stream(), table()
