"""Orders, customers and their credit lines for ``order_credit_enrichment`` (a stream joined with two tables,
:class:`~spark_jobs.primitives.StreamTableJoin` with ``more_tables``), and the plain-Python reference of the join.

The orders and customers are :func:`spark_jobs.reference.generators.orders.adversarial`'s; the credit lines are a
second change stream keyed by the same customer id (``c01``: co-partitioned with both), a row
``{customer_id, credit_limit, standing}`` or a tombstone, its Kafka timestamp the time the line changed: opened,
raised or lowered, put on watch, closed and reopened, some changed within seconds of an order and written after
it. The reference (:func:`expected_credit_enrichment`) is Kafka Streams' task record by record: per partition,
the three topics' records in timestamp order (each topic's in offset order; on a tie, the topic taken least
recently), each table's versions for the retention of its own time, each order joined at once (no grace) with
both rows valid at its time.

Kafka Streams breaks a tie between more than two topics by its priority queue's order, which no rule states:
:func:`untied` moves every record to a millisecond of its own input's residue (mod 3), so that an input the
Kafka Streams twin reads has no tie across topics in a partition, and the twin's answer is the reference's.
"""

from __future__ import annotations

import dataclasses
import random

from spark_jobs.reference.generators.orders import Record, Versions, adversarial, enriched, iso_time
from spark_jobs.reference.generators.producer import kafka_partition

#: an output row's fields, in order (spark_jobs/reference/jobs/order_credit_enrichment.py): the order's, the
#: customer's, then the credit line's
FIELDS = ("customer_id", "order_id", "amount", "event_time", "name", "tier", "credit_limit", "standing")
STANDINGS = ("good", "watch", "blocked")


def credit_lines(
    orders: list[Record], customers: int = 10, seed: int = 17, span_ms: int = 30 * 60_000, max_delay_ms: int = 20_000
) -> list[Record]:
    """Credit-line records (in arrival order) for customers ``c00``..``c<customers - 2>`` over the orders' span:
    each line opened, changed every few minutes (sometimes closed: a tombstone), and changed a few seconds before
    some orders, or at their time, but written after them (a late update a versioned lookup still finds)."""
    rng = random.Random(seed)
    start_ms = min(r.time_ms for r in orders)
    lines: list[Record] = []
    for n in range(customers - 1):
        customer = f"c{n:02d}"
        t = start_ms + rng.randrange(span_ms // 5)
        while t < start_ms + span_ms:
            value = None if rng.random() < 0.1 else _line(customer, rng)
            lines.append(Record(customer, value, t, t + rng.randrange(max_delay_ms)))
            t += rng.randrange(20_000, span_ms // 4)
    for order in orders:
        if order.key != f"c{customers - 1:02d}" and rng.random() < 0.12:
            # a few seconds before the order, or at its very time (a tie with the order, and with the customer's
            # change when the order has one's time), written after it
            at = order.time_ms - rng.choice((0, rng.randrange(1, 4_000)))
            lines.append(Record(order.key, _line(order.key, rng), at, order.arrival_ms + rng.randrange(1, 8_000)))
    return sorted(lines, key=lambda r: (r.arrival_ms, r.time_ms))


def _line(customer: str, rng: random.Random) -> dict:
    return {"customer_id": customer, "credit_limit": rng.randrange(0, 50) * 500, "standing": rng.choice(STANDINGS)}


def adversarial_inputs(
    orders: int = 300, customers: int = 10, seed: int = 5, ties: bool = True
) -> tuple[list[Record], ...]:
    """``(orders, customer records, credit-line records)``, each in arrival order: records of two or three topics
    at one time, or (``ties=False``) none (:func:`untied`)."""
    stream, profiles = adversarial(orders=orders, customers=customers, seed=seed)
    lines = credit_lines(stream, customers=customers, seed=seed + 1)
    if ties:
        return stream, profiles, lines
    return untied(stream, 0), untied(profiles, 1), untied(lines, 2)


def untied(records: list[Record], residue: int) -> list[Record]:
    """``records`` with each time moved to the nearest millisecond of ``residue`` (mod 3) at or below it (an
    order's ``event_time`` with it): three inputs, each of its own residue, never tie."""

    def moved(record: Record) -> Record:
        at = record.time_ms - (record.time_ms - residue) % 3
        value = record.value
        if value is not None and "event_time" in value:
            value = {**value, "event_time": iso_time(at)}
        return dataclasses.replace(record, value=value, time_ms=at)

    return [moved(r) for r in records]


def expected_credit_enrichment(
    runs: list[tuple[list[Record], ...]], partitions: int, retention_ms: int, join: str = "left"
) -> dict[tuple[int, int], tuple]:
    """(partition, offset of the order) -> the output row (:data:`FIELDS`; a Decimal amount, an ISO time) of each
    joined order (see the module docstring for the rules). ``runs``: what is written before each run of the job,
    ``(orders, customer records, credit-line records)``, every list appended in its order to a topic of
    ``partitions`` partitions; a run takes all of it (nothing is written beyond what it reads, so no input waits
    for another), one run after the other; ``[(orders, customers, lines)]`` is the input read all at once."""
    results: dict[tuple[int, int], tuple] = {}
    for p in range(partitions):
        versions = [Versions(retention_ms) for _ in runs[0][1:]]
        recency, offsets = list(range(len(runs[0]))), [0] * len(runs[0])
        for run in runs:
            mine = [[r for r in records if kafka_partition(r.key, partitions) == p] for records in run]
            heads = [0] * len(mine)
            while candidates := [i for i in recency if heads[i] < len(mine[i])]:
                # the smallest time; on a tie the input taken least recently (min keeps the first of equals)
                chosen = min(candidates, key=lambda i: mine[i][heads[i]].time_ms)
                record, offset = mine[chosen][heads[chosen]], offsets[chosen]
                heads[chosen] += 1
                offsets[chosen] += 1
                recency.remove(chosen)
                recency.append(chosen)
                if chosen > 0:
                    versions[chosen - 1].update(record)
                    continue
                rows = [table.lookup(record.key, record.time_ms) for table in versions]
                if join == "inner" and any(row is None for row in rows):
                    continue
                results[(p, offset)] = _joined(record, *rows)
    return results


def _joined(order: Record, profile: dict | None, line: dict | None) -> tuple:
    credit = (line["credit_limit"], line["standing"]) if line else (None, None)
    return (*enriched(order, profile), *credit)
