"""Delta table maintenance: compact small files, vacuum files past the time-travel window.

Output tables get a MERGE per micro-batch and snapshot tables a commit per snapshot (the standby's
MERGEs are small), so files pile up; nothing else deletes the files older versions reference. This
module plans and runs, with delta-rs (no Spark session), per table:

* **compaction** (``OPTIMIZE``) when the current version holds at least :data:`MIN_FILES_TO_COMPACT`
  files smaller than :data:`SMALL_FILE_BYTES`; data and history are unchanged, only the file layout.
  A table whose writer runs (the job version's driver or standby holds its lease) is not compacted
  unless asked: a compaction that commits while a MERGE or a snapshot overwrite is under way fails
  that writer's commit (Delta's conflict rules), which would stop the job's batch or the standby;
* **vacuum** of files no version inside the retention references. The retention is never shorter than
  :data:`TIME_TRAVEL_DAYS` (the time travel the README promises) nor than the table's own declared
  ``delta.deletedFileRetentionDuration`` / ``delta.logRetentionDuration``: a table configured shorter
  is vacuumed at the promise, and one whose retention cannot be read is not vacuumed at all.

Tables (:func:`tables_to_maintain`): every registered, not purged, version's snapshot and output
tables (named by :class:`~spark_jobs.layout.JobLayout`; snapshot tables through
:class:`~spark_jobs.state.snapshots.SnapshotStore`) and the platform's own tables (``_streamstate``).

A run is a dry run unless told otherwise: the plan lists, per table, the files a compaction would
rewrite and the files and bytes a vacuum would delete. Each run's summary goes to
:func:`~spark_jobs.layout.table_maintenance_file`, with the totals freed so far, for the state-size
audit's report.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from runtime.settings import Settings
    from spark_jobs.layout import JobLayout

#: old versions of every table stay readable by time travel this long (README: "stay readable by time
#: travel for 7 days", "Delta table maintenance")
TIME_TRAVEL_DAYS = 7
#: the same promise as a Delta interval body (``interval 7 days``): the retention snapshot tables declare
TIME_TRAVEL_RETENTION = f"{TIME_TRAVEL_DAYS} days"
#: a file smaller than this is "small" (a Parquet file a reader would rather not open alone)
SMALL_FILE_BYTES = 16 * 1024 * 1024
#: compact when a table's current version holds at least this many small files
MIN_FILES_TO_COMPACT = 8
#: the size compaction writes files at
TARGET_FILE_BYTES = 128 * 1024 * 1024
#: the table properties that bound how long a table keeps what time travel reads
RETENTION_PROPERTIES = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")

TableKind = Literal["snapshot", "output", "platform"]

_INTERVAL_PART = re.compile(r"(\d+)\s*([a-z]+)")
_UNIT_SECONDS = {
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86_400,
    "week": 604_800,
}


def interval_hours(interval: str) -> int:
    """Hours (rounded up) of a Delta interval property such as ``interval 7 days`` or ``1 week 2 hours``.

    Raises:
        ValueError: not an interval Delta accepts for a retention (months and years are not).
    """
    body = interval.strip().lower()
    body = body[len("interval") :].strip() if body.startswith("interval") else body
    parts = _INTERVAL_PART.findall(body)
    if not parts or _INTERVAL_PART.sub("", body).strip():
        raise ValueError(f"not a retention interval: {interval!r}")
    seconds = 0.0
    for count, unit in parts:
        unit = unit.removesuffix("s")
        if unit not in _UNIT_SECONDS:
            raise ValueError(f"not a retention interval: {interval!r} (unit {unit!r})")
        seconds += int(count) * _UNIT_SECONDS[unit]
    return math.ceil(seconds / 3600)


def retention_hours(configuration: dict[str, str]) -> int:
    """The vacuum retention of a table: the longest of its declared retentions and the promise.

    Raises:
        ValueError: a declared retention that cannot be read (such a table is not vacuumed).
    """
    declared = [interval_hours(configuration[name]) for name in RETENTION_PROPERTIES if configuration.get(name)]
    return max([TIME_TRAVEL_DAYS * 24, *declared])


@dataclasses.dataclass
class TableMaintenance:
    """What maintenance does (or would do) to one table."""

    path: str
    kind: TableKind
    #: files of the current version, and the small ones among them (paths relative to the table)
    files: int = 0
    small_files: list[str] = dataclasses.field(default_factory=list)
    small_bytes: int = 0
    compact: bool = False
    #: why a table with small files is not compacted (its writer runs), None otherwise
    compact_deferred: str | None = None
    #: the vacuum retention; None: not vacuumed (``vacuum_skipped`` says why)
    retention_hours: int | None = None
    vacuum_skipped: str | None = None
    #: files a vacuum deletes (or would: a dry run), and their bytes
    vacuum_files: list[str] = dataclasses.field(default_factory=list)
    vacuum_bytes: int = 0
    #: after a real run: files the compaction removed and wrote
    compacted_files_removed: int = 0
    compacted_files_added: int = 0
    dry_run: bool = True
    error: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def maintain_table(
    path: Path | str, kind: TableKind, *, dry_run: bool = True, writer_running: str | None = None
) -> TableMaintenance:
    """Plan (``dry_run``) or run compaction and vacuum of one Delta table.

    ``writer_running``: who writes the table now (e.g. ``purchase_counts-v2 (driver)``); the table is
    then not compacted, only vacuumed (a vacuum changes no file a current version reads).
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    result = TableMaintenance(str(path), kind, dry_run=dry_run)
    actions = pa.table(table.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pylist()
    small = [a for a in actions if a["size_bytes"] < SMALL_FILE_BYTES]
    result.files = len(actions)
    result.small_files = [a["path"] for a in small]
    result.small_bytes = sum(a["size_bytes"] for a in small)
    if len(small) >= MIN_FILES_TO_COMPACT:
        if writer_running:
            result.compact_deferred = f"its writer runs: {writer_running}"
        else:
            result.compact = True
    try:
        result.retention_hours = retention_hours(table.metadata().configuration)
    except ValueError as err:
        result.vacuum_skipped = str(err)
    if result.compact and not dry_run:
        metrics = table.optimize.compact(target_size=TARGET_FILE_BYTES)
        result.compacted_files_removed = int(metrics.get("numFilesRemoved") or 0)
        result.compacted_files_added = int(metrics.get("numFilesAdded") or 0)
        table = DeltaTable(str(path))
    if result.retention_hours is None:
        return result
    # The files compaction just replaced are removed as of now: inside the retention, never vacuumed here.
    # enforce_retention_duration: delta-rs itself refuses a retention shorter than the table declares.
    doomed = table.vacuum(retention_hours=result.retention_hours, dry_run=True, enforce_retention_duration=True)
    result.vacuum_files = sorted(doomed)
    result.vacuum_bytes = sum(_size(Path(path) / name) for name in doomed)
    if doomed and not dry_run:
        table.vacuum(retention_hours=result.retention_hours, dry_run=False, enforce_retention_duration=True)
    return result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclasses.dataclass(frozen=True)
class MaintainedTable:
    """One table to maintain: its kind, path, and the job version that owns it (None: the platform's)."""

    kind: TableKind
    path: Path
    layout: JobLayout | None = None
    store: str | None = None

    def writer_running(self) -> str | None:
        """Who writes the table now (the version's driver; for a snapshot table also its standby)."""
        from spark_jobs.lease import JobLease

        if self.layout is None:
            return None  # platform tables only get appends, which never conflict with a compaction
        writers = [self.layout.driver] + ([self.layout.standby] if self.kind == "snapshot" else [])
        running = [w.name for w in writers if JobLease(self.layout.status_dir, w.name).holder() is not None]
        return ", ".join(running) or None


def purged_versions(settings: Settings) -> set[tuple[str, int]]:
    """(job, version) whose data was purged and that were not promoted again since."""
    from spark_jobs.versions import ADOPTED, PROMOTED, PURGED, JobVersions

    purged: set[tuple[str, int]] = set()
    for event in JobVersions(settings).history():
        if event.event == PURGED:
            purged.add((event.job, event.version))
        elif event.event in (PROMOTED, ADOPTED):
            purged.discard((event.job, event.version))
    return purged


def tables_to_maintain(settings: Settings) -> list[MaintainedTable]:
    """Every existing snapshot and output table of a registered, not purged, version, and the platform's tables."""
    from deltalake import DeltaTable

    from spark_jobs.layout import JobLayout
    from spark_jobs.registry import registered_versions
    from spark_jobs.versions import platform_table

    purged = purged_versions(settings)
    found: list[MaintainedTable] = []
    for name, versions in sorted(registered_versions().items()):
        for version, spec in sorted(versions.items()):
            if (name, version) in purged:
                continue
            layout = JobLayout.of(spec, settings)
            found += [MaintainedTable("snapshot", layout.snapshot_table(s), layout, s) for s in layout.store_names]
            found += [MaintainedTable("output", t, layout) for t in layout.output_tables]
    platform_dir = platform_table(settings, "job_versions").parent
    if platform_dir.is_dir():
        found += [MaintainedTable("platform", t) for t in sorted(platform_dir.iterdir())]
    return [t for t in found if DeltaTable.is_deltatable(str(t.path))]


def maintain(settings: Settings, *, dry_run: bool = True, compact_running: bool = False) -> list[TableMaintenance]:
    """Maintain every table (:func:`tables_to_maintain`); snapshot tables through their ``SnapshotStore``.

    ``compact_running``: compact tables whose writer runs too (that writer's next commit may fail and
    the job or standby restart). A table that fails is reported (``error``); the others still run.
    """
    from spark_jobs.state.snapshots import SnapshotStore

    results = []
    for table in tables_to_maintain(settings):
        writer = None if compact_running else table.writer_running()
        try:
            if table.kind == "snapshot":
                store = SnapshotStore.of(table.layout, table.store)
                results.append(store.maintain(dry_run=dry_run, writer_running=writer))
            else:
                results.append(maintain_table(table.path, table.kind, dry_run=dry_run, writer_running=writer))
        except Exception as err:  # a conflict with a writer that started meanwhile: the next run retries
            results.append(TableMaintenance(str(table.path), table.kind, dry_run=dry_run, error=repr(err)))
    return results


def summarize(results: list[TableMaintenance], *, dry_run: bool) -> dict:
    """One run's totals (what the operator returns and the state-size audit shows)."""
    return {
        "run_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "dry_run": dry_run,
        "tables": len(results),
        "tables_compacted": sum(1 for r in results if r.compact),
        "tables_deferred": sum(1 for r in results if r.compact_deferred),
        "files_compacted": sum(r.compacted_files_removed for r in results),
        "files_written": sum(r.compacted_files_added for r in results),
        "vacuum_files": sum(len(r.vacuum_files) for r in results),
        "vacuum_bytes": sum(r.vacuum_bytes for r in results),
        "errors": [f"{r.path}: {r.error}" for r in results if r.error],
    }


def record_summary(settings: Settings, summary: dict) -> dict:
    """Keep the run's summary as the latest run (and, when it applied, the latest applied run) and add
    what it freed to the totals; returns the record (:func:`read_summary` reads it)."""
    from spark_jobs.layout import table_maintenance_file

    record = read_summary(settings) or {"freed_files_total": 0, "freed_bytes_total": 0, "compacted_files_total": 0}
    record["last_run"] = summary
    if not summary["dry_run"]:
        record["last_applied"] = summary
        record["freed_files_total"] += summary["vacuum_files"]
        record["freed_bytes_total"] += summary["vacuum_bytes"]
        record["compacted_files_total"] += summary["files_compacted"]
    path = table_maintenance_file(settings.status_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, sort_keys=True))
    tmp.replace(path)
    return record


def read_summary(settings: Settings) -> dict | None:
    """The record :func:`record_summary` keeps, None before the first maintenance run."""
    from spark_jobs.layout import table_maintenance_file

    path = table_maintenance_file(settings.status_dir)
    return json.loads(path.read_text()) if path.exists() else None
