"""Delta table maintenance: compact small files, vacuum files past the time-travel window.

Output tables get a MERGE per micro-batch and snapshot tables a commit per snapshot (a layered
snapshot appends a few small files), so files pile up; nothing else deletes the files older versions reference. This
module runs, over every table the platform writes, the compaction and vacuum of one table
(:func:`spark_jobs.io.table_maintenance.maintain_table`: the rules are stated there). A table whose writer runs (the
job version's driver or standby holds its lease) is not compacted unless asked: the compaction would fail that
writer's commit, which would stop the job's batch or the standby.

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
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.object_store import Location
from spark_jobs.io.table_maintenance import TableKind, TableMaintenance, maintain_table

if TYPE_CHECKING:
    from runtime.settings import Settings
    from spark_jobs.layout import JobLayout


@dataclasses.dataclass(frozen=True)
class MaintainedTable:
    """One table to maintain: its kind, path, and the job version that owns it (None: the platform's)."""

    kind: TableKind
    path: Location
    layout: JobLayout | None = None
    store: str | None = None

    def writer_running(self) -> str | None:
        """Who writes the table now (the version's driver; for a snapshot table also its standby)."""
        from spark_jobs.driver.lease import JobLease

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
