"""``streamstate new-job`` writes a job and its test that run as written: the generated test passes on the
real broker and Spark through the public harness (spark_jobs.testing), here on the suite's stack."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest

from runtime.settings import PROJECT_ROOT
from spark_jobs.testing import JobHarness
from streamstate_cli.cli import main as streamstate

pytestmark = pytest.mark.integration

# What a Kafka client left open says once its broker has stopped: the Java client's (Spark's Kafka sink,
# through log4j) and librdkafka's (confluent-kafka).
KAFKA_CLIENT_COMPLAINTS = re.compile(
    r"NetworkClient|could not be established|Node may not be available|Connection refused|Disconnected"
    r"|FAIL\|rdkafka|brokers are down"
)


def test_a_new_job_and_its_test_run_as_written(spark, kafka_broker, settings, tmp_path, monkeypatch):
    assert streamstate(["new-job", "shop_totals", "--dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop_totals.py", "test_shop_totals.py"]
    assert streamstate(["new-job", "shop_totals", "--dir", str(tmp_path)]) == 2  # never overwrites
    assert streamstate(["new-job", "Shop", "--dir", str(tmp_path)]) == 2

    monkeypatch.syspath_prepend(str(tmp_path))
    generated = importlib.import_module("test_shop_totals")
    assert generated.pytest_plugins == ["spark_jobs.testing"]
    with JobHarness(settings=settings, spark=spark) as harness:  # the suite's broker and session
        generated.test_shop_totals_adds_rejects_and_removes(harness)


def test_the_harness_leaves_a_session_it_did_not_start_running(spark, kafka_broker, settings):
    with JobHarness(settings=settings) as harness:  # no session given: it takes the running one
        assert harness.spark is spark
    assert spark.range(3).count() == 3  # not stopped


def test_a_new_jobs_first_test_run_ends_quietly(tmp_path):
    """The generated test as a team first runs it: its own pytest process, the harness's own broker and
    Spark (the ``job_harness`` fixture). It passes, and its output ends without Kafka clients retrying the
    stopped broker (the producers Spark's Kafka sink caches were left open, a screen of warnings)."""
    assert streamstate(["new-job", "shop_totals", "--dir", str(tmp_path)]) == 0
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "test_shop_totals.py", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "1 passed" in run.stdout, output[-3000:]
    complaints = [line for line in output.splitlines() if KAFKA_CLIENT_COMPLAINTS.search(line)]
    assert not complaints, "\n".join(complaints[:20])
