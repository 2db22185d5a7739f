"""The stream-stream join's plain-Python reference (:func:`spark_jobs.reference.generators.payments.expected_join`) on
hand-made cases, one per rule of its module docstring: what Kafka Streams' task does with a few orders and
payments (tests/bench/test_kafka_streams_peer.py holds the Kafka Streams twin to this reference on adversarial
input). Times in minutes of event time; the twin's window: 10 minutes before and after, 1 minute grace."""

from __future__ import annotations

from decimal import Decimal

import pytest

from spark_jobs.reference.generators.payments import ORDER, PAYMENT, Record, expected_join, task_order

MINUTE = 60_000
W, G = 10 * MINUTE, MINUTE


def _order(order_id: str, t: float, arrival: float | None = None) -> Record:
    """Order ``order_id`` at minute ``t`` (arriving at ``arrival``: only the list's order matters here)."""
    ms = round(t * MINUTE)
    value = {"order_id": order_id, "customer_id": "c1", "amount": 12.5, "event_time": f"t{ms}"}
    return Record(order_id, value, ms, ms if arrival is None else round(arrival * MINUTE))


def _pay(payment_id: str, order_id: str, t: float) -> Record:
    ms = round(t * MINUTE)
    value = {"payment_id": payment_id, "order_id": order_id, "paid": 12.50, "event_time": f"t{ms}"}
    return Record(order_id, value, ms, ms)


def _joined(orders: list[Record], payments: list[Record], join: str = "outer") -> set[tuple[str | None, str | None]]:
    """(order id, payment id) of each result, None for an absent side (one partition: offsets index the lists)."""
    results = expected_join(orders, payments, 1, W, G, join)
    assert all(k[0] in (0, None) and k[2] in (0, None) for k in results)
    labels = set()
    for (_, order, _, payment), row in results.items():
        o = orders[order].value if order is not None else None
        p = payments[payment].value if payment is not None else None
        assert row == (
            (o or p)["order_id"],
            o and "c1",
            o and Decimal("12.5"),
            o and o["event_time"],
            p and p["payment_id"],
            p and Decimal("12.5"),
            p and p["event_time"],
        )
        labels.add((o and o["order_id"], p and p["payment_id"]))
    assert len(labels) == len(results)
    return labels


def test_rule_1_the_smaller_head_time_first_and_on_a_tie_the_side_not_taken_last():
    # the case Kafka Streams 4.3.1 was traced on (PartitionGroup at TRACE): O0 P0.5 O1 P1 O1 P1 O1 P2 O3 P3 O3 P3
    orders = [_order(f"o{n}", t) for n, t in enumerate([0, 1, 1, 1, 3, 3])]
    payments = [_pay(f"p{n}", "x", t) for n, t in enumerate([0.5, 1, 1, 2, 3, 3])]
    sides = [side for side, _ in task_order(orders, payments)]
    assert sides == [ORDER, PAYMENT] * 6
    assert [offset for side, offset in task_order(orders, payments) if side == ORDER] == list(range(6))


def test_rule_1_records_are_taken_by_time_across_the_two_partitions():
    # p1 (5 min) is taken before o3 (20 min, written before it): it joins o1 before o3 closes o1's window (taken
    # in offset order, o3 would first emit o1 unmatched, and p1 join it after that)
    orders = [_order("o1", 0), _order("o3", 20)]
    payments = [_pay("p1", "o1", 5)]
    assert _joined(orders, payments, "left") == {("o1", "p1")}


def test_rule_2_either_side_advances_the_one_stream_time_of_the_task():
    # a payment of another order closes o1's window: emitted unmatched once stream time passes o1 + W + G
    orders = [_order("o1", 0)]
    assert _joined(orders, [_pay("px", "x", 11 + 1 / MINUTE)], "left") == {("o1", None)}
    assert _joined(orders, [_pay("px", "x", 11)], "left") == set()  # exactly at o1 + W + G: still open


def test_rule_3_a_late_order_joins_what_the_payments_store_still_holds_by_the_payments_own_time():
    # o2 comes after oA (40 min): stream time is 40 min, 35 past o2, but the payments' store has seen 21 min - 1 ms
    # only, so p2 (0 min) is still fetchable: the late order is joined; 1 ms more and p2 is past the retention
    for last_payment, joined in ((21 - 1 / MINUTE, {("o2", "p2")}), (21, set())):
        orders = [_order("oA", 40), _order("o2", 5)]
        payments = [_pay("p2", "o2", 0), _pay("pZ", "z", last_payment)]
        assert _joined(orders, payments, "inner") == joined


def test_rule_3_a_late_record_is_joined_but_not_kept_for_later_records():
    # p2 is taken before o2 (written later with an older time) but after pZ: when o2 comes, the payments' store
    # has seen 39 min, and p2 (6 min) is older than 39 - 21 + 1: neither joins the other
    orders = [_order("oA", 40), _order("o2", 5)]
    payments = [_pay("pZ", "z", 39), _pay("p2", "o2", 6)]
    assert _joined(orders, payments, "inner") == set()
    assert ("o2", None) in _joined(orders, payments, "left")


