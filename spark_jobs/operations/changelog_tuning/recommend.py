"""Topic config recommendations for one changelog, from its measurement and its store's kind.

Pure rules (no I/O), each recommendation carrying its reason in numbers. What the rules know about
Kafka's log cleaner (the seeds' "aggressive topic compaction", table 6-1):

- the **active segment is never cleaned**: superseded records in it wait until the segment rolls,
  by size (``segment.bytes``) or time (``segment.ms``);
- the cleaner starts on a log when the closed segments' dirty share reaches
  ``min.cleanable.dirty.ratio`` r; right after a clean they hold about one record per key, so just
  before the next one they hold up to 1 / (1 - r) records per key;
- ``max.compaction.lag.ms`` forces a clean (and a roll) once a superseded record is that old, whatever
  the ratio; ``min.compaction.lag.ms`` protects records younger than it (a versioned store's history);
- tombstones are removed ``delete.retention.ms`` after their segment was cleaned: a restore that
  starts from an older snapshot would miss the delete and bring the key back;
- windowed stores also delete by time (``compact,delete``), never before the store's retention (counted
  from a window's start, at least window + grace) plus Kafka Streams' extra day for the changelog.

Only changes are returned; a config already inside the rules is left alone (no churn). A config the job
declares (``StoreSpec.changelog_configs``, Kafka Streams' ``withLoggingEnabled(map)``) is the team's
decision: its recommendation is returned marked ``held_by_job`` and is never applied.
"""

from __future__ import annotations

import dataclasses
import math

from runtime.settings import CompactionPolicy
from spark_jobs.operations.changelog_tuning.measure import ChangelogMeasurement
from spark_jobs.registry import JobSpec, StoreSpec
from spark_jobs.state.changelog import (
    TIME_DELETED_KINDS,
    WINDOWED_CHANGELOG_EXTRA_RETENTION_MS,
    windowed_changelog_retention_ms,
)

#: how many snapshot intervals a tombstone must outlive (see the delete.retention.ms rule)
SNAPSHOT_INTERVALS_FOR_TOMBSTONES = 4


@dataclasses.dataclass(frozen=True)
class Recommendation:
    topic: str
    config: str
    current: str | None
    proposed: str
    reason: str
    #: the job declares this config (``StoreSpec.changelog_configs``): reported, never applied
    held_by_job: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def human_ms(ms: float) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            value = ms / size
            return f"{value:.0f} {unit}" if value == int(value) or value >= 10 else f"{value:.1f} {unit}"
    return f"{ms:.0f} ms"


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _int(configs: dict, name: str, default: int) -> int:
    value = configs.get(name)
    return int(value) if value not in (None, "") else default


def recommend(
    spec: JobSpec, store: StoreSpec, m: ChangelogMeasurement, policy: CompactionPolicy
) -> list[Recommendation]:
    """The config changes ``m.topic`` needs. ``m.configs`` are the effective values (defaults included)."""
    rules = _Rules(spec, store, m, policy)
    rules.cleanup_policy()
    min_lag = rules.min_compaction_lag()
    rules.max_compaction_lag(min_lag)
    segment_bytes = rules.segment_bytes()
    rules.segment_ms(segment_bytes)
    rules.dirty_ratio()
    rules.delete_retention()
    return rules.out


