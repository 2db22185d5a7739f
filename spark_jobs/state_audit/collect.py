"""One audit row per store: live state, snapshots, changelog, dead letters, restore estimates, trends.

Everything here runs without Spark: the live state per partition was read by
:mod:`.checkpoint_state` (its rows are passed in), snapshots are read with delta-rs, the changelog
numbers are the compaction tuning DAG's newest measurement (``_streamstate/changelog_measurements``;
only when there is none does the audit fall back to watermark offsets), and restore times are
estimated from the restores this deployment measured (:mod:`spark_jobs.state.restore_history`).
A snapshot table's bytes are counted three ways: what its latest snapshot reads, what the table keeps on
disk (older snapshots, for time travel), and what Delta table maintenance (:mod:`spark_jobs.maintenance`)
can vacuum next and has freed so far.
A store with a TTL has its changelog read to measure whether idle keys are evicted (:mod:`.ttl`).
"""

from __future__ import annotations

import datetime as dt
import json

from runtime.settings import Settings
from spark_jobs.kafka_topics import existing_topics, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.lifecycle import read_status
from spark_jobs.maintenance import read_record
from spark_jobs.registry import JobSpec, StoreSpec
from spark_jobs.state.restore import tail_records
from spark_jobs.state.restore_history import RestoreRates
from spark_jobs.state.snapshots import SnapshotInfo, SnapshotStore
from spark_jobs.state_audit import trends, ttl
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


def record_audit(settings: Settings, rows: list[dict]) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    if rows:
        table = audit_table(settings)
        # merge: a table written before a column was added (the TTL check's) gains it
        write_deltalake(
            str(table),
            pa.Table.from_pylist(rows, schema=_schema()),
            mode="append",
            schema_mode="merge",
            storage_options=table.storage_options(),
        )


def audit_rows(settings: Settings, application_id: str | None = None, store: str | None = None) -> list[dict]:
    """Audit rows, oldest first."""
    rows = [
        r
        for r in read_rows(audit_table(settings))
        if (application_id is None or r["application_id"] == application_id) and (store is None or r["store"] == store)
    ]
    return sorted(rows, key=lambda r: r["audited_at"])


def snapshot_numbers(settings: Settings, spec: JobSpec, store: StoreSpec) -> tuple[dict, list[SnapshotInfo], list]:
    """(numbers, the snapshots still in the table oldest first, the latest one's decoded values) of the
    store's Delta snapshot table."""
    snapshots = SnapshotStore.of(JobLayout.of(spec, settings), store.name)
    if not snapshots.exists():
        return {"snapshot_versions": 0}, [], []
    infos = snapshots.history()
    latest = infos[-1] if infos else None
    files = snapshots.files()
    taken = dt.datetime.fromisoformat(latest.taken_at) if latest else None
    numbers = {
        "snapshot_versions": len(infos),
        "snapshot_rows": snapshots.count(latest) if latest else None,  # a layered snapshot's are counted by a read
        "snapshot_bytes": sum(files),
        "snapshot_files": len(files),
        "snapshot_age_s": (dt.datetime.now(dt.UTC) - taken).total_seconds() if taken else None,
        # what table maintenance keeps (time travel), can free next, and has freed
        "snapshot_disk_bytes": snapshots.table.size_bytes(),
        "snapshot_vacuumable_bytes": snapshots.maintain(dry_run=True).vacuum_bytes,
        "snapshot_freed_bytes": read_record(settings).freed_from(snapshots.path).bytes,
    }
    values = []
    if latest is not None and (store.kind in ("windowed", "session") or store.ttl_clock == "event_time"):
        values = [json.loads(v) for v in snapshots.values(latest)]
    return numbers, infos, values


