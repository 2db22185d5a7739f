"""Delta table maintenance: compact small files, vacuum files past the time-travel window.

Output tables get a MERGE per micro-batch and snapshot tables a commit per snapshot (a layered
snapshot appends a few small files), so files pile up; nothing else deletes the files older versions reference. This
module plans and runs, with delta-rs (no Spark session), per table:

* **compaction** (``OPTIMIZE``) when the current version holds at least :data:`MIN_FILES_TO_COMPACT`
  files smaller than :data:`SMALL_FILE_BYTES`; data and history are unchanged, only the file layout.
  A table whose writer runs (the job version's driver or standby holds its lease) is not compacted
  unless asked: a compaction that commits while a MERGE or a snapshot overwrite is under way fails
  that writer's commit (Delta's conflict rules), which would stop the job's batch or the standby;
* **vacuum** of files no version inside the retention references. The retention is never shorter than
  :data:`TIME_TRAVEL_DAYS` (the time travel the documentation promises) nor than the table's own declared
  ``delta.deletedFileRetentionDuration`` / ``delta.logRetentionDuration``: a table configured shorter
  is vacuumed at the promise, and one whose retention cannot be read is not vacuumed at all.

Tables (:func:`tables_to_maintain`): every registered, not purged, version's snapshot and output
tables (named by :class:`~spark_jobs.layout.JobLayout`; snapshot tables through
:class:`~spark_jobs.state.snapshots.SnapshotStore`), every batch job's output (a run replaces its
interval's files: a compaction committing meanwhile fails that run's commit, and Airflow retries the run)
and the platform's own tables (``_streamstate``).

A run is a dry run unless told otherwise: the plan lists, per table, the files a compaction would
rewrite and the files and bytes a vacuum would delete. Each run is added to the
:class:`MaintenanceRecord` in :func:`~spark_jobs.layout.table_maintenance_file`: what applied runs freed,
in total and per table, which the state-size audit reports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from runtime.object_store import Location

if TYPE_CHECKING:
    from runtime.settings import Settings
    from spark_jobs.layout import JobLayout

#: old versions of every table stay readable by time travel this long (docs/writing-jobs/index.md: "stay readable by
#: time travel for 7 days"; docs/tuning/table-maintenance.md)
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

TableKind = Literal["snapshot", "output", "batch", "platform"]

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
    path: Location | Path | str, kind: TableKind, *, dry_run: bool = True, writer_running: str | None = None
) -> TableMaintenance:
    """Plan (``dry_run``) or run compaction and vacuum of one Delta table.

    ``writer_running``: who writes the table now (e.g. ``purchase_counts-v2 (driver)``); the table is
    then not compacted, only vacuumed (a vacuum changes no file a current version reads).
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    location = Location.of(path)
    table = DeltaTable(str(location), storage_options=location.storage_options())
    result = TableMaintenance(str(location), kind, dry_run=dry_run)
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
        table = DeltaTable(str(location), storage_options=location.storage_options())
    if result.retention_hours is None:
        return result
    # The files compaction just replaced are removed as of now: inside the retention, never vacuumed here.
    # enforce_retention_duration: delta-rs itself refuses a retention shorter than the table declares.
    doomed = table.vacuum(retention_hours=result.retention_hours, dry_run=True, enforce_retention_duration=True)
    result.vacuum_files = sorted(doomed)
    result.vacuum_bytes = sum((location / name).size_bytes() for name in doomed)
    if doomed and not dry_run:
        table.vacuum(retention_hours=result.retention_hours, dry_run=False, enforce_retention_duration=True)
    return result


@dataclasses.dataclass(frozen=True)
class MaintainedTable:
    """One table to maintain: its kind, path, and the job version that owns it (None: the platform's)."""

    kind: TableKind
    path: Location
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
    """Every existing snapshot and output table of a registered, not purged, version, every batch job's output,
    and the platform's tables."""
    from deltalake import DeltaTable

    from spark_jobs.batch.runner import output_location
    from spark_jobs.batch.spec import batch_jobs
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
    found += [
        MaintainedTable("batch", output_location(settings, job))
        for job in batch_jobs(settings.job_modules or "").values()
    ]
    found += [MaintainedTable("platform", t) for t in platform_table(settings, "job_versions").parent.children()]
    return [t for t in found if DeltaTable.is_deltatable(str(t.path), storage_options=t.path.storage_options())]


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