class _Rules:
    """:func:`recommend`'s rules, one method a config (or two that go together), each proposing its change."""

    def __init__(self, spec: JobSpec, store: StoreSpec, m: ChangelogMeasurement, policy: CompactionPolicy) -> None:
        self.spec, self.store, self.m, self.policy = spec, store, m, policy
        self.cfg = m.configs
        self.out: list[Recommendation] = []

    def propose(self, name: str, value, reason: str) -> None:
        """Adds the change of ``name`` to ``value`` unless it is the value already."""
        cfg, store = self.cfg, self.store
        if cfg.get(name) != str(value):
            held = name in store.changelog_configs
            if held:
                reason += f"; not applied: the job sets {name}={store.changelog_configs[name]} (changelog_configs)"
            self.out.append(Recommendation(self.m.topic, name, cfg.get(name), str(value), reason, held_by_job=held))

    def cleanup_policy(self) -> None:
        """cleanup.policy and retention.ms: what leaves the log by time."""
        cfg, store, m, propose = self.cfg, self.store, self.m, self.propose
        policies = set((cfg.get("cleanup.policy") or "compact").replace(" ", "").split(","))
        if store.kind in TIME_DELETED_KINDS:
            if policies != {"compact", "delete"}:
                propose(
                    "cleanup.policy",
                    "compact,delete",
                    f"windowed store: windows must also leave the changelog by time; with "
                    f"'{','.join(sorted(policies))}' every window ever written ({m.live_keys:,} live keys now) stays "
                    f"and is replayed on restore",
                )
            needed = windowed_changelog_retention_ms(store.retention_ms or 0)
            if _int(cfg, "retention.ms", 7 * 86_400_000) < needed:
                propose(
                    "retention.ms",
                    needed,
                    f"the store keeps a window {human_ms(store.retention_ms or 0)} from its start, the changelog "
                    f"{human_ms(WINDOWED_CHANGELOG_EXTRA_RETENTION_MS)} longer = {human_ms(needed)}; retention.ms="
                    f"{human_ms(_int(cfg, 'retention.ms', 0))} would delete windows a restore still needs",
                )
        elif policies != {"compact"}:
            propose(
                "cleanup.policy",
                "compact",
                f"{store.kind} store: its keys never expire by time; '{','.join(sorted(policies))}' would delete live "
                f"state after retention.ms={human_ms(_int(cfg, 'retention.ms', 0))}",
            )

    def min_compaction_lag(self) -> int:
        """min.compaction.lag.ms: a versioned store's history must survive compaction. Returns the lag it gets."""
        cfg, store = self.cfg, self.store
        min_lag = _int(cfg, "min.compaction.lag.ms", 0)
        if store.kind == "versioned" and min_lag < (store.retention_ms or 0):
            min_lag = store.retention_ms or 0
            self.propose(
                "min.compaction.lag.ms",
                min_lag,
                f"versioned store keeps {human_ms(min_lag)} of history; compaction may not remove a superseded "
                f"version younger than that (now {human_ms(_int(cfg, 'min.compaction.lag.ms', 0))})",
            )
        return min_lag

    def max_compaction_lag(self, min_lag: int) -> None:
        """max.compaction.lag.ms: bound how long a removable record may wait, whatever the dirty ratio."""
        m, policy = self.m, self.policy
        max_lag = min_lag + policy.max_uncompacted_ms
        current_max_lag = _int(self.cfg, "max.compaction.lag.ms", 2**63 - 1)
        if current_max_lag > max_lag:
            age = "none" if m.oldest_obsolete_age_ms is None else human_ms(m.oldest_obsolete_age_ms)
            unbounded = "unbounded (Kafka's default)" if current_max_lag >= 2**63 - 1 else human_ms(current_max_lag)
            self.propose(
                "max.compaction.lag.ms",
                max_lag,
                f"a superseded record may now wait {unbounded} for the dirty ratio; the oldest removable one "
                f"is {age} old; the policy allows {human_ms(policy.max_uncompacted_ms)}"
                + (f" after the {human_ms(min_lag)} of history" if min_lag else ""),
            )

    def segment_bytes(self) -> int:
        """segment.bytes: the active segment is never cleaned, so its size bounds the uncleaned tail. Returns the
        segment size the topic gets."""
        m, policy = self.m, self.policy
        per_partition_live = m.live_bytes / max(m.partitions, 1)
        want_bytes = per_partition_live * (policy.target_replay_ratio - 1)
        want_bytes = 2 ** math.ceil(math.log2(want_bytes)) if want_bytes > 1 else 1
        want_bytes = int(min(policy.max_segment_bytes, max(policy.min_segment_bytes, want_bytes)))
        segment_bytes = _int(self.cfg, "segment.bytes", 1024**3)
        if segment_bytes > 2 * want_bytes or segment_bytes < policy.min_segment_bytes:
            self.propose(
                "segment.bytes",
                want_bytes,
                f"live state is {human_bytes(per_partition_live)} per partition; up to segment.bytes="
                f"{human_bytes(segment_bytes)} per partition sits in the active segment, which the cleaner never "
                f"compacts; {human_bytes(want_bytes)} keeps that tail within the target of "
                f"{policy.target_replay_ratio:g} records per live key (bounds {human_bytes(policy.min_segment_bytes)}"
                f"-{human_bytes(policy.max_segment_bytes)})",
            )
            segment_bytes = want_bytes
        return segment_bytes

    def segment_ms(self, segment_bytes: int) -> None:
        """segment.ms: a segment that fills slowly must still roll, for its superseded records to be cleaned."""
        m, policy = self.m, self.policy
        want_ms = max(policy.min_segment_ms, policy.max_uncompacted_ms // 2)
        fill_ms = segment_bytes / m.write_bytes_per_s * 1000 if m.write_bytes_per_s > 0 else math.inf
        segment_ms = _int(self.cfg, "segment.ms", 7 * 86_400_000)
        if segment_ms > want_ms and fill_ms > want_ms:
            fill = "never (no writes in the last hour)" if math.isinf(fill_ms) else f"in {human_ms(fill_ms)}"
            self.propose(
                "segment.ms",
                want_ms,
                f"at {m.write_bytes_per_s:,.1f} B/s per partition a {human_bytes(segment_bytes)} segment fills {fill} "
                f"and segment.ms={human_ms(segment_ms)}: superseded records in the active segment wait that long; "
                f"rolling every {human_ms(want_ms)} makes them compactable within the policy's "
                f"{human_ms(policy.max_uncompacted_ms)}",
            )

    def dirty_ratio(self) -> None:
        """min.cleanable.dirty.ratio: closed segments hold up to 1 / (1 - r) records per key before a clean."""
        m, policy = self.m, self.policy
        target = policy.target_replay_ratio
        want_ratio = round(min(policy.max_dirty_ratio, max(policy.min_dirty_ratio, 1 - 1 / target)), 2)
        ratio = float(self.cfg.get("min.cleanable.dirty.ratio") or 0.5)
        if ratio > want_ratio + 0.005:
            self.propose(
                "min.cleanable.dirty.ratio",
                f"{want_ratio:g}",
                f"the cleaner waits until {ratio:.0%} of the closed segments is dirty, so they reach "
                f"{1 / (1 - ratio) if ratio < 1 else math.inf:.1f} records per key before a clean (measured now: "
                f"{m.excess_replay_ratio:.1f} per live key, dirty ratio {m.dirty_ratio:.2f}); the target "
                f"{target:g} needs at most {want_ratio:g} (bounds {policy.min_dirty_ratio:g}-{policy.max_dirty_ratio:g})",
            )

    def delete_retention(self) -> None:
        """delete.retention.ms: a tombstone must outlive the snapshot a restore starts from."""
        spec, policy = self.spec, self.policy
        snapshot_ms = spec.snapshot_every_batches * spec.trigger_interval_s * 1000
        needed_retention = int(max(policy.min_delete_retention_ms, SNAPSHOT_INTERVALS_FOR_TOMBSTONES * snapshot_ms))
        current_retention = _int(self.cfg, "delete.retention.ms", 86_400_000)
        if current_retention < needed_retention:
            snapshots = (
                f"{SNAPSHOT_INTERVALS_FOR_TOMBSTONES} snapshot intervals ({spec.snapshot_every_batches} batches x "
                f"{spec.trigger_interval}) = {human_ms(SNAPSHOT_INTERVALS_FOR_TOMBSTONES * snapshot_ms)}"
                if snapshot_ms
                else "no snapshots (restores replay the whole log)"
            )
            self.propose(
                "delete.retention.ms",
                needed_retention,
                f"{self.m.tombstones:,} tombstones present; a restore starts from the latest snapshot and replays "
                f"the tail, so a tombstone removed before it is read brings its key back; "
                f"{human_ms(current_retention)} is less than max(policy minimum "
                f"{human_ms(policy.min_delete_retention_ms)}, {snapshots})",
            )
