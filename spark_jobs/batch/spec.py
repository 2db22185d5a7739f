"""Batch steps over streaming jobs' outputs, declared: a frozen, validated :class:`BatchJob` each.

Batch jobs come from :data:`BUILTIN_BATCH_JOBS` plus the ``BATCH_JOBS`` iterable of every module named in
``STREAMSTATE_JOB_MODULES`` (the modules that register a team's streaming jobs).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import importlib
import re

from spark_jobs.layout import batch_dag_id
from spark_jobs.registry import JobSpecError, check_job_name, registered_versions

#: the columns every batch output starts with
INTERVAL_COLUMNS = ("interval_start", "interval_end")
_SCHEDULES = {"@hourly", "@daily", "@weekly", "@monthly"}
_CRON = re.compile(r"^\S+ \S+ \S+ \S+ \S+$")


@dataclasses.dataclass(frozen=True)
class BatchJob:
    """A step Airflow runs on a schedule over the Delta outputs of streaming jobs (``spark_jobs/batch``).

    Each run covers one data interval and writes its rows, with ``interval_start`` and ``interval_end``
    first, to its own Delta table, replacing that interval's rows (a rerun or a backfill never duplicates).
    Its inputs are read as of the interval's end + ``settle`` (see :mod:`spark_jobs.batch.intervals`).

    Attributes:
        name: the batch job's name; its DAG is ``batch__<name>``.
        inputs: the streaming jobs whose main output it reads (their serving version's table, see
            :mod:`spark_jobs.versions`), each as a view named after the job.
        sql: a Spark SQL query over the input views; ``:interval_start`` and ``:interval_end`` are the data
            interval's bounds (TIMESTAMPs). Exactly one of ``sql`` and ``function``.
        function: ``module:function`` taking ``(spark, inputs: dict[str, DataFrame], interval:
            spark_jobs.batch.intervals.Interval)`` and returning the interval's rows as a DataFrame (the
            input views exist too: ``spark.sql(interval.bind(query))`` works there as well).
        output_table: its Delta table under the lake, ``<lake>/<output_table>`` (default: the name).
        schedule: an Airflow preset (``@hourly``, ``@daily``, ...) or a cron expression.
        settle: how long after an interval's end its inputs are final (at least the inputs' windows'
            grace plus a trigger interval); the run waits for it.
        start_date: the first interval the schedule knows (backfills go no earlier).
        retries: how often Airflow retries a failed run (5 minutes apart) before on-call hears of it.
        description: what it computes, for the DAG's page.
    """

    name: str
    inputs: tuple[str, ...]
    sql: str | None = None
    function: str | None = None
    output_table: str = ""
    schedule: str = "@daily"
    settle: dt.timedelta = dt.timedelta(minutes=15)
    start_date: dt.datetime = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    retries: int = 1
    description: str = ""

    def __post_init__(self) -> None:
        where = f"batch job {self.name}"
        try:
            check_job_name(self.name)
        except JobSpecError as err:
            raise JobSpecError(f"{where}: {err}") from None
        if not self.inputs:
            raise JobSpecError(f"{where}: inputs: name at least one streaming job")
        if (self.sql is None) == (self.function is None):
            raise JobSpecError(f"{where}: give exactly one of sql and function")
        if self.function is not None and ":" not in self.function:
            raise JobSpecError(f"{where}: function must be 'module:function', got {self.function!r}")
        if self.schedule not in _SCHEDULES and not _CRON.match(self.schedule):
            raise JobSpecError(f"{where}: schedule {self.schedule!r}: one of {sorted(_SCHEDULES)} or a cron expression")
        if self.settle < dt.timedelta(0):
            raise JobSpecError(f"{where}: settle must be >= 0")
        if self.retries < 0:
            raise JobSpecError(f"{where}: retries must be >= 0")
        if self.start_date.tzinfo is None:
            raise JobSpecError(f"{where}: start_date needs a time zone")

    @property
    def dag_id(self) -> str:
        return batch_dag_id(self.name)

    @property
    def output_table_dir(self) -> str:
        return self.output_table or self.name

    @property
    def application_id(self) -> str:
        """Its name where alerts and Spark applications name a job version (a batch job has no versions)."""
        return f"batch-{self.name}"


BUILTIN_BATCH_JOBS: tuple[BatchJob, ...] = (
    BatchJob(
        name="daily_top_movers",
        inputs=("stock_price_changes",),
        sql="""
            SELECT rank, symbol, change, ticks FROM (
                SELECT symbol, change, ticks, row_number() OVER (ORDER BY change DESC, symbol) AS rank
                FROM stock_price_changes
                WHERE window_start = :interval_start
            ) WHERE rank <= 10
        """,
        schedule="@daily",
        # the input's days close 10 min (its grace) after midnight, and are written a trigger later
        settle=dt.timedelta(minutes=15),
        description="The day's ten largest price changes, over stock_price_changes' closed days: stage 2 of "
        "the seeds' top-movers pipeline, as a batch step.",
    ),
)


@functools.lru_cache(maxsize=8)
def _registered(job_modules: str) -> dict[str, BatchJob]:
    jobs = list(BUILTIN_BATCH_JOBS)
    for module_name in filter(None, (m.strip() for m in job_modules.split(","))):
        jobs.extend(getattr(importlib.import_module(module_name), "BATCH_JOBS", ()))
    streaming = registered_versions(job_modules)
    found: dict[str, BatchJob] = {}
    for job in jobs:
        if not isinstance(job, BatchJob):
            raise JobSpecError(f"job modules must list BatchJob objects in BATCH_JOBS, got {job!r}")
        if job.name in found:
            raise JobSpecError(f"batch job {job.name} is registered twice")
        for name in job.inputs:
            if name not in streaming:
                raise JobSpecError(f"batch job {job.name}: input {name!r} is not a registered streaming job")
        found[job.name] = job
    return dict(sorted(found.items()))


def batch_jobs(job_modules: str | None = None) -> dict[str, BatchJob]:
    """name -> batch job, for every registered one (built-ins and ``job_modules``, by default
    ``Settings.from_env().job_modules``)."""
    if job_modules is None:
        from runtime.settings import Settings

        job_modules = Settings.from_env().job_modules or ""
    return _registered(job_modules)


def get_batch_job(name: str) -> BatchJob:
    jobs = batch_jobs()
    if name not in jobs:
        raise JobSpecError(f"unknown batch job {name!r}; registered: {', '.join(jobs) or 'none'}")
    return jobs[name]
