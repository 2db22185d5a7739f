"""A micro-batch's driver-side reads collected together: each frame as its own ``toArrow``, in one Spark job."""

from __future__ import annotations

import decimal

import pytest

from spark_jobs.driver_rows import DriverRows

pytestmark = pytest.mark.integration


def _jobs(spark, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_announced_frames_read_as_their_own_to_arrow_in_one_spark_job(spark, unique):
    batch = spark.createDataFrame(
        [(f"user-{i % 7}", i, decimal.Decimal(i) / 4, i % 3 == 0) for i in range(50)],
        "key STRING, n BIGINT, amount DECIMAL(22,2), gone BOOLEAN",
    ).repartition(3)  # several partitions: each frame's rows in their own order
    cached = batch.persist()
    cached.count()
    outputs = cached.select("key", "n", "amount", "gone")
    records = cached.selectExpr(
        "CAST(key AS BINARY) AS key", "IF(gone, NULL, CAST(to_json(struct(n)) AS BINARY)) AS value"
    )
    changelog = cached.selectExpr("key", "IF(gone, NULL, to_json(struct(n, amount))) AS value")
    nothing = cached.where("n < 0").select("key", "n")
    expected = [frame.toArrow() for frame in (outputs, records, changelog, nothing)]

    group = f"driver-rows-{unique}"
    spark.sparkContext.setJobGroup(group, "one batch's driver-side reads")
    try:
        rows = DriverRows()
        rows.announce(records, None, changelog, nothing)
        read = [rows.arrow(outputs), rows.arrow(records), rows.arrow(changelog), rows.arrow(nothing)]
        assert _jobs(spark, group) == 1
        assert all(table.equals(want) for table, want in zip(read, expected, strict=True))
        assert [t.schema for t in read] == [t.schema for t in expected]
        assert read[3].num_rows == 0 and read[2].num_rows == 50

        rows.arrow(changelog)  # read twice: collected again, on its own
        assert _jobs(spark, group) == 2
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        cached.unpersist()
