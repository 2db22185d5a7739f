"""The Kafka Streams peer of bench/compare.py, on the real local broker with the real app (built by Maven).

The benchmark's ratios are only worth something if the peer computes the same thing as the platform and
is noticed when it fails: its stream threads once died on refused records while the process lived on,
and a 1e7-event benchmark waited on it for half an hour.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest

from bench import answers
from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer, build
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def classpath() -> str:
    return build()


def _readback_consumer(settings, unique: str):
    """A consumer for reading an output topic back whole (``read_partition``: it needs partition EOF)."""
    from confluent_kafka import Consumer

    from runtime.kafka_connection import client_config

    settings_ = {"group.id": f"readback-{unique}", "enable.auto.commit": False, "enable.partition.eof": True}
    return Consumer(client_config(settings.kafka, {**settings_, "log_level": 3}))


def _compacted_view(settings, topic: str) -> dict[str, dict]:
    """Latest value per key of ``topic`` as JSON, tombstoned keys absent (what compaction converges to)."""
    return {key: json.loads(value) for key, value in answers.latest_per_key(settings.kafka, topic).items()}


def _peer(classpath, settings, tmp_path, unique, topic, name="kstreams"):
    app, output = f"{name}-{unique}", f"{name}-{unique}-out"
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)  # it creates internal topics, not sinks
    return KafkaStreamsPeer(classpath, settings, "purchase_counts", app, tmp_path / app, topic, output, threads=1)


def test_peer_counts_what_the_platform_counts_and_restores_from_its_changelog(
    kafka_broker, settings, classpath, tmp_path, unique
):
    events = list(purchases.generate(4000, users=300, seed=3, start=purchases.start_ending_by(4000)))
    topic = f"purchases-{unique}"
    ensure_topic(settings.kafka, topic, 2)
    purchases.produce(settings.kafka, topic, events)

    peer = _peer(classpath, settings, tmp_path, unique, topic)
    assert peer.wait_caught_up(timeout_s=300) > 0
    peer.stop()
    changelog = f"{peer.application_id}-counts-changelog"
    expected = purchases.expected_counts(events)
    assert answers.kafka_streams_purchases(settings.kafka, changelog) == expected and any(
        e["type"] == "account_closed" for e in events
    )

    shutil.rmtree(tmp_path / peer.application_id)  # no local state: a full restore from the changelog
    again = _peer(classpath, settings, tmp_path, unique, topic)
    again.wait_running(timeout_s=300)
    again.stop()
    assert again.restored_records() >= len(expected) and again.restore_seconds() > 0


def test_a_failed_peer_ends_the_wait_with_its_cause(kafka_broker, settings, classpath, tmp_path, unique):
    # Event times two hours ahead: the app stamps its changelog records with them and the broker refuses
    # them (log.message.timestamp.after.max.ms, 1 h), which kills its stream threads.
    events = list(
        purchases.generate(200, users=20, seed=3, start=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2))
    )
    topic = f"future-{unique}"
    ensure_topic(settings.kafka, topic, 2)
    purchases.produce(settings.kafka, topic, events)

    peer = _peer(classpath, settings, tmp_path, unique, topic, name="doomed")
    with pytest.raises(RuntimeError, match="Timestamp .* is out of range") as failure:
        peer.wait_caught_up(timeout_s=300)  # without the failure check: a TimeoutError after 300 s
    assert peer.proc.poll() == 1, "a failed app must exit, not idle"
    assert f"the Kafka Streams app {peer.application_id} failed" in str(failure.value)


def test_peer_closes_the_same_windows_as_the_platform_reference(kafka_broker, settings, classpath, tmp_path, unique):
    """Kafka Streams' windows (per-task stream time, grace, suppress until close) on adversarial pulses
    equal spark_jobs.reference.generators.pulse.expected, the reference the platform's window processor is held
    to under any micro-batching (tests/spark_jobs/test_patient_heart_rate_semantics.py). The peer has no
    check-outs, so the input has none."""
    from spark_jobs.reference.generators import pulse
    from spark_jobs.reference.generators.producer import kafka_partition

    start = pulse.START - dt.timedelta(days=3)  # in the past: the app stamps records with event time
    events = [e for e in pulse.adversarial(400, patients=8, seed=21, start=start) if e["type"] == pulse.PULSE]
    assert {kafka_partition(e["patient_id"], 2) for e in events} == {0, 1}
    topic, app, output = f"pulses-{unique}", f"kspulses-{unique}", f"kspulses-{unique}-out"
    ensure_topic(settings.kafka, topic, 2)
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    pulse.produce(settings.kafka, topic, events)
    peer = KafkaStreamsPeer(classpath, settings, "pulse_counts", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()
    emitted = {
        (key.rpartition("@")[0], value["window_start_ms"]): value["beats"]
        for key, value in _compacted_view(settings, output).items()
    }
    want = pulse.expected([events], 60_000, 5_000, 6 * 3600 * 1000, partitions=2)
    assert want.late and len(want.emitted) > 10
    assert emitted == want.emitted


def test_peer_computes_the_same_hopping_windows_as_the_platform_reference(
    kafka_broker, settings, classpath, tmp_path, unique
):
    """Kafka Streams' hopping windows (5 min advancing by 1 min, 30 s grace, 2 h retention) with an
    aggregate beyond a count, emitted on close and on every update, equal
    spark_jobs.reference.generators.temperatures.expected: the reference temperature_averages' processor is held to
    under any micro-batching (tests/spark_jobs/test_temperature_averages.py). The peer has no removals."""
    from spark_jobs.reference.generators import temperatures

    start = temperatures.START - dt.timedelta(days=3)  # in the past: the app stamps records with event time
    events = list(temperatures.adversarial(400, sensors=8, seed=21, start=start, removals=False))
    topic, app, output = f"readings-{unique}", f"kstemperatures-{unique}", f"kstemperatures-{unique}-out"
    ensure_topic(settings.kafka, topic, 2)
    for sink in (output, f"{output}-updates"):
        ensure_topic(settings.kafka, sink, 2, config=OUTPUT_TOPIC_CONFIG)
    temperatures.produce(settings.kafka, topic, events)
    peer = KafkaStreamsPeer(classpath, settings, "temperature_averages", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()

    def windows_of(sink: str) -> dict:
        return {
            (key.rpartition("@")[0], v["window_start_ms"]): (
                v["readings"],
                v["temperature_sum"],
                v["min_temperature"],
                v["max_temperature"],
            )
            for key, v in _compacted_view(settings, sink).items()
        }

    want = temperatures.expected(events, partitions=2)
    assert any(0 < n < 5 for n in want.late.values()) and 0 in want.late.values() and len(want.emitted) > 20
    assert windows_of(output) == want.emitted
    assert windows_of(f"{output}-updates") == want.updated


def test_peer_expires_the_same_keys_by_event_time_as_the_platform_reference(
    kafka_broker, settings, classpath, tmp_path, unique
):
    """A keyed aggregate with an event-time TTL in Kafka Streams' Processor API (per-task stream time,
    users expiring 60 s after their latest click, logouts deleting, late clicks for absent users dropped)
    ends with the store spark_jobs.reference.generators.activity.expected computes: the reference the platform's
    ExpiringAggregate is held to under any micro-batching (tests/spark_jobs/test_event_time_ttl.py)."""
    from spark_jobs.reference.generators import activity
    from spark_jobs.reference.generators.producer import produce_keyed

    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3)  # the app stamps records with event time
    events = activity.generate(300, seed=21, start=start)
    want = activity.expected(events, 60_000, partitions=2)
    assert want.expired > 10 and want.restarted and want.old_but_alive and want.late and want.state
    topic, app, output = f"activity-{unique}", f"ksactivity-{unique}", f"ksactivity-{unique}-out"
    ensure_topic(settings.kafka, topic, 2)
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    produce_keyed(settings.kafka, topic, events, "user")
    peer = KafkaStreamsPeer(classpath, settings, "activity_ttl", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()
    got = {user: (v["clicks"], v["qty"], v["event_time_ms"]) for user, v in _compacted_view(settings, output).items()}
    assert got == {user: (clicks, qty, t) for user, (clicks, qty, _, t) in want.state.items()}


def test_peer_computes_the_same_sessions_as_the_platform_reference(kafka_broker, settings, classpath, tmp_path, unique):
    """Kafka Streams' session windows (30 min inactivity gap, 5 min grace, 2 h retention; a merger adding
    counts) on adversarial clicks, emitted on close (suppress) and on every update (merged sessions as
    tombstones), equal spark_jobs.reference.generators.sessions.expected: the reference user_sessions' processor is held
    to under any micro-batching (tests/spark_jobs/test_user_sessions.py). The peer has no deletes."""
    from spark_jobs.reference.generators import sessions

    start = sessions.START - dt.timedelta(days=3)  # in the past: the app stamps records with event time
    events = list(sessions.adversarial(400, users=8, seed=21, start=start, deletes=False))
    topic, app, output = f"clicks-{unique}", f"kssessions-{unique}", f"kssessions-{unique}-out"
    ensure_topic(settings.kafka, topic, 2)
    for sink in (output, f"{output}-updates"):
        ensure_topic(settings.kafka, sink, 2, config=OUTPUT_TOPIC_CONFIG)
    sessions.produce(settings.kafka, topic, events)
    peer = KafkaStreamsPeer(classpath, settings, "user_sessions", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()

    def sessions_of(sink: str) -> dict:
        return {
            (key.rpartition("@")[0], v["session_start_ms"]): (
                v["session_end_ms"],
                (v["events"], v["page_views"], v["last_page"]),
            )
            for key, v in _compacted_view(settings, sink).items()
        }

    want = sessions.expected_visits(events, partitions=2)
    assert want.late and want.bridges and want.reopened and len(want.emitted) > 20
    assert any(end > start for (_, start), (end, _) in want.emitted.items())
    assert sessions_of(output) == want.emitted
    assert sessions_of(f"{output}-updates") == want.updated


def test_peer_computes_the_same_daily_top_movers_as_the_platform_reference(
    kafka_broker, settings, classpath, tmp_path, unique
):
    """The seeds' two-stage pattern in Kafka Streams: change and ticks per symbol per day (1-day windows,
    10 min grace, suppress until close) to an intermediate topic, read back as a table regrouped by day
    (adder and subtractor) into the day's top 10, equal spark_jobs.reference.generators.ticks' references
    (daily_changes, then top_movers): what the platform's streaming job and the batch step
    daily_top_movers are held to. The generator's late ticks (change 100 on the first day) must not count."""
    from spark_jobs.io.kafka_topics import partition_offsets
    from spark_jobs.reference.generators import ticks
    from spark_jobs.reference.generators.producer import kafka_partition, produce_keyed
    from spark_jobs.reference.generators.windows import millis

    start = ticks.START - dt.timedelta(days=3)  # in the past: the app stamps records with event time
    events = ticks.generate(days=3, symbols=24, seed=7, start=start)
    assert {kafka_partition(e["symbol"], 2) for e in events} == {0, 1}
    daily = ticks.daily_changes(events, partitions=2)
    days = sorted({day for _, day in daily})
    want = {day: ticks.top_movers(daily, day) for day in days}
    assert len(days) == 3 and all(len(top) == 10 for top in want.values())
    assert not any(change >= 100 for change, _ in daily.values())  # the late ticks are left out

    topic, app, output = f"ticks-{unique}", f"ksmovers-{unique}", f"ksmovers-{unique}-out"
    ensure_topic(settings.kafka, topic, 2)
    ensure_topic(settings.kafka, f"{output}-daily", 1, config=OUTPUT_TOPIC_CONFIG)  # the stage-1 hand-over
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
    produce_keyed(settings.kafka, topic, events, "symbol")
    peer = KafkaStreamsPeer(classpath, settings, "top_movers", app, tmp_path / app, topic, output, threads=1)
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
        # Stage 1's answer is in the hand-over topic once the input is committed (a commit flushes the
        # producer); stage 2 has read it once the group's offsets reach the end of that topic and of its
        # groupBy's repartition topic, in that order.
        for stage_2_input in (f"{output}-daily", f"{app}-movers-by-day-repartition"):
            assert partition_offsets(settings.kafka, stage_2_input), f"no topic {stage_2_input}"
            peer.input_topic = stage_2_input
            peer.wait_caught_up(timeout_s=300)
    finally:
        peer.stop()

    handed_over = {
        (v["symbol"], millis(v["window_start"])): (v["change"], v["ticks"])
        for v in _compacted_view(settings, f"{output}-daily").values()
    }
    assert handed_over == daily
    got = {
        millis(day): [(row["rank"], row["symbol"], row["change"], row["ticks"]) for row in v["top"]]
        for day, v in _compacted_view(settings, output).items()
    }
    assert got == {
        day: [(rank, symbol, change, daily[symbol, day][1]) for rank, (symbol, change) in enumerate(top, 1)]
        for day, top in want.items()
    }