def windows_beyond_retention(store: StoreSpec, values: list[dict], stream_time_ms: int) -> int | None:
    """Windows in the state that should have been evicted: their start + the store's retention is before
    stream time (the store keeps a window ``retention_ms`` from its start). Stream time is the store's own per-partition entry (``stream_time_ms`` with a
    ``source_partition``) where it keeps one, else ``stream_time_ms`` (the snapshot's watermark). A session
    store keeps a session ``retention_ms`` from its end: counted from ``session_end_ms``."""
    if store.kind not in ("windowed", "session"):
        return None
    since = "window_start_ms" if store.kind == "windowed" else "session_end_ms"
    per_partition = {
        v.get("source_partition"): v["stream_time_ms"]
        for v in values
        if v.get(since) is None and isinstance(v.get("stream_time_ms"), int)
    }
    if not stream_time_ms and not per_partition:
        return None
    horizon = store.retention_ms or 0
    return sum(
        1
        for v in values
        if isinstance(v.get(since), int)
        and v[since] + horizon < per_partition.get(v.get("source_partition"), stream_time_ms)
    )


def ttl_check(
    settings: Settings, spec: JobSpec, store: StoreSpec, snapshots: list[SnapshotInfo], values: list[dict]
) -> ttl.TtlCheck | None:
    """Whether ``store``'s TTL evicts idle keys, measured on its changelog, or for an event-time TTL on
    ``values``, the latest snapshot's (None: no TTL declared)."""
    if not store.ttl_ms:
        return None
    if store.ttl_clock == "event_time":
        if not snapshots:
            return ttl.TtlCheck(ttl.UNVERIFIABLE, 0, 0, None, "no snapshot yet")
        return ttl.event_time_ttl_verdict(store.ttl_ms, values)
    topic = JobLayout.of(spec, settings).changelog_topic(store.name)
    if topic not in existing_topics(settings.kafka, [topic]):
        return ttl.TtlCheck(ttl.UNVERIFIABLE, 0, 0, None, f"no changelog topic {topic} yet")
    taken = [int(dt.datetime.fromisoformat(s.taken_at).timestamp() * 1000) for s in snapshots]
    return ttl.check_ttl(settings.kafka, spec, store, topic, snapshots_since_ms=min(taken, default=None))


def _offset_span(settings: Settings, topic: str) -> int | None:
    if topic not in existing_topics(settings.kafka, [topic]):
        return None
    return sum(high - low for low, high in partition_offsets(settings.kafka, topic).values())


