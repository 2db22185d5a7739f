"""Delta table maintenance on real tables (delta-rs, local disk): compaction keeps the data, vacuum
never breaks the promised time travel, a dry run changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from runtime.settings import Settings
from spark_jobs.layout import JobLayout
from spark_jobs.maintenance import MIN_FILES_TO_COMPACT, TIME_TRAVEL_DAYS, maintain, maintain_table, retention_hours
from spark_jobs.registry import get_job
from spark_jobs.state.snapshots import SnapshotStore


def _many_small_commits(path: Path, commits: int) -> None:
    for i in range(commits):
        write_deltalake(str(path), pa.table({"key": [f"k{i}"], "value": [str(i)]}), mode="append")


def _age_every_file(path: Path, days: float) -> None:
    """Removals as if committed ``days`` ago: vacuum goes by the remove actions' ``deletionTimestamp``."""
    shift = int(days * 86_400_000)
    for commit in (path / "_delta_log").glob("*.json"):
        lines = []
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "remove" in action and action["remove"].get("deletionTimestamp"):
                action["remove"]["deletionTimestamp"] -= shift
            lines.append(json.dumps(action))
        commit.write_text("\n".join(lines) + "\n")


def test_retention_is_never_shorter_than_the_promised_time_travel():
    assert retention_hours({}) == TIME_TRAVEL_DAYS * 24
    assert retention_hours({"delta.deletedFileRetentionDuration": "interval 0 hours"}) == TIME_TRAVEL_DAYS * 24
    assert retention_hours({"delta.deletedFileRetentionDuration": "interval 2 weeks"}) == 14 * 24


def test_compaction_keeps_the_data_and_vacuum_keeps_the_time_travel_window(tmp_path):
    table = tmp_path / "out"
    _many_small_commits(table, MIN_FILES_TO_COMPACT + 2)
    rows = sorted(DeltaTable(str(table)).to_pyarrow_table().to_pylist(), key=lambda r: r["key"])

    planned = maintain_table(table, "output", dry_run=True)
    assert planned.compact and planned.small_files == MIN_FILES_TO_COMPACT + 2 and planned.vacuum_files == 0
    assert DeltaTable(str(table)).version() == MIN_FILES_TO_COMPACT + 1  # the dry run committed nothing

    done = maintain_table(table, "output", dry_run=False)
    after = DeltaTable(str(table))
    assert done.compacted["files_removed"] == MIN_FILES_TO_COMPACT + 2 and len(after.file_uris()) == 1
    assert sorted(after.to_pyarrow_table().to_pylist(), key=lambda r: r["key"]) == rows
    # The files compaction replaced are younger than the promise: still there, time travel still reads.
    assert done.vacuum_files == 0 and DeltaTable(str(table), version=3).to_pyarrow_table().num_rows == 4

    _age_every_file(table, TIME_TRAVEL_DAYS + 1)  # a week and a day later
    freed = maintain_table(table, "output", dry_run=False)
    assert freed.vacuum_files == MIN_FILES_TO_COMPACT + 2 and freed.vacuum_bytes > 0
    assert sorted(DeltaTable(str(table)).to_pyarrow_table().to_pylist(), key=lambda r: r["key"]) == rows


def test_every_registered_versions_tables_are_maintained_snapshots_through_their_store(tmp_path):
    settings = Settings(data_dir=tmp_path)
    layout = JobLayout.of(get_job("purchase_counts"), settings)
    store = SnapshotStore.of(layout, "counts")
    for batch in range(3):
        store.write({b"u1": str(batch).encode()}, batch, {}, {0: batch})
    _many_small_commits(layout.output_table, 2)
    results = {Path(r.path): r for r in maintain(settings, dry_run=True)}
    assert set(results) == {layout.snapshot_table("counts"), layout.output_table}
    assert results[layout.snapshot_table("counts")].kind == "snapshot"
    _age_every_file(layout.snapshot_table("counts"), TIME_TRAVEL_DAYS + 1)
    maintain(settings, dry_run=False)
    assert store.read(store.latest()) == {b"u1": b"2"}  # the newest snapshot is untouched
