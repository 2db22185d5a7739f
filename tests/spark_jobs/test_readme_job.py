"""The documentation's job example (docs/writing-jobs/keyed-aggregate.md; README.md shows the same job, which
tests/test_docs_site.py holds to it) is a job a user can run: the code block is written to a module of its own
outside this repository, registered through ``STREAMSTATE_JOB_MODULES``, and run on the broker twice (the second
run resumes from its checkpoint). Its outputs and dead letters are what the example's rules say."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys

import pytest
from confluent_kafka import Producer

from runtime.settings import PROJECT_ROOT
from spark_jobs.driver.run import run
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.registry import get_job
from spark_jobs.versions import read_rows
from tests.spark_jobs.test_dead_letter import read_with_headers

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 11, 2, 9, 0, tzinfo=dt.timezone.utc)


def _at(minutes: int) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def _readme_job() -> str:
    text = (PROJECT_ROOT / "docs" / "writing-jobs" / "keyed-aggregate.md").read_text()
    found = re.search(r"<!-- readme-job -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/writing-jobs/keyed-aggregate.md lost its job example"
    return found.group(1)


def _produce(bootstrap: str, topic: str, records: list[tuple[str | None, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value in records:
        producer.produce(topic, key=key.encode() if key else None, value=value)
    assert producer.flush(30) == 0


def _event(type_: str, sku: str | None, qty: int | None = None, minutes: int | None = None) -> tuple[str | None, bytes]:
    event = {"type": type_, "sku": sku, "qty": qty, "at": None if minutes is None else _at(minutes)}
    return sku, json.dumps({k: v for k, v in event.items() if v is not None}).encode()


def _stock(output) -> dict[str, tuple]:
    return {r["sku"]: (r["on_hand"], r["moves"], r["last_sold_at"], r["first_seen_at"]) for r in read_rows(output)}


def test_the_readme_job_runs_from_its_own_module(spark, kafka_broker, settings, tmp_path, monkeypatch):
    (tmp_path / "stock_jobs.py").write_text(_readme_job())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STREAMSTATE_JOB_MODULES", "stock_jobs")
    job = get_job("item_stock")
    assert sys.modules.get("stock_jobs") is not None and job.entrypoint == "stock_jobs:STOCK"
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)

    _produce(
        bootstrap,
        job.source_topic,
        [
            _event("delivered", "apple", 10, minutes=5),
            _event("sold", "apple", 3, minutes=30),
            _event("sold", "apple", 2, minutes=20),  # sold earlier than the previous sale: last_sold_at stays
            _event("delivered", "pear", 5, minutes=1),
            _event("delisted", "plum"),  # never stocked: nothing to delete, no row
            _event("sold", "apple", 0, minutes=40),  # rule: qty > 0
            _event("stolen", "pear", 1, minutes=2),  # not a type of the job
            _event("delivered", None, 1, minutes=3),  # no key
            ("apple", b"{not json"),
        ],
    )
    first = run(job, settings, available_now=True, spark=spark)
    assert first.error is None and first.input_rows == 9
    stock = _stock(first.output)
    assert {sku: row[:2] for sku, row in stock.items()} == {"apple": (5, 3), "pear": (5, 1)}
    assert [_naive(t) for t in stock["apple"][2:]] == [_utc(30), _utc(5)] and stock["pear"][2] is None
    letters = read_with_headers(bootstrap, dead_letter_topic(job.application_id))
    assert sorted(d["headers"]["reason"] for d in letters) == [
        "failed_validation",
        "missing_key",
        "undecodable",
        "unknown_event_type",
    ]
    assert any(d["headers"]["message"].endswith(": delivered and sold need a qty > 0") for d in letters), letters

    # The next run resumes from the checkpoint: apple is delisted (its row goes), pear moves on.
    _produce(bootstrap, job.source_topic, [_event("delisted", "apple"), _event("sold", "pear", 4, minutes=50)])
    second = run(job, settings, available_now=True, spark=spark)
    assert second.error is None and second.input_rows == 2 and not second.restores
    stock = _stock(second.output)
    assert {sku: row[:2] for sku, row in stock.items()} == {"pear": (1, 2)}
    assert _naive(stock["pear"][2]) == _utc(50)


def _utc(minutes: int) -> dt.datetime:
    return (T0 + dt.timedelta(minutes=minutes)).replace(tzinfo=None)


def _naive(value: dt.datetime | None) -> dt.datetime | None:
    """A UTC time as delta-rs reads it, without its zone (the comparisons are in UTC)."""
    if value is not None and value.tzinfo:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    return value
