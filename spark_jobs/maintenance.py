"""Delta table maintenance: compact small files, vacuum files past the time-travel window.

Output tables get a MERGE per micro-batch and snapshot tables a commit per snapshot (the standby's
MERGEs are small), so files pile up; nothing deletes the files older versions reference. This module
plans and runs, with delta-rs (no Spark session), per table:

* **compaction** (``OPTIMIZE``) when the current version holds at least :data:`MIN_FILES_TO_COMPACT`
  files smaller than :data:`SMALL_FILE_BYTES`; data and history are unchanged, only the file layout;
* **vacuum** of files no version inside the retention references. The retention is never shorter than
  :data:`TIME_TRAVEL_DAYS` (the time travel the README promises) nor than the table's own
  ``delta.deletedFileRetentionDuration``: a table configured shorter is vacuumed at the promise.

Tables: every registered, not purged, version's snapshot and output tables (named by
:class:`~spark_jobs.layout.JobLayout`; snapshot tables through
:class:`~spark_jobs.state.snapshots.SnapshotStore`) and the platform's own tables (``_streamstate``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

#: old versions of every table stay readable by time travel this long (README, "Reprocessing")
TIME_TRAVEL_DAYS = 7
#: a file smaller than this is "small" (a Parquet file a reader would rather not open alone)
SMALL_FILE_BYTES = 16 * 1024 * 1024
#: compact when a table's current version holds at least this many small files
MIN_FILES_TO_COMPACT = 8
#: the size compaction writes files at
TARGET_FILE_BYTES = 128 * 1024 * 1024

TableKind = Literal["snapshot", "output", "platform"]
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(hour|day|week)s?\s*$", re.IGNORECASE)
_HOURS = {"hour": 1, "day": 24, "week": 168}


@dataclasses.dataclass
class TableMaintenance:
    """What maintenance does (or would do) to one table."""

    path: str
    kind: TableKind
    files: int
    small_files: int
    compact: bool
    retention_hours: int
    #: files a vacuum deletes (or would), and their bytes
    vacuum_files: int = 0
    vacuum_bytes: int = 0
    #: after a real run: files removed and added by the compaction
    compacted: dict = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def retention_hours(configuration: dict[str, str]) -> int:
    """The vacuum retention of a table: its ``deletedFileRetentionDuration``, never below the promise."""
    declared = _INTERVAL.match(configuration.get("delta.deletedFileRetentionDuration") or "")
    hours = int(declared.group(1)) * _HOURS[declared.group(2).lower()] if declared else 0
    return max(hours, TIME_TRAVEL_DAYS * 24)


def maintain_table(path: Path | str, kind: TableKind, *, dry_run: bool = True) -> TableMaintenance:
    """Plan (``dry_run``) or run compaction and vacuum of one Delta table."""
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(str(path))
    sizes = [int(size) for size in pa.table(table.get_add_actions(flatten=True)).column("size_bytes").to_pylist()]
    small = sum(1 for size in sizes if size < SMALL_FILE_BYTES)
    result = TableMaintenance(str(path), kind, len(sizes), small, small >= MIN_FILES_TO_COMPACT,
                              retention_hours(table.metadata().configuration))  # fmt: skip
    if result.compact and not dry_run:
        metrics = table.optimize.compact(target_size=TARGET_FILE_BYTES)
        result.compacted = {"files_removed": metrics.get("numFilesRemoved"), "files_added": metrics.get("numFilesAdded")}
        table = DeltaTable(str(path))
    # The compaction's removed files are inside the retention: a vacuum never touches them today.
    doomed = table.vacuum(retention_hours=result.retention_hours, dry_run=True, enforce_retention_duration=True)
    result.vacuum_files = len(doomed)
    result.vacuum_bytes = sum(_size(Path(path) / name) for name in doomed)
    if doomed and not dry_run:
        table.vacuum(retention_hours=result.retention_hours, dry_run=False, enforce_retention_duration=True)
    return result


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def tables_to_maintain(settings) -> list[tuple[TableKind, Path]]:
    """Every existing snapshot and output table of a registered version, and the platform's tables."""
    from deltalake import DeltaTable

    from spark_jobs.layout import JobLayout
    from spark_jobs.registry import registered_versions

    found: list[tuple[TableKind, Path]] = []
    for versions in registered_versions().values():
        for spec in versions.values():  # a purged version's tables are gone: skipped below
            layout = JobLayout.of(spec, settings)
            found += [("snapshot", t) for t in layout.snapshot_tables]
            found += [("output", t) for t in layout.output_tables]
    platform = settings.lake_dir / "_streamstate"
    found += [("platform", t) for t in sorted(platform.iterdir())] if platform.is_dir() else []
    return [(kind, path) for kind, path in found if DeltaTable.is_deltatable(str(path))]


def maintain(settings, *, dry_run: bool = True) -> list[TableMaintenance]:
    """Maintain every table (:func:`tables_to_maintain`): snapshot tables through their ``SnapshotStore``."""
    from spark_jobs.state.snapshots import SnapshotStore

    results = []
    for kind, path in tables_to_maintain(settings):
        if kind == "snapshot":
            results.append(SnapshotStore(path, "", path.name).maintain(dry_run=dry_run))
        else:
            results.append(maintain_table(path, kind, dry_run=dry_run))
    return results
