"""Compare two versions' outputs key by key: the side-by-side reprocessing report.

A Spark batch application (``spark-submit spark_jobs/operations/reprocess/compare.py <job> <old> <new> <run id>``;
the Airflow task builds the command from :func:`spark_jobs.driver.submit.submit_spec`-like settings). It
joins the two output tables on the job's ``output_key`` and classifies every key as equal,
different, only in the old or only in the new output. Written, idempotently per run id, to:

* ``<lake>/_streamstate/reprocess_diffs``: one row per key that is not equal (partitioned by run);
* ``<lake>/_streamstate/reprocess_reports``: one row per run with the counts, samples and the input
  positions both versions had committed (``aligned`` when they were the same).

Spark joins the tables; the rest is driver-side through delta-rs (whether a table exists, the report's one
row): in a fresh driver each Spark call is seconds of a cold JVM, and the task runs in one per reprocessing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec, get_job
from spark_jobs.state.source_position import committed_source_offsets
from spark_jobs.versions import platform_table

EQUAL, DIFFERENT, ONLY_OLD, ONLY_NEW = "equal", "different", "only_old", "only_new"
SAMPLES = 5


def diffs_table(settings: Settings):
    return platform_table(settings, "reprocess_diffs")


def reports_table(settings: Settings):
    return platform_table(settings, "reprocess_reports")


def _position(settings: Settings, spec: JobSpec) -> dict:
    """How far the version has consumed its inputs, topic -> partition -> offset (re-keyed and applied, for a
    version that re-keys its source)."""
    committed = committed_source_offsets(JobLayout.of(spec, settings), settings.kafka) or {}
    return {topic: {str(p): o for p, o in by_p.items()} for topic, by_p in committed.items()}


def compare_outputs(spark, settings: Settings, job: str, old_version: int, new_version: int, run_id: str) -> dict:
    """Classify every output key of ``old`` vs ``new``; write the diff rows and the report row."""
    from pyspark.sql import functions as F

    old_spec, new_spec = get_job(job, old_version), get_job(job, new_version)
    keys = list(new_spec.output_keys)
    old = _read(spark, JobLayout.of(old_spec, settings).output_table)
    new = _read(spark, JobLayout.of(new_spec, settings).output_table)
    if old is None and new is None:
        raise RuntimeError(
            f"neither {old_spec.output_table_dir} nor {new_spec.output_table_dir} exists: nothing to compare"
        )
    old_columns = [c for c in (old.columns if old is not None else []) if c not in keys]
    new_columns = [c for c in (new.columns if new is not None else []) if c not in keys]
    compared = [c for c in new_columns if c in old_columns]
    old = old if old is not None else spark.createDataFrame([], new.schema)
    new = new if new is not None else spark.createDataFrame([], old.schema)

    def side(df, name: str):
        return df.select(*keys, F.to_json(F.struct(*[F.col(c) for c in compared])).alias(name))

    joined = side(old, "old").join(side(new, "new"), keys, "full_outer")
    outcome = (
        F.when(F.col("old").isNull(), F.lit(ONLY_NEW))
        .when(F.col("new").isNull(), F.lit(ONLY_OLD))
        .when(F.col("old") == F.col("new"), F.lit(EQUAL))
        .otherwise(F.lit(DIFFERENT))
    )
    classified = joined.select(
        F.to_json(F.struct(*keys)).alias("key"), outcome.alias("outcome"), "old", "new"
    ).persist()
    try:
        counts = {row["outcome"]: row["count"] for row in classified.groupBy("outcome").count().collect()}
        samples = {
            o: [r.asDict() for r in classified.where(F.col("outcome") == o).orderBy("key").limit(SAMPLES).collect()]
            if counts.get(o)
            else []
            for o in (DIFFERENT, ONLY_OLD, ONLY_NEW)
        }
        if any(counts.get(o) for o in (DIFFERENT, ONLY_OLD, ONLY_NEW)):
            diffs = classified.where(F.col("outcome") != EQUAL).select(
                F.lit(run_id).alias("run_id"),
                F.lit(job).alias("job"),
                F.lit(old_version).alias("old_version"),
                F.lit(new_version).alias("new_version"),
                "key",
                "outcome",
                "old",
                "new",
            )
            _replace_run(diffs, diffs_table(settings), run_id, partitioned=True)
        else:  # no Spark write for no rows: only an earlier attempt's, if any, to delete
            _clear_run(diffs_table(settings), run_id)
    finally:
        classified.unpersist()
    old_at, new_at = _position(settings, old_spec), _position(settings, new_spec)
    report = {
        "run_id": run_id,
        "job": job,
        "old_version": old_version,
        "new_version": new_version,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "keys": ",".join(keys),
        "compared_columns": ",".join(compared),
        "columns_only_old": ",".join(c for c in old_columns if c not in compared),
        "columns_only_new": ",".join(c for c in new_columns if c not in compared),
        "equal": counts.get(EQUAL, 0),
        "different": counts.get(DIFFERENT, 0),
        "only_old": counts.get(ONLY_OLD, 0),
        "only_new": counts.get(ONLY_NEW, 0),
        "old_position": json.dumps(old_at, sort_keys=True),
        "new_position": json.dumps(new_at, sort_keys=True),
        "aligned": old_at == new_at,
        "samples": json.dumps(samples, sort_keys=True, default=str),
    }
    _replace_report(reports_table(settings), report)
    return report


def _exists(table: Location) -> bool:
    from deltalake import DeltaTable

    return DeltaTable.is_deltatable(str(table), storage_options=table.storage_options())


def _read(spark, table: Location):
    return spark.read.format("delta").load(str(table)) if _exists(table) else None


def _replace_run(df, table: Location, run_id: str, partitioned: bool) -> None:
    """Write this run's rows, replacing any from an earlier attempt of the same run (idempotent)."""
    writer = df.write.format("delta")
    if partitioned:
        writer = writer.partitionBy("run_id")
    if _exists(table):
        writer.mode("overwrite").option("replaceWhere", f"run_id = '{run_id}'").save(str(table))
    else:
        writer.mode("append").save(str(table))


