"""The stream-table join's plain-Python reference (:func:`spark_jobs.reference.generators.orders.expected_enrichment`) on
hand-made cases: what each rule of Kafka Streams' task does to one order (the join tests hold the platform and
the Kafka Streams twin to this reference on adversarial input)."""

from __future__ import annotations

from decimal import Decimal

from spark_jobs.reference.generators.orders import Record, expected_enrichment

MINUTE = 60_000


def _order(n: int, t: int, arrival: int | None = None, customer: str = "c1") -> Record:
    value = {"order_id": f"o{n}", "customer_id": customer, "amount": 1.5, "event_time": f"t{t}"}
    return Record(customer, value, t, t if arrival is None else arrival)


def _row(t: int, tier: str | None, customer: str = "c1") -> Record:
    value = None if tier is None else {"customer_id": customer, "name": "Ann", "tier": tier}
    return Record(customer, value, t, t)


def _tiers(orders, customers, grace=MINUTE, retention=60 * MINUTE, join="left") -> dict[str, str | None]:
    joined = expected_enrichment(orders, customers, 1, grace, retention, join)
    assert all(row[2] == Decimal("1.5") for row in joined.values())
    return {row[1]: row[5] for row in joined.values()}


def test_an_order_joins_the_row_valid_at_its_time_once_stream_time_passes_its_grace():
    customers = [_row(0, "bronze"), _row(10 * MINUTE, "gold")]
    orders = [_order(1, 5 * MINUTE), _order(2, 10 * MINUTE), _order(3, 12 * MINUTE), _order(4, 20 * MINUTE)]
    # o2 at the very time of the change sees it; o4 is still waiting out its grace (no later order)
    assert _tiers(orders, customers) == {"o1": "bronze", "o2": "gold", "o3": "gold"}


def test_a_change_that_arrives_after_the_order_within_the_grace_counts():
    # the change is written after the order (a later offset) but is older than it: the versions order by time
    customers = [_row(0, "bronze"), _row(4 * MINUTE, "gold")]
    orders = [_order(1, 5 * MINUTE), _order(2, 7 * MINUTE)]
    assert _tiers(orders, customers) == {"o1": "gold"}


def test_without_a_grace_the_order_joins_the_rows_taken_before_it():
    customers = [_row(0, "bronze"), _row(6 * MINUTE, "gold")]
    orders = [_order(1, 5 * MINUTE), _order(2, 7 * MINUTE)]
    assert _tiers(orders, customers, grace=0) == {"o1": "bronze", "o2": "gold"}


def test_a_late_order_joins_at_once_as_of_its_time():
    customers = [_row(0, "bronze"), _row(10 * MINUTE, "gold")]
    orders = [_order(1, 20 * MINUTE), _order(2, 30 * MINUTE), _order(3, 2 * MINUTE)]  # o3: 28 min late
    assert _tiers(orders, customers) == {"o1": "gold", "o3": "bronze"}


def test_a_tombstone_ends_the_row_and_an_inner_join_drops_the_order():
    customers = [_row(0, "bronze"), _row(5 * MINUTE, None), _row(9 * MINUTE, "gold")]
    orders = [_order(1, 6 * MINUTE), _order(2, 10 * MINUTE), _order(3, 20 * MINUTE)]
    assert _tiers(orders, customers) == {"o1": None, "o2": "gold"}
    assert _tiers(orders, customers, join="inner") == {"o2": "gold"}


def test_lookups_and_changes_older_than_the_retention_find_and_change_nothing():
    customers = [_row(0, "bronze"), _row(70 * MINUTE, "gold"), _row(5 * MINUTE, "silver")]  # the last: expired
    orders = [_order(1, 71 * MINUTE), _order(2, 6 * MINUTE), _order(3, 90 * MINUTE)]  # o2: before the retention
    assert _tiers(orders, customers) == {"o1": "gold", "o2": None}


def test_orders_due_together_are_joined_in_time_then_key_then_offset_order():
    orders = [_order(1, 3 * MINUTE, customer="c2"), _order(2, 1 * MINUTE), _order(3, 3 * MINUTE), _order(4, 9 * MINUTE)]
    joined = expected_enrichment(orders, [], 1, MINUTE, 60 * MINUTE)
    assert list(joined) == [(0, 1), (0, 2), (0, 0)]  # o2 (1 min), then c1's o3 before c2's o1 (both 3 min)
