"""The path users take when they outgrow one machine: spark-submit to a real Spark standalone cluster.

A master and a worker run as separate processes (pyspark's spark-class); the job is submitted with
the same SubmitSpec the Airflow DAGs use, its executors run in the worker's JVM, and the Delta
output equals a plain-Python computation over everything in the topic. The job is a team's own: its
module lives outside the repository and its state logic is a Python processor defined there, so the
driver and the executors' Python workers can only import it from what the submission ships.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from runtime.process import free_port
from runtime.spark_standalone import LocalSparkStandalone
from spark_jobs.driver.run import report_path
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import registered_versions
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def cluster(settings, tmp_path):
    local = LocalSparkStandalone(
        settings.replace(data_dir=tmp_path / "cluster"),
        free_port(),
        free_port(),
        free_port(),
        worker_cores=1,
        worker_memory="1g",
    )
    local.start()
    yield local
    local.stop()


#: a team's job module: purchase_counts' rules in a Python processor of its own
CLUSTER_JOBS = '''
from spark_jobs.reference.jobs import purchase_counts
from spark_jobs.registry import JobSpec, StoreSpec


class ClusterCounter(purchase_counts.PurchaseCounter):
    """Defined here, outside the platform: the executors' Python workers import this module to run it."""


def build(ctx):
    return purchase_counts.build(ctx, ClusterCounter)


JOBS = (JobSpec(name="cluster_counts", version=1, source_topic="cluster-purchases", key_field="user_id",
                output_table="cluster_counts", entrypoint="cluster_jobs:build", stores=(StoreSpec("counts"),)),)
'''


def test_job_runs_on_a_standalone_cluster(cluster, settings, kafka_broker, spark, tmp_path, monkeypatch):
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "cluster_jobs.py").write_text(CLUSTER_JOBS)
    monkeypatch.syspath_prepend(str(tmp_path / "team"))
    spec = registered_versions("cluster_jobs")["cluster_counts"][1]  # its own topic: the suite's broker will do
    on_cluster = settings.replace(spark_master=cluster.master_url, job_modules="cluster_jobs")
    ensure_topic(settings.kafka_bootstrap_servers, spec.source_topic, spec.source_partitions)
    purchases.produce(
        settings.kafka_bootstrap_servers, spec.source_topic, list(purchases.generate(2000, users=150, seed=11))
    )

    submit = submit_spec(spec, on_cluster, available_now=True)
    assert submit.master.startswith("spark://")
    # The driver imports the module where it runs (README: importable where drivers run); the executors
    # on the worker have only what the submission ships.
    driver_env = {**os.environ, **submit.env, "PYTHONPATH": str(tmp_path / "team")}
    proc = subprocess.run(submit.command(), env=driver_env, capture_output=True, text=True, timeout=600)
    errors = [line for line in proc.stderr.splitlines() if "Error" in line or "Exception" in line][:10]
    assert proc.returncode == 0, "\n".join(errors) + "\n...\n" + proc.stdout[-2000:] + proc.stderr[-2000:]

    # The application really ran on the cluster: the worker launched an executor for it.
    apps = list(cluster.work_dir.glob("*/app-*"))  # a work directory per worker
    assert apps, f"no executor directory under {cluster.work_dir}"

    report = json.loads(report_path(spec, on_cluster).read_text())
    events = read_topic(settings.kafka_bootstrap_servers, spec.source_topic)
    assert report["input_rows"] == len(events) == 2000
    assert delta_purchase_counts(spark, report["output"]) == expected_purchase_counts(events)
