"""``streamstate new-job`` writes a job and its test that run as written: the generated test passes on the
real broker and Spark through the public harness (spark_jobs.testing), here on the suite's stack."""

from __future__ import annotations

import importlib

import pytest

from spark_jobs.testing import JobHarness
from streamstate_cli.cli import main as streamstate

pytestmark = pytest.mark.integration


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
