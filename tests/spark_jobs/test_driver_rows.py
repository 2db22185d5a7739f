"""A micro-batch's driver-side reads collected together: each frame as its own ``toArrow``, in one Spark job."""

from __future__ import annotations

import decimal

import pytest

from spark_jobs.io.driver_rows import DriverRows

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
    flags = cached.selectExpr("key", "n IS NULL AS missing")  # a column Spark knows is never null
    expected = [frame.toArrow() for frame in (outputs, records, changelog, nothing, flags)]

    group = f"driver-rows-{unique}"
    spark.sparkContext.setJobGroup(group, "one batch's driver-side reads")
    try:
        rows = DriverRows()
        rows.announce(records, None, changelog, nothing, flags)
        read = [rows.arrow(frame) for frame in (outputs, records, changelog, nothing, flags)]
        assert _jobs(spark, group) == 1
        assert all(table.equals(want) for table, want in zip(read, expected, strict=True))
        assert [t.schema for t in read] == [t.schema for t in expected]
        assert read[3].num_rows == 0 and read[2].num_rows == 50

        rows.arrow(changelog)  # read twice: collected again, on its own
        assert _jobs(spark, group) == 2
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        cached.unpersist()


def test_the_collection_that_materialises_a_persisted_batch_runs_its_plan_once(spark, unique):
    """A small micro-batch's first driver-side read is the job that runs its plan (no count materialises it
    first): every announced frame reads the persisted rows, and the plan's work is done once per row."""
    from pyspark.sql import functions as F

    runs = spark.sparkContext.accumulator(0)

    @F.udf("bigint")
    def planned(n):  # the stateful plan's stand-in: counts the rows it computes
        runs.add(1)
        return n

    batch = spark.range(40, numPartitions=3).select(planned("id").alias("n")).persist()
    group = f"driver-rows-{unique}"
    spark.sparkContext.setJobGroup(group, "a batch's plan, run by its driver-side reads")
    try:
        even, tenfold, none = batch.where("n % 2 = 0"), batch.selectExpr("n * 10 AS m"), batch.where("n < 0")
        rows = DriverRows()
        rows.announce(tenfold, none)
        read = [rows.arrow(even), rows.arrow(tenfold), rows.arrow(none)]
        assert _jobs(spark, group) == 1
        assert runs.value == 40  # not once per frame reading it
        assert sorted(read[0].column("n").to_pylist()) == list(range(0, 40, 2))
        assert sorted(read[1].column("m").to_pylist()) == [n * 10 for n in range(40)]
        assert read[2].num_rows == 0
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        batch.unpersist()
