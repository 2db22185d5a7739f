"""Orders and their payments for ``order_payments`` (a windowed stream-stream join), and the plain-Python reference
of the join: what Kafka Streams 4.3.1 emits for ``orders.join/leftJoin/outerJoin(payments, joiner,
JoinWindows.ofTimeDifferenceAndGrace(window, grace))`` on a pre-produced input, record by record.

Both topics are keyed by the order id's text (``o0007``; a payment's key is the order it pays), co-partitioned
(same partition count, murmur2 of the same key bytes), so a task joins partition p of orders with partition p of
payments. A record's time is its ``event_time`` (BenchApp's ``EventTime`` extractor), also its Kafka timestamp.
Every record has an **arrival** time: its own time plus a delay within the grace, or for a few late records far
more; each topic is written in arrival order, so offsets are out of time order.

The rules (``KSJ``: ``kstream.internals.KStreamKStreamJoin.KStreamKStreamJoinProcessor``, decompiled from the
kafka-streams-4.3.1 jar; ``W`` the time difference, the same before and after as ``ofTimeDifferenceAndGrace``
makes it, ``G`` the grace, retention ``R = 2W + G``, the join windows' size plus grace,
``StreamJoinedStoreFactory.retentionPeriod``). Records with a null key or value are skipped
(``StreamStreamJoinUtil.skipRecord``; BenchApp also drops a value that is not a JSON object): the input has none.

1. **Which record next** (``processor.internals.PartitionGroup.nextRecord``): a task takes records from its two
   partitions in offset order each, the one whose head has the smaller timestamp first (a priority queue of the
   non-empty partitions by head timestamp). On a tie it takes the partition it did **not** take last: the
   partition just polled is offered back to the ``java.util.PriorityQueue`` behind the other (its sift-up moves it
   only past a strictly larger head), and so is a drained partition when it is refilled. On a tie at the very
   first record (nothing taken yet) the order is the order in which the two partitions' first fetches were
   buffered: not fixed by the input (three runs of one input took the payment first twice, the order once); this
   reference takes the order, and :func:`adversarial`'s input has no such tie. The task waits until both
   partitions have buffered records (``PartitionGroup.readyToProcess``: an empty partition with unknown or
   positive lag is waited for; ``max.task.idle.ms`` 0 only lets an empty partition with lag 0, i.e. at its end,
   go), so on a pre-produced input the order depends on the input alone. The order of two records of the same
   time does not change this join's output: both set the same stream time and see the same closed entries, and
   the first raises its store's observed time (rule 3) to at most ``t``, which moves no cut-off past ``t - W``.
2. **Stream time** (``KStreamImplJoin.TimeTracker``, one per task, shared by both sides' join processors):
   ``streamTime = max(streamTime, record time)`` first thing in ``KSJ.process`` for every record of either side,
   starting at -1.
3. **The window stores and lateness** (``KStreamJoinWindow``, ``AbstractRocksDBSegmentedBytesStore``): each side's
   records go to that side's window store (retention ``R``, retaining duplicates) *after* the join processor has
   handled them (``KStreamJoinWindowProcessor.process`` forwards, then puts). Each store has its own
   ``observedStreamTime``: the largest time of that side's records put so far (not the shared stream time). A
   fetch returns only records at ``time >= observedStreamTime - R + 1`` (``getActualFrom``); a put into a
   segment (``max(R / 2, 60 s)`` long) older than that is dropped (``getOrCreateSegmentIfLive``), and so are
   expired segments, which the fetch rule already implies. No
   record is dropped as late by the join itself: a record older than anything still fetchable is still joined
   with the other side's fetchable records in its window (inner results), and, unmatched in a left/outer join,
   emitted at once (rule 5). It only cannot be joined by later records of the other side.
4. **Inner results** (``KSJ.process``, ``emitInnerJoin``): a record at time ``t`` fetches the other side's records
   with its key and a time in ``[max(0, t - W, observedStreamTime(other) - R + 1), t + W]``, bounds included, and
   emits one result per record found (timestamp ``max`` of the two): a pair is joined once, by the later of its
   two records to be taken, whichever side that is. Each found record's key and time is deleted
   from the outer store (all of the other side's records pending there with that key and that exact time,
   ``ListValueStore.putIfAbsent(key, null)``): they are matched and never emitted unmatched.
5. **An unmatched record** (left: orders only; outer: both sides; inner: none): one whose fetch found nothing.
   If ``t + W >= streamTime`` it is put into the outer store (a RocksDB key-value store of lists keyed by (time,
   side, key)) and ``minTime = min(minTime, t)``; otherwise (already more than ``W`` behind the stream time: the
   grace is not considered here) it is emitted at once, unmatched.
6. **Emitting the closed ones** (``KSJ.emitNonJoinedOuterRecords``, left and outer joins, called by either side's
   processor): only for a record that does not lag (``t == streamTime`` after rule 2), *before* its own fetch,
   and only when ``minTime + W + G < streamTime`` evaluated in Java ``long`` arithmetic (``minTime`` starts at
   ``Long.MAX_VALUE``, where the sum overflows to a negative number: then the scan runs) and the wall-clock throttle
   allows it (``__emit.interval.ms.kstreams.outer.join.spurious.results.fix__``, default 1000 ms: the scan runs at
   most once per interval of wall-clock time; the twin runs with 0, and then every such record scans). A scan sets
   ``minTime = Long.MAX_VALUE`` and walks the outer store in key order: time ascending, then payments before
   orders (the side byte, 0 right, 1 left), then key bytes, each key's records in the order they were put. For
   each entry it first sets ``minTime`` to the entry's time; it stops there once both sides have met an entry
   whose window is still open; an entry is open while ``time + W + G >= streamTime`` and is then skipped; a
   closed one is emitted unmatched (with its own time) and deleted. With ``W`` the same on both sides every entry
   after the first open one is open too, so a scan emits every closed entry; but it leaves ``minTime`` at the time
   of the entry it stopped at (the first entry after both sides were seen open), or at the last entry's time
   when it walked the whole store (e.g. a left join, whose store has orders only): later than the oldest entry
   still pending. Until ``streamTime`` passes that ``minTime + W + G``, or an unmatched record older than it is
   put (rule 5), no scan runs, so older entries whose window has closed wait: a matching record of the other
   side processed meanwhile still deletes them (rule 4), and they may still be pending at the end.
7. **At the end**: records still in the outer store are not emitted (nothing but a processed record triggers a
   scan; there is no wall-clock punctuation).

Checked on Kafka Streams 4.3.1 (BenchApp's ``order_payments_*`` with the emit interval 0): every case of
tests/spark_jobs/reference/generators/test_payments.py run through the twin gave this reference's output exactly, rule 1's
tie case also traced in the ``PartitionGroup`` log; tests/bench/test_kafka_streams_peer.py holds the three joins to
it on :func:`adversarial`'s input. With the default emit interval the same input lost 37 (left) and 56 (outer) of
the unmatched results: the throttle's outcome depends on wall-clock time.

Output: one row per result, keyed here by its sides' source coordinates ``(order_partition, order_offset,
payment_partition, payment_offset)``, ``None`` for an absent side's two.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Iterator
from decimal import Decimal

from spark_jobs.reference.generators.orders import (
    CHUNK,
    SCALED_MIN_SPAN_MS,
    SCALED_STEP_MS,
    Encoded,
    Record,
    arrival_chunks,
    iso_times,
    produce,
)
from spark_jobs.reference.generators.producer import kafka_partition

__all__ = [
    "FIELDS",
    "ORDER",
    "PAYMENT",
    "SOURCE",
    "Record",
    "adversarial",
    "arrival_chunks",
    "expected_join",
    "expected_join_in_batches",
    "expected_join_in_cuts",
    "expected_rekeyed_join_in_cuts",
    "produce",
    "scaled",
    "task_order",
]

#: an output row's fields, in order (BenchApp.orderPayment): the order's, then the payment's
FIELDS = ("order_id", "customer_id", "amount", "order_time", "payment_id", "paid", "payment_time")
#: the source coordinates the twin adds to each row, the key of :func:`expected_join`'s answer
SOURCE = ("order_partition", "order_offset", "payment_partition", "payment_offset")

MINUTE = 60_000
ORDER, PAYMENT = "order", "payment"
#: TimestampedKeyAndJoinSideSerializer: the side byte after the time, 1 for the left (orders), 0 for the right
_SIDE_BYTE = {ORDER: 1, PAYMENT: 0}
_LONG_MAX = 2**63 - 1


def _long(value: int) -> int:
    """``value`` as a Java ``long`` (two's complement, 64 bits): what ``minTime + W + G`` is in KSJ."""
    return (value + 2**63) % 2**64 - 2**63


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def adversarial(
    orders: int = 240,
    customers: int = 10,
    seed: int = 7,
    start_ms: int | None = None,
    span_ms: int = 60 * MINUTE,
    window_ms: int = 10 * MINUTE,
    grace_ms: int = MINUTE,
    max_delay_ms: int = 40_000,
    late: int = 8,
    strays: int = 12,
    partitions: int = 2,
) -> tuple[list[Record], list[Record]]:
    """``(orders, payments)`` from ``start_ms`` (default: two hours ago), each list in arrival order.

    Over ``span_ms``: ``orders`` orders arriving out of time order by up to ``max_delay_ms`` (within the grace),
    payments before and after their order at the window's bounds (``window_ms`` inside by 1 ms, at it, outside
    by 1 ms) and anywhere inside it, orders without a payment, ``strays`` payments of orders that never exist,
    orders paid twice, retried (duplicated) orders and payments, ``late`` payments of orders placed in the span's
    first half arriving after their window closed (half of them of unpaid orders; half within minutes, the order
    still in the retention of the orders' window store, half past it), and ``late`` late orders, every other one
    with a payment on time.

    Then, 25 minutes after the span, in each of ``partitions`` partitions (keys chosen by partition), a scene for
    rules 6 and 7 of the module docstring: unpaid orders X (t0), A (t0 + 2 min), B (+3 min), C (+4 min); a payment
    of no order at t0 + W + G + 1 ms (X's window has closed: a scan emits X unmatched, passes A, B, C, whose
    windows are open, and leaves ``minTime`` at C); a late payment of X (t0 + 1 min) right after it, joined with X
    (still in the orders' window store); another payment of no order at t0 + W + G + 3.5 min (A's and B's windows
    have closed, but ``minTime`` + W + G keeps the scan off); a late payment of A (t0 + 6 min) right after it:
    joined with A, which is then never emitted unmatched; a payment of no order at t0 + 30 min (B, C and, in the
    outer join, the payments of no order emitted unmatched); an unpaid order D at t0 + 30 min + 1 s, still pending
    at the end."""
    rng = random.Random(seed)
    start_ms = start_ms if start_ms is not None else (int(dt.datetime.now(dt.UTC).timestamp()) - 2 * 3600) * 1000
    draws = _AdversarialDraws(rng, [f"c{n:02d}" for n in range(customers)], max_delay_ms, window_ms, grace_ms)
    unpaid = draws.orders_and_payments(orders, start_ms, span_ms)
    for n in range(strays):  # payments of orders that never exist
        draws.pay(f"o9{n:03d}", start_ms + rng.randrange(span_ms))
    draws.late_records(late, start_ms, span_ms, unpaid)
    t0 = start_ms + span_ms + 25 * MINUTE
    for p in range(partitions):
        draws.closing_scene(t0, p, partitions)
    by_arrival = lambda r: (r.arrival_ms, r.time_ms)  # noqa: E731
    return sorted(draws.order_list, key=by_arrival), sorted(draws.payment_list, key=by_arrival)


class _AdversarialDraws:
    """:func:`adversarial`'s records as it draws them: its steps, each drawing from the one ``rng`` in turn (so
    the order of the steps and of their draws is what fixes the input of a seed)."""

    def __init__(self, rng: random.Random, ids: list[str], max_delay_ms: int, window_ms: int, grace_ms: int) -> None:
        self.rng, self.ids, self.max_delay_ms = rng, ids, max_delay_ms
        self.window_ms = window_ms
        self.closed = window_ms + grace_ms  # after this long past a record's time its window has closed
        self.retention = 2 * window_ms + grace_ms
        self.order_list: list[Record] = []
        self.payment_list: list[Record] = []
        self.paid = 0

    def _arrival(self, t: int, arrival: int | None) -> int:
        return t + self.rng.randrange(self.max_delay_ms) if arrival is None else arrival

    def order(self, order_id: str, t: int, arrival: int | None = None, amount: float = 1.0) -> Record:
        value = {
            "order_id": order_id,
            "customer_id": self.rng.choice(self.ids),
            "amount": amount,
            "event_time": _iso(t),
        }
        record = Record(order_id, value, t, self._arrival(t, arrival))
        self.order_list.append(record)
        return record

    def pay(self, order_id: str, t: int, amount: float = 9.99, arrival: int | None = None) -> Record:
        value = {"payment_id": f"p{self.paid:04d}", "order_id": order_id, "paid": amount, "event_time": _iso(t)}
        self.paid += 1
        record = Record(order_id, value, t, self._arrival(t, arrival))
        self.payment_list.append(record)
        return record

    def retry(self, records: list[Record]) -> None:
        """The same record again, a little later (a producer's retry)."""
        last = records[-1]
        records.append(dataclasses.replace(last, arrival_ms=last.arrival_ms + self.rng.randrange(1, 3_000)))

    def orders_and_payments(self, orders: int, start_ms: int, span_ms: int) -> list[Record]:
        """The span's orders and their payments (none, once near or at a window bound, or twice), some retried;
        returns the unpaid orders."""
        window_ms, rng = self.window_ms, self.rng
        bounds = [-window_ms - 1, -window_ms, -window_ms + 1, window_ms - 1, window_ms, window_ms + 1]
        unpaid: list[Record] = []
        for n in range(orders):
            amount = float(Decimal(rng.randint(100, 500_000)) / 100)
            o = self.order(f"o{n:04d}", start_ms + rng.randrange(span_ms), amount=amount)
            if rng.random() < 0.04:
                self.retry(self.order_list)
            draw = rng.random()
            if draw < 0.15:
                unpaid.append(o)
                continue
            offsets = [rng.choice(bounds) if draw < 0.45 else rng.randrange(-window_ms // 4, window_ms)]
            if rng.random() < 0.08:  # paid twice (in two parts)
                offsets.append(rng.randrange(-window_ms + 1, window_ms))
            for offset in offsets:
                self.pay(o.key, o.time_ms + offset, amount if len(offsets) == 1 else round(amount / 2, 2))
                if rng.random() < 0.04:
                    self.retry(self.payment_list)
        return unpaid

    def late_records(self, late: int, start_ms: int, span_ms: int, unpaid: list[Record]) -> None:
        """``late`` late payments of orders of the span's first half and ``late`` late orders."""
        window_ms, closed, rng = self.window_ms, self.closed, self.rng
        early = [o for o in self.order_list if o.time_ms < start_ms + span_ms // 2]
        early_unpaid = [o for o in unpaid if o.time_ms < start_ms + span_ms // 2]
        for n in range(late):
            # a late payment of an order (every other one unpaid until then): minutes after its window closed, the
            # order still in the retention of the orders' window store, or after that
            o = rng.choice(early_unpaid if n % 2 == 0 and early_unpaid else early)
            t = o.time_ms + rng.randrange(window_ms // 4)
            if n % 4 < 2:
                delay = closed + 1 + rng.randrange(4 * MINUTE)
            else:
                delay = self.retention + MINUTE + rng.randrange(window_ms)
            self.pay(o.key, t, 1.0, t + delay)
            # a late order with a payment on time, and every other one without
            t = start_ms + rng.randrange(span_ms // 2)
            late_order = self.order(f"o8{n:03d}", t, t + closed + 1 + rng.randrange(3 * window_ms))
            if n % 2 == 0:
                self.pay(late_order.key, t + rng.randrange(-window_ms // 2, window_ms // 2), 1.0)

    def closing_scene(self, t0: int, partition: int, partitions: int) -> None:
        """The scene for rules 6 and 7 (see :func:`adversarial`) from ``t0``, its keys all in ``partition``."""
        closed = self.closed
        keys = (f"o7{n:03d}" for n in range(1000))
        mine = [k for k in keys if kafka_partition(k, partitions) == partition]
        x, a, b, c, d, s1, s2, s3 = mine[:8]
        for key, t in ((x, t0), (a, t0 + 2 * MINUTE), (b, t0 + 3 * MINUTE), (c, t0 + 4 * MINUTE)):
            self.order(key, t, t)
        self.pay(s1, t0 + closed + 1, arrival=t0 + closed + 1)
        self.pay(x, t0 + MINUTE, arrival=t0 + closed + 2)
        self.pay(s2, t0 + closed + 210_000, arrival=t0 + closed + 210_000)
        self.pay(a, t0 + 6 * MINUTE, arrival=t0 + closed + 211_000)
        self.pay(s3, t0 + 30 * MINUTE, arrival=t0 + 30 * MINUTE)
        self.order(d, t0 + 30 * MINUTE + 1_000, t0 + 30 * MINUTE + 1_000)


@dataclasses.dataclass(frozen=True)
class _Stored:
    """A record in a task's stores: its side, source partition and offset, and the record."""

    side: str
    partition: int
    offset: int
    record: Record


class _Task:
    """One partition of each topic joined, as Kafka Streams' task runs it (rules 2 to 7 of the module
    docstring)."""

    def __init__(self, window_ms: int, grace_ms: int, join: str) -> None:
        if join not in ("inner", "left", "outer"):
            raise ValueError(f"unknown join {join}")
        self.window_ms, self.grace_ms = window_ms, grace_ms
        self.retention_ms = 2 * window_ms + grace_ms
        self.outer_sides = {"inner": (), "left": (ORDER,), "outer": (ORDER, PAYMENT)}[join]
        self.stream_time = -1
        self.min_time = _LONG_MAX
        #: each side's window store: key -> records in put order, and its observedStreamTime
        self.windows: dict[str, dict[str, list[_Stored]]] = {ORDER: {}, PAYMENT: {}}
        self.observed = {ORDER: -1, PAYMENT: -1}
        #: the outer store: (time, side byte, key bytes) -> records pending in put order
        self.pending: dict[tuple[int, int, bytes], list[_Stored]] = {}
        self.results: dict[tuple, tuple] = {}

    def process(self, stored: _Stored) -> None:
        side, t, key = stored.side, stored.record.time_ms, stored.record.key
        other = PAYMENT if side == ORDER else ORDER
        self.stream_time = max(self.stream_time, t)
        if self.outer_sides and t == self.stream_time:
            self.emit_closed()
        time_from = max(0, t - self.window_ms, self.observed[other] - self.retention_ms + 1)
        time_to = max(0, t + self.window_ms)
        found = sorted(
            (s for s in self.windows[other].get(key, []) if time_from <= s.record.time_ms <= time_to),
            key=lambda s: s.record.time_ms,
        )
        for match in found:
            self.pending.pop((match.record.time_ms, _SIDE_BYTE[other], key.encode()), None)
            self.emit(stored, match)
        if side in self.outer_sides and not found:
            if t + self.window_ms >= self.stream_time:
                self.min_time = min(self.min_time, t)
                self.pending.setdefault((t, _SIDE_BYTE[side], key.encode()), []).append(stored)
            else:
                self.emit(stored, None)
        self.windows[side].setdefault(key, []).append(stored)
        self.observed[side] = max(self.observed[side], t)

    def emit_closed(self) -> None:
        if not _long(self.min_time + self.window_ms + self.grace_ms) < self.stream_time:
            return
        self.min_time = _LONG_MAX
        open_sides: set[int] = set()
        emitted = []
        for entry in sorted(self.pending):
            for stored in self.pending[entry]:
                self.min_time = entry[0]
                if len(open_sides) == 2:
                    break
                if entry[0] + self.window_ms + self.grace_ms >= self.stream_time:
                    open_sides.add(entry[1])
                    continue
                self.emit(stored, None)
                emitted.append(entry)
            else:
                continue
            break
        for entry in emitted:
            self.pending.pop(entry, None)

    def emit(self, this: _Stored, other: _Stored | None) -> None:
        order, payment = (this, other) if this.side == ORDER else (other, this)
        o = order.record.value if order else None
        p = payment.record.value if payment else None
        coordinates = (
            order.partition if order else None,
            order.offset if order else None,
            payment.partition if payment else None,
            payment.offset if payment else None,
        )
        self.results[coordinates] = (
            (o or p)["order_id"],
            o and o["customer_id"],
            o and Decimal(str(o["amount"])),
            o and o["event_time"],
            p and p["payment_id"],
            p and Decimal(str(p["paid"])),
            p and p["event_time"],
        )


def task_order(orders: list[Record], payments: list[Record], last: str | None = None) -> list[tuple[str, int]]:
    """The order in which a task takes the records of one orders and one payments partition (each list in
    offset order): ``(side, offset)`` pairs, ``side`` :data:`ORDER` or :data:`PAYMENT` (rule 1 of the module
    docstring: the smaller head time first, on a tie the side not taken last (``last``), orders on a tie at the
    start)."""
    taken: list[tuple[str, int]] = []
    heads = {ORDER: 0, PAYMENT: 0}
    while heads[ORDER] < len(orders) or heads[PAYMENT] < len(payments):
        o = orders[heads[ORDER]].time_ms if heads[ORDER] < len(orders) else None
        y = payments[heads[PAYMENT]].time_ms if heads[PAYMENT] < len(payments) else None
        side = ORDER if y is None or (o is not None and (o < y or (o == y and last != ORDER))) else PAYMENT
        taken.append((side, heads[side]))
        heads[side] += 1
        last = side
    return taken


def expected_join(
    orders: list[Record],
    payments: list[Record],
    partitions: int,
    window_ms: int = 10 * MINUTE,
    grace_ms: int = MINUTE,
    join: str = "outer",
) -> dict[tuple, tuple]:
    """``(order_partition, order_offset, payment_partition, payment_offset)`` (``None`` for an absent side's two)
    -> the output row (:data:`FIELDS`; Decimal amounts, the ISO times as given) of each result Kafka Streams'
    ``join`` (``inner``, ``left`` or ``outer``) emits, both lists written in their order to fresh topics of
    ``partitions`` partitions (see the module docstring for the rules)."""
    last_arrival = max((r.arrival_ms for r in orders + payments), default=0)
    return expected_join_in_batches(orders, payments, partitions, [last_arrival + 1], window_ms, grace_ms, join)


def _arrived_before(bound: int, records: list[Record]) -> list[Record]:
    """The head of ``records`` (in arrival order) that arrived before ``bound``."""
    end = 0
    while end < len(records) and records[end].arrival_ms < bound:
        end += 1
    return records[:end]


def _partitions(orders: list[Record], payments: list[Record], partitions: int) -> dict[tuple[str, int], list[Record]]:
    """(side, partition) -> that partition's records of the side's topic, in offset order."""
    return {
        (side, p): [r for r in records if kafka_partition(r.key, partitions) == p]
        for side, records in ((ORDER, orders), (PAYMENT, payments))
        for p in range(partitions)
    }


def expected_join_in_batches(
    orders: list[Record],
    payments: list[Record],
    partitions: int,
    arrival_bounds: list[int],
    window_ms: int = 10 * MINUTE,
    grace_ms: int = MINUTE,
    join: str = "outer",
) -> dict[tuple, tuple]:
    """:func:`expected_join` for an input that arrives in micro-batches: batch n holds the records (of both
    topics) that arrived before ``arrival_bounds[n]`` and after the previous bound (see
    :func:`expected_join_in_cuts`). What the platform's processor computes when each micro-batch reads both
    topics to their ends."""
    queues = _partitions(orders, payments, partitions)
    cuts, ends = [], dict.fromkeys(queues, 0)
    for bound in arrival_bounds:
        ends = {place: ends[place] + len(_arrived_before(bound, queues[place][ends[place] :])) for place in queues}
        cuts.append(ends)
    return expected_join_in_cuts(orders, payments, partitions, cuts, window_ms, grace_ms, join)


def expected_join_in_cuts(
    orders: list[Record],
    payments: list[Record],
    partitions: int,
    cuts: list[dict[tuple[str, int], int]],
    window_ms: int = 10 * MINUTE,
    grace_ms: int = MINUTE,
    join: str = "outer",
) -> dict[tuple, tuple]:
    """:func:`expected_join` for an input read in micro-batches cut by offsets: batch n ends at ``cuts[n]``,
    (side, partition) -> the offset it reads to (exclusive; a place not named is read to its end). A task takes
    each batch's records by rule 1 among themselves (the side taken last carried over), its state carried over
    too."""
    queues = _partitions(orders, payments, partitions)
    placed = {(side, p): [(o, (p, o), r) for o, r in enumerate(records)] for (side, p), records in queues.items()}
    return _join_placed(placed, partitions, cuts, window_ms, grace_ms, join)


def expected_rekeyed_join_in_cuts(
    repartitioned: list[list[tuple[int, tuple[int, int], Record]]],
    payments: list[Record],
    cuts: list[dict[tuple[str, int], int]],
    window_ms: int = 10 * MINUTE,
    grace_ms: int = MINUTE,
    join: str = "outer",
) -> dict[tuple, tuple]:
    """:func:`expected_join_in_cuts` for orders re-keyed by order id before the join (``repartition=True``, Kafka
    Streams' ``selectKey``): ``repartitioned[p]`` is partition ``p`` of the repartition topic, its orders in offset
    order as ``(offset there, (source partition, source offset), order)``; ``payments`` written in their order to a
    topic of as many partitions. ``cuts`` name the repartition topic's offsets for the orders. A result's order
    coordinates are the order's place in the source."""
    partitions = len(repartitioned)
    queues = _partitions([], payments, partitions)
    placed = {(ORDER, p): list(repartitioned[p]) for p in range(partitions)}
    placed |= {(PAYMENT, p): [(o, (p, o), r) for o, r in enumerate(queues[PAYMENT, p])] for p in range(partitions)}
    return _join_placed(placed, partitions, cuts, window_ms, grace_ms, join)


def _join_placed(
    placed: dict[tuple[str, int], list[tuple[int, tuple[int, int], Record]]],
    partitions: int,
    cuts: list[dict[tuple[str, int], int]],
    window_ms: int,
    grace_ms: int,
    join: str,
) -> dict[tuple, tuple]:
    """Each task's records, ``placed[side, p]``: (offset in the task's partition, the coordinates a result names,
    the record), in offset order, taken in the batches ``cuts`` end (offsets, exclusive)."""
    results: dict[tuple, tuple] = {}
    for p in range(partitions):
        task = _Task(window_ms, grace_ms, join)
        heads, last = {ORDER: 0, PAYMENT: 0}, None
        for cut in [*cuts, {}]:  # and whatever the cuts left, as a last batch
            batch = {}
            for side, head in heads.items():
                queue, end = placed[side, p], head
                while end < len(queue) and ((side, p) not in cut or queue[end][0] < cut[side, p]):
                    end += 1
                batch[side] = queue[head:end]
            records = {side: [record for _, _, record in entries] for side, entries in batch.items()}
            for side, n in task_order(records[ORDER], records[PAYMENT], last):
                _offset, (partition, offset), record = batch[side][n]
                task.process(_Stored(side, partition, offset, record))
                last = side
            heads = {side: heads[side] + len(batch[side]) for side in heads}
        results.update(task.results)
    return results


def scaled(
    orders: int, end_ms: int, seed: int = 3, customers: int = 100_000, window_ms: int = 10 * MINUTE
) -> tuple[Iterator[Encoded], Iterator[Encoded]]:
    """``(orders, payments)``, as many payments as orders, each topic in time order and ending by ``end_ms``: a
    benchmark's input of the windowed join at any size (1e7 + 1e7 records in about a minute).

    Orders (``o00000042``, of one of ``customers`` customers) on a grid of times, a few ms to 750 ms apart (a step
    that divides ``window_ms``), at least two hours of them. Payments are drawn as intents: 8% of the orders never
    paid, 3% paid outside the window (``window_ms`` + 1 ms to 5 min more, before or after: an unmatched order and
    an unmatched payment), 4% paid twice (two parts, each within the window), 1% exactly at a bound of the window
    or one step inside it (before or after), the rest once within 5 minutes before or after the order, and the
    remaining payments of orders that never exist (``s00000042``), anywhere in the span. Then the intents, in order
    of the time they want, take the orders' times one for one: the payments' times are the orders' times, so the
    two topics advance together in time, and a payment lands within seconds of the time it wanted (minutes at the
    span's two ends); a bound payment then pays the order exactly at the bound from the time it got. So a
    micro-batch that cuts both topics at the same fraction of their offsets (Spark's ``maxOffsetsPerTrigger``)
    holds them within seconds of each other, well within the grace, and few records wait for the other topic
    (the platform takes both topics in time order across micro-batches: docs/writing-jobs/stream-table-join.md).

    A record's time is its ``event_time`` and Kafka timestamp. No record is behind its topic's latest time: what
    every peer joins the same way (plain Spark's watermark drops nothing), the unmatched ones aside (see
    bench/answers.py)."""
    import numpy as np

    step = next(
        d for d in range(max(SCALED_STEP_MS, -(-SCALED_MIN_SPAN_MS // orders)), window_ms + 1) if window_ms % d == 0
    )
    start = end_ms - orders * step
    rng = np.random.default_rng(seed)
    order_times = start + np.arange(orders) * step
    payer, halves = _scaled_payers(rng, order_times, start, step, window_ms)
    cents = rng.integers(100, 500_000, orders)
    buyers = rng.integers(0, customers, orders)
    pay_times = order_times  # the k-th payment in time order takes the k-th order's time
    return _scaled_orders(order_times, buyers, cents), _scaled_payments(pay_times, payer, cents, halves)


def _scaled_intents(rng, orders: int, window_ms: int, step: int):
    """:func:`scaled`'s payment intents of its orders: ``(offsets, paid, bounds, second)``, each order's offset
    from its time to its (first) payment's, which orders are paid, which exactly at a bound of the window, and
    the indices of those paid twice."""
    import numpy as np

    draw = rng.random(orders)
    once = draw >= 0.16
    bounds = (draw >= 0.15) & (draw < 0.16)
    twice = (draw >= 0.11) & (draw < 0.15)
    outside = (draw >= 0.08) & (draw < 0.11)
    bound_offsets = rng.choice([-window_ms, -window_ms + step, window_ms - step, window_ms], orders)
    offsets = np.where(once, rng.integers(-5 * MINUTE, 5 * MINUTE + 1, orders), 0)
    offsets = np.where(bounds, bound_offsets, offsets)
    offsets = np.where(twice, rng.integers(-window_ms, window_ms + 1, orders), offsets)
    sign = rng.choice([-1, 1], orders)
    offsets = np.where(outside, sign * rng.integers(window_ms + 1, window_ms + 5 * MINUTE + 1, orders), offsets)
    paid = once | bounds | twice | outside
    return offsets, paid, bounds, np.flatnonzero(twice)


def _scaled_payers(rng, order_times, start: int, step: int, window_ms: int):
    """``(payer, halves)``: the order the k-th payment in time order pays (``-1 - n``: the n-th payment of no
    order), as many payments as orders; and which orders are paid in two halves."""
    import numpy as np

    orders = len(order_times)
    offsets, paid, bounds, second = _scaled_intents(rng, orders, window_ms, step)
    payer = np.concatenate([np.flatnonzero(paid), second])
    wanted = np.concatenate(
        [
            order_times[paid] + offsets[paid],
            order_times[second] + rng.integers(-window_ms, window_ms + 1, len(second)),
        ]
    )
    strays = orders - len(payer)
    assert strays >= 0, f"{len(payer)} payments of {orders} orders"
    payer = np.concatenate([payer, -1 - np.arange(strays)])  # -1 - n: the n-th payment of no order
    wanted = np.concatenate([wanted, start + rng.integers(0, orders * step, strays)])
    bound = np.concatenate([np.where(bounds[paid], offsets[paid], 0), np.zeros(len(second) + strays, dtype=np.int64)])
    by_time = np.argsort(wanted, kind="stable")
    payer, bound = payer[by_time], bound[by_time]
    at_bound = np.flatnonzero(bound != 0)
    bound_payer = at_bound - bound[at_bound] // step  # the order exactly ``bound`` before the payment's time
    inside = (bound_payer >= 0) & (bound_payer < orders)
    payer[at_bound[inside]] = bound_payer[inside]
    halves = np.zeros(orders, dtype=bool)
    halves[second] = True
    return payer, halves


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def _chunked_rows(times, *columns) -> Iterator[tuple]:
    """``(index, *columns' values, ISO time, time)`` for each row of the arrays ``times`` and ``columns``, made
    into Python values a chunk at a time, so memory stays one chunk's worth however large the input."""
    count = len(times)
    for low in range(0, count, CHUNK):
        high = min(count, low + CHUNK)
        yield from zip(
            range(low, high),
            *(column[low:high].tolist() for column in columns),
            iso_times(times[low:high]),
            times[low:high].tolist(),
            strict=True,
        )


def _scaled_orders(order_times, buyers, cents) -> Iterator[Encoded]:
    for i, buyer, amount, iso, t in _chunked_rows(order_times, buyers, cents):
        key = f"o{i:08d}"
        value = (
            f'{{"order_id": "{key}", "customer_id": "c{buyer:07d}", "amount": {_money(amount)}, "event_time": "{iso}"}}'
        )
        yield key, value.encode(), t


def _scaled_payments(pay_times, payer, cents, halves) -> Iterator[Encoded]:
    for n, o, iso, t in _chunked_rows(pay_times, payer):
        key = f"o{o:08d}" if o >= 0 else f"s{-1 - o:08d}"
        amount = _money(cents[o] // 2 if halves[o] else cents[o]) if o >= 0 else "9.99"
        value = f'{{"payment_id": "y{n:08d}", "order_id": "{key}", "paid": {amount}, "event_time": "{iso}"}}'
        yield key, value.encode(), t
