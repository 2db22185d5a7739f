"""A batch's writes to a Delta output table (spark_jobs/io/output_table.py): delta-rs from the driver and a Spark
MERGE on the executors leave the same rows, the same idempotent-write ``txn`` and the same input marks, and
both skip a batch the table holds already (real Spark, real Delta)."""

from __future__ import annotations

import decimal

import pytest
from deltalake import DeltaTable
from pyspark.sql import types as T

from runtime.object_store import Location
from spark_jobs.io.output_table import OutputCommit, OutputTable
from spark_jobs.state import output_marks

pytestmark = pytest.mark.integration

SCHEMA = T.StructType(
    [
        T.StructField("user_id", T.StringType(), nullable=False),
        T.StructField("purchases", T.LongType()),
        T.StructField("amount", T.DecimalType(22, 2)),
        T.StructField("last_at", T.TimestampType()),
    ]
)
ROW_SCHEMA = T.StructType([*SCHEMA.fields, T.StructField("gone", T.BooleanType())])
APP = "app-outputs"


def _rows(spark, rows):
    import datetime as dt

    at = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
    return spark.createDataFrame([(k, n, decimal.Decimal(a), at, g) for k, n, a, g in rows], ROW_SCHEMA)


def _table_rows(path) -> dict:
    return {r["user_id"]: (r["purchases"], str(r["amount"])) for r in DeltaTable(path).to_pyarrow_table().to_pylist()}


@pytest.mark.parametrize("through_driver", [True, False], ids=["delta-rs", "spark"])
def test_either_engine_writes_the_same_rows_txn_and_marks_and_skips_a_written_batch(spark, tmp_path, through_driver):
    from pyspark.sql.pandas.types import to_arrow_schema

    path = tmp_path / "outputs"
    DeltaTable.create(str(path), to_arrow_schema(SCHEMA, timezone="UTC"))
    table = OutputTable(Location.of(path), ("user_id",))

    def commit(version: int, end: int) -> OutputCommit:
        return OutputCommit(APP, version, {0: end}, through_driver=through_driver)

    # batch 7: three new keys (a gone key that is absent is not inserted)
    first = _rows(spark, [("u1", 1, "1.10", False), ("u2", 2, "2.00", False), ("u3", 1, "9.99", True)])
    assert table.upsert(first, commit(7, 10), gone="gone")
    assert _table_rows(path) == {"u1": (1, "1.10"), "u2": (2, "2.00")}

    # batch 8: an update, a delete and an insert in one MERGE
    second = _rows(spark, [("u1", 3, "5.10", False), ("u2", 2, "2.00", True), ("u4", 1, "0.01", False)])
    assert table.upsert(second, commit(8, 20), gone="gone")
    assert _table_rows(path) == {"u1": (3, "5.10"), "u4": (1, "0.01")}

    # batch 8 again (a fenced driver's late write, or a replay with the same id): skipped
    assert table.upsert(_rows(spark, [("u9", 1, "1.00", False)]), commit(8, 20), gone="gone")
    assert _table_rows(path) == {"u1": (3, "5.10"), "u4": (1, "0.01")}

    # batch 9 re-derives rows written already: no row changes, the batch's txn and mark are committed anyway
    assert table.insert_absent(_rows(spark, [("u1", 3, "5.10", False)]).drop("gone"), commit(9, 30))
    # batch 10 appends a new key; batch 11 has nothing: no commit
    assert table.append(_rows(spark, [("u5", 1, "1.00", False)]).drop("gone"), commit(10, 40))
    assert not table.append(_rows(spark, []).drop("gone"), commit(11, 50))

    delta = DeltaTable(str(path))
    assert _table_rows(path) == {"u1": (3, "5.10"), "u4": (1, "0.01"), "u5": (1, "1.00")}
    assert delta.transaction_version(APP) == 10
    marks = [c.get("userMetadata") for c in reversed(delta.history()) if c["operation"] != "CREATE TABLE"]
    assert marks == [output_marks.commit_metadata({0: end}) for end in (10, 20, 30, 40)]
    assert output_marks.written_input_end(Location.of(path)) == {0: 40}
    # Spark reads what either wrote, with the table's types
    read = spark.read.format("delta").load(str(path)).orderBy("user_id").collect()
    assert [(r.user_id, r.purchases, r.amount) for r in read][0] == ("u1", 3, decimal.Decimal("5.10"))


def test_the_driver_reuses_its_table_across_batches_and_still_meets_a_newer_drivers_commit(spark, tmp_path):
    """A query's batches write through one delta-rs table object (``OutputCommit.open_tables``), brought up to
    date before each write: a newer driver's commit in between (a higher txn version) fences the next write."""
    from pyspark.sql.pandas.types import to_arrow_schema

    path = tmp_path / "outputs"
    DeltaTable.create(str(path), to_arrow_schema(SCHEMA, timezone="UTC"))
    table, open_tables = OutputTable(Location.of(path), ("user_id",)), {}

    def commit(version: int, end: int) -> OutputCommit:
        return OutputCommit(APP, version, {0: end}, open_tables=open_tables)

    assert table.upsert(_rows(spark, [("u1", 1, "1.00", False)]), commit(1, 10), gone="gone")
    opened = open_tables[table.location]
    assert table.upsert(_rows(spark, [("u2", 1, "2.00", False)]), commit(2, 20), gone="gone")
    assert open_tables[table.location] is opened and opened.version() == DeltaTable(str(path)).version()

    # a newer driver (another process: a table object of its own) writes its batch 9
    newer = OutputTable(Location.of(path), ("user_id",))
    assert newer.upsert(_rows(spark, [("u1", 5, "5.00", False)]), OutputCommit(APP, 9, {0: 30}), gone="gone")
    # this driver's late batch 3 is skipped: its table saw batch 9's txn
    assert table.upsert(_rows(spark, [("u1", 2, "9.99", False)]), commit(3, 30), gone="gone")
    assert _table_rows(path) == {"u1": (5, "5.00"), "u2": (1, "2.00")}
    assert DeltaTable(str(path)).transaction_version(APP) == 9
