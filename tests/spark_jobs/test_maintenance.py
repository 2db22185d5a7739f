"""Delta table maintenance on real tables (delta-rs, local disk): compaction keeps the data, vacuum
never breaks the promised time travel (whatever retention a table declares), a dry run changes
nothing, running writers' tables are not compacted, purged versions are left alone, and each run's
summary adds what it freed to the totals the state-size audit shows."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.io.table_maintenance import (
    MIN_FILES_TO_COMPACT,
    TIME_TRAVEL_DAYS,
    TIME_TRAVEL_RETENTION,
    interval_hours,
    maintain_table,
    retention_hours,
)
from spark_jobs.layout import JobLayout, table_maintenance_file
from spark_jobs.operations.maintenance import Freed, maintain, read_record, record_run, summarize, tables_to_maintain
from spark_jobs.registry import get_job
from spark_jobs.state.snapshots import SnapshotStore, snapshot_table_configuration
from spark_jobs.versions import JobVersions
from tests.helpers import age_delta_removals, documentation_text

PROMISE_HOURS = TIME_TRAVEL_DAYS * 24


def _many_small_commits(path: Path, commits: int, configuration: dict | None = None) -> None:
    for i in range(commits):
        batch = pa.table({"key": [f"k{i}"], "value": [str(i)]})
        write_deltalake(str(path), batch, mode="append", configuration=configuration if i == 0 else None)


def _overwrite(path: Path, rows: int) -> None:
    """One commit that removes every file (each becomes a vacuum candidate once it is old enough)."""
    batch = pa.table({"key": [f"n{i}" for i in range(rows)], "value": ["x"] * rows})
    write_deltalake(str(path), batch, mode="overwrite")


def _rows(path: Path, version: int | None = None) -> list[dict]:
    return sorted(DeltaTable(str(path), version=version).to_pyarrow_table().to_pylist(), key=lambda r: r["key"])


def _parquet_files(path: Path | Location) -> set[str]:
    return {p.name for p in Path(path).glob("*.parquet")}


def test_retention_intervals_are_read_as_delta_writes_them():
    assert interval_hours("interval 7 days") == 168
    assert interval_hours("interval 1 week") == 168
    assert interval_hours("2 weeks") == 336
    assert interval_hours("interval 1 day 12 hours") == 36
    assert interval_hours("interval 90 minutes") == 2  # rounded up: never shorter than declared
    for unreadable in ("interval 1 month", "forever", ""):
        with pytest.raises(ValueError):
            interval_hours(unreadable)


def test_retention_is_never_shorter_than_the_promise_nor_than_what_the_table_declares():
    assert retention_hours({}) == PROMISE_HOURS
    assert retention_hours({"delta.deletedFileRetentionDuration": "interval 0 hours"}) == PROMISE_HOURS
    assert retention_hours({"delta.deletedFileRetentionDuration": "interval 2 weeks"}) == 336
    longest = {"delta.deletedFileRetentionDuration": "interval 1 day", "delta.logRetentionDuration": "interval 10 days"}
    assert retention_hours(longest) == 240


def test_the_readme_promise_and_the_snapshot_tables_retention_are_the_constant():
    promised = set(re.findall(r"time travel[^.;]*?(\d+) days", documentation_text().replace("\n", " ")))
    assert promised == {str(TIME_TRAVEL_DAYS)}, f"the documentation promises time travel for {promised} days"
    configuration = snapshot_table_configuration()
    assert configuration["delta.deletedFileRetentionDuration"] == f"interval {TIME_TRAVEL_RETENTION}"
    assert interval_hours(configuration["delta.logRetentionDuration"]) == PROMISE_HOURS


def test_compaction_keeps_the_data_and_history_and_a_dry_run_changes_nothing(tmp_path):
    table = tmp_path / "out"
    _many_small_commits(table, MIN_FILES_TO_COMPACT + 2)
    rows, files = _rows(table), _parquet_files(table)

    planned = maintain_table(table, "output", dry_run=True)
    assert planned.compact and len(planned.small_files) == MIN_FILES_TO_COMPACT + 2
    assert set(planned.small_files) == files and planned.small_bytes > 0
    assert DeltaTable(str(table)).version() == MIN_FILES_TO_COMPACT + 1 and _parquet_files(table) == files

    done = maintain_table(table, "output", dry_run=False)
    after = DeltaTable(str(table))
    assert done.compacted_files_removed == MIN_FILES_TO_COMPACT + 2 and done.compacted_files_added == 1
    assert len(after.file_uris()) == 1 and _rows(table) == rows
    # The replaced files were removed just now: kept, so time travel to before the compaction reads.
    assert done.vacuum_files == [] and _rows(table, version=3) == rows[:4]
    assert maintain_table(table, "output", dry_run=True).compact is False  # nothing small left


def test_a_table_declaring_no_retention_is_vacuumed_at_the_promise_not_earlier(tmp_path):
    table = tmp_path / "out"
    _many_small_commits(table, 3, configuration={"delta.deletedFileRetentionDuration": "interval 0 hours"})
    before_overwrite = _rows(table)
    _overwrite(table, 5)
    old_files = _parquet_files(table) - {Path(u).name for u in DeltaTable(str(table)).file_uris()}
    assert len(old_files) == 3

    # Removed a day ago: inside the promised window although the table declares 0 hours.
    age_delta_removals(table, 1)
    kept = maintain_table(table, "output", dry_run=False)
    assert kept.retention_hours == PROMISE_HOURS and kept.vacuum_files == []
    assert old_files <= _parquet_files(table) and _rows(table, version=2) == before_overwrite

    # A week and a day ago: past the window. The dry run lists them and deletes nothing.
    age_delta_removals(table, TIME_TRAVEL_DAYS)
    planned = maintain_table(table, "output", dry_run=True)
    assert {Path(f).name for f in planned.vacuum_files} == old_files and planned.vacuum_bytes > 0
    assert old_files <= _parquet_files(table)
    freed = maintain_table(table, "output", dry_run=False)
    assert {Path(f).name for f in freed.vacuum_files} == old_files and freed.vacuum_bytes == planned.vacuum_bytes
    assert not old_files & _parquet_files(table) and len(_rows(table)) == 5


def test_a_table_whose_retention_cannot_be_read_is_not_vacuumed(tmp_path):
    table = tmp_path / "out"
    _many_small_commits(table, 2, configuration={"delta.logRetentionDuration": "interval 1 month"})
    _overwrite(table, 1)
    age_delta_removals(table, 365)
    result = maintain_table(table, "output", dry_run=False)
    assert result.retention_hours is None and "1 month" in result.vacuum_skipped
    assert len(_parquet_files(table)) == 3


def test_every_registered_versions_tables_snapshots_through_their_store_running_writers_not_compacted(tmp_path):
    settings = Settings(data_dir=tmp_path)
    layout = JobLayout.of(get_job("purchase_counts"), settings)
    store = SnapshotStore.of(layout, "counts")
    latest = store.write({b"u0": b"0"}, 0, {}, {0: 0})
    for batch in range(1, MIN_FILES_TO_COMPACT):  # the standby's layers: a small file each
        info = dataclasses.replace(latest, batch_id=batch, changelog_offsets={0: batch})
        latest = store.append_layer({f"u{batch}".encode(): str(batch).encode()}, info, base=latest)
    state = store.read(store.latest())
    _many_small_commits(layout.output_table, MIN_FILES_TO_COMPACT)
    output_files = _parquet_files(layout.output_table)

    listed = {t.path: t.kind for t in tables_to_maintain(settings)}
    assert listed == {layout.snapshot_table("counts"): "snapshot", layout.output_table: "output"}

    with JobLease(settings.status_dir, layout.driver.name):  # the job runs
        results = {Location.of(r.path): r for r in maintain(settings, dry_run=False)}
    output = results[layout.output_table]
    assert not output.compact and layout.driver.name in output.compact_deferred
    assert _parquet_files(layout.output_table) == output_files
    assert DeltaTable(str(layout.output_table)).version() == MIN_FILES_TO_COMPACT - 1

    with JobLease(settings.status_dir, layout.standby.name):  # only the standby runs: it writes snapshots only
        results = {Location.of(r.path): r for r in maintain(settings, dry_run=False)}
    assert results[layout.output_table].compacted_files_removed == MIN_FILES_TO_COMPACT
    assert layout.standby.name in results[layout.snapshot_table("counts")].compact_deferred

    results = {Location.of(r.path): r for r in maintain(settings, dry_run=False)}  # nothing runs
    assert results[layout.snapshot_table("counts")].compacted_files_removed == MIN_FILES_TO_COMPACT
    assert len(state) == MIN_FILES_TO_COMPACT and store.read(store.latest()) == state


def test_purged_versions_are_left_alone_platform_tables_are_maintained(tmp_path):
    settings = Settings(data_dir=tmp_path)
    layout = JobLayout.of(get_job("vote_counts"), settings)
    _many_small_commits(layout.output_table, 1)
    versions = JobVersions(settings)
    spec = get_job("vote_counts")
    versions.mark_purged(spec.name, spec.version, by="test")  # e.g. a table left behind by a purge
    listed = {t.path: t.kind for t in tables_to_maintain(settings)}
    assert listed == {versions.path: "platform"}


def test_a_batch_jobs_output_is_maintained_too(tmp_path):
    from spark_jobs.batch.runner import output_location
    from spark_jobs.batch.spec import get_batch_job

    settings = Settings(data_dir=tmp_path)
    table = output_location(settings, get_batch_job("daily_top_movers"))
    _many_small_commits(table, MIN_FILES_TO_COMPACT)
    assert {t.path: t.kind for t in tables_to_maintain(settings)} == {table: "batch"}
    (result,) = maintain(settings, dry_run=False)
    assert result.compacted_files_removed == MIN_FILES_TO_COMPACT


def test_the_record_adds_what_applied_runs_freed_dry_runs_add_nothing(tmp_path):
    settings = Settings(data_dir=tmp_path)
    table = tmp_path / "out"
    _many_small_commits(table, 2)
    _overwrite(table, 1)
    age_delta_removals(table, TIME_TRAVEL_DAYS + 1)

    record = record_run(settings, summarize([maintain_table(table, "output", dry_run=True)], dry_run=True))
    assert record.last_run.vacuumed.files == 2 and record.freed == Freed() and record.freed_from(table) == Freed()
    applied = summarize([maintain_table(table, "output", dry_run=False)], dry_run=False)
    record_run(settings, applied)
    record = read_record(settings)  # read back from its file
    assert record.freed.files == 2 and record.freed.bytes == applied.vacuumed.bytes > 0
    assert record.freed_from(table) == record.freed and record.last_applied == applied
    assert table_maintenance_file(settings.status_dir).exists()


def test_the_state_size_audit_counts_what_maintenance_can_free_and_freed(settings, kafka_broker, tmp_path):
    from spark_jobs.operations.state_audit.collect import audit_store
    from spark_jobs.operations.state_audit.report import write_report

    settings = dataclasses.replace(settings, data_dir=tmp_path)  # the shared broker, tables of this test only
    spec = get_job("purchase_counts")
    store = SnapshotStore.of(JobLayout.of(spec, settings), "counts")
    for batch in range(3):  # each snapshot replaces the previous one's files
        store.write({b"u1": str(batch).encode()}, batch, {}, {0: batch})
    age_delta_removals(Path(store.path), TIME_TRAVEL_DAYS + 1)

    def audit(run_id: str):
        return audit_store(
            settings, run_id, spec, spec.stores[0], checkpoint_rows=[], changelog=None, restores=[], history=[]
        )

    before = audit("before")
    assert before.snapshot_vacuumable_bytes > 0 and before.snapshot_freed_bytes == 0
    record_run(settings, summarize(maintain(settings, dry_run=False), dry_run=False))
    after = audit("after")
    assert after.snapshot_freed_bytes == before.snapshot_vacuumable_bytes
    assert after.snapshot_vacuumable_bytes == 0
    assert after.snapshot_disk_bytes < before.snapshot_disk_bytes
    assert store.read(store.latest()) == {b"u1": b"2"}

    page = write_report(settings, {(spec.application_id, "counts"): [before, after]}).read_text()
    assert f"has freed {after.snapshot_freed_bytes:,} B" in page
    assert f"Delta table maintenance freed 2 files, {after.snapshot_freed_bytes:,} B so far" in page