def test_rule_4_a_payment_joins_within_the_window_bounds_included():
    orders = [_order("o1", 20)]
    payments = [_pay(f"p{n}", "o1", 20 + d) for n, d in enumerate([-10 - 1 / MINUTE, -10, 10, 10 + 1 / MINUTE])]
    assert _joined(orders, payments, "inner") == {("o1", "p1"), ("o1", "p2")}
    # p0 emitted unmatched once its window closed (at p2), p3 still pending at the end
    assert _joined(orders, payments, "outer") == {("o1", "p1"), ("o1", "p2"), (None, "p0")}


def test_rule_4_duplicates_and_second_payments_each_join():
    orders = [_order("o1", 0), _order("o1", 0, 0.1)]  # a retried order: the same record at the next offset
    payments = [_pay("p1", "o1", 1), _pay("p2", "o1", 2)]
    results = expected_join(orders, payments, 1, W, G, "inner")
    assert set(results) == {(0, o, 0, p) for o in (0, 1) for p in (0, 1)}


def test_rule_5_an_unmatched_record_more_than_w_behind_is_emitted_at_once_grace_or_not():
    # o1 is 10 min + 1 ms behind stream time (oA): emitted at once, then joined too by p1 within its grace;
    # o2, exactly 10 min behind, waits in the outer store and p2's join removes it
    orders = [_order("oA", 20), _order("o1", 10 - 1 / MINUTE), _order("o2", 10)]
    payments = [_pay("pZ", "z", 20 + 1 / MINUTE), _pay("p1", "o1", 12), _pay("p2", "o2", 12)]
    assert _joined(orders, payments, "left") == {("o1", None), ("o1", "p1"), ("o2", "p2")}


def test_rule_6_min_time_holds_back_closed_orders_until_it_passes():
    # pX (11 min + 1 ms) closes o1: the scan emits it, passes o2 and o3 (open) and leaves minTime at o3 (2 min)
    # (a left join's store has orders only: the scan walks it all). pY (12 min + 1 ms) closes o2, but 2 + 11 is
    # not before 12.000...1: no scan. pZ (13 min + 1 ms) passes 13: o2 and o3 go.
    orders = [_order("o1", 0), _order("o2", 1), _order("o3", 2)]
    px, py, pz = (_pay(name, name, t + 1 / MINUTE) for name, t in (("px", 11), ("py", 12), ("pz", 13)))
    assert _joined(orders, [px], "left") == {("o1", None)}
    assert _joined(orders, [px, py], "left") == {("o1", None)}  # o2 is closed but still pending at the end
    assert _joined(orders, [px, py, pz], "left") == {("o1", None), ("o2", None), ("o3", None)}
    # a late payment of o2 taken while it is held back joins it, and o2 is then never emitted unmatched
    late = _pay("p2", "o2", 5)
    assert _joined(orders, [px, py, late, pz], "left") == {("o1", None), ("o2", "p2"), ("o3", None)}
    # taken after o2 was emitted, the same payment joins it too (o2 is still in the orders' window store)
    assert _joined(orders, [px, py, pz, late], "left") == {("o1", None), ("o2", None), ("o2", "p2"), ("o3", None)}


def test_rule_6_in_an_outer_join_the_scan_stops_after_both_sides_are_open():
    # at pC (11 min + 1 ms) the scan emits o1, finds pA (1) and o2 (2) open and stops at pB: minTime 3 min. pA
    # closes at 12, but no scan runs before 3 + 11: pD (12 min + 1 ms) leaves it pending; pE (14 min + 1 ms)
    # emits pA, o2 and pB
    orders = [_order("o1", 0), _order("o2", 2)]
    early = [_pay("pA", "a", 1), _pay("pB", "b", 3), _pay("pC", "c", 11 + 1 / MINUTE)]
    pd, pe = _pay("pD", "d", 12 + 1 / MINUTE), _pay("pE", "e", 14 + 1 / MINUTE)
    assert _joined(orders, [*early, pd], "outer") == {("o1", None)}
    assert _joined(orders, [*early, pd, pe], "outer") == {("o1", None), (None, "pA"), ("o2", None), (None, "pB")}


@pytest.mark.parametrize(
    ("join", "want"),
    [
        ("inner", {("o1", "p1")}),
        ("left", {("o1", "p1"), ("o2", None)}),
        ("outer", {("o1", "p1"), ("o2", None), (None, "p9")}),
    ],
)
def test_rule_7_records_still_pending_at_the_end_are_not_emitted(join, want):
    # o2 and p9 closed by oZ; oZ (unpaid) still pending at the end in left and outer joins
    orders = [_order("o1", 0), _order("o2", 1), _order("oZ", 30)]
    payments = [_pay("p1", "o1", 3), _pay("p9", "o9", 4)]
    assert _joined(orders, payments, join) == want


def test_an_unknown_join_is_refused():
    with pytest.raises(ValueError, match="unknown join"):
        expected_join([], [_pay("p1", "o1", 0)], 1, W, G, "right")
