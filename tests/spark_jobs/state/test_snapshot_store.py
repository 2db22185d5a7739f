"""SnapshotStore on a real Delta table (local disk): commits, retries, empty state, time travel, layered
snapshots written by the standby (delta-rs) and the job (Spark), folds, and maintenance over layers."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from spark_jobs.io.table_maintenance import maintain_table
from spark_jobs.state.restore import STORE_SCHEMA
from spark_jobs.state.snapshots import SnapshotConflict, SnapshotInfo, SnapshotStore, overlay
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
    return SnapshotInfo(
        delta_version=-1,
        application_id="job-v1",
        store="counts",
        batch_id=batch_id,
        input_offsets={"purchases": {0: batch_id * 10}},
        changelog_offsets={0: batch_id * 3},
        rows=0,
        taken_at="2026-11-23T00:00:00+00:00",
        writer="standby",
    )


def test_the_standbys_layers_read_as_the_state_and_fold_when_they_outgrow_the_base(tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts", fold_fraction=1.0)
    first = store.append_layer({b"u1": b"1", b"u2": b"2", b"u3": b"3", b"gone": None}, _info(0), base=None)
    assert (first.mode, first.rows, first.delta_version, first.writer) == ("full", 3, store.version(), "standby")
    # A change, a delete and a new key: one append, read back as the state
    second = store.append_layer({b"u2": b"5", b"u1": None, b"u4": b"4"}, _info(1), base=first)
    assert (second.mode, second.rows, second.base_rows, second.layer_rows, second.layers) == ("layered", None, 3, 3, 1)
    assert store.latest() == second and second.rows_scanned == 6 and store.count(second) == 3
    assert store.read(second) == {b"u2": b"5", b"u3": b"3", b"u4": b"4"}
    assert store.read(first) == {b"u1": b"1", b"u2": b"2", b"u3": b"3"}  # the base stays readable by time travel
    assert sorted(store.values(second)) == ["3", "4", "5"]
    # A newer layer wins over an older one, a delete over a value; a key deleted and set again is back.
    third = store.append_layer({b"u4": None, b"u1": b"11"}, _info(2), base=second)
    assert store.read_text(third) == {"u1": "11", "u2": "5", "u3": "3"}
    assert (third.layer_rows, third.layers, third.base_batch) == (5, 2, 0)
    # The layers hold more rows than the base: they fold into a new base of the same batch.
    assert store.next_mode(second) == "layered" and store.next_mode(third) == "full"
    folded = store.fold(third)
    assert (folded.mode, folded.batch_id, folded.rows, folded.layers) == ("full", 2, 3, 0)
    assert store.read_text(folded) == store.read_text(third) and store.read_text(second) == {
        "u2": "5",
        "u3": "3",
        "u4": "4",
    }
    assert len(store.files()) >= 1 and all(size > 0 for size in store.files())
    # A driver snapshot landed meanwhile: the standby's layer is refused, nothing is committed.
    _write(store, {b"x": b"1"}, 3)
    with pytest.raises(SnapshotConflict, match="a snapshot landed after version"):
        store.append_layer({b"u9": b"9"}, _info(4), base=folded)
    assert store.read(store.latest()) == {b"x": b"1"}
    # A layer of a batch the table already holds is refused too (it would hide newer values).
    with pytest.raises(SnapshotConflict, match="is not after"):
        store.append_layer({b"u9": b"9"}, _info(3), base=store.latest())


@pytest.mark.parametrize("broadcast", [True, False], ids=["changes-in-driver", "shuffled"])
def test_an_overlay_keeps_the_untouched_rows_and_the_live_changes(spark, broadcast):
    # enough untouched keys that the Bloom filter ahead of the exact set passes some of them (~3%): the exact
    # set must still keep them; keys of several UTF-8 lengths, since the filter hashes the key's bytes
    base = {f"k{i}-é€𝄞"[: 2 + i % 6]: f"b{i}" for i in range(20_000)} | {"": "empty key"}
    changes = {f"k{i}-é€𝄞"[: 2 + i % 6]: None if i % 3 else f"c{i}" for i in range(0, 20_000, 97)}
    changes |= {"only-in-changes": "new", "deleted-but-absent": None, "": None}
    base_rows = [*base.items(), (None, "a null key is no change's")]
    frame = overlay(
        spark.createDataFrame(base_rows, STORE_SCHEMA),
        spark.createDataFrame([*changes.items(), (None, "dropped")], STORE_SCHEMA),
        broadcast=broadcast,
    )
    rows = [(r.key, r.value) for r in frame.collect()]
    expected = {k: v for k, v in (base | changes).items() if v is not None}
    assert sorted(rows, key=str) == sorted([*expected.items(), (None, "a null key is no change's")], key=str)
    if broadcast:  # the changes were read by the call: the frame scans the base alone, without a join
        plan = frame._jdf.queryExecution().executedPlan().toString()
        assert "Join" not in plan and plan.count("Scan ExistingRDD") == 2  # the base (a test's RDD), the live changes


def test_spark_appends_a_layer_that_reads_like_the_whole_state(spark, tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts", file_size_bytes=32 * 1024)
    state = {f"k{i:05d}": f'{{"n":{i}}}' for i in range(20_000)}
    full = store.write({k.encode(): v.encode() for k, v in state.items()}, 3, {"in": {0: 30}}, {0: 9})
    base_files = len(store.files())
    assert full.mode == "full" and base_files >= 8  # enough small files for maintenance to compact

    # 1% of the keys change, some are deleted, some are new: the latest value per key, null deletes
    changes = {f"k{i:05d}": f'{{"n":{-i}}}' for i in range(0, 20_000, 100)}
    changes |= {"k00001": None, "k00002": None, "new1": '{"n":1}', "gone": None}
    frame = spark.createDataFrame(list(changes.items()), STORE_SCHEMA)
    assert store.next_mode(full) == "layered"
    layer = store.append_layer_frame(frame, full, 4, {"in": {0: 40}}, {0: 12}, watermark_ms=7)
    expected = {k: v for k, v in (state | changes).items() if v is not None}
    assert (layer.mode, layer.rows, layer.base_rows, layer.layer_rows) == ("layered", None, 20_000, len(changes))
    assert (layer.batch_id, layer.changelog_offsets, layer.watermark_ms) == (4, {0: 12}, 7)
    assert store.latest() == layer and layer.delta_version == full.delta_version + 1 and layer.bytes > 0
    metrics = DeltaTable(store.path).history(1)[0]["operationMetrics"]
    # an append: nothing of the base was read or rewritten
    assert int(metrics["numOutputRows"]) == len(changes) and len(store.files()) > base_files
    assert store.read_text(layer) == expected and store.count(layer) == len(expected)
    assert {r.key: r.value for r in store.frame(spark, layer).collect()} == expected
    assert store.read_text(full) == state  # the previous snapshot stays readable

    # A retried batch commits nothing; a base that is no longer the latest is refused.
    assert store.append_layer_frame(frame, full, 4, {"in": {0: 40}}, {0: 12}) == layer
    with pytest.raises(SnapshotConflict, match="a snapshot landed after version"):
        store.append_layer_frame(frame, full, 5, {"in": {0: 50}}, {0: 15})
    assert store.version() == layer.delta_version

    # A short tail's layer is committed by delta-rs (as take_snapshot writes it): the same rows, read the same way.
    few = {b"k00200": b'{"n":2}', b"k00003": None}
    short = store.append_layer(few, store.new_info(5, {"in": {0: 50}}, {0: 15}), base=layer)
    expected = {k: v for k, v in (expected | {"k00200": '{"n":2}', "k00003": None}).items() if v is not None}
    assert (short.mode, short.layers, short.layer_rows, short.writer) == ("layered", 2, len(changes) + 2, "driver")
    assert store.read_text(short) == expected and store.read_text(layer) != expected

    # The standby's delta-rs layer goes on the job's: all are read, the newest wins.
    standby_changes = {b"k00100": b'{"n":0}', b"new1": None, b"new2": b"2"}
    standby = store.append_layer(standby_changes, _info(6), base=short)
    expected = {
        k: v
        for k, v in (
            expected | {k.decode(): None if v is None else v.decode() for k, v in standby_changes.items()}
        ).items()
        if v is not None
    }
    assert (standby.layers, standby.layer_rows) == (3, len(changes) + 5)
    assert store.read_text(standby) == expected
    assert {r.key: r.value for r in store.frame(spark, standby).collect()} == expected

    # Compaction merges base and layer files; every snapshot reads the same after it.
    assert maintain_table(store.path, "snapshot", dry_run=False).compacted_files_removed > 0
    assert store.read_text(store.latest()) == expected and store.read_text(full) == state
    # A fold by Spark: the resolved frame written as the new base (what take_snapshot does when one is due)
    folded = store.write_frame(store.frame(spark, standby), 7, {"in": {0: 70}}, {0: 21})
    assert (folded.mode, folded.rows, folded.layers) == ("full", len(expected), 0) and store.read_text(
        folded
    ) == expected
    # Past the time-travel window the files only older snapshots read are vacuumed; what the latest reads stays.
    age_delta_removals(Path(store.path), 30)
    assert maintain_table(store.path, "snapshot", dry_run=False).vacuum_files
    assert store.read_text(store.latest()) == expected


def test_a_snapshot_table_from_before_layers_gains_the_column_with_its_first_layer(spark, tmp_path):
    import json

    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    store = SnapshotStore(tmp_path / "old", "job-v1", "counts")
    # a snapshot as it was written before layers: (key, value) only
    old = store.new_info(0, {}, {0: 2}, rows=2)
    table = pa.table({"key": ["a", "b"], "value": ["1", "2"]})
    write_deltalake(
        store.path, table, commit_properties=CommitProperties(custom_metadata={"userMetadata": old.metadata_json()})
    )
    full = store.latest()
    assert store.read_text(full) == {"a": "1", "b": "2"} and json.loads(old.metadata_json())["mode"] == "full"
    assert {r.key: r.value for r in store.frame(spark, full).collect()} == {"a": "1", "b": "2"}
    changes = spark.createDataFrame([("a", None), ("c", "3")], STORE_SCHEMA)
    layer = store.append_layer_frame(changes, full, 1, {}, {0: 4})
    assert store.latest() == layer and store.count(layer) == 2 and store.read_text(layer) == {"b": "2", "c": "3"}
    assert {r.key: r.value for r in store.frame(spark, layer).collect()} == {"b": "2", "c": "3"}


def test_spark_scans_a_snapshots_files_and_reads_a_table_with_deletion_vectors_through_delta(spark, tmp_path):
    store = SnapshotStore(tmp_path / "snap", "job-v1", "counts")
    info = _write(store, {b"u1": b"1", b"u2": b"2", b"u3": b"3"}, 3)
    # a plain Parquet scan of the version's files (Spark's Delta reader would replay the log with jobs of its own)
    frame = store.frame(spark, info)
    assert "Location: InMemoryFileIndex" in _scan(frame)
    assert {r.key: r.value for r in frame.collect()} == {"u1": "1", "u2": "2", "u3": "3"}

    # deletion vectors (a table MERGEd into by an older platform) hide rows the files still hold: Delta reads it
    table = f"delta.`{store.path}`"
    spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableDeletionVectors' = true)")
    spark.sql(f"DELETE FROM {table} WHERE key = 'u2'")
    assert DeltaTable(store.path).protocol().min_reader_version == 3
    frame = store.frame(spark, info)
    assert "Location: PreparedDeltaFileIndex" in _scan(frame)
    assert {r.key: r.value for r in frame.collect()} == {"u1": "1", "u3": "3"} == store.read_text(info)


def _scan(frame) -> str:
    """The physical plan of ``frame``: its scan's file index says which reader listed the files."""
    return frame._jdf.queryExecution().executedPlan().toString()
