"""One audit row per store: live state, snapshots, changelog, dead letters, restore estimates, trends.

Everything here runs without Spark: the live state per partition was read by
:mod:`.checkpoint_state` (its rows are passed in), snapshots are read with delta-rs, the changelog
numbers are the compaction tuning DAG's newest measurement (``_streamstate/changelog_measurements``;
only when there is none does the audit fall back to watermark offsets), and restore times are
estimated from the restores this deployment measured (:mod:`spark_jobs.state.restore_history`).
A snapshot table's bytes are counted three ways: what its latest snapshot reads, what the table keeps on
disk (older snapshots, for time travel), and what Delta table maintenance (:mod:`spark_jobs.operations.maintenance`)
can vacuum next and has freed so far.
A store with a TTL has its changelog read to measure whether idle keys are evicted (:mod:`.ttl`).

:func:`audit_store` measures a store in named steps, then judges its trends, budgets and growth; the row it
returns is a :class:`~spark_jobs.operations.state_audit.rows.StoreAudit`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from runtime.settings import Settings
from spark_jobs.driver.lifecycle import BatchProgress, read_status
from spark_jobs.io.kafka_topics import existing_topics, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.operations.changelog_tuning import history as tuning_history
from spark_jobs.operations.maintenance import read_record
from spark_jobs.operations.state_audit import trends, ttl
from spark_jobs.operations.state_audit.rows import (
    ChangelogMeasurement,
    CheckpointStateRow,
    PartitionState,
    SnapshotEntry,
    StateRowsSource,
    StoreAudit,
)
from spark_jobs.registry import JobSpec, StoreSpec
from spark_jobs.state.restore import tail_records
from spark_jobs.state.restore_history import RestoreRates
from spark_jobs.state.snapshots import SnapshotInfo, SnapshotStore
from spark_jobs.versions import platform_table, read_rows

_INTS = (
    "version",
    "state_rows",
    "state_bytes",
    "state_disk_bytes",
    "memory_bytes",
    "checkpoint_bytes",
    "snapshot_versions",
    "snapshot_rows",
    "snapshot_bytes",
    "snapshot_files",
    "changelog_records",
    "changelog_bytes",
    "changelog_live_keys",
    "changelog_tombstones",
    "dead_letter_records",
    "dead_letter_growth",
    "tail_records",
    "windows_beyond_retention",
    "budget_max_rows",
    "budget_max_bytes",
    "snapshot_disk_bytes",
    "snapshot_vacuumable_bytes",
    "snapshot_freed_bytes",
    "ttl_ms",
    "ttl_keys_checked",
    "ttl_keys_overdue",
    "ttl_oldest_overdue_ms",
)
_FLOATS = (
    "snapshot_age_s",
    "restore_snapshot_tail_s",
    "restore_full_replay_s",
    "rows_per_day",
    "bytes_per_day",
    "restore_s_per_day",
    "days_to_budget",
    "budget_max_restore_s",
    "budget_warn_days",
)
_STRINGS = (
    "run_id",
    "job",
    "application_id",
    "store",
    "kind",
    "state_rows_source",
    "partitions",
    "changelog_source",
    "unbounded_reason",
    "budget_status",
    "errors",
    "ttl_verdict",
    "ttl_reason",
)


def audit_table(settings: Settings):
    return platform_table(settings, "state_audit")


def _schema():
    import pyarrow as pa

    return pa.schema(
        [pa.field("audited_at", pa.timestamp("us", tz="UTC")), pa.field("unbounded", pa.bool_())]
        + [pa.field(n, pa.int64()) for n in _INTS]
        + [pa.field(n, pa.float64()) for n in _FLOATS]
        + [pa.field(n, pa.string()) for n in _STRINGS]
    )


def record_audit(settings: Settings, rows: list[StoreAudit]) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    if rows:
        table = audit_table(settings)
        # merge: a table written before a column was added (the TTL check's) gains it
        write_deltalake(
            str(table),
            pa.Table.from_pylist([row.table_row() for row in rows], schema=_schema()),
            mode="append",
            schema_mode="merge",
            storage_options=table.storage_options(),
        )


def audit_rows(settings: Settings, application_id: str | None = None, store: str | None = None) -> list[StoreAudit]:
    """Audit rows, oldest first."""
    rows = [
        row
        for row in map(StoreAudit.of, read_rows(audit_table(settings)))
        if (application_id is None or row.application_id == application_id) and (store is None or row.store == store)
    ]
    return sorted(rows, key=lambda row: row.audited_at)


def latest_changelog_measurements(settings: Settings) -> dict[str, ChangelogMeasurement]:
    """changelog topic -> the compaction tuning DAG's newest measurement of it."""
    measured = map(ChangelogMeasurement.of, tuning_history.measurements(settings))
    return {m.topic: m for m in measured}  # oldest first: the newest wins


