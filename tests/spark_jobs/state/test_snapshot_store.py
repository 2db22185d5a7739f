"""SnapshotStore on a real Delta table (delta-rs, local disk): commits, retries, empty state, time travel,
the standby's incremental MERGEs."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from spark_jobs.state.snapshots import SnapshotConflict, SnapshotInfo, SnapshotStore


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
