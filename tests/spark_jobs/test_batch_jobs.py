"""A batch step over a streaming job's outputs: the seeds' top movers (``stock_price_changes`` per symbol and
day, then ``daily_top_movers``, the day's ten largest changes) equal the plain-Python reference for every
closed day; a rerun replaces its interval's rows and touches no other interval's files; a run reads its
input as of the interval's settle time (Delta time travel), not what the stream wrote since; and the batch
DAG runs it from Airflow, telling on-call once when a run fails and again when the next one succeeds."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time

import pytest

from runtime.alert_inbox import AlertInbox
from spark_jobs.batch.intervals import Interval
from spark_jobs.batch.runner import output_path, run_interval, table_commits
from spark_jobs.batch.spec import batch_jobs, get_batch_job
from spark_jobs.reference.generators import ticks
from spark_jobs.registry import get_job
from spark_jobs.testing import JobHarness
from spark_jobs.versions import current_output_path

pytestmark = pytest.mark.integration

STAGE_ONE = "stock_price_changes"
DAY = dt.timedelta(days=1)
TICKS = ticks.generate(days=3)
#: day 3's ticks, and the ticks that close it, arriving after the first three days were written
LATER = [
    {**tick, "tick_id": f"later-{tick['tick_id']}"}
    for tick in ticks.generate(days=1, start=ticks.START + 3 * DAY, seed=8)
    if not tick["tick_id"].startswith("late-")
]


def day(n: int) -> Interval:
    return Interval(ticks.START + n * DAY, ticks.START + (n + 1) * DAY)


def day_ms(n: int) -> int:
    return int(day(n).start.timestamp() * 1000)


def movers(spark, settings, n: int) -> list[tuple[int, str, float]]:
    rows = (
        spark.read.format("delta")
        .load(output_path(settings, get_batch_job("daily_top_movers")))
        .where(f"interval_start = TIMESTAMP '{day(n).start:%Y-%m-%d %H:%M:%S}'")
        .collect()
    )
    return sorted((row["rank"], row["symbol"], row["change"]) for row in rows)


def ranked(top: list[tuple[str, float]]) -> list[tuple[int, str, float]]:
    return [(rank, symbol, change) for rank, (symbol, change) in enumerate(top, start=1)]


@pytest.fixture(scope="module")
def stage_one(settings, kafka_broker, spark):
    """Stage 1 over the first three days (closed by the generator's closing ticks)."""
    return JobHarness(settings=settings, spark=spark).run(STAGE_ONE, TICKS)


def test_each_closed_day_is_written_once_and_the_top_movers_of_each_equal_the_reference(settings, spark, stage_one):
    daily = ticks.daily_changes(TICKS)
    written = {
        (r["symbol"], int(r["window_start"].timestamp() * 1000)): (r["change"], r["ticks"]) for r in stage_one.outputs
    }
    assert written == daily and len(daily) == 3 * 24
    assert sorted(letter.reason for letter in stage_one.dead_letters) == ["late"] * 3

    job = get_batch_job("daily_top_movers")
    for n in range(3):
        run = run_interval(spark, settings, job, day(n))
        # the table was written long after these days settled (rule 3): read at its newest commit
        assert run.reads[STAGE_ONE].rule == "written_after_settle_time"
        assert run.rows == 10
        assert movers(spark, settings, n) == ranked(ticks.top_movers(daily, day_ms(n)))

    table = output_path(settings, job)

    def files_by_day() -> dict[str, set[str]]:
        files = (
            spark.read.format("delta")
            .load(table)
            .selectExpr("CAST(interval_start AS STRING) AS day", "_metadata.file_path AS file")
        )
        found: dict[str, set[str]] = {}
        for row in files.collect():
            found.setdefault(row["day"], set()).add(row["file"])
        return found

    before = files_by_day()
    rerun = run_interval(spark, settings, job, day(1))
    after = files_by_day()
    assert rerun.rows == 10 and movers(spark, settings, 1) == ranked(ticks.top_movers(daily, day_ms(1)))
    assert sum(1 for _ in spark.read.format("delta").load(table).collect()) == 30, "replaced, not appended"
    days = sorted(before)
    assert after[days[0]] == before[days[0]] and after[days[2]] == before[days[2]], "other days' files untouched"
    assert after[days[1]].isdisjoint(before[days[1]]), "the rerun day's rows were rewritten"
    metadata = spark.sql(f"DESCRIBE HISTORY delta.`{table}` LIMIT 1").first()["userMetadata"]
    assert json.loads(metadata)["reads"][STAGE_ONE]["version"] == rerun.reads[STAGE_ONE].version


def test_a_run_reads_its_input_as_of_the_settle_time_not_what_the_stream_wrote_since(settings, spark, stage_one):
    source = current_output_path(settings, STAGE_ONE)
    written_before = max(c.version for c in table_commits(spark, source))
    time.sleep(1.5)
    between = dt.datetime.now(dt.UTC)
    time.sleep(1.5)
    JobHarness(settings=settings, spark=spark).run(STAGE_ONE, LATER)  # closes day 3: a commit after `between`
    assert max(c.version for c in table_commits(spark, source)) > written_before

    # an interval that settles at `between`: it reads the commit before day 3 was written, so day 3 is empty
    settled_between = dataclasses.replace(get_batch_job("daily_top_movers"), settle=between - day(3).end)
    run = run_interval(spark, settings, settled_between, day(3))
    assert (run.reads[STAGE_ONE].rule, run.reads[STAGE_ONE].version) == ("as_of_settle_time", written_before)
    assert run.rows == 0 and movers(spark, settings, 3) == []

    run = run_interval(spark, settings, get_batch_job("daily_top_movers"), day(3))
    assert run.reads[STAGE_ONE].version > written_before
    assert movers(spark, settings, 3) == ranked(ticks.top_movers(ticks.daily_changes(TICKS + LATER), day_ms(3)))
    assert len(movers(spark, settings, 3)) == 10


def test_the_batch_dag_runs_an_interval_and_on_call_hears_of_a_failure_once_and_of_the_recovery(
    settings, spark, stage_one, dag_runner
):
    assert "daily_top_movers" in batch_jobs()
    inbox = AlertInbox()
    env = {"STREAMSTATE_JOB_MODULES": "tests.fixtures.batch_jobs", "AIRFLOW_CONN_STREAMSTATE_WEBHOOK": inbox.connection}
    try:
        failed = dag_runner.dags_test(
            "batch__flaky_top_movers", env={**env, "FLAKY_TOP_MOVERS_FAIL": "1"}, logical_date=day(2).end.isoformat()
        )
        assert failed.returncode != 0, failed.stdout[-2000:]
        assert inbox.of("batch-flaky_top_movers") == [("batch_failed", "firing")]
        succeeded = dag_runner.dags_test("batch__flaky_top_movers", env=env, logical_date=day(2).end.isoformat())
        assert succeeded.returncode == 0, succeeded.stdout[-3000:] + succeeded.stderr[-3000:]
        assert inbox.of("batch-flaky_top_movers") == [("batch_failed", "firing"), ("batch_failed", "resolved")]
    finally:
        inbox.close()
    table = str(settings.lake / "flaky_top_movers")
    (written,) = (
        spark.read.format("delta").load(table).selectExpr("interval_start", "interval_end").distinct().collect()
    )
    interval = Interval(
        written["interval_start"].replace(tzinfo=dt.UTC), written["interval_end"].replace(tzinfo=dt.UTC)
    )
    assert interval == day(2), "a manual run covers the interval that ended last before its logical date"
    rows = spark.read.format("delta").load(table).collect()
    top = ticks.top_movers(ticks.daily_changes(TICKS), int(interval.start.timestamp() * 1000))
    assert sorted((r["rank"], r["symbol"], r["change"]) for r in rows) == ranked(top)
    assert get_job(STAGE_ONE).version == 1