@dataclasses.dataclass(frozen=True)
class LiveState:
    """A store's live state: read out of its checkpoint, else the job's latest progress, else unknown."""

    source: StateRowsSource
    rows: int | None = None
    bytes: int | None = None
    disk_bytes: int | None = None
    partitions: dict[int, PartitionState] | None = None


def live_state(readable: list[CheckpointStateRow], progress: BatchProgress | None) -> LiveState:
    """``readable``: the checkpoint reader's rows of the store in this run, without its error rows."""
    if readable:
        return LiveState(
            "checkpoint",
            rows=sum(r.rows for r in readable),
            bytes=sum(r.bytes for r in readable),
            disk_bytes=sum(r.disk_bytes for r in readable),
            partitions={r.partition: PartitionState(r.rows, r.bytes, r.disk_bytes) for r in readable},
        )
    if progress is not None:
        return LiveState("progress", rows=progress.state_rows)
    return LiveState("none")


@dataclasses.dataclass(frozen=True)
class SnapshotNumbers:
    """A store's Delta snapshot table (None: no table, or no snapshot in it)."""

    #: snapshots still in the table
    versions: int
    #: the latest snapshot's rows (a layered snapshot's are counted by a read)
    rows: int | None = None
    #: what the latest snapshot reads
    bytes: int | None = None
    files: int | None = None
    age_s: float | None = None
    #: what table maintenance keeps (time travel), can free next, and has freed
    disk_bytes: int | None = None
    vacuumable_bytes: int | None = None
    freed_bytes: int | None = None


def snapshot_numbers(
    settings: Settings, spec: JobSpec, store: StoreSpec
) -> tuple[SnapshotNumbers, list[SnapshotInfo], list[SnapshotEntry]]:
    """(numbers, the snapshots still in the table oldest first, the latest one's entries) of the store's
    Delta snapshot table. The entries are decoded only for a store whose expiry the audit judges on them
    (windows, sessions, an event-time TTL)."""
    snapshots = SnapshotStore.of(JobLayout.of(spec, settings), store.name)
    if not snapshots.exists():
        return SnapshotNumbers(0), [], []
    infos = snapshots.history()
    latest = infos[-1] if infos else None
    files = snapshots.files()
    taken = dt.datetime.fromisoformat(latest.taken_at) if latest else None
    numbers = SnapshotNumbers(
        versions=len(infos),
        rows=snapshots.count(latest) if latest else None,
        bytes=sum(files),
        files=len(files),
        age_s=(dt.datetime.now(dt.UTC) - taken).total_seconds() if taken else None,
        disk_bytes=snapshots.table.size_bytes(),
        vacuumable_bytes=snapshots.maintain(dry_run=True).vacuum_bytes,
        freed_bytes=read_record(settings).freed_from(snapshots.path).bytes,
    )
    entries = []
    if latest is not None and (store.kind in ("windowed", "session") or store.ttl_clock == "event_time"):
        entries = [SnapshotEntry.decode(v) for v in snapshots.values(latest)]
    return numbers, infos, entries


def windows_beyond_retention(store: StoreSpec, entries: list[SnapshotEntry], stream_time_ms: int) -> int | None:
    """Windows in the state that should have been evicted: their start + the store's retention is before
    stream time (the store keeps a window ``retention_ms`` from its start). Stream time is the store's own
    per-partition entry (``stream_time_ms`` with a ``source_partition``) where it keeps one, else
    ``stream_time_ms`` (the snapshot's watermark). A session store keeps a session ``retention_ms`` from its
    end: counted from ``session_end_ms``."""
    if store.kind not in ("windowed", "session"):
        return None

    def kept_since(entry: SnapshotEntry) -> int | None:
        """When the store's retention of the entry starts: its window's start, or its session's end."""
        return entry.window_start_ms if store.kind == "windowed" else entry.session_end_ms

    per_partition = {
        e.source_partition: e.stream_time_ms
        for e in entries
        if kept_since(e) is None and isinstance(e.stream_time_ms, int)
    }
    if not stream_time_ms and not per_partition:
        return None
    horizon = store.retention_ms or 0
    return sum(
        1
        for e in entries
        if isinstance(kept_since(e), int)
        and kept_since(e) + horizon < per_partition.get(e.source_partition, stream_time_ms)
    )


