"""One Delta table's maintenance, with delta-rs (no Spark session): compact its small files, vacuum the files
past its time-travel window.

* **compaction** (``OPTIMIZE``) when the current version holds at least :data:`MIN_FILES_TO_COMPACT`
  files smaller than :data:`SMALL_FILE_BYTES`; data and history are unchanged, only the file layout.
  A table whose writer runs is not compacted unless asked: a compaction that commits while a MERGE or a
  snapshot overwrite is under way fails that writer's commit (Delta's conflict rules);
* **vacuum** of files no version inside the retention references. The retention is never shorter than
  :data:`TIME_TRAVEL_DAYS` (the time travel the documentation promises) nor than the table's own declared
  ``delta.deletedFileRetentionDuration`` / ``delta.logRetentionDuration``: a table configured shorter
  is vacuumed at the promise, and one whose retention cannot be read is not vacuumed at all.

Which tables the platform maintains, and the record of what runs freed: :mod:`spark_jobs.operations.maintenance`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Literal

from runtime.object_store import Location

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
