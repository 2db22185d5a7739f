"""The state audit's rows, typed: what the checkpoint reader wrote, what the audit of a store found, and what
the audit reads of other tables and of a store's snapshot.

The rows cross processes through Delta tables: the checkpoint reader (a Spark application) appends one
:class:`CheckpointStateRow` per store and partition, the audit task reads them and appends a
:class:`StoreAudit` per store, which the next audits and the report read back. Each is written with
:func:`~spark_jobs.documents.to_row` and read back with :func:`~spark_jobs.documents.from_json`, at the one
place its table is read: a column an older table lacks reads as None, a column the row does not know is
ignored.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any, Literal

from spark_jobs.documents import from_json, to_json, to_row
from spark_jobs.registry import StoreKind

#: a measure a store's budget limits: live rows, bytes, seconds of a restore
Measure = Literal["rows", "bytes", "restore_s"]
#: where a store's live row count comes from: Spark's statestore reader, the job's latest progress, nowhere
StateRowsSource = Literal["checkpoint", "progress", "none"]
#: what the TTL check found (:mod:`.ttl`)
TtlVerdict = Literal["ttl_verified", "ttl_not_enforced", "ttl_unverifiable"]


@dataclasses.dataclass(frozen=True)
class CheckpointStateRow:
    """One row of ``_streamstate/state_checkpoint_audit``: a store's state in one partition of a checkpoint,
    or (with ``error``) a store the reader could not read."""

    run_id: str
    read_at: dt.datetime
    application_id: str
    version: int
    #: the checkpoint's latest committed batch, the one read
    batch_id: int
    store: str
    #: the stateful operator holding the store (None: the state metadata could not be read)
    operator_id: int | None = None
    partition: int | None = None
    rows: int | None = None
    #: key + value as JSON, summed
    bytes: int | None = None
    #: the store's share of the partition's state files on disk
    disk_bytes: int | None = None
    #: why the store could not be read (None: it was)
    error: str | None = None

    @classmethod
    def of(cls, table_row: Mapping[str, Any]) -> CheckpointStateRow:
        return from_json(cls, table_row)


@dataclasses.dataclass(frozen=True)
class PartitionState:
    """A store's live state in one partition, as the checkpoint reader counted it."""

    rows: int
    bytes: int
    disk_bytes: int


@dataclasses.dataclass(frozen=True)
class BudgetCheck:
    """One measure against its budget."""

    measure: Measure
    current: float
    limit: float
    #: growth per day (None: no trend yet)
    per_day: float | None
    #: days until the limit is reached at that growth (0: already beyond it; None: not growing)
    days_left: float | None

    @property
    def crossed(self) -> bool:
        return self.current > self.limit


@dataclasses.dataclass(frozen=True)
class ChangelogMeasurement:
    """What the audit reads of a row of ``_streamstate/changelog_measurements`` (the compaction tuning DAG's
    measurement of a changelog topic; its other columns are the tuner's)."""

    topic: str
    measured_at: dt.datetime
    records: int | None = None
    bytes: int | None = None
    #: keys whose latest record is a value
    live_keys: int | None = None
    tombstones: int | None = None

    @classmethod
    def of(cls, table_row: Mapping[str, Any]) -> ChangelogMeasurement:
        return from_json(cls, table_row)


@dataclasses.dataclass(frozen=True)
class SnapshotEntry:
    """The times the audit judges expiry by in one value of a store's latest snapshot (decoded JSON the job's
    processor wrote; the rest of the value is not read). A window store's value has ``window_start_ms``, a
    session store's ``session_end_ms``, an event-time TTL store's ``event_time_ms``; an entry with
    ``stream_time_ms`` (and none of those) is a partition's stream time."""

    source_partition: int | None = None
    stream_time_ms: int | None = None
    event_time_ms: int | None = None
    window_start_ms: int | None = None
    session_end_ms: int | None = None

    @classmethod
    def decode(cls, value: bytes | str) -> SnapshotEntry:
        return from_json(cls, json.loads(value))


#: the audit table's columns that hold JSON text (a list of budget checks, partition -> state)
_JSON_COLUMNS = ("budget_status", "partitions")