def _customer_key(customer_id: str) -> str:
    """The upsert topics' Kafka key: the key field as canonical JSON, identical bytes in both topics."""
    return json.dumps({"customer_id": customer_id}, separators=(",", ":"))


def _customer(customer_id: str, name: str, tier: str | None) -> str:
    return json.dumps({"customer_id": customer_id, "name": name, "tier": tier})


def _account(customer_id: str, account_id: str, status: str, balance: str) -> str:
    """``balance`` as written: a JSON number with up to 2 decimals (json.dumps has no exact decimal)."""
    return json.dumps({"customer_id": customer_id, "account_id": account_id, "status": status})[:-1] + (
        f', "balance": {balance}}}'
    )


_ROW_FIELDS = ("customer_id", "name", "tier", "account_id", "status", "balance")


def _joined_rows(customers: dict[str, dict], accounts: dict[str, dict], how: str) -> dict[str, dict]:
    """The reference table-table join of two final tables (key -> row): inner has both sides, left the
    customer, outer either; an absent side's fields are None."""
    keys = {
        "inner": customers.keys() & accounts.keys(),
        "left": customers.keys(),
        "outer": customers.keys() | accounts.keys(),
    }[how]
    rows = {}
    for key in keys:
        c, a = customers.get(key), accounts.get(key)
        rows[key] = {
            "customer_id": (c or a)["customer_id"],
            "name": c and c["name"],
            "tier": c and c["tier"],
            "account_id": a and a["account_id"],
            "status": a and a["status"],
            "balance": a and a["balance"],
        }
    return rows


