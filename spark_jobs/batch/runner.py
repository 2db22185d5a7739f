"""Run one data interval of a batch job: read its inputs as the rules of :mod:`spark_jobs.batch.intervals`
say, compute, replace the interval's rows in its output table.

A Spark batch application, run by the batch job's DAG::

    spark-submit spark_jobs/batch/runner.py daily_top_movers --start 2026-03-02T00:00:00Z --end 2026-03-03T00:00:00Z

It prints the run (:class:`BatchRun`, JSON) on its last line; the output table's commit carries the same
document as its ``userMetadata`` (``DESCRIBE HISTORY`` shows which input commits each interval read).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import json
import sys
from collections.abc import Mapping

from runtime.settings import Settings
from spark_jobs.batch.intervals import BatchIntervalError, Commit, InputRead, Interval, plan_reads
from spark_jobs.batch.spec import INTERVAL_COLUMNS, BatchJob, get_batch_job
from spark_jobs.documents import to_json


@dataclasses.dataclass(frozen=True)
class BatchRun:
    """What one run read and wrote."""

    batch_job: str
    interval: Interval
    output: str
    #: the output table's version after the run (the run's commit, or the one before when it had nothing to change)
    output_version: int
    rows: int
    #: input job -> the table and commit read
    reads: Mapping[str, InputRead]


def output_location(settings: Settings, job: BatchJob):
    """The batch job's output table (``<lake>/<name>``)."""
    return settings.lake / job.output_table_dir


def output_path(settings: Settings, job: BatchJob) -> str:
    return str(output_location(settings, job))


def input_paths(settings: Settings, job: BatchJob) -> dict[str, str]:
    """Each input job's main output table, of its serving version."""
    from spark_jobs.versions import current_output_path

    return {name: current_output_path(settings, name) for name in job.inputs}


def table_commits(spark, path: str) -> list[Commit]:
    from delta.tables import DeltaTable
    from pyspark.sql.utils import AnalysisException

    try:
        history = DeltaTable.forPath(spark, path).history().selectExpr("version", "unix_millis(timestamp) AS at")
    except AnalysisException:
        return []  # no table yet
    return [Commit(row.version, dt.datetime.fromtimestamp(row.at / 1000, dt.UTC)) for row in history.collect()]


def run_interval(
    spark, settings: Settings, job: BatchJob, interval: Interval, now: dt.datetime | None = None
) -> BatchRun:
    """Compute ``interval`` of ``job`` and replace its rows in the output table."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    interval.check_settled(job.settle, now or dt.datetime.now(dt.UTC))
    paths = input_paths(settings, job)
    commits = {name: table_commits(spark, path) for name, path in paths.items()}
    reads = {
        name: dataclasses.replace(read, table=paths[name])
        for name, read in plan_reads(commits, interval.settled_at(job.settle)).items()
    }
    for name, read in reads.items():
        # A view of the SQL text pins the version: a temp view of a time-travelled DataFrame is re-resolved
        # by Delta to the table's latest version when a query reads it.
        spark.sql(
            f"CREATE OR REPLACE TEMP VIEW `{name}` AS SELECT * FROM delta.`{read.table}` VERSION AS OF {read.version}"
        )
    frames = {name: spark.table(f"`{name}`") for name in reads}
    if job.sql is not None:
        result = spark.sql(interval.bind(job.sql))
    else:
        module, _, function = job.function.partition(":")
        result = getattr(importlib.import_module(module), function)(spark, frames, interval)
    if taken := [c for c in INTERVAL_COLUMNS if c in result.columns]:
        raise BatchIntervalError(f"batch job {job.name}: its result may not have the columns {taken}")
    rows = result.select(
        F.lit(interval.start).cast("timestamp").alias("interval_start"),
        F.lit(interval.end).cast("timestamp").alias("interval_end"),
        *result.columns,
    )
    output = output_path(settings, job)
    previous = max((c.version for c in table_commits(spark, output)), default=-1)
    record = {"batch_job": job.name, "interval": to_json(interval), "reads": {n: to_json(r) for n, r in reads.items()}}
    (
        rows.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", interval.replace_where)
        .option("userMetadata", json.dumps(record, sort_keys=True))
        .partitionBy("interval_start")
        .save(output)
    )
    last = DeltaTable.forPath(spark, output).history(1).select("version", "operationMetrics").first()
    # An interval with no rows that had none before commits nothing: the newest commit is another run's.
    written = int((last.operationMetrics or {}).get("numOutputRows", 0)) if last.version > previous else 0
    return BatchRun(job.name, interval, output, last.version, written, reads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batch_job")
    parser.add_argument("--start", required=True, help="the data interval's start, ISO 8601")
    parser.add_argument("--end", required=True, help="the data interval's end, ISO 8601")
    args = parser.parse_args(argv)
    from spark_jobs.driver.session import build_spark_session

    job = get_batch_job(args.batch_job)
    settings = Settings.from_env()
    spark = build_spark_session(settings, job.application_id)
    try:
        run = run_interval(spark, settings, job, Interval.parse(args.start, args.end))
    except BatchIntervalError as err:
        print(f"batch job {job.name}: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(json.dumps(to_json(run), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
