"""``streamstate new-job NAME``: a job module (a declaration and its ``JobSpec``) and its test, to edit.

The job counts and sums per key and deletes a key on request (spark_jobs.primitives.KeyedAggregate); the
test runs it on a real broker and Spark (spark_jobs.testing). Both run as written, so a team starts from
a job that works and changes it.
"""

from __future__ import annotations

from pathlib import Path

from spark_jobs.registry import check_job_name

JOB_TEMPLATE = '''"""{name}: per id, how many items were added and their total amount; "removed" deletes the id.

Register it with STREAMSTATE_JOB_MODULES={name} (this module importable where drivers run, e.g. on PYTHONPATH).
"""

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives import Aggregate, JsonEvents, KeyedAggregate
from spark_jobs.registry import JobSpec, StoreSpec

SCHEMA = T.StructType(
    [
        T.StructField("type", T.StringType()),  # added or removed
        T.StructField("id", T.StringType()),
        T.StructField("amount", T.DecimalType(12, 2)),
        T.StructField("at", T.TimestampType()),
    ]
)


def rules():
    """(condition, message) over the decoded event: the first that holds sends the record to dead letters."""
    added, amount = dead_letter.event("type") == "added", dead_letter.event("amount")
    return [
        (added & amount.isNull(), "an added item needs an amount"),
        (added & dead_letter.inexact_decimal("amount", 12, 2), dead_letter.decimal_message("amount", 12, 2)),
        (added & (amount < 0), "amount is negative"),
        (dead_letter.bad_event_time("at", required=False), "at is not a time between 1970 and 2200"),
    ]


{constant} = KeyedAggregate(
    store="totals",
    events=JsonEvents(SCHEMA, types=("added", "removed"), rules=rules),
    values={{
        "items": Aggregate.count(),
        "total": Aggregate.sum("amount"),
        "last_added_at": Aggregate.max("at"),
    }},
    where="type = 'added'",
    delete_when="type = 'removed'",
)

JOBS = (
    JobSpec(
        name="{name}",
        version=1,
        source_topic="{topic}",
        key_field="id",
        output_table="{name}",
        entrypoint="{name}:{constant}",
        stores=(StoreSpec("totals"),),
        description="per id: items added and their total; removed deletes the id",
    ),
)
'''

TEST_TEMPLATE = '''"""{name} on a real Kafka broker and Spark (spark_jobs.testing starts them once per test session)."""

from decimal import Decimal

import {name}

pytest_plugins = ["spark_jobs.testing"]


def test_{name}_adds_rejects_and_removes(job_harness):
    (job,) = {name}.JOBS
    result = job_harness.run(job, [
        {{"type": "added", "id": "a", "amount": 1.5, "at": "2026-01-01T10:00:00Z"}},
        {{"type": "added", "id": "a", "amount": 2, "at": "2026-01-01T09:00:00Z"}},
        {{"type": "added", "id": "b", "amount": -1}},  # refused: a dead letter, not a crash
        {{"type": "removed", "id": "c"}},  # nothing to remove
    ])
    assert {{k: (r["items"], r["total"]) for k, r in result.outputs_by("id").items()}} == {{"a": (2, Decimal("3.50"))}}
    assert [(d.key, d.reason) for d in result.dead_letters] == [(b"b", "failed_validation")]

    # the next run resumes where this one stopped
    result = job_harness.run(job, [{{"type": "removed", "id": "a"}}, {{"type": "added", "id": "b", "amount": 4}}])
    assert {{k: (r["items"], r["total"]) for k, r in result.outputs_by("id").items()}} == {{"b": (1, Decimal("4.00"))}}
'''


def new_job(name: str, directory: Path) -> list[Path]:
    """Write ``<name>.py`` and ``test_<name>.py`` into ``directory``; refuses to overwrite a file."""
    check_job_name(name)
    files = {
        directory / f"{name}.py": JOB_TEMPLATE.format(name=name, constant=name.upper(), topic=name.replace("_", "-")),
        directory / f"test_{name}.py": TEST_TEMPLATE.format(name=name),
    }
    if existing := [str(path) for path in files if path.exists()]:
        raise FileExistsError(f"not overwriting {', '.join(existing)}")
    directory.mkdir(parents=True, exist_ok=True)
    for path, text in files.items():
        path.write_text(text)
    return list(files)
