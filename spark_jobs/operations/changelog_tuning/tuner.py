"""The tuning steps the DAG runs, as plain functions: measure every changelog, apply (or dry-run)
the recommendations, roll a change back, and judge the effect over runs.

Every step writes what it saw and decided to :mod:`.history` before returning.
"""

from __future__ import annotations

import dataclasses

from confluent_kafka.admin import AdminClient

from runtime.kafka_connection import client_config
from runtime.settings import Settings
from spark_jobs.io.kafka_topics import existing_topics
from spark_jobs.operations.changelog_tuning import history, topic_configs
from spark_jobs.operations.changelog_tuning.measure import (
    ChangelogMeasurement,
    ChangelogTarget,
    broker_log_dirs,
    changelog_targets,
    measure_changelog,
)
from spark_jobs.operations.changelog_tuning.recommend import Recommendation
from spark_jobs.operations.changelog_tuning.topic_configs import ConfigValue, TopicConfigError


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(client_config(settings.kafka, {"log_level": 3}))


def measure_all(settings: Settings, run_id: str, on_topic=None) -> list[tuple[ChangelogTarget, ChangelogMeasurement]]:
    """Measure the changelog of every store of every registered job version that exists on the
    cluster, record the measurements, and return them. ``on_topic(i, n, measurement)`` reports progress."""
    targets = changelog_targets()
    present = existing_topics(settings.kafka, [t.topic for t in targets])
    targets = [t for t in targets if t.topic in present]
    log_dirs = broker_log_dirs(_admin(settings))
    results = []
    for i, target in enumerate(targets, 1):
        m = measure_changelog(
            settings.kafka, target.topic, max_records=settings.compaction.scan_max_records, log_dirs=log_dirs
        )
        results.append((target, m))
        if on_topic:
            on_topic(i, len(targets), m)
    history.record_measurements(settings, [history.measurement_row(run_id, t, m) for t, m in results])
    return results


@dataclasses.dataclass
class TopicOutcome:
    topic: str
    action: str  # dry_run | applied | unchanged | held | failed | rolled_back | nothing_to_roll_back
    changes: dict[str, str | None]
    detail: str = ""


def apply_recommendations(
    settings: Settings, run_id: str, target: ChangelogTarget, recs: list[Recommendation], *, dry_run: bool, by: str
) -> TopicOutcome:
    """Dry run: record the proposals, change nothing. Otherwise: let the broker validate the change
    (``validate_only``), apply it, re-describe to verify, and record the previous values for rollback."""
    changes = {r.config: r.proposed for r in recs}
    if not recs:
        return TopicOutcome(target.topic, "unchanged", {})
    admin = _admin(settings)
    before = topic_configs.describe(admin, [target.topic])[target.topic]

    def rows(action: str, detail: str = "") -> list[dict]:
        return [
            history.change_row(
                run_id,
                target,
                config=r.config,
                action=action,
                previous_value=before.get(r.config, ConfigValue(None, True)).value,
                previous_is_default=before.get(r.config, ConfigValue(None, True)).is_default,
                new_value=r.proposed,
                reason=r.reason,
                by=by,
                detail=detail,
            )
            for r in recs
        ]

    try:
        topic_configs.alter(admin, target.topic, changes, validate_only=True)
        if dry_run:
            history.record_changes(settings, rows(history.DRY_RUN, "validated by the broker, not applied"))
            return TopicOutcome(target.topic, "dry_run", changes, "validated by the broker, not applied")
        topic_configs.alter(admin, target.topic, changes, validate_only=False)
        wrong = topic_configs.mismatches(admin, target.topic, {k: ConfigValue(v, False) for k, v in changes.items()})
        if wrong:
            raise TopicConfigError(f"{target.topic}: applied but reads back differently: {wrong}")
    except TopicConfigError as err:
        history.record_changes(settings, rows(history.FAILED, str(err)))
        return TopicOutcome(target.topic, "failed", changes, str(err))
    history.record_changes(settings, rows(history.APPLIED))
    return TopicOutcome(target.topic, "applied", changes)


def roll_back(
    settings: Settings, run_id: str, target: ChangelogTarget, *, undo_run_id: str | None, by: str, dry_run: bool = False
) -> TopicOutcome:
    """Restore the values ``undo_run_id`` (default: the newest change not yet undone) replaced: set
    the old value where the topic had its own, delete the override where it had a default. Verified
    by re-describing; the topic is then held (scheduled runs leave it alone)."""
    undo_run_id, applied = history.changes_to_roll_back(history.changes(settings, target.topic), undo_run_id)
    if not applied:
        return TopicOutcome(target.topic, "nothing_to_roll_back", {}, f"no applied change to undo (run {undo_run_id})")
    previous = {r["config"]: ConfigValue(r["previous_value"], bool(r["previous_is_default"])) for r in applied}
    changes = {name: (None if value.is_default else value.value) for name, value in previous.items()}
    admin = _admin(settings)
    current = topic_configs.describe(admin, [target.topic])[target.topic]

    def rows(action: str, detail: str) -> list[dict]:
        return [
            history.change_row(
                run_id,
                target,
                config=name,
                action=action,
                previous_value=current[name].value,
                previous_is_default=current[name].is_default,
                new_value=previous[name].value,
                reason=f"roll back run {undo_run_id}",
                by=by,
                detail=detail,
            )
            for name in previous
        ]

    try:
        topic_configs.alter(admin, target.topic, changes, validate_only=True)
        if dry_run:
            return TopicOutcome(target.topic, "dry_run", changes, f"would roll back run {undo_run_id}")
        topic_configs.alter(admin, target.topic, changes, validate_only=False)
        wrong = topic_configs.mismatches(admin, target.topic, previous)
        if wrong:
            raise TopicConfigError(f"{target.topic}: rolled back but reads back differently: {wrong}")
    except TopicConfigError as err:
        history.record_changes(settings, rows(history.FAILED, str(err)))
        return TopicOutcome(target.topic, "failed", changes, str(err))
    # detail = the run undone: history.changes_to_roll_back matches on it
    history.record_changes(settings, rows(history.ROLLED_BACK, undo_run_id))
    return TopicOutcome(target.topic, "rolled_back", changes, f"undid run {undo_run_id}")