def _clear_run(table: Location, run_id: str) -> None:
    """Delete an earlier attempt's rows of this run, if there were any."""
    from deltalake import DeltaTable

    if _exists(table):
        DeltaTable(str(table), storage_options=table.storage_options()).delete(f"run_id = '{run_id}'")


def _report_schema():
    """The report row's columns, in the order of the tables Spark wrote before delta-rs did (it sorted them)."""
    import pyarrow as pa

    text, count = pa.string(), pa.int64()
    return pa.schema(
        [
            ("aligned", pa.bool_()),
            ("columns_only_new", text),
            ("columns_only_old", text),
            ("compared_columns", text),
            ("created_at", text),
            ("different", count),
            ("equal", count),
            ("job", text),
            ("keys", text),
            ("new_position", text),
            ("new_version", count),
            ("old_position", text),
            ("old_version", count),
            ("only_new", count),
            ("only_old", count),
            ("run_id", text),
            ("samples", text),
        ]
    )


def _replace_report(table: Location, report: dict) -> None:
    """The run's report row, replacing one from an earlier attempt of the same run, in one commit."""
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(
        str(table),
        pa.Table.from_pylist([report], schema=_report_schema()),
        mode="overwrite",
        predicate=f"run_id = '{report['run_id']}'",
        storage_options=table.storage_options(),
    )


def render_report(report: dict) -> str:
    """The report as people read it (task log, the report file)."""
    total = sum(report[k] for k in (EQUAL, DIFFERENT, ONLY_OLD, ONLY_NEW))
    lines = [
        f"# {report['job']}: v{report['old_version']} vs v{report['new_version']} (run {report['run_id']})",
        f"keys on {report['keys']}; compared columns: {report['compared_columns'] or '(none)'}",
        f"- equal:     {report['equal']} of {total}",
        f"- different: {report['different']}",
        f"- only in v{report['old_version']}: {report['only_old']}",
        f"- only in v{report['new_version']}: {report['only_new']}",
        f"input committed: v{report['old_version']} {report['old_position']}, v{report['new_version']} "
        f"{report['new_position']} ({'aligned' if report['aligned'] else 'NOT aligned: some differences may be input one side has not processed yet'})",
    ]
    for name in ("columns_only_old", "columns_only_new"):
        if report.get(name):
            lines.append(f"{name.replace('_', ' ')}: {report[name]}")
    for outcome, rows in json.loads(report["samples"]).items():
        if rows:
            lines.append(f"samples {outcome}:")
            lines += [
                f"  {r['key']}: v{report['old_version']}={r['old']} v{report['new_version']}={r['new']}" for r in rows
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark_jobs.operations.reprocess.compare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("job")
    parser.add_argument("old_version", type=int)
    parser.add_argument("new_version", type=int)
    parser.add_argument("run_id")
    args = parser.parse_args(argv)
    from spark_jobs.driver.session import build_spark_session
    from spark_jobs.layout import comparison_name

    settings = Settings.from_env()
    spark = build_spark_session(settings, "compare-" + comparison_name(args.job, args.old_version, args.new_version))
    report = compare_outputs(spark, settings, args.job, args.old_version, args.new_version, args.run_id)
    print(render_report(report))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