@dataclasses.dataclass(frozen=True)
class StoreAudit:
    """One store's audit: a row of ``_streamstate/state_audit``. None: not measured (or not measurable) in
    this audit, or a column added after the row was written."""

    run_id: str
    audited_at: dt.datetime
    application_id: str
    store: str
    job: str | None = None
    version: int | None = None
    kind: StoreKind | None = None

    # live state
    #: live rows (keys) of the store
    state_rows: int | None = None
    state_rows_source: StateRowsSource | None = None
    #: key + value as JSON, summed over the partitions (read from the checkpoint)
    state_bytes: int | None = None
    #: the store's share of the checkpoint's state files
    state_disk_bytes: int | None = None
    #: partition -> its live state (read from the checkpoint; the column holds JSON text)
    partitions: Mapping[int, PartitionState] | None = None
    #: state memory the job's latest progress reported
    memory_bytes: int | None = None
    #: the whole checkpoint on disk
    checkpoint_bytes: int | None = None

    # the Delta snapshot table
    #: snapshots still in the table (0: no table)
    snapshot_versions: int | None = None
    #: the latest snapshot's rows (None for a layered snapshot it could not count)
    snapshot_rows: int | None = None
    #: what the latest snapshot reads
    snapshot_bytes: int | None = None
    snapshot_files: int | None = None
    #: seconds since the latest snapshot was taken
    snapshot_age_s: float | None = None
    #: what the table keeps on disk, older snapshots included (time travel)
    snapshot_disk_bytes: int | None = None
    #: what Delta table maintenance can vacuum next
    snapshot_vacuumable_bytes: int | None = None
    #: what Delta table maintenance has freed so far
    snapshot_freed_bytes: int | None = None
    #: windows (or sessions) past the store's retention still in the latest snapshot (None: not such a store)
    windows_beyond_retention: int | None = None

    # the changelog and the dead letters
    changelog_records: int | None = None
    changelog_bytes: int | None = None
    changelog_live_keys: int | None = None
    changelog_tombstones: int | None = None
    #: where the changelog numbers come from (the tuning measurement, or the topic's offsets)
    changelog_source: str | None = None
    #: records in the job's dead-letter topic
    dead_letter_records: int | None = None
    #: dead letters since the previous audit that counted them
    dead_letter_growth: int | None = None

    # restore estimates, from the restores this deployment measured
    #: changelog records written after the latest snapshot (replayed on top of it)
    tail_records: int | None = None
    restore_snapshot_tail_s: float | None = None
    restore_full_replay_s: float | None = None

    # trends and budgets
    rows_per_day: float | None = None
    bytes_per_day: float | None = None
    restore_s_per_day: float | None = None
    #: the fewest days until a budget is crossed (0: crossed)
    days_to_budget: float | None = None
    #: every limited measure against its budget (the column holds JSON text)
    budget_status: tuple[BudgetCheck, ...] = ()
    unbounded: bool | None = None
    unbounded_reason: str | None = None
    budget_max_rows: int | None = None
    budget_max_bytes: int | None = None
    budget_max_restore_s: float | None = None
    budget_warn_days: float | None = None

    # the TTL check (a store with ttl_ms)
    ttl_ms: int | None = None
    ttl_verdict: TtlVerdict | None = None
    #: live keys whose idle time was measured
    ttl_keys_checked: int | None = None
    #: live keys idle longer than the TTL + tolerance
    ttl_keys_overdue: int | None = None
    ttl_oldest_overdue_ms: int | None = None
    ttl_reason: str | None = None

    #: why parts of the store could not be read ("; "-separated)
    errors: str | None = None

    @property
    def largest_bytes(self) -> int:
        """The store's size for its bytes budget and trend: the largest of its measured sizes (0: none)."""
        sizes = (self.state_bytes, self.state_disk_bytes, self.snapshot_bytes, self.changelog_bytes)
        return max((size for size in sizes if size is not None), default=0)

    @property
    def restore_s(self) -> float | None:
        """The estimated restore time: from the latest snapshot + tail, else by a full replay."""
        return self.restore_snapshot_tail_s if self.restore_snapshot_tail_s is not None else self.restore_full_replay_s

    def table_row(self) -> dict[str, Any]:
        """The row as the audit table stores it (budget checks, each with ``crossed``, and partitions as JSON
        text)."""
        checks = [{**to_json(check), "crossed": check.crossed} for check in self.budget_status]
        partitions = None if self.partitions is None else {p: to_json(s) for p, s in self.partitions.items()}
        return {
            **to_row(self),
            "budget_status": json.dumps(checks),
            "partitions": None if partitions is None else json.dumps(partitions),
        }

    @classmethod
    def of(cls, table_row: Mapping[str, Any]) -> StoreAudit:
        """A row of the audit table, its JSON text decoded (a budget check's ``crossed`` is recomputed)."""
        decoded = {name: json.loads(text) for name in _JSON_COLUMNS if (text := table_row.get(name))}
        audit = from_json(cls, {**table_row, **decoded})
        return audit if audit.budget_status is not None else dataclasses.replace(audit, budget_status=())