def test_the_table_join_twin_joins_customers_and_accounts(kafka_broker, settings, classpath, tmp_path, unique):
    """Kafka Streams' KTable join, leftJoin and outerJoin of two co-partitioned upsert topics (JSON keys,
    tombstones deleting rows) hold the rows a plain-Python join of the two tables computes after each of
    three rounds of input: keys on one side only, a customer and an account deleted, a customer updated twice,
    an account re-created after its delete, a tombstone for a key never written, balances kept exact. Each
    round is committed before the next is written, so its deletes reach the join (within one commit interval
    the record cache would fold a row's create and delete into nothing) and the output's tombstones count."""
    from decimal import Decimal

    from confluent_kafka import Producer

    from runtime.kafka_connection import client_config
    from spark_jobs.io.kafka_topics import partition_offsets
    from spark_jobs.reference.generators.producer import kafka_partition

    customers_topic, accounts_topic = f"customers-{unique}", f"accounts-{unique}"

    def customer(c: str, name: str, tier: str | None) -> tuple[str, str, str]:
        return customers_topic, _customer_key(c), _customer(c, name, tier)

    def account(c: str, a: str, status: str, balance: str) -> tuple[str, str, str]:
        return accounts_topic, _customer_key(c), _account(c, a, status, balance)

    def deleted(topic: str, c: str) -> tuple[str, str, None]:
        return topic, _customer_key(c), None

    # (topic, key, value or None for a tombstone), each round in the order it is written
    rounds = [
        [
            customer("c01", "Ann", "gold"),
            customer("c02", "Bob", None),
            customer("c03", "Cid", "silver"),
            customer("c04", "Dee", "gold"),
            customer("c05", "Eve", "bronze"),
            customer("c06", "Fay", None),
            customer("c07", "Gus", "silver"),
            customer("c08", "Hal", "gold"),
            account("c03", "a-03", "open", "12.50"),
            account("c04", "a-04", "open", "0.10"),
            account("c05", "a-05", "frozen", "1234567.89"),
            account("c06", "a-06", "open", "7"),
            account("c09", "a-09", "open", "0.07"),  # accounts without a customer: c09, c10
            account("c10", "a-10", "open", "99.99"),
            customer("c03", "Cid", None),  # c03 updated twice: here and in the last round
        ],
        [
            account("c04", "a-04", "closed", "-3.30"),
            deleted(customers_topic, "c02"),  # a customer without an account
            deleted(customers_topic, "c05"),  # a customer with an account
            deleted(accounts_topic, "c06"),  # an account with a customer
            deleted(accounts_topic, "c10"),  # an account without a customer, written again next round
            deleted(accounts_topic, "c11"),  # a key never written
        ],
        [
            customer("c03", "Cyd", "platinum"),
            account("c10", "a-10b", "open", "100.01"),
        ],
    ]
    assert {kafka_partition(key, 2) for records in rounds for _, key, _ in records} == {0, 1}

    for topic in (customers_topic, accounts_topic):
        ensure_topic(settings.kafka, topic, 2)
    # murmur2, as the Java client's default partitioner: one customer's key in the same partition of both topics
    producer = Producer(
        client_config(settings.kafka, {"enable.idempotence": True, "partitioner": "murmur2_random", "log_level": 3})
    )
    peers = {}
    try:
        for how in ("inner", "left", "outer"):
            app, output = f"ksjoin-{how}-{unique}", f"ksjoin-{how}-{unique}-out"
            ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)
            peers[how, output] = KafkaStreamsPeer(
                classpath,
                settings,
                f"customer_accounts_{how}",
                app,
                tmp_path / app,
                f"{customers_topic},{accounts_topic}",
                output,
                threads=1,
            )
        tables: dict[str, dict[str, dict]] = {customers_topic: {}, accounts_topic: {}}
        for n, records in enumerate(rounds, 1):
            for topic, key, value in records:
                producer.produce(topic, key=key.encode(), value=None if value is None else value.encode())
                if value is None:
                    tables[topic].pop(key, None)
                else:
                    tables[topic][key] = json.loads(value, parse_float=Decimal)
            assert producer.flush(60) == 0
            customers, accounts = tables[customers_topic], tables[accounts_topic]
            for (how, output), peer in peers.items():
                assert peer.wait_caught_up(timeout_s=300) > 0  # a commit flushes the caches and the producer
                got = {
                    key: json.loads(value, parse_float=Decimal)
                    for key, value in answers.latest_per_key(settings.kafka, output).items()
                }
                assert got == _joined_rows(customers, accounts, how), f"{how} join after round {n}"
                assert all(list(row) == list(_ROW_FIELDS) for row in got.values())
                # balances as written, trailing zeros kept (Decimal("12.5") == Decimal("12.50"), not as text)
                assert [str(row["balance"]) for row in got.values()] == [
                    str(accounts.get(key, {}).get("balance")) for key in got
                ]
        assert len(customers) == 6 and len(accounts) == 5 and customers.keys() ^ accounts.keys()
    finally:
        for peer in peers.values():
            peer.stop()
    for store in ("customers", "accounts"):  # the tables' RocksDB stores, by name
        assert all(
            partition_offsets(settings.kafka, f"{peer.application_id}-{store}-changelog") for peer in peers.values()
        )


