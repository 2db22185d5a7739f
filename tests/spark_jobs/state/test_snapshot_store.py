"""SnapshotStore on a real Delta table (local disk): commits, retries, empty state, time travel, the
standby's incremental MERGEs (delta-rs) and the job's (Spark), over deletion vectors."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_jobs.maintenance import maintain_table
from spark_jobs.state.restore import STORE_SCHEMA
from spark_jobs.state.snapshots import SnapshotConflict, SnapshotInfo, SnapshotStore
from tests.helpers import age_delta_removals


def _write(store: SnapshotStore, state: dict[bytes, bytes], batch_id: int):
    return store.write(state, batch_id, {"purchases": {0: batch_id * 10}}, {0: batch_id * 3}, watermark_ms=batch_id)


def test_snapshots_commit_once_per_batch_and_time_travel(tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts", retention="3 days")
    first = _write(store, {b"u1": b'{"n":1}', b"u2": b'{"n":2}'}, 3)
    assert (first.batch_id, first.rows, first.changelog_offsets, first.watermark_ms) == (3, 2, {0: 9}, 3)
    assert first.input_offsets == {"purchases": {0: 30}}
    config = DeltaTable(store.path).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 3 days"

    # A retried task writes batch 3 again (with whatever it holds now): nothing is committed.
    again = _write(store, {b"u9": b'{"n":9}'}, 3)
    assert again.delta_version == first.delta_version and DeltaTable(store.path).version() == first.delta_version
    assert store.read(store.latest()) == {b"u1": b'{"n":1}', b"u2": b'{"n":2}'}

    second = _write(store, {b"u2": b'{"n":5}'}, 7)
    assert store.latest() == second and second.rows == 1
    assert store.read(second) == {b"u2": b'{"n":5}'}
    assert store.read(first) == {b"u1": b'{"n":1}', b"u2": b'{"n":2}'}  # the old version stays readable
    assert [s.batch_id for s in store.history()] == [3, 7]


def test_empty_state_over_empty_state_is_still_a_snapshot(tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts")
    _write(store, {}, 0)
    later = _write(store, {}, 1)  # every key deleted again: the snapshot must move on to batch 1
    assert store.latest().batch_id == 1 == later.batch_id and store.read(later) == {}


def _info(batch_id: int) -> SnapshotInfo:
    return SnapshotInfo(delta_version=-1, application_id="job-v1", store="counts", batch_id=batch_id,
                        input_offsets={"purchases": {0: batch_id * 10}}, changelog_offsets={0: batch_id * 3}, rows=0,
                        taken_at="2026-11-23T00:00:00+00:00", writer="standby")  # fmt: skip


def test_the_standbys_incremental_snapshots_merge_changes_only(tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts")
    first = store.merge({b"u1": b"1", b"u2": b"2", b"gone": None}, _info(0), expected_version=None)
    assert (first.rows, first.delta_version, first.writer) == (2, store.version(), "standby")
    # A change and a delete: only those keys are rewritten; the row count follows.
    second = store.merge({b"u2": b"5", b"u1": None, b"u3": b"3"}, _info(1), expected_version=first.delta_version,
                         previous_rows=first.rows)  # fmt: skip
    assert store.latest() == second and second.rows == 2
    assert store.read(second) == {b"u2": b"5", b"u3": b"3"} and store.read(first) == {b"u1": b"1", b"u2": b"2"}
    assert store.read_text(second) == {"u2": "5", "u3": "3"} and sorted(store.values(second)) == ["3", "5"]
    assert len(store.files()) >= 1 and all(size > 0 for size in store.files())
    # A driver snapshot landed meanwhile: the standby's merge is refused, nothing is committed.
    _write(store, {b"x": b"1"}, 2)
    with pytest.raises(SnapshotConflict, match="changed since version"):
        store.merge({b"u9": b"9"}, _info(3), expected_version=second.delta_version)
    assert store.read(store.latest()) == {b"x": b"1"}


def test_spark_merges_an_incremental_snapshot_through_deletion_vectors(spark, tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts", file_size_bytes=32 * 1024)
    state = {f"k{i:05d}": f'{{"n":{i}}}' for i in range(20_000)}
    full = store.write({k.encode(): v.encode() for k, v in state.items()}, 3, {"in": {0: 30}}, {0: 9})
    assert full.mode == "full" and len(store.files()) >= 8  # enough small files for maintenance to compact

    # 1% of the keys change, some are deleted, some are new: the latest value per key, null deletes
    changes = {f"k{i:05d}": f'{{"n":{-i}}}' for i in range(0, 20_000, 100)}
    changes |= {"k00001": None, "k00002": None, "new1": '{"n":1}', "gone": None}
    frame = spark.createDataFrame(list(changes.items()), STORE_SCHEMA)
    merged = store.merge_frame(frame, full, 4, {"in": {0: 40}}, {0: 12}, watermark_ms=7)
    expected = {k: v for k, v in (state | changes).items() if v is not None}
    assert (merged.mode, merged.rows_before, merged.rows) == ("incremental", 20_000, len(expected))
    assert (merged.batch_id, merged.changelog_offsets, merged.watermark_ms) == (4, {0: 12}, 7)
    assert store.latest() == merged and merged.delta_version == full.delta_version + 1
    metrics = DeltaTable(store.path).history(1)[0]["operationMetrics"]
    # no file holding a changed key was rewritten: the replaced rows are marked in deletion vectors
    assert int(metrics["numTargetFilesRemoved"]) == 0 and int(metrics["numTargetDeletionVectorsAdded"]) > 0
    assert store.read_text(merged) == expected  # delta-rs applies the deletion vectors
    assert {r.key: r.value for r in store.frame(spark, merged).collect()} == expected
    assert store.read_text(full) == state  # the previous snapshot stays readable

    # A retried batch commits nothing; a base that is no longer the latest is refused.
    assert store.merge_frame(frame, full, 4, {"in": {0: 40}}, {0: 12}) == merged
    with pytest.raises(SnapshotConflict, match="changed since version"):
        store.merge_frame(frame, full, 5, {"in": {0: 50}}, {0: 15})
    assert store.version() == merged.delta_version

    # The standby's delta-rs MERGE rewrites a file with a deletion vector: the rows it deletes stay deleted.
    standby_changes = {b"k00105": b'{"n":0}', b"new2": b"2"}  # k00105 shares its file with the replaced k00100
    standby = store.merge(standby_changes, _info(5), expected_version=merged.delta_version, previous_rows=merged.rows)
    expected |= {k.decode(): v.decode() for k, v in standby_changes.items()}
    assert standby.rows == len(expected) == len(store.values(standby)) and store.read_text(standby) == expected

    # Compaction rewrites the files without the deleted rows; every snapshot reads the same after it.
    assert maintain_table(store.path, "snapshot", dry_run=False).compacted_files_removed > 0
    assert store.read_text(store.latest()) == expected and store.read_text(full) == state
    # Past the time-travel window the files only older snapshots read are vacuumed; what the latest reads stays.
    age_delta_removals(Path(store.path), 30)
    assert maintain_table(store.path, "snapshot", dry_run=False).vacuum_files
    assert store.read_text(store.latest()) == expected


def test_a_snapshot_table_from_before_deletion_vectors_is_upgraded_by_its_first_merge(spark, tmp_path):
    import pyarrow as pa

    store = SnapshotStore(tmp_path / "old", "job-v1", "counts")
    schema = pa.schema([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())])
    DeltaTable.create(store.path, schema)  # as tables were created before snapshots were incremental
    full = store.write({b"a": b"1", b"b": b"2"}, 0, {}, {0: 2})
    changes = spark.createDataFrame([("a", None), ("c", "3")], STORE_SCHEMA)
    merged = store.merge_frame(changes, full, 1, {}, {0: 4})
    assert DeltaTable(store.path).metadata().configuration["delta.enableDeletionVectors"] == "true"
    assert store.latest() == merged and merged.rows == 2 and store.read_text(merged) == {"b": "2", "c": "3"}
