"""The rules of a batch step's interval (spark_jobs/batch/intervals.py) and the checks of its declaration
(spark_jobs/batch/spec.py): pure logic, no Spark."""

from __future__ import annotations

import datetime as dt

import pytest

from spark_jobs.batch.intervals import BatchIntervalError, Commit, InputRead, Interval, plan_reads
from spark_jobs.batch.spec import BatchJob, batch_jobs
from spark_jobs.documents import from_json, to_json
from spark_jobs.registry import JobSpecError

DAY = Interval.parse("2026-03-02T00:00:00Z", "2026-03-03T00:00:00Z")
SETTLE = dt.timedelta(minutes=15)


def at(hh_mm: str, day: int = 3) -> dt.datetime:
    return dt.datetime.fromisoformat(f"2026-03-{day:02d}T{hh_mm}:00+00:00")


def test_an_interval_is_refused_until_it_settled():
    with pytest.raises(BatchIntervalError, match=r"settles at 2026-03-03T00:15:00\+00:00"):
        DAY.check_settled(SETTLE, at("00:14"))
    DAY.check_settled(SETTLE, at("00:15"))
    with pytest.raises(BatchIntervalError, match="empty"):
        Interval(DAY.end, DAY.start)
    with pytest.raises(BatchIntervalError, match="time zone"):
        Interval(dt.datetime(2026, 3, 2), DAY.end)


def test_each_input_is_read_at_its_newest_commit_before_the_settle_time():
    commits = {
        "a": [Commit(0, at("12:00", 2)), Commit(1, at("00:10")), Commit(2, at("00:20"))],
        "b": [Commit(4, at("00:15")), Commit(5, at("09:00"))],
    }
    reads = plan_reads(commits, DAY.settled_at(SETTLE))
    assert reads["a"] == InputRead("a", 1, at("00:10"), "as_of_settle_time")
    assert reads["b"] == InputRead("b", 4, at("00:15"), "as_of_settle_time")  # at the settle time counts


def test_an_input_written_after_the_settle_time_is_read_at_its_newest_commit():
    reads = plan_reads({"a": [Commit(3, at("09:00", 20)), Commit(7, at("10:00", 20))]}, DAY.settled_at(SETTLE))
    assert reads["a"] == InputRead("a", 7, at("10:00", 20), "written_after_settle_time")
    with pytest.raises(BatchIntervalError, match="input a has no commit"):
        plan_reads({"a": []}, DAY.settled_at(SETTLE))


def test_a_query_names_the_interval_outside_its_string_literals():
    sql = "SELECT ':interval_start' AS s FROM t WHERE a >= :interval_start AND a < :interval_end AND b = 'x''s :interval_end'"
    assert DAY.bind(sql) == (
        "SELECT ':interval_start' AS s FROM t WHERE a >= TIMESTAMP '2026-03-02 00:00:00.000000' "
        "AND a < TIMESTAMP '2026-03-03 00:00:00.000000' AND b = 'x''s :interval_end'"
    )
    assert DAY.replace_where == "interval_start = TIMESTAMP '2026-03-02 00:00:00.000000'"


def test_a_run_is_recorded_as_a_typed_document():
    read = InputRead("/lake/t", 3, at("00:10"), "as_of_settle_time")
    assert from_json(InputRead, to_json(read)) == read
    assert from_json(Interval, to_json(DAY)) == DAY


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"inputs": ()}, "inputs: name at least one"),
        ({"sql": None}, "exactly one of sql and function"),
        ({"function": "m:f"}, "exactly one of sql and function"),
        ({"schedule": "daily"}, "schedule 'daily'"),
        ({"settle": dt.timedelta(seconds=-1)}, "settle must be >= 0"),
        ({"retries": -1}, "retries must be >= 0"),
        ({"name": "Top"}, "batch job Top: job name"),
    ],
)
def test_a_declaration_that_cannot_run_is_refused_naming_the_job_and_field(fields, message):
    declared = {"name": "top", "inputs": ("stock_price_changes",), "sql": "SELECT 1", **fields}
    with pytest.raises(JobSpecError, match=message):
        BatchJob(**declared)


def test_a_batch_job_reads_only_registered_streaming_jobs():
    assert batch_jobs("")["daily_top_movers"].inputs == ("stock_price_changes",)
    assert (
        batch_jobs("tests.fixtures.batch_jobs")["flaky_top_movers"].function == "tests.fixtures.batch_jobs:top_movers"
    )
    with pytest.raises(JobSpecError, match="input 'nope' is not a registered streaming job"):
        batch_jobs("tests.fixtures.batch_jobs_unknown_input")