def test_the_stream_table_join_twin_enriches_orders_as_of_their_time(
    kafka_broker, settings, classpath, tmp_path, unique
):
    """Kafka Streams' stream-table join (``leftJoin`` with a 1 min grace period over a versioned table with 24 h
    of history, KIP-923) of adversarial orders with a customers change stream equals
    spark_jobs.reference.generators.orders.expected_enrichment, the reference the platform's order_enrichment is held to:
    each order joined once with the customer row valid at its time (updates and deletes within seconds of an
    order, orders at the time of an update, retried orders, late orders, a customer that never exists),
    the orders of each partition's last minute of stream time still held at the end, amounts as written; a tie
    between an order and another customer's change after a table record, then a late order
    (:func:`~spark_jobs.reference.generators.orders.tie_then_late`)."""
    from decimal import Decimal

    from spark_jobs.io.kafka_topics import partition_offsets, read_partition
    from spark_jobs.reference.generators import orders as generator
    from spark_jobs.reference.generators.producer import kafka_partition

    orders, customers = generator.adversarial()
    tie_orders, tie_customers = generator.tie_then_late(max(r.time_ms for r in orders + customers), 2)
    orders, customers = orders + tie_orders, customers + tie_customers
    assert {kafka_partition(r.key, 2) for r in orders} == {0, 1}
    want = generator.expected_enrichment(orders, customers, 2, 60_000, 24 * 3600 * 1000)
    # a tie between the topics is broken as Kafka Streams breaks it: the topic not taken last first
    assert [row[4].endswith("-first") for row in want.values() if row[1] == "late-k"] == [True]
    assert sum(row[4] is None for row in want.values()) > 5 and sum(row[4] is not None for row in want.values()) > 100
    assert len({row[1] for row in want.values()}) < len(want)  # retried orders are joined twice

    orders_topic, customers_topic = f"orders-{unique}", f"customer-profiles-{unique}"
    app, output = f"ksorders-{unique}", f"ksorders-{unique}-out"
    for topic in (orders_topic, customers_topic):
        ensure_topic(settings.kafka, topic, 2)
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)  # not compacted: one record per order
    generator.produce(settings.kafka, customers_topic, customers, partitions=2)
    generator.produce(settings.kafka, orders_topic, orders, partitions=2)
    peer = KafkaStreamsPeer(
        classpath,
        settings,
        "order_enrichment",
        app,
        tmp_path / app,
        f"{orders_topic},{customers_topic}",
        output,
        threads=1,
    )
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0  # a commit flushes the producer: the output is complete
    finally:
        peer.stop()

    consumer = _readback_consumer(settings, unique)
    try:
        emitted = [
            (msg.key().decode(), json.loads(msg.value(), parse_float=Decimal))
            for p in (0, 1)
            for msg in read_partition(consumer, output, p)
        ]
    finally:
        consumer.close()
    assert all(key == row["customer_id"] for key, row in emitted)
    assert all(list(row) == [*generator.FIELDS, "source_partition", "source_offset"] for _, row in emitted)
    got = {
        (row["source_partition"], row["source_offset"]): tuple(row[field] for field in generator.FIELDS)
        for _, row in emitted
    }
    assert len(got) == len(emitted), "an order joined more than once"
    assert 0.8 * len(orders) < len(got) < len(orders)  # each partition's last minute is still held
    assert got == want
    # amounts as written (Decimal("12.5") == Decimal("12.50"): compare the text)
    assert {k: str(row[2]) for k, row in got.items()} == {k: str(row[2]) for k, row in want.items()}
    # the versioned table's and the join buffer's (Joined "order-enrichment") RocksDB stores, by name
    for store in ("customer-profiles", "order-enrichment-Buffer"):
        assert any(high > 0 for _, high in partition_offsets(settings.kafka, f"{app}-{store}-changelog").values())


