"""SnapshotStore on a real Delta table (delta-rs, local disk): commits, retries, empty state, time travel."""

from __future__ import annotations

from deltalake import DeltaTable

from spark_jobs.state.snapshots import SnapshotStore


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