@dataclasses.dataclass
class Freed:
    """Files and bytes a vacuum deleted (or, in a dry run, would delete)."""

    files: int = 0
    bytes: int = 0

    def add(self, other: Freed) -> None:
        self.files += other.files
        self.bytes += other.bytes


@dataclasses.dataclass
class MaintenanceRun:
    """One run's totals: what the operator logs and returns, and what :class:`MaintenanceRecord` keeps."""

    run_at: str
    dry_run: bool
    tables: int
    tables_compacted: int
    tables_deferred: int
    files_compacted: int
    files_written: int
    vacuumed: Freed
    #: table path -> what a vacuum deleted there (tables with nothing to delete are left out)
    vacuumed_by_table: dict[str, Freed]
    errors: list[str]

    @classmethod
    def from_dict(cls, data: dict) -> MaintenanceRun:
        return cls(
            **{
                **data,
                "vacuumed": Freed(**data["vacuumed"]),
                "vacuumed_by_table": {k: Freed(**v) for k, v in data["vacuumed_by_table"].items()},
            }
        )


def summarize(results: list[TableMaintenance], *, dry_run: bool) -> MaintenanceRun:
    """One run's totals."""
    by_table = {r.path: Freed(len(r.vacuum_files), r.vacuum_bytes) for r in results if r.vacuum_files}
    total = Freed()
    for freed in by_table.values():
        total.add(freed)
    return MaintenanceRun(
        run_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        dry_run=dry_run,
        tables=len(results),
        tables_compacted=sum(1 for r in results if r.compact),
        tables_deferred=sum(1 for r in results if r.compact_deferred),
        files_compacted=sum(r.compacted_files_removed for r in results),
        files_written=sum(r.compacted_files_added for r in results),
        vacuumed=total,
        vacuumed_by_table=by_table,
        errors=[f"{r.path}: {r.error}" for r in results if r.error],
    )


@dataclasses.dataclass
class MaintenanceRecord:
    """What maintenance has done so far: its latest run, its latest applied run, and what applied runs
    freed, in total and per table (the state-size audit reports a snapshot table's share)."""

    last_run: MaintenanceRun | None = None
    last_applied: MaintenanceRun | None = None
    freed: Freed = dataclasses.field(default_factory=Freed)
    compacted_files: int = 0
    freed_by_table: dict[str, Freed] = dataclasses.field(default_factory=dict)

    def freed_from(self, table: Path | str) -> Freed:
        """What applied runs freed in ``table`` so far."""
        return self.freed_by_table.get(str(table), Freed())

    def add(self, run: MaintenanceRun) -> None:
        self.last_run = run
        if run.dry_run:
            return
        self.last_applied = run
        self.freed.add(run.vacuumed)
        self.compacted_files += run.files_compacted
        for path, freed in run.vacuumed_by_table.items():
            self.freed_by_table.setdefault(path, Freed()).add(freed)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> MaintenanceRecord:
        data = json.loads(text)

        def run(d: dict | None) -> MaintenanceRun | None:
            return MaintenanceRun.from_dict(d) if d else None

        return cls(
            last_run=run(data["last_run"]),
            last_applied=run(data["last_applied"]),
            freed=Freed(**data["freed"]),
            compacted_files=data["compacted_files"],
            freed_by_table={k: Freed(**v) for k, v in data["freed_by_table"].items()},
        )


def record_run(settings: Settings, run: MaintenanceRun) -> MaintenanceRecord:
    """Add ``run`` to the record (:func:`read_record`) and keep it; returns the record."""
    from spark_jobs.layout import table_maintenance_file

    record = read_record(settings)
    record.add(run)
    path = table_maintenance_file(settings.status_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(record.to_json())
    tmp.replace(path)
    return record


def read_record(settings: Settings) -> MaintenanceRecord:
    """What maintenance has done so far (an empty record before its first run)."""
    from spark_jobs.layout import table_maintenance_file

    path = table_maintenance_file(settings.status_dir)
    return MaintenanceRecord.from_json(path.read_text()) if path.exists() else MaintenanceRecord()
