"""The output tables' input marks (spark_jobs/state/output_marks.py): which batches may repeat outputs
already written. Pure decisions, and the marks read back from real Delta tables (written by delta-rs here;
the Spark path is tested by tests/faults/test_driver_kills.py)."""

from __future__ import annotations

import pyarrow as pa
from deltalake import CommitProperties, write_deltalake

from runtime.object_store import Location
from spark_jobs.state.output_marks import commit_metadata, may_repeat, written_input_end


def test_a_batch_may_repeat_outputs_while_it_starts_before_the_highest_mark():
    written = {0: 100, 1: 50}
    assert may_repeat({0: 100, 1: 50}, written) is False  # starts where the last write ended
    assert may_repeat({0: 120, 1: 70}, written) is False
    assert may_repeat({0: 99, 1: 70}, written) is True  # re-reads offset 99 of partition 0
    assert may_repeat({0: 120}, written) is True  # partition 1's start unknown
    assert may_repeat(None, written) is True  # "earliest"
    assert may_repeat(None, {}) is False  # nothing written yet
    assert may_repeat({0: 500}, None) is True  # written, but by whom and how far is unknown


def _write(path, rows: int, metadata: str | None) -> None:
    properties = CommitProperties(custom_metadata={"userMetadata": metadata}) if metadata else None
    write_deltalake(
        str(path), pa.table({"k": pa.array(range(rows), pa.int64())}), mode="append", commit_properties=properties
    )


def test_the_marks_are_read_back_from_the_table_history(tmp_path):
    table = Location.of(tmp_path / "outputs")
    assert written_input_end(table) == {}  # no table: nothing written
    _write(tmp_path / "outputs", 0, None)
    assert written_input_end(table) == {}  # a table without data
    _write(tmp_path / "outputs", 3, None)
    assert written_input_end(table) is None  # data, no mark: a table from before marks, or a copy
    _write(tmp_path / "outputs", 2, commit_metadata({0: 40, 1: 7}))
    _write(tmp_path / "outputs", 2, commit_metadata({1: 9, 0: 30}))  # a rewound writer: the highest counts
    _write(tmp_path / "outputs", 1, "a user's own note")  # maintenance or other commits are skipped
    assert written_input_end(table) == {0: 40, 1: 9}