def ttl_check(
    settings: Settings, spec: JobSpec, store: StoreSpec, snapshots: list[SnapshotInfo], entries: list[SnapshotEntry]
) -> ttl.TtlCheck | None:
    """Whether ``store``'s TTL evicts idle keys, measured on its changelog, or for an event-time TTL on
    ``entries``, the latest snapshot's (None: no TTL declared)."""
    if not store.ttl_ms:
        return None
    if store.ttl_clock == "event_time":
        if not snapshots:
            return ttl.TtlCheck(ttl.UNVERIFIABLE, 0, 0, None, "no snapshot yet")
        return ttl.event_time_ttl_verdict(store.ttl_ms, entries)
    topic = JobLayout.of(spec, settings).changelog_topic(store.name)
    if topic not in existing_topics(settings.kafka, [topic]):
        return ttl.TtlCheck(ttl.UNVERIFIABLE, 0, 0, None, f"no changelog topic {topic} yet")
    taken = [int(dt.datetime.fromisoformat(s.taken_at).timestamp() * 1000) for s in snapshots]
    return ttl.check_ttl(settings.kafka, spec, store, topic, snapshots_since_ms=min(taken, default=None))


def _offset_span(settings: Settings, topic: str) -> int | None:
    if topic not in existing_topics(settings.kafka, [topic]):
        return None
    return sum(high - low for low, high in partition_offsets(settings.kafka, topic).values())


@dataclasses.dataclass(frozen=True)
class ChangelogNumbers:
    """A store's changelog: the tuning DAG's newest measurement, else the records its offsets span."""

    records: int | None
    #: where the numbers come from
    source: str
    bytes: int | None = None
    live_keys: int | None = None
    tombstones: int | None = None


def changelog_numbers(settings: Settings, topic: str, measured: ChangelogMeasurement | None) -> ChangelogNumbers:
    if measured is None:
        return ChangelogNumbers(_offset_span(settings, topic), "watermark offsets (not measured yet)")
    return ChangelogNumbers(
        measured.records,
        f"tuning measurement {measured.measured_at.isoformat(timespec='seconds')}",
        bytes=measured.bytes,
        live_keys=measured.live_keys,
        tombstones=measured.tombstones,
    )


def dead_letter_growth(dead_letters: int | None, history: list[StoreAudit]) -> int | None:
    """Dead letters added since the newest earlier audit that counted them (None: none did, or none now)."""
    previous = next((r for r in reversed(history) if r.dead_letter_records is not None), None)
    if dead_letters is None or previous is None:
        return None
    return dead_letters - previous.dead_letter_records


@dataclasses.dataclass(frozen=True)
class RestoreEstimate:
    """How long a restore of the store would take today (None: not estimable from the measured restores)."""

    #: changelog records written after the latest snapshot
    tail_records: int
    #: from the latest snapshot + that tail (None also without a snapshot)
    snapshot_tail_s: float | None
    #: replaying the whole changelog
    full_replay_s: float | None


def restore_estimate(
    settings: Settings,
    spec: JobSpec,
    store: StoreSpec,
    latest: SnapshotInfo | None,
    changelog_records: int | None,
    restores: list[dict],
) -> RestoreEstimate:
    """The latest snapshot + the changelog written after it, and a full replay, at the rates this
    deployment's measured ``restores`` show."""
    topic = JobLayout.of(spec, settings).changelog_topic(store.name)
    tail = tail_records(settings.kafka, topic, latest.changelog_offsets if latest else None)
    rates = RestoreRates.fit(restores, store=store.name, application_id=spec.application_id)
    return RestoreEstimate(
        tail,
        rates.estimate(snapshot_rows=latest.rows_scanned, changelog_records=tail) if latest else None,
        rates.estimate(snapshot_rows=None, changelog_records=changelog_records or 0),
    )


