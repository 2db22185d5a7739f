"""Finding an output table's Delta version as of a batch (what a migration copies), on delta-rs tables."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake

from runtime.object_store import Location
from spark_jobs.state.migration import MigrationRefused, output_version_at

APP = "job-v1-outputs"


def _commit(path, batch_id: int | None) -> None:
    """One commit; an idempotent batch write when ``batch_id`` is given, else e.g. a restart's reconcile."""
    transactions = [Transaction(APP, batch_id)] if batch_id is not None else []
    rows = pa.table({"batch": [batch_id]}, schema=pa.schema([("batch", pa.int64())]))
    write_deltalake(str(path), rows, mode="append", commit_properties=CommitProperties(app_transactions=transactions))


def test_the_version_as_of_a_batch_is_the_newest_with_nothing_of_a_later_batch(tmp_path):
    table = tmp_path / "outputs"
    # versions: 0 created (no batch), 1: batch 5, 2: batch 6, 3: reconcile, 4: batch 9, 5: batch 2_000_000_001 (a
    # newer driver generation), 6: a maintenance commit
    for batch_id in (None, 5, 6, None, 9, 2_000_000_001, None):
        _commit(table, batch_id)
    location = Location.of(table)
    expected = {5: 1, 6: 3, 7: 3, 9: 4, 1_000_000_000: 4, 2_000_000_001: 6, 3_000_000_000: 6}
    assert {b: output_version_at(location, APP, b) for b in expected} == expected
    with pytest.raises(MigrationRefused, match="after batch 4"):
        output_version_at(Location.of(_table_starting_with_a_batch(tmp_path)), APP, 4)


def _table_starting_with_a_batch(tmp_path):
    table = tmp_path / "written-first"
    _commit(table, 5)
    return table
