"""The side-by-side report (spark_jobs/operations/reprocess/compare.py) on real Delta tables and Spark, without the DAG:
every key classified, the diff rows and the report row written once per run id (a retried run replaces its
own rows and nobody else's), also into a reports table an earlier release wrote through Spark."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.compare import compare_outputs, diffs_table, render_report, reports_table
from spark_jobs.registry import get_job
from spark_jobs.versions import read_rows

pytestmark = pytest.mark.integration

JOB = "gift_card_counts"
COUNTS = pa.schema([("user_id", pa.string()), ("purchases", pa.int64()), ("amount_spent", pa.decimal128(12, 2))])


@pytest.fixture
def own_settings(settings, tmp_path, monkeypatch):
    """The fixture jobs registered, on a lake of this test's own (the DAG tests run the same job names)."""
    monkeypatch.setenv("STREAMSTATE_JOB_MODULES", "tests.fixtures.reprocess_jobs")
    return settings.replace(data_dir=tmp_path)


def _write_outputs(settings, version: int, counts: dict[str, tuple[int, str]]) -> None:
    rows = [{"user_id": u, "purchases": n, "amount_spent": Decimal(spent)} for u, (n, spent) in counts.items()]
    table = JobLayout.of(get_job(JOB, version), settings).output_table
    write_deltalake(str(table), pa.Table.from_pylist(rows, schema=COUNTS), mode="overwrite")


def test_every_key_is_classified_and_a_retried_run_replaces_only_its_own_rows(spark, own_settings):
    settings = own_settings
    _write_outputs(settings, 1, {"u1": (2, "10.00"), "u2": (4, "20.00"), "u3": (1, "5.00")})
    _write_outputs(settings, 2, {"u1": (2, "10.00"), "u2": (2, "10.00"), "u4": (1, "7.50")})
    # a report an earlier release wrote through Spark (the columns in Spark's order): delta-rs appends to it
    earlier = compare_outputs(spark, settings, JOB, 1, 2, "earlier-run")
    spark.createDataFrame([{**earlier, "equal": 99}]).write.format("delta").mode("overwrite").save(
        str(reports_table(settings))
    )

    report = compare_outputs(spark, settings, JOB, 1, 2, "run-1")
    counts = {k: report[k] for k in ("equal", "different", "only_old", "only_new")}
    assert counts == {"equal": 1, "different": 1, "only_old": 1, "only_new": 1}
    assert report["compared_columns"] == "purchases,amount_spent" and report["keys"] == "user_id"
    samples = json.loads(report["samples"])
    assert [s["key"] for s in samples["different"]] == ['{"user_id":"u2"}']
    assert "- different: 1" in render_report(report)
    diffs = {(r["run_id"], r["key"], r["outcome"]) for r in read_rows(diffs_table(settings))}
    assert {d for d in diffs if d[0] == "run-1"} == {
        ("run-1", '{"user_id":"u2"}', "different"),
        ("run-1", '{"user_id":"u3"}', "only_old"),
        ("run-1", '{"user_id":"u4"}', "only_new"),
    }

    # the run retried after v2 changed: its rows replaced, the other runs' kept
    _write_outputs(settings, 2, {"u1": (2, "10.00"), "u2": (4, "20.00"), "u3": (1, "5.00")})
    again = compare_outputs(spark, settings, JOB, 1, 2, "run-1")
    assert (again["equal"], again["different"], again["only_old"], again["only_new"]) == (3, 0, 0, 0)
    reports = {r["run_id"]: r for r in read_rows(reports_table(settings))}
    assert sorted(reports) == ["earlier-run", "run-1"]
    assert reports["earlier-run"]["equal"] == 99 and reports["run-1"]["equal"] == 3
    assert reports["run-1"]["aligned"] is True  # neither version consumed anything: both positions empty
    assert not [r for r in read_rows(diffs_table(settings)) if r["run_id"] == "run-1"]
    assert {r["run_id"] for r in read_rows(diffs_table(settings))} == {"earlier-run"}
