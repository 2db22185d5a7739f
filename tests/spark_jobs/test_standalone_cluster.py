"""The path users take when they outgrow one machine: spark-submit to a real Spark standalone cluster.

A master and a worker run as separate processes (pyspark's spark-class); the job is submitted with
the same SubmitSpec the Airflow DAGs use, its executors run in the worker's JVM, and the Delta
output equals a plain-Python computation over everything in the topic.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from runtime.process import free_port
from runtime.spark_standalone import LocalSparkStandalone
from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.registry import get_job
from spark_jobs.run import report_path
from spark_jobs.submit import submit_spec
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def cluster(private_stack, tmp_path):
    local = LocalSparkStandalone(private_stack.replace(data_dir=tmp_path / "cluster"), free_port(), free_port(), free_port(),
                                 worker_cores=1, worker_memory="1g")  # fmt: skip
    local.start()
    yield local
    local.stop()


def test_job_runs_on_a_standalone_cluster(cluster, private_stack, spark):
    settings = private_stack
    spec = get_job("purchase_counts")
    on_cluster = settings.replace(spark_master=cluster.master_url)
    ensure_topic(settings.kafka_bootstrap_servers, spec.source_topic, spec.source_partitions)
    purchases.produce(settings.kafka_bootstrap_servers, spec.source_topic,
                      list(purchases.generate(2000, users=150, seed=11)))  # fmt: skip

    submit = submit_spec(spec, on_cluster, available_now=True)
    assert submit.master.startswith("spark://")
    proc = subprocess.run(submit.command(), env={**os.environ, **submit.env}, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # The application really ran on the cluster: the worker launched an executor for it.
    apps = [p for p in (cluster.work_dir).iterdir() if p.name.startswith("app-")]
    assert apps, f"no executor directory under {cluster.work_dir}"

    report = json.loads(report_path(spec, on_cluster).read_text())
    events = read_topic(settings.kafka_bootstrap_servers, spec.source_topic)
    assert report["input_rows"] == len(events) == 2000
    assert delta_purchase_counts(spark, report["output"]) == expected_purchase_counts(events)