def audit_store(
    settings: Settings,
    run_id: str,
    spec: JobSpec,
    store: StoreSpec,
    *,
    checkpoint_rows: list[CheckpointStateRow],
    changelog: ChangelogMeasurement | None,
    restores: list[dict],
    history: list[StoreAudit],
) -> StoreAudit:
    """The audit row of one store. ``checkpoint_rows``: this run's rows of the checkpoint reader for
    the store; ``changelog``: the newest tuning measurement of its changelog (None: never measured);
    ``restores``: every measured restore; ``history``: the store's earlier audit rows, oldest first."""
    layout = JobLayout.of(spec, settings)
    status = read_status(settings.status_dir, spec.application_id)
    progress = status.progress if status else None
    live = live_state([r for r in checkpoint_rows if not r.error], progress)
    snapshot, snapshots, entries = snapshot_numbers(settings, spec, store)
    latest = snapshots[-1] if snapshots else None
    changes = changelog_numbers(settings, layout.changelog_topic(store.name), changelog)
    dead_letters = _offset_span(settings, layout.dead_letter_topic)
    restore = restore_estimate(settings, spec, store, latest, changes.records, restores)
    budget = store.budget
    measured = StoreAudit(
        run_id=run_id,
        audited_at=dt.datetime.now(dt.UTC),
        application_id=spec.application_id,
        store=store.name,
        job=spec.name,
        version=spec.version,
        kind=store.kind,
        state_rows=live.rows,
        state_rows_source=live.source,
        state_bytes=live.bytes,
        state_disk_bytes=live.disk_bytes,
        partitions=live.partitions,
        memory_bytes=progress.state_memory_bytes if progress else None,
        checkpoint_bytes=layout.checkpoint.size_bytes(),
        snapshot_versions=snapshot.versions,
        snapshot_rows=snapshot.rows,
        snapshot_bytes=snapshot.bytes,
        snapshot_files=snapshot.files,
        snapshot_age_s=snapshot.age_s,
        snapshot_disk_bytes=snapshot.disk_bytes,
        snapshot_vacuumable_bytes=snapshot.vacuumable_bytes,
        snapshot_freed_bytes=snapshot.freed_bytes,
        windows_beyond_retention=windows_beyond_retention(store, entries, latest.watermark_ms if latest else 0),
        changelog_records=changes.records,
        changelog_bytes=changes.bytes,
        changelog_live_keys=changes.live_keys,
        changelog_tombstones=changes.tombstones,
        changelog_source=changes.source,
        dead_letter_records=dead_letters,
        dead_letter_growth=dead_letter_growth(dead_letters, history),
        tail_records=restore.tail_records,
        restore_snapshot_tail_s=restore.snapshot_tail_s,
        restore_full_replay_s=restore.full_replay_s,
        budget_max_rows=budget.max_rows,
        budget_max_bytes=budget.max_bytes,
        budget_max_restore_s=budget.max_restore_s,
        budget_warn_days=budget.warn_days,
        errors="; ".join(r.error for r in checkpoint_rows if r.error) or None,
    )
    checked = ttl_check(settings, spec, store, snapshots, entries)
    return judged(with_ttl_check(measured, store, checked), store, history, checked)


def with_ttl_check(audit: StoreAudit, store: StoreSpec, checked: ttl.TtlCheck | None) -> StoreAudit:
    """``audit`` with what the TTL check found (unchanged for a store without a TTL)."""
    if checked is None:
        return audit
    return dataclasses.replace(
        audit,
        ttl_ms=store.ttl_ms,
        ttl_verdict=checked.verdict,
        ttl_keys_checked=checked.keys_checked,
        ttl_keys_overdue=checked.keys_overdue,
        ttl_oldest_overdue_ms=checked.oldest_overdue_ms,
        ttl_reason=checked.reason,
    )


def judged(audit: StoreAudit, store: StoreSpec, history: list[StoreAudit], checked: ttl.TtlCheck | None) -> StoreAudit:
    """``audit`` with its trends over ``history`` (the earlier audits, oldest first) and this one, its budget
    checks and whether the store grows without bound."""
    series = [*history, audit]
    rows_per_day = trends.growth_per_day([(r.audited_at, r.state_rows) for r in series])
    bytes_per_day = trends.growth_per_day([(r.audited_at, r.largest_bytes) for r in series])
    restore_s_per_day = trends.growth_per_day([(r.audited_at, r.restore_s) for r in series])
    checks = trends.budget_checks(
        store.budget,
        {"rows": audit.state_rows, "bytes": audit.largest_bytes, "restore_s": audit.restore_s},
        {"rows": rows_per_day, "bytes": bytes_per_day, "restore_s": restore_s_per_day},
    )
    days = [c.days_left for c in checks if c.days_left is not None]
    unbounded = trends.unbounded_growth(store, series, audit.windows_beyond_retention, checked)
    return dataclasses.replace(
        audit,
        rows_per_day=rows_per_day,
        bytes_per_day=bytes_per_day,
        restore_s_per_day=restore_s_per_day,
        days_to_budget=min(days) if days else None,
        budget_status=tuple(checks),
        unbounded=unbounded.flagged,
        unbounded_reason=unbounded.reason,
    )
