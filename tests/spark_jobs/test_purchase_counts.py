"""End to end on the real stack: Kafka -> stateful Spark job (RocksDB) -> Delta, checked against plain Python."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.registry import get_job
from spark_jobs.run import report_path, run
from tests.helpers import delta_purchase_counts, expected_purchase_counts

pytestmark = pytest.mark.integration


@pytest.fixture
def job(unique):
    spec = get_job("purchase_counts")
    return dataclasses.replace(spec, name=f"purchase_counts_{unique}", source_topic=f"purchases-{unique}",
                               output_table=f"purchase_counts_{unique}")  # fmt: skip


def test_state_equals_an_independent_computation_across_runs(spark, kafka_broker, settings, job):
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    first = list(purchases.generate(3000, users=200, seed=1))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, first)

    report = run(job, settings, available_now=True, spark=spark)
    assert report.error is None
    assert report.input_rows == 3000
    assert report.state_rows == len(expected_purchase_counts(first))
    assert delta_purchase_counts(spark, report.output) == expected_purchase_counts(first)
    assert json.loads(report_path(job, settings).read_text())["input_rows"] == 3000

    # A second run continues from the checkpoint: only the new events are read, nothing twice.
    second = list(purchases.generate(2000, users=300, seed=2))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, second)
    report = run(job, settings, available_now=True, spark=spark)
    assert report.input_rows == 2000
    assert delta_purchase_counts(spark, report.output) == expected_purchase_counts(first + second)
    assert sum(report.end_offsets[job.source_topic].values()) == 5000


def test_generator_is_deterministic():
    assert list(purchases.generate(50, seed=3)) == list(purchases.generate(50, seed=3))
    assert list(purchases.generate(50, seed=3)) != list(purchases.generate(50, seed=4))