def test_the_twin_of_a_stream_joined_with_two_tables_enriches_orders_as_of_their_time(
    kafka_broker, settings, classpath, tmp_path, unique
):
    """Kafka Streams' ``orders.leftJoin(customers).leftJoin(creditLines)`` (two versioned tables of 24 h history,
    no grace, one task per partition of the three co-partitioned topics) equals
    spark_jobs.reference.generators.credit.expected_credit_enrichment, the reference the platform's
    order_credit_enrichment is held to: each order joined once with the customer and the credit line valid at its
    time (changes and closings within seconds of an order, written after it; retried and late orders; a customer
    without rows). No two topics hold records of one time in a partition (``ties=False``): Kafka Streams breaks
    such a tie by its priority queue's order, which no rule states."""
    from decimal import Decimal

    from spark_jobs.io.kafka_topics import read_partition
    from spark_jobs.reference.generators import credit
    from spark_jobs.reference.generators.orders import produce

    stream, profiles, lines = credit.adversarial_inputs(orders=300, seed=5, ties=False)
    want = credit.expected_credit_enrichment([(stream, profiles, lines)], 2, 24 * 3600 * 1000)
    topics = (f"orders-{unique}", f"customer-profiles-{unique}", f"credit-lines-{unique}")
    app, output = f"kscredit-{unique}", f"kscredit-{unique}-out"
    for topic, records in zip(topics, (stream, profiles, lines), strict=True):
        ensure_topic(settings.kafka, topic, 2)
        produce(settings.kafka, topic, records, partitions=2)
    ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)  # not compacted: one record per order
    peer = KafkaStreamsPeer(
        classpath, settings, "order_credit_enrichment", app, tmp_path / app, ",".join(topics), output, threads=1
    )
    try:
        assert peer.wait_caught_up(timeout_s=300) > 0
    finally:
        peer.stop()

    consumer = _readback_consumer(settings, unique)
    try:
        emitted = [
            json.loads(msg.value(), parse_float=Decimal) for p in (0, 1) for msg in read_partition(consumer, output, p)
        ]
    finally:
        consumer.close()
    assert all(list(row) == [*credit.FIELDS, "source_partition", "source_offset"] for row in emitted)
    got = {(row["source_partition"], row["source_offset"]): tuple(row[f] for f in credit.FIELDS) for row in emitted}
    assert len(got) == len(emitted) == len(stream), "each order joined once"
    assert got == want
    assert sum(row[4] is None for row in want.values()) > 5 and sum(row[6] is None for row in want.values()) > 5


