"""Airflow 3 standalone on SQLite with the repo's dags/ and plugins/ and a spark_default connection,
and a DAG run through it that submits a job to Spark."""

from __future__ import annotations

import json
import time

import pytest

from runtime.airflow_standalone import LocalAirflow
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job, latest_jobs
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic, wait_for_success

pytestmark = pytest.mark.integration


def test_standalone_is_healthy(airflow, settings):
    health = LocalAirflow(settings).health()
    for component in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
        assert health[component]["status"] == "healthy", health


def test_spark_default_points_at_the_configured_master(airflow, settings):
    conn = airflow.connection("spark_default")
    assert conn["conn_type"] == "spark"
    assert conn["host"] == settings.spark_master == "local[*]"


def test_repo_dags_are_loaded_without_import_errors(airflow):
    deadline = time.monotonic() + 180
    expected = {f"drain__{name}" for name in latest_jobs()}
    while time.monotonic() < deadline and not expected <= set(airflow.dag_ids()):
        time.sleep(3)
    assert expected <= set(airflow.dag_ids())
    assert airflow.import_errors() == []


@pytest.mark.variation(
    of="test_job_and_admin_dags_run_on_secured_kafka (tests/security/test_secured_kafka.py: the drain DAG through "
    "spark_default, its output equal to the reference; here under the standalone's scheduler)"
)
def test_drain_dag_submits_the_job_through_spark_default(airflow, kafka_broker, settings, spark):
    spec = get_job("purchase_counts")
    ensure_topic(settings.kafka_bootstrap_servers, spec.source_topic, spec.source_partitions)
    purchases.produce(
        settings.kafka_bootstrap_servers, spec.source_topic, list(purchases.generate(1500, users=100, seed=21))
    )
    test_repo_dags_are_loaded_without_import_errors(airflow)

    run_id = airflow.trigger(f"drain__{spec.name}")
    wait_for_success(airflow, f"drain__{spec.name}", run_id, timeout_s=600)

    report = json.loads((settings.status_dir / f"{spec.application_id}.last-run.json").read_text())
    expected = expected_purchase_counts(read_topic(settings.kafka_bootstrap_servers, spec.source_topic))
    assert delta_purchase_counts(spark, report["output"]) == expected
