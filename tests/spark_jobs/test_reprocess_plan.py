"""Reprocessing plans on the real broker: start positions resolved to offsets, bad requests rejected with
the reason, plans that name everything they would touch, resets that refuse while the lease is held,
and the version pointer. No Spark needed: plans and resets work on topics, files and Delta logs."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from spark_jobs.driver.lease import JobLease
from spark_jobs.io.kafka_topics import ensure_topic, existing_topics, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.plan import RESET, SIDE_BY_SIDE, BadReprocessRequest, ReprocessPlan, make_plan
from spark_jobs.operations.reprocess.positions import BadStartPosition, parse_datetime, parse_duration
from spark_jobs.operations.reprocess.purge import purge_candidates, purge_version
from spark_jobs.operations.reprocess.reset import ResetRefused, reset_in_place
from spark_jobs.reference.generators.purchases import generate, produce
from spark_jobs.registry import get_job
from spark_jobs.versions import JobVersions

JOB_MODULES = "tests.fixtures.reprocess_jobs"


@pytest.fixture(scope="module")
def fixture_jobs():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAMSTATE_JOB_MODULES", JOB_MODULES)
        yield


def test_durations_and_datetimes():
    assert parse_duration("6h") == dt.timedelta(hours=6)
    assert parse_duration("PT1H30M") == dt.timedelta(minutes=90)
    assert parse_duration("2d") == dt.timedelta(days=2)
    for bad in ("", "6 hours", "P", "0s", "-1h"):
        with pytest.raises(BadStartPosition):
            parse_duration(bad)
    assert parse_datetime("2026-11-22T09:30:00").tzinfo == dt.timezone.utc
    assert parse_datetime("2026-11-22T09:30:00Z") == parse_datetime("2026-11-22T10:30:00+01:00")
    with pytest.raises(BadStartPosition, match="ISO 8601"):
        parse_datetime("yesterday")


@pytest.fixture(scope="module")
def topic_with_two_batches(settings, kafka_broker, fixture_jobs):
    """planned_counts' input: batch A, then (a moment later) batch B; returns B's first offsets and time."""
    spec = get_job("planned_counts")
    ensure_topic(settings.kafka_bootstrap_servers, spec.source_topic, spec.source_partitions)
    before = partition_offsets(settings.kafka_bootstrap_servers, spec.source_topic)
    produce(settings.kafka_bootstrap_servers, spec.source_topic, list(generate(40, users=10, seed=1)))
    time.sleep(1.2)
    between = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.2)
    after_a = {
        p: high for p, (_, high) in partition_offsets(settings.kafka_bootstrap_servers, spec.source_topic).items()
    }
    produce(settings.kafka_bootstrap_servers, spec.source_topic, list(generate(30, users=10, seed=2)))
    return spec, before, between, after_a


def test_start_positions_resolve_to_explicit_offsets(settings, topic_with_two_batches):
    spec, before, between, after_a = topic_with_two_batches
    base = {"job": "planned_counts", "mode": RESET, "dry_run": True}
    plan = make_plan(settings, {**base, "start_from": "datetime", "start_datetime": between.isoformat()})
    topic = spec.source_topic
    assert plan.start_offsets == {topic: after_a}  # the first record of batch B, per partition
    assert plan.records_to_process == 30
    earliest = make_plan(settings, {**base, "start_from": "earliest"})
    assert earliest.start_offsets == {topic: {p: low for p, (low, _) in before.items()}}
    recent = make_plan(settings, {**base, "start_from": "duration", "start_duration": "1h"})
    assert recent.start_offsets == earliest.start_offsets  # everything is younger than an hour
    explicit = make_plan(settings, {**base, "start_from": "offsets", "start_offsets": {"0": after_a[0]}})
    assert explicit.start_offsets == {topic: {0: after_a[0], 1: earliest.start_offsets[topic][1]}}
    named = make_plan(settings, {**base, "start_from": "offsets", "start_offsets": {topic: {"0": after_a[0]}}})
    assert named.start_offsets == explicit.start_offsets


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"job": "no_such_job", "mode": RESET}, "unknown job 'no_such_job'"),
        ({"job": "planned_counts", "mode": "rewind"}, "mode 'rewind'"),
        (
            {"job": "planned_counts", "mode": RESET, "start_from": "offsets", "start_offsets": {"7": 0}},
            r"has no partition \[7\]",
        ),
        (
            {"job": "planned_counts", "mode": RESET, "start_from": "offsets", "start_offsets": {"0": 10**9}},
            "is outside",
        ),
        (
            {
                "job": "planned_counts",
                "mode": RESET,
                "start_from": "datetime",
                "start_datetime": "2999-01-01T00:00:00Z",
            },
            "is in the future",
        ),
        ({"job": "planned_counts", "mode": RESET, "start_from": "datetime"}, "needs start_datetime"),
        (
            {"job": "planned_counts", "mode": RESET, "start_from": "duration", "start_duration": "soon"},
            "expected e.g. 6h",
        ),
        ({"job": "planned_counts", "mode": RESET, "dry_run": False}, "type the job name 'planned_counts'"),
        ({"job": "planned_counts", "mode": SIDE_BY_SIDE}, "already the current version"),
        ({"job": "gift_card_counts", "mode": SIDE_BY_SIDE, "version": 9}, "has no version 9"),
        ({"job": "unfed_counts", "mode": RESET}, "input topic 'reprocess-never-created' does not exist"),
        (
            {"job": "planned_counts", "mode": RESET, "start_from": "offsets", "start_offsets": {"payments": {"0": 1}}},
            r"does not read \['payments'\]",
        ),
    ],
)
def test_bad_requests_are_rejected_with_the_reason(settings, topic_with_two_batches, params, reason):
    with pytest.raises(BadReprocessRequest, match=reason):
        make_plan(settings, {"dry_run": True, **params})


def test_a_migration_from_a_rekeyed_version_is_refused_by_the_dry_run(settings, fixture_jobs):
    """The migrated state's position would be in v1's own repartition topic: the plan refuses, saying why."""
    JobVersions(settings).promote("rekeyed_tiered_counts", 1, by="test: v1 is current")
    with pytest.raises(BadReprocessRequest, match="migrate v1 -> v2 is not supported: v1 re-keys the source"):
        make_plan(settings, {"job": "rekeyed_tiered_counts", "mode": "migrate", "version": 2, "dry_run": True})


def test_reset_plan_names_every_artifact_and_reset_refuses_while_the_lease_is_held(settings, topic_with_two_batches):
    spec = topic_with_two_batches[0]
    plan = make_plan(
        settings,
        {
            "job": "planned_counts",
            "mode": RESET,
            "dry_run": False,
            "confirm": "planned_counts",
            "truncate_outputs": True,
        },
    )
    text = plan.render()
    for target in (
        "planned_counts-v1-counts-changelog",
        "planned_counts-v1-dead-letter",
        str(settings.checkpoints / spec.application_id),
        str(settings.lake / "_state" / spec.application_id),
        str(settings.lake / "planned_counts_v1"),
        "start-offsets.json",
    ):
        assert target in text, f"{target} missing from the plan:\n{text}"
    assert [a.verb for a in plan.actions if a.kind == "output table"] == ["truncate"]
    checkpoint = (settings.checkpoints / spec.application_id).path
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "marker").write_text("still here")
    layout = JobLayout.of(spec, settings)
    assert [(a.kind, a.target) for a in plan.actions if a.step == "stop"] == [
        ("spare driver", layout.spare.name),
        ("driver", spec.application_id),
        ("warm standby", layout.standby.name),
    ]
    for running in (layout.spare.name, layout.driver.name, layout.standby.name):  # a spare, a driver, a standby
        with JobLease(settings.status_dir, running):
            with pytest.raises(ResetRefused, match=f"{running} is held .* stop it first - nothing was touched"):
                reset_in_place(settings, plan)
    assert (checkpoint / "marker").read_text() == "still here"
    done = reset_in_place(settings, plan)
    assert str(checkpoint) in done["deleted_paths"] and not (checkpoint / "marker").exists()
    assert (checkpoint / "streamstate" / "start-offsets.json").exists()
    assert reset_in_place(settings, plan)["start_offsets_file"] == done["start_offsets_file"]  # again: no-op


def test_version_pointer_adopts_promotes_and_retires(settings, fixture_jobs, tmp_path):
    versions = JobVersions(settings.replace(data_dir=tmp_path))  # the DAG tests use gift_card_counts' pointer
    assert versions.current("gift_card_counts") is None
    assert versions.current_spec("gift_card_counts").version == 2  # newest registered, not recorded
    assert versions.current("gift_card_counts") is None
    assert versions.current_spec("gift_card_counts", adopt_by="test").version == 2
    assert versions.current("gift_card_counts") == 2
    assert versions.promote("gift_card_counts", 1, by="test") is True
    assert versions.promote("gift_card_counts", 1, by="test") is False  # idempotent
    assert versions.unfinished_promotion("gift_card_counts") == 2  # v2 replaced, not retired yet
    with pytest.raises(ValueError, match="is the current version"):
        versions.retire("gift_card_counts", 1, by="test", retain_until=dt.datetime.now(dt.timezone.utc))
    assert versions.promote("gift_card_counts", 2, by="test") is True
    until = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=7)
    assert versions.unfinished_promotion("gift_card_counts") == 1
    assert versions.retire("gift_card_counts", 1, by="test", retain_until=until) is True
    assert versions.retire("gift_card_counts", 1, by="test", retain_until=until) is False
    assert versions.unfinished_promotion("gift_card_counts") is None  # the promotion is complete
    assert [(e.version, e.event) for e in versions.history("gift_card_counts")] == [
        (2, "adopted"),
        (1, "promoted"),
        (2, "promoted"),
        (1, "retired"),
    ]
    assert [e.version for e in versions.retired("gift_card_counts")] == [1]
    # A rollback and a second promotion: each one's old version must be retired again, once per promotion.
    assert versions.promote("gift_card_counts", 1, by="test") and versions.unfinished_promotion("gift_card_counts") == 2
    assert versions.retire("gift_card_counts", 2, by="test", retain_until=until) is True
    assert versions.promote("gift_card_counts", 2, by="test") and versions.unfinished_promotion("gift_card_counts") == 1
    assert versions.retire("gift_card_counts", 1, by="test", retain_until=until) is True  # retired before, not since
    assert versions.unfinished_promotion("gift_card_counts") is None
    assert [e.version for e in versions.retired("gift_card_counts")] == [1]  # v2 was promoted back: not retired


def test_retired_versions_are_purged_after_their_retention_only(settings, kafka_broker, fixture_jobs, tmp_path):
    own = settings.replace(data_dir=tmp_path)  # its own lake and pointer, the shared broker
    v1 = get_job("retired_counts", 1)
    art = JobLayout.of(v1, own)
    for path in (art.checkpoint / "commits", art.output_tables[0], art.snapshot_tables[0]):
        Path(path).mkdir(parents=True)
    ensure_topic(own.kafka_bootstrap_servers, art.changelog_topics[0], v1.source_partitions)
    versions = JobVersions(own)
    versions.promote("retired_counts", 2, by="test")
    now = dt.datetime.now(dt.timezone.utc)
    versions.retire("retired_counts", 1, by="test", retain_until=now + dt.timedelta(days=1))

    [kept] = purge_candidates(own, now)
    assert kept.blocked.startswith("kept until") and f"topic {art.changelog_topics[0]}" in kept.targets
    later = now + dt.timedelta(days=2)
    with JobLease(own.status_dir, v1.application_id):  # a driver of v1 still runs
        assert purge_candidates(own, later)[0].blocked == "its driver is running"
    with JobLease(own.status_dir, art.standby.name):  # its warm standby still runs: it writes the snapshots
        assert purge_candidates(own, later)[0].blocked == "its warm standby is running"
        with pytest.raises(RuntimeError, match="standby runs"):
            purge_version(own, "retired_counts", 1, by="test")
    with JobLease(own.status_dir, art.spare.name):  # its spare driver still runs: it would take over
        assert purge_candidates(own, later)[0].blocked == "its spare driver is running"
    art.standby_status.write_text("{}")
    [due] = purge_candidates(own, later)
    owned = [
        art.checkpoint,
        art.output_tables[0],
        art.snapshot_tables[0],
        art.driver.lease,
        art.spare.lease,
        art.standby.lease,
        art.standby_status,
    ]
    assert due.blocked is None and len(due.targets) == len(owned) + 1  # and the changelog topic
    assert all(any(t.startswith(f"{p} (") for t in due.targets) for p in owned), due.targets
    purge_version(own, "retired_counts", 1, by="test")
    assert [a.location for a in art.artifacts() if a.system != "kafka" and Path(a.location).exists()] == []
    assert not existing_topics(own.kafka_bootstrap_servers, list(art.changelog_topics))
    assert purge_candidates(own, later) == []  # purged once, recorded
    with pytest.raises(ValueError, match="current version"):
        purge_version(own, "retired_counts", 2, by="test")


def test_a_start_the_source_no_longer_holds_is_refused_unless_the_gap_is_accepted(settings, fixture_jobs):
    spec = get_job("gapped_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, 1)
    long_ago = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    produce(bootstrap, spec.source_topic, list(generate(30, users=5, seed=4)))
    # Retention deletes the head of the log (what a broker's retention.ms does to old segments).
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(spec.source_topic, 0, 12)]).values():
        future.result(30)
    base = {"job": "gapped_counts", "mode": RESET, "dry_run": True}

    for start in (
        {"start_from": "datetime", "start_datetime": long_ago.isoformat()},
        {"start_from": "duration", "start_duration": "2h"},
        {"start_from": "offsets", "start_offsets": {"0": 3}},
    ):
        with pytest.raises(
            BadReprocessRequest, match="no longer holds .*partition 0: up to \\d+ records before offset 12"
        ):
            make_plan(settings, {**base, **start})
    plan = make_plan(settings, {**base, "start_from": "offsets", "start_offsets": {"0": 3}, "accept_history_gap": True})
    topic = spec.source_topic
    assert (plan.start_offsets, plan.history_gap) == ({topic: {0: 12}}, {topic: {0: 9}})
    plan = make_plan(
        settings, {**base, "start_from": "datetime", "start_datetime": long_ago.isoformat(), "accept_history_gap": True}
    )
    assert plan.history_gap == {topic: {0: 12}} == ReprocessPlan.from_dict(plan.to_dict()).history_gap
    text = plan.render()
    assert "HISTORY GAP (accepted): partition 0: up to 12 records" in text and "retention.ms=604800000" in text
    earliest = make_plan(settings, base)  # everything the topic holds: no gap, but the plan says what is gone
    assert earliest.history_gap == {} and earliest.start_offsets == {topic: {0: 12}}
    assert any(
        f"retention of {topic} already deleted the head of partition 0 (offsets below 12)" in note
        for note in earliest.notes
    )
    later = make_plan(settings, {**base, "start_from": "offsets", "start_offsets": {"0": 20}})
    assert later.history_gap == {} and "HISTORY GAP" not in later.render()


def _timed(kafka, topic: str, keys_and_times: list[tuple[str, int]]) -> None:
    """Records of ``topic`` (2 partitions), each with its key and Kafka timestamp (ms), in list order."""
    from spark_jobs.reference.generators.orders import Record
    from spark_jobs.reference.generators.orders import produce as produce_records

    ensure_topic(kafka, topic, 2)
    produce_records(kafka, topic, [Record(key, {"key": key}, at, at) for key, at in keys_and_times], 2)


def test_a_joins_streams_start_at_the_position_and_its_table_from_earliest(settings, kafka_broker, fixture_jobs):
    """Each input of a join gets its own start: a stream at the requested position, a table (its topic is the
    table) from earliest; explicit offsets name their topic when the job reads two streams."""
    bootstrap = settings.kafka_bootstrap_servers
    hour = 3_600_000
    # recent times: records older than the broker's retention (7 days) may be deleted before the plan reads them
    t = (int(time.time() * 1000) // hour - 3) * hour
    at = dt.datetime.fromtimestamp((t + hour // 2) / 1000, dt.timezone.utc).isoformat()
    for topic in (
        "reprocess-planned-orders",
        "reprocess-planned-profiles",
        "reprocess-placed-orders",
        "reprocess-payments",
    ):
        _timed(bootstrap, topic, [(f"c{n % 4}", t + (n // 4) * hour) for n in range(8)])  # 4 at 9:00, 4 at 10:00
    ends = {
        topic: {p: high for p, (_l, high) in partition_offsets(bootstrap, topic).items()}
        for topic in (
            "reprocess-planned-orders",
            "reprocess-planned-profiles",
            "reprocess-placed-orders",
            "reprocess-payments",
        )
    }
    after = {topic: offsets_for_time_after(bootstrap, topic, at) for topic in ends}

    enrichment = make_plan(
        settings,
        {"job": "planned_enrichment", "mode": RESET, "dry_run": True, "start_from": "datetime", "start_datetime": at},
    )
    assert enrichment.inputs == {"reprocess-planned-orders": "stream", "reprocess-planned-profiles": "table"}
    assert enrichment.start_offsets == {
        "reprocess-planned-orders": after["reprocess-planned-orders"],
        "reprocess-planned-profiles": {0: 0, 1: 0},
    }
    assert enrichment.input_end == {t: ends[t] for t in enrichment.inputs}
    assert enrichment.records_to_process == 4 + 8
    text = enrichment.render()
    assert "input reprocess-planned-profiles (table), start: earliest (a table is read whole)" in text, text
    assert any("reprocess-planned-profiles is a table: read from earliest" in note for note in enrichment.notes)
    assert ReprocessPlan.from_dict(enrichment.to_dict()) == enrichment

    base = {"job": "paired_orders", "mode": RESET, "dry_run": True}
    pairs = make_plan(settings, {**base, "start_from": "datetime", "start_datetime": at})
    assert pairs.start_offsets == {t: after[t] for t in ("reprocess-placed-orders", "reprocess-payments")}
    with pytest.raises(BadReprocessRequest, match="reads reprocess-placed-orders, reprocess-payments: name each"):
        make_plan(settings, {**base, "start_from": "offsets", "start_offsets": {"0": 1}})
    named = make_plan(settings, {**base, "start_from": "offsets", "start_offsets": {"reprocess-payments": {"1": 1}}})
    assert named.start_offsets == {"reprocess-placed-orders": {0: 0, 1: 0}, "reprocess-payments": {0: 0, 1: 1}}


def offsets_for_time_after(bootstrap: str, topic: str, iso: str) -> dict[int, int]:
    from spark_jobs.io.kafka_topics import offsets_for_time

    return offsets_for_time(bootstrap, topic, int(dt.datetime.fromisoformat(iso).timestamp() * 1000))
