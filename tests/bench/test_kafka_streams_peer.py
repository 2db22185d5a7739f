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
from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def classpath() -> str:
    return build()


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
    equal spark_jobs.generators.pulse.expected, the reference the platform's window processor is held
    to under any micro-batching (tests/spark_jobs/test_patient_heart_rate_semantics.py). The peer has no
    check-outs, so the input has none."""
    from spark_jobs.generators import pulse
    from spark_jobs.generators.producer import kafka_partition

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
    spark_jobs.generators.temperatures.expected: the reference temperature_averages' processor is held to
    under any micro-batching (tests/spark_jobs/test_temperature_averages.py). The peer has no removals."""
    from spark_jobs.generators import temperatures

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
    ends with the store spark_jobs.generators.activity.expected computes: the reference the platform's
    ExpiringAggregate is held to under any micro-batching (tests/spark_jobs/test_event_time_ttl.py)."""
    from spark_jobs.generators import activity
    from spark_jobs.generators.producer import produce_keyed

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
    tombstones), equal spark_jobs.generators.sessions.expected: the reference user_sessions' processor is held
    to under any micro-batching (tests/spark_jobs/test_user_sessions.py). The peer has no deletes."""
    from spark_jobs.generators import sessions

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
    (adder and subtractor) into the day's top 10, equal spark_jobs.generators.ticks' references
    (daily_changes, then top_movers): what the platform's streaming job and the batch step
    daily_top_movers are held to. The generator's late ticks (change 100 on the first day) must not count."""
    from spark_jobs.generators import ticks
    from spark_jobs.generators.producer import kafka_partition, produce_keyed
    from spark_jobs.generators.windows import millis
    from spark_jobs.kafka_topics import partition_offsets

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
