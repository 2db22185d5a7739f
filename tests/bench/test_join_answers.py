"""The join workloads of bench/compare.py: their generated inputs keep the three peers' semantics equal, and
their answers are compared on what the peers mean alike (bench/answers.py). Pure logic: no broker, no Spark."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from bench import answers
from bench.answers import AnswersDiffer, check_enrichment_agree, check_payments_agree
from spark_jobs.reference.generators import orders as order_generator
from spark_jobs.reference.generators import payments as payment_generator
from spark_jobs.reference.generators.producer import kafka_partition

END_MS = 1_790_000_000_000
MINUTE = 60_000
SLACK_MS = 2 * (10 * MINUTE + MINUTE)


def _result(digest: int, at: int) -> tuple[int, int]:
    return at, digest


def _payments_answers() -> dict[str, dict]:
    """Three peers agreeing: two pairs, unmatched records, each peer with its own tail of unmatched ones."""
    pairs = {((0, 1), (0, 1)): _result(11, 1_000), ((1, 5), (1, 2)): _result(12, 2_000)}
    common = {((0, 2), None): _result(21, 3_000), (None, (1, 3)): _result(22, 3_500)}
    platform = {**pairs, **common, ((0, 9), None): _result(31, 60 * MINUTE)}
    kafka_streams = {**pairs, **common, ((0, 9), None): _result(31, 60 * MINUTE)}
    plain_spark = {**pairs, **common, (None, (1, 8)): _result(32, 59 * MINUTE)}
    # plain Spark's latest unmatched result in partition 0 is at 3,000 ms: it had not closed 0:9 yet; in partition
    # 1 the others' latest is at 3,500 ms, 1:8 (59 min) is after theirs
    return {"platform": platform, "kafka_streams": kafka_streams, "plain_spark": plain_spark}


def test_payments_compare_every_pair_and_the_unmatched_results_every_peer_emitted():
    compared, note = check_payments_agree(_payments_answers(), SLACK_MS)
    assert compared == {"platform": 4, "kafka_streams": 4, "plain_spark": 4}
    assert "2 unmatched results in common" in note and "plain_spark 1" in note


def test_payments_differ_on_a_pair_one_peer_lacks():
    got = _payments_answers()
    del got["plain_spark"][(0, 1), (0, 1)]
    with pytest.raises(AnswersDiffer, match="plain_spark and platform differ on 1 matched pairs"):
        check_payments_agree(got, SLACK_MS)


def test_payments_differ_on_a_pair_with_another_row():
    got = _payments_answers()
    got["kafka_streams"][(1, 5), (1, 2)] = _result(99, 2_000)
    with pytest.raises(AnswersDiffer, match="kafka_streams and platform differ"):
        check_payments_agree(got, SLACK_MS)


def test_payments_refuse_a_record_emitted_unmatched_that_is_matched():
    got = _payments_answers()
    got["platform"][None, (1, 2)] = _result(40, 2_000)  # the payment of the pair (1:5, 1:2), alone too
    with pytest.raises(AnswersDiffer, match="platform emitted 1 records unmatched that are matched"):
        check_payments_agree(got, SLACK_MS)


def test_payments_differ_on_an_unmatched_row():
    got = _payments_answers()
    got["plain_spark"][(0, 2), None] = _result(77, 3_000)
    with pytest.raises(AnswersDiffer, match="unmatched results differ on 1"):
        check_payments_agree(got, SLACK_MS)


def test_payments_refuse_an_unmatched_record_missing_long_before_a_peers_latest():
    got = _payments_answers()
    for answer in got.values():  # every peer closed a window at 90 min in partition 0
        answer[(0, 60), None] = _result(60, 90 * MINUTE)
    got["platform"][(0, 3), None] = _result(3, MINUTE)  # closed long before: plain Spark should have emitted it
    got["kafka_streams"][(0, 3), None] = _result(3, MINUTE)  # the others' 0:9 (60 min) too
    with pytest.raises(AnswersDiffer, match=r"plain_spark did not emit 2 unmatched .*\(0, 3\).*\(0, 9\)"):
        check_payments_agree(got, SLACK_MS)


def test_payments_accept_a_tail_the_peer_had_not_closed():
    got = _payments_answers()
    got["platform"][(1, 70), None] = _result(70, 61 * MINUTE)
    got["kafka_streams"][(1, 70), None] = _result(70, 61 * MINUTE)  # plain Spark's latest in partition 1: 59 min
    compared, _ = check_payments_agree(got, SLACK_MS)
    assert compared["plain_spark"] == 4


def test_enrichment_compares_plain_spark_on_the_orders_the_platform_joined():
    platform = {(0, 1): 1, (1, 1): 2}
    got = {"platform": platform, "kafka_streams": dict(platform), "plain_spark": {**platform, (1, 2): 3}}
    compared, note = check_enrichment_agree(got)
    assert compared == {"platform": 2, "kafka_streams": 2, "plain_spark": 2} and "1 further orders" in note
    got["kafka_streams"][1, 2] = 3  # Kafka Streams holds what the platform holds: compared on every order
    with pytest.raises(AnswersDiffer, match="kafka_streams and platform differ on 1 of 3"):
        check_enrichment_agree(got)
    got["kafka_streams"] = dict(platform)
    got["plain_spark"][0, 1] = 9
    with pytest.raises(AnswersDiffer, match="plain_spark and platform differ on 1 of 2"):
        check_enrichment_agree(got)


def test_digests_equal_for_equal_decimals_written_differently():
    from decimal import Decimal

    assert answers.enrichment_digest("c1", "o1", Decimal("12.5"), 1, None, None) == answers.enrichment_digest(
        "c1", "o1", Decimal("12.50"), 1, None, None
    )
    assert answers.iso_millis("2026-09-21T13:50:09.819Z") == 1789998609819


def test_growing_customers_profile_every_order_before_it_and_no_later_in_the_topic():
    count, customers = 20_000, 2_000
    stream, table = order_generator.growing_customers(count, customers, END_MS)
    profiles = list(table)
    position = {key: n / customers for n, (key, _, _) in enumerate(profiles)}
    profile_time = {key: t for key, _, t in profiles}
    assert [t for _, _, t in profiles] == sorted(t for _, _, t in profiles)
    placed = list(stream)
    assert len(placed) == count and [t for _, _, t in placed] == sorted(t for _, _, t in placed)
    assert max(t for _, _, t in placed) < END_MS
    known = [(n, key, t) for n, (key, _, t) in enumerate(placed) if key in profile_time]
    assert 0.97 * count < len(known) < count  # about 1% of the orders' customers have no profile
    assert all(profile_time[key] < t for _, key, t in known)
    # an order's customer is at most 90% as far through the profiles as the order through the orders (+ the
    # first 1% of the customers, signed up before the first order)
    assert all(position[key] <= max(0.01, 0.9 * n / count) for n, key, _ in known)
    assert all(json.loads(value)["customer_id"] == key for key, value, _ in placed + profiles)


def test_scaled_payments_advance_with_their_orders_and_keep_the_window_cases():
    count = 20_000
    placed, paid = (list(records) for records in payment_generator.scaled(count, END_MS))
    assert len(placed) == len(paid) == count
    # the payments take the orders' times, one for one: at any fraction of both topics, the same time
    assert [t for _, _, t in paid] == [t for _, _, t in placed]
    order_time = {key: t for key, _, t in placed}
    gaps = Counter(t - order_time[key] for key, _, t in paid if key in order_time)
    assert all(gaps[g] > 10 for g in (-10 * MINUTE, 10 * MINUTE))  # exactly at the bounds, both sides
    assert sum(n for g, n in gaps.items() if abs(g) > 10 * MINUTE) > 0.02 * count  # outside the window
    assert sum(1 for key, _, _ in paid if key.startswith("s")) > 0.02 * count  # payments of no order
    assert len(order_time.keys() - {key for key, _, _ in paid}) > 0.05 * count  # unpaid orders
    assert {kafka_partition(key, 2) for key in order_time} == {0, 1}
    assert all(json.loads(value)["order_id"] == key for key, value, _ in placed + paid)