def test_the_stream_stream_join_twin_matches_orders_and_payments(kafka_broker, settings, classpath, tmp_path, unique):
    """Kafka Streams' windowed stream-stream joins (``join``, ``leftJoin``, ``outerJoin`` of orders with payments,
    10 min before and after, 1 min grace, KS 3.1+ semantics) of adversarial input over 2 partitions emit exactly
    what spark_jobs.reference.generators.payments.expected_join computes, result by result (matched by the sides' source
    partitions and offsets), with the timestamps it implies: payments at the window's bounds, unpaid orders,
    payments of no order, orders paid twice, retried records, late records (joined while the other side still
    holds their partner, else emitted unmatched at once), unmatched records emitted once their window has closed
    but held back while the join's ``minTime`` says so, and the records still pending at the end never emitted.
    The twin runs with the wall-clock throttle of those emissions off (its emit interval 0): its output then
    depends on the input alone."""
    from decimal import Decimal

    from spark_jobs.io.kafka_topics import read_partition
    from spark_jobs.reference.generators import payments as generator
    from spark_jobs.reference.generators.producer import kafka_partition

    window, grace = 10 * 60_000, 60_000
    orders, payments = generator.adversarial(window_ms=window, grace_ms=grace)
    # each side's records per partition in offset order: (partition, offset) -> record
    written = {
        side: {
            (p, offset): r
            for p in (0, 1)
            for offset, r in enumerate(r for r in records if kafka_partition(r.key, 2) == p)
        }
        for side, records in (("order", orders), ("payment", payments))
    }
    firsts = {side: {p: at[p, 0].time_ms for p in (0, 1)} for side, at in written.items()}
    assert all(firsts["order"][p] != firsts["payment"][p] for p in (0, 1)), "a tie at a task's first record"
    joins = ("inner", "left", "outer")
    want = {how: generator.expected_join(orders, payments, 2, window, grace, how) for how in joins}

    # the input covers the rules (spark_jobs/reference/generators/payments.py)
    def gap(coordinates) -> int:
        op, oo, pp, po = coordinates
        return written["payment"][pp, po].time_ms - written["order"][op, oo].time_ms

    pairs = list(want["inner"])
    assert {-window, window, -window + 1, window - 1} <= {gap(k) for k in pairs}  # the bounds are in
    assert all(abs(gap(k)) <= window for k in pairs)
    assert any(
        abs(p.time_ms - o.time_ms) == window + 1 for o in orders for p in payments if o.key == p.key
    )  # and some pairs just outside
    joined_orders = [k[:2] for k in pairs]
    assert len(set(joined_orders)) < len(joined_orders)  # orders paid twice, retried payments
    assert len({row[0] for row in want["inner"].values()}) < len({k[:2] for k in pairs})  # retried orders
    unmatched_orders = {k[:2] for k in want["left"] if k[2] is None}
    assert unmatched_orders & set(joined_orders), "no order emitted unmatched and then joined by a late payment"
    assert len(unmatched_orders) > 10 and sum(k[0] is None for k in want["outer"]) > 10
    assert set(written["order"]) - {k[:2] for k in want["left"]}, "no order still pending at the end"
    held_back = {  # joined only by payments that arrived well after the order's window closed, never unmatched
        k[:2]
        for k in want["left"]
        if k[2] is not None
        and k[:2] not in unmatched_orders
        and all(
            written["payment"][j[2:]].arrival_ms > written["order"][k[:2]].time_ms + window + grace + 60_000
            for j in pairs
            if j[:2] == k[:2]
        )
    }
    assert held_back, "no order whose unmatched result minTime held back until a late payment joined it"
    assert set(want["inner"]) <= set(want["left"]) & set(want["outer"])  # the same pairs: the same fetches

    orders_topic, payments_topic = f"orders-{unique}", f"payments-{unique}"
    for topic in (orders_topic, payments_topic):
        ensure_topic(settings.kafka, topic, 2)
    generator.produce(settings.kafka, orders_topic, orders, partitions=2)
    generator.produce(settings.kafka, payments_topic, payments, partitions=2)
    peers = {}
    try:
        for how in joins:
            app, output = f"kspayments-{how}-{unique}", f"kspayments-{how}-{unique}-out"
            ensure_topic(settings.kafka, output, 2, config=OUTPUT_TOPIC_CONFIG)  # not compacted: one per result
            peers[how] = KafkaStreamsPeer(
                classpath,
                settings,
                f"order_payments_{how}",
                app,
                tmp_path / app,
                f"{orders_topic},{payments_topic}",
                output,
                threads=1,
                jvm_options=("-Dstreams.__emit.interval.ms.kstreams.outer.join.spurious.results.fix__=0",),
            )
        for peer in peers.values():
            assert peer.wait_caught_up(timeout_s=300) > 0  # a commit flushes the producer: the output is complete
    finally:
        for peer in peers.values():
            peer.stop()

    consumer = _readback_consumer(settings, unique)
    try:
        for how in joins:
            emitted = [
                (msg.key().decode(), msg.timestamp()[1], json.loads(msg.value(), parse_float=Decimal))
                for p in (0, 1)
                for msg in read_partition(consumer, f"kspayments-{how}-{unique}-out", p)
            ]
            assert all(key == row["order_id"] for key, _, row in emitted)
            assert all(list(row) == [*generator.FIELDS, *generator.SOURCE] for _, _, row in emitted)
            got = {
                tuple(row[f] for f in generator.SOURCE): tuple(row[f] for f in generator.FIELDS)
                for _, _, row in emitted
            }
            assert len(got) == len(emitted), f"{how}: a result emitted more than once"
            missing, extra = set(want[how]) - set(got), set(got) - set(want[how])
            assert not missing and not extra, f"{how}: missing {sorted(missing)[:10]}, extra {sorted(extra)[:10]}"
            assert got == want[how], how
            # decimals as written (Decimal("12.5") == Decimal("12.50"): compare the text)
            assert {k: (str(r[2]), str(r[5])) for k, r in got.items()} == {
                k: (str(r[2]), str(r[5])) for k, r in want[how].items()
            }
            # an inner result carries the later of its two times, an unmatched record its own
            times = {
                k: max(
                    written[side][k[i], k[i + 1]].time_ms
                    for side, i in (("order", 0), ("payment", 2))
                    if k[i] is not None
                )
                for k in got
            }
            assert {tuple(row[f] for f in generator.SOURCE): t for _, t, row in emitted} == times, how
    finally:
        consumer.close()