def audit_store(
    settings: Settings,
    run_id: str,
    spec: JobSpec,
    store: StoreSpec,
    *,
    checkpoint_rows: list[dict],
    changelog: dict | None,
    restores: list[dict],
    history: list[dict],
) -> dict:
    """The audit row of one store. ``checkpoint_rows``: this run's rows of the checkpoint reader for
    the store; ``changelog``: the newest tuning measurement of its changelog (None: never measured);
    ``restores``: every measured restore; ``history``: the store's earlier audit rows, oldest first."""
    errors = [r["error"] for r in checkpoint_rows if r.get("error")]
    readable = [r for r in checkpoint_rows if not r.get("error")]
    layout = JobLayout.of(spec, settings)
    status = read_status(settings.status_dir, spec.application_id)
    progress = status.progress if status else None
    row: dict = {
        "run_id": run_id,
        "audited_at": dt.datetime.now(dt.UTC),
        "job": spec.name,
        "version": spec.version,
        "application_id": spec.application_id,
        "store": store.name,
        "kind": store.kind,
        "checkpoint_bytes": layout.checkpoint.size_bytes(),
        "memory_bytes": progress.state_memory_bytes if progress else None,
    }
    if readable:
        row.update(
            state_rows=sum(r["rows"] for r in readable),
            state_bytes=sum(r["bytes"] for r in readable),
            state_disk_bytes=sum(r["disk_bytes"] for r in readable),
            state_rows_source="checkpoint",
            partitions=json.dumps(
                {
                    str(r["partition"]): {"rows": r["rows"], "bytes": r["bytes"], "disk_bytes": r["disk_bytes"]}
                    for r in readable
                }
            ),
        )
    elif progress is not None:
        row.update(state_rows=progress.state_rows, state_rows_source="progress")
    else:
        row["state_rows_source"] = "none"

    snap, snapshots, values = snapshot_numbers(settings, spec, store)
    latest = snapshots[-1] if snapshots else None
    row.update(snap)
    row["windows_beyond_retention"] = windows_beyond_retention(store, values, latest.watermark_ms if latest else 0)

    topic = layout.changelog_topic(store.name)
    if changelog is not None:
        row.update(
            changelog_records=changelog["records"],
            changelog_bytes=changelog["bytes"],
            changelog_live_keys=changelog["live_keys"],
            changelog_tombstones=changelog["tombstones"],
            changelog_source=f"tuning measurement {changelog['measured_at'].isoformat(timespec='seconds')}",
        )
    else:
        row.update(
            changelog_records=_offset_span(settings, topic), changelog_source="watermark offsets (not measured yet)"
        )

    dead_letters = _offset_span(settings, layout.dead_letter_topic)
    previous = next((r for r in reversed(history) if r.get("dead_letter_records") is not None), None)
    row["dead_letter_records"] = dead_letters
    row["dead_letter_growth"] = (
        dead_letters - previous["dead_letter_records"] if dead_letters is not None and previous else None
    )

    # restore estimates: latest snapshot + the changelog written after it, and a full replay
    tail = tail_records(settings.kafka, topic, latest.changelog_offsets if latest else None)
    rates = RestoreRates.fit(restores, store=store.name, application_id=spec.application_id)
    row["tail_records"] = tail
    row["restore_snapshot_tail_s"] = (
        rates.estimate(snapshot_rows=latest.rows_scanned if latest else 0, changelog_records=tail) if latest else None
    )
    row["restore_full_replay_s"] = rates.estimate(
        snapshot_rows=None, changelog_records=row.get("changelog_records") or 0
    )

    # trends and budgets
    state_bytes = max(
        v
        for v in (
            row.get("state_bytes"),
            row.get("state_disk_bytes"),
            row.get("snapshot_bytes"),
            row.get("changelog_bytes"),
            0,
        )
        if v is not None
    )
    restore_s = (
        row["restore_snapshot_tail_s"] if row["restore_snapshot_tail_s"] is not None else row["restore_full_replay_s"]
    )
    series = history + [{**row, "_bytes": state_bytes, "_restore_s": restore_s}]
    for r in history:
        r.setdefault(
            "_bytes",
            max(
                v
                for v in (
                    r.get("state_bytes"),
                    r.get("state_disk_bytes"),
                    r.get("snapshot_bytes"),
                    r.get("changelog_bytes"),
                    0,
                )
                if v is not None
            ),
        )
        r.setdefault(
            "_restore_s",
            r.get("restore_snapshot_tail_s")
            if r.get("restore_snapshot_tail_s") is not None
            else r.get("restore_full_replay_s"),
        )
    per_day = {
        "rows": trends.growth_per_day([(r["audited_at"], r.get("state_rows")) for r in series]),
        "bytes": trends.growth_per_day([(r["audited_at"], r.get("_bytes")) for r in series]),
        "restore_s": trends.growth_per_day([(r["audited_at"], r.get("_restore_s")) for r in series]),
    }
    row.update(rows_per_day=per_day["rows"], bytes_per_day=per_day["bytes"], restore_s_per_day=per_day["restore_s"])
    checks = trends.budget_checks(
        store.budget, {"rows": row.get("state_rows"), "bytes": state_bytes, "restore_s": restore_s}, per_day
    )
    days = [c.days_left for c in checks if c.days_left is not None]
    row["days_to_budget"] = min(days) if days else None
    row["budget_status"] = json.dumps([c.__dict__ | {"crossed": c.crossed} for c in checks])
    checked = ttl_check(settings, spec, store, snapshots, values)
    if checked is not None:
        row.update(
            ttl_ms=store.ttl_ms,
            ttl_verdict=checked.verdict,
            ttl_keys_checked=checked.keys_checked,
            ttl_keys_overdue=checked.keys_overdue,
            ttl_oldest_overdue_ms=checked.oldest_overdue_ms,
            ttl_reason=checked.reason,
        )
    unbounded = trends.unbounded_growth(store, series, row["windows_beyond_retention"], checked)
    row.update(unbounded=unbounded.flagged, unbounded_reason=unbounded.reason)
    b = store.budget
    row.update(
        budget_max_rows=b.max_rows,
        budget_max_bytes=b.max_bytes,
        budget_max_restore_s=b.max_restore_s,
        budget_warn_days=b.warn_days,
        errors="; ".join(errors) or None,
    )
    return row
