"""Changelog tuning: the recommendation rules and the history logic (pure), the policy settings, and
topic config changes on the real broker (validate-only refusals, exact rollback of defaults)."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from confluent_kafka.admin import AdminClient

from runtime.settings import CompactionPolicy, Settings, SettingsError
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.operations.changelog_tuning import history, topic_configs
from spark_jobs.operations.changelog_tuning.measure import ChangelogMeasurement
from spark_jobs.operations.changelog_tuning.recommend import recommend
from spark_jobs.registry import JobSpec, StoreSpec, registered_versions
from spark_jobs.state.changelog import ChangelogTopic

KAFKA_DEFAULTS = {
    "cleanup.policy": "compact",
    "segment.bytes": str(1024**3),
    "segment.ms": "604800000",
    "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0",
    "max.compaction.lag.ms": str(2**63 - 1),
    "delete.retention.ms": "86400000",
    "retention.ms": "604800000",
}
KV = StoreSpec("counts")
WINDOWED = StoreSpec("windows", kind="windowed", window_ms=60_000, grace_ms=5_000, retention_ms=3_600_000)
VERSIONED = StoreSpec("history", kind="versioned", retention_ms=7_200_000)
SPEC = JobSpec(
    name="tuned",
    version=1,
    source_topic="t",
    key_field="k",
    output_table="tuned",
    entrypoint="m:f",
    stores=(KV, WINDOWED, VERSIONED),
)


def measurement(**overrides) -> ChangelogMeasurement:
    values = dict(
        topic="tuned-v1-counts-changelog",
        measured_at=dt.datetime.now(dt.timezone.utc),
        partitions=2,
        configs=dict(KAFKA_DEFAULTS),
        overridden=[],
        offset_span=50_000,
        records=50_000,
        scan_complete=True,
        live_keys=1_000,
        live_bytes=100_000,
        tombstones=10,
        markers=200,
        obsolete=48_800,
        history_records=0,
        oldest_obsolete_age_ms=3_600_000,
        bytes=5_000_000,
        bytes_source="log_dirs",
        segments=2,
        active_segment_bytes=5_000_000,
        dirty_ratio=0.0,
        dirty_ratio_source="log_dirs",
        write_bytes_per_s=50.0,
        scan_seconds=1.0,
    )
    values.update(overrides)
    return ChangelogMeasurement(**values)


def by_config(recs) -> dict:
    return {r.config: r for r in recs}


def test_key_value_store_under_defaults_gets_small_segments_and_a_bounded_lag():
    policy = CompactionPolicy(target_replay_ratio=1.5)
    recs = by_config(recommend(SPEC, KV, measurement(), policy))
    assert recs["segment.bytes"].proposed == str(1024**2)  # 50 KB live per partition: the 1 MiB floor
    assert "1.0 GiB" in recs["segment.bytes"].reason and "active segment" in recs["segment.bytes"].reason
    assert recs["segment.ms"].proposed == str(3 * 3_600_000)  # half of max_uncompacted 6 h
    assert "50.0 B/s" in recs["segment.ms"].reason
    assert (
        recs["max.compaction.lag.ms"].proposed == str(6 * 3_600_000)
        and "unbounded" in recs["max.compaction.lag.ms"].reason
    )
    assert recs["min.cleanable.dirty.ratio"].proposed == "0.33"  # 1 - 1/1.5
    assert set(recs) == {"segment.bytes", "segment.ms", "max.compaction.lag.ms", "min.cleanable.dirty.ratio"}


def test_tuned_topic_gets_no_further_changes():
    policy = CompactionPolicy(target_replay_ratio=1.5)
    first = recommend(SPEC, KV, measurement(), policy)
    tuned = measurement(configs={**KAFKA_DEFAULTS, **{r.config: r.proposed for r in first}})
    assert recommend(SPEC, KV, tuned, policy) == []


def test_default_target_keeps_kafkas_dirty_ratio_and_bounds_hold():
    # target 3 -> 1 - 1/3 = 0.67, above the policy's maximum 0.5 (Kafka's default): no change
    assert "min.cleanable.dirty.ratio" not in by_config(recommend(SPEC, KV, measurement(), CompactionPolicy()))
    # a huge target would ask for segments beyond the maximum: clamped
    big = measurement(live_bytes=20 * 1024**3)
    policy = CompactionPolicy(max_segment_bytes=256 * 1024**2)
    assert by_config(recommend(SPEC, KV, big, policy))["segment.bytes"].proposed == str(256 * 1024**2)
    # a fast writer fills a segment before segment.ms matters: no segment.ms change
    fast = measurement(write_bytes_per_s=10_000_000.0)
    assert "segment.ms" not in by_config(recommend(SPEC, KV, fast, CompactionPolicy()))


def test_a_config_the_job_declares_is_reported_but_never_applied():
    """``changelog_configs`` is the team's decision (Kafka Streams' ``withLoggingEnabled(map)``)."""
    own = dataclasses.replace(KV, changelog_configs={"min.cleanable.dirty.ratio": "0.9", "segment.ms": "604800000"})
    m = measurement(configs={**KAFKA_DEFAULTS, "min.cleanable.dirty.ratio": "0.9"})
    recs = by_config(recommend(SPEC, own, m, CompactionPolicy()))
    assert recs["min.cleanable.dirty.ratio"].held_by_job and recs["segment.ms"].held_by_job
    assert "not applied: the job sets min.cleanable.dirty.ratio=0.9" in recs["min.cleanable.dirty.ratio"].reason
    assert not recs["max.compaction.lag.ms"].held_by_job  # what the job leaves open is still tuned


@pytest.mark.parametrize(
    "spec",
    [s for versions in registered_versions().values() for s in versions.values()],
    ids=lambda s: s.application_id,
)
def test_the_platforms_own_changelogs_pass_its_tuners_retention_rules(spec):
    """Windowed retention has one meaning: the topic the platform creates is what its tuner requires."""
    for store in spec.stores:
        topic = ChangelogTopic(
            spec.application_id,
            store.name,
            spec.source_partitions,
            kind=store.kind,
            retention_ms=store.retention_ms,
            overrides=store.changelog_configs,
        )
        m = measurement(topic=topic.name, configs={**KAFKA_DEFAULTS, **topic.configs()})
        recs = by_config(recommend(spec, store, m, CompactionPolicy()))
        for config in ("cleanup.policy", "retention.ms", "min.compaction.lag.ms"):
            assert config not in recs, f"{topic.name}: the tuner would change {config}: {recs[config].reason}"


def test_windowed_store_deletes_by_time_no_earlier_than_its_retention_plus_a_day():
    m = measurement(topic="tuned-v1-windows-changelog", configs={**KAFKA_DEFAULTS, "retention.ms": "3600000"})
    recs = by_config(recommend(SPEC, WINDOWED, m, CompactionPolicy()))
    assert recs["cleanup.policy"].proposed == "compact,delete"
    assert recs["retention.ms"].proposed == str(3_600_000 + 86_400_000)
    assert "keeps a window 1 h from its start, the changelog 1 d longer" in recs["retention.ms"].reason


def test_versioned_store_keeps_its_history_and_max_lag_stays_above_min_lag():
    m = measurement(topic="tuned-v1-history-changelog")
    recs = by_config(recommend(SPEC, VERSIONED, m, CompactionPolicy()))
    assert recs["min.compaction.lag.ms"].proposed == "7200000"
    assert int(recs["max.compaction.lag.ms"].proposed) == 7_200_000 + 6 * 3_600_000


def test_key_value_store_never_deletes_by_time():
    m = measurement(configs={**KAFKA_DEFAULTS, "cleanup.policy": "compact,delete"})
    assert by_config(recommend(SPEC, KV, m, CompactionPolicy()))["cleanup.policy"].proposed == "compact"


def test_tombstones_outlive_the_snapshot_a_restore_starts_from():
    slow = JobSpec(
        name="slow",
        version=1,
        source_topic="t",
        key_field="k",
        output_table="slow",
        entrypoint="m:f",
        stores=(KV,),
        trigger_interval="1 minute",
        snapshot_every_batches=600,
    )  # a snapshot every 10 h
    recs = by_config(recommend(slow, KV, measurement(), CompactionPolicy()))
    assert recs["delete.retention.ms"].proposed == str(4 * 600 * 60_000)
    assert "10 tombstones" in recs["delete.retention.ms"].reason


def test_compaction_policy_from_env_and_its_bounds():
    settings = Settings.from_env(
        {"STREAMSTATE_COMPACTION_TARGET_REPLAY_RATIO": "1.5", "STREAMSTATE_COMPACTION_SCHEDULED_MODE": "dry_run"}
    )
    assert settings.compaction.target_replay_ratio == 1.5 and settings.compaction.scheduled_mode == "dry_run"
    assert Settings.from_env(settings.to_env()) == settings
    for bad in (
        {"STREAMSTATE_COMPACTION_MIN_SEGMENT_BYTES": "1000"},
        {"STREAMSTATE_COMPACTION_TARGET_REPLAY_RATIO": "1"},
        {"STREAMSTATE_COMPACTION_SCHEDULED_MODE": "yolo"},
        {"STREAMSTATE_COMPACTION_MIN_DIRTY_RATIO": "0.9"},
    ):
        with pytest.raises(SettingsError):
            Settings.from_env(bad)


def _row(run_id, action, config="segment.ms", at=0, detail=""):
    return {
        "run_id": run_id,
        "action": action,
        "config": config,
        "detail": detail,
        "at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=at),
    }


def test_rollback_picks_the_newest_change_not_undone_and_holds_the_topic():
    rows = [_row("r1", history.APPLIED, at=1), _row("r2", history.DRY_RUN, at=2), _row("r3", history.APPLIED, at=3)]
    assert history.changes_to_roll_back(rows)[0] == "r3" and not history.is_held(rows)
    rows.append(_row("r4", history.ROLLED_BACK, at=4, detail="r3"))
    assert history.is_held(rows)
    assert history.changes_to_roll_back(rows)[0] == "r1"  # the next rollback undoes the change before
    assert history.changes_to_roll_back(rows, "r3") == ("r3", [])  # already undone
    rows.append(_row("r5", history.APPLIED, at=5))
    assert not history.is_held(rows)  # an apply by name resumed it


def test_streak_above_target_and_before_after():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    ms = [
        {
            "measured_at": t0 + dt.timedelta(hours=i),
            "records": r,
            "live_keys": 100,
            "replay_ratio": r / 100,
            "excess_replay_ratio": r / 100,
        }
        for i, r in enumerate([500, 120, 900, 800])
    ]
    assert history.runs_above_target(ms, 3.0) == 2 and history.runs_above_target(ms[:2], 3.0) == 0
    changed = [{**_row("r", history.APPLIED), "at": t0 + dt.timedelta(hours=2, minutes=1)}]
    effect = history.before_and_after(ms, changed)
    assert (
        effect["before"]["records"] == 900 and effect["now"]["records"] == 800 and effect["records_reduction"] == 1.12
    )


@pytest.mark.integration
def test_broker_refuses_an_invalid_change_and_rollback_restores_defaults(settings, kafka_broker, unique):
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    topic = f"tuning-configs-{unique}"
    ensure_topic(
        settings.kafka_bootstrap_servers, topic, 1, config={"cleanup.policy": "compact", "segment.ms": "3600000"}
    )
    original = topic_configs.describe(admin, [topic])[topic]
    with pytest.raises(topic_configs.TopicConfigError, match="segment.bytes"):
        topic_configs.alter(admin, topic, {"segment.bytes": "1000"}, validate_only=True)  # below Kafka 4's 1 MiB
    topic_configs.alter(admin, topic, {"segment.ms": "60000", "max.compaction.lag.ms": "120000"}, validate_only=True)
    assert topic_configs.describe(admin, [topic])[topic] == original  # validate-only changed nothing

    topic_configs.alter(admin, topic, {"segment.ms": "60000", "max.compaction.lag.ms": "120000"}, validate_only=False)
    # mismatches re-reads until the broker has applied the change (KRaft applies it a moment after the ack)
    applied = {
        "segment.ms": topic_configs.ConfigValue("60000", False),
        "max.compaction.lag.ms": topic_configs.ConfigValue("120000", False),
    }
    assert topic_configs.mismatches(admin, topic, applied) == {}
    assert topic_configs.describe(admin, [topic])[topic]["max.compaction.lag.ms"] == applied["max.compaction.lag.ms"]
    never = {"segment.ms": topic_configs.ConfigValue("61000", False)}
    assert topic_configs.mismatches(admin, topic, never, settle_s=0.5) == {
        "segment.ms": (never["segment.ms"], applied["segment.ms"])
    }
    # roll back: the topic's own value is set again, the default becomes a default again
    topic_configs.alter(admin, topic, {"segment.ms": "3600000", "max.compaction.lag.ms": None}, validate_only=False)
    assert (
        topic_configs.mismatches(
            admin,
            topic,
            {"segment.ms": original["segment.ms"], "max.compaction.lag.ms": original["max.compaction.lag.ms"]},
        )
        == {}
    )
    assert topic_configs.describe(admin, [topic])[topic] == original
