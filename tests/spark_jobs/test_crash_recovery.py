"""kill -9 of the driver mid-stream, then a restart from the checkpoint: nothing lost, nothing twice.

The job runs as users run it (spark-submit, processing-time trigger) while events keep arriving; its
whole process group is killed with SIGKILL once it has committed batches; a restart drains the rest.
The Delta output and the changelog's latest values must equal a plain-Python computation over every
event in the topic.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.lifecycle import read_status
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.submit import submit_spec
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = pytest.mark.integration


def test_kill_9_of_the_driver_then_restart(private_stack, spark):
    settings = private_stack
    spec = get_job("purchase_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    purchases.produce(bootstrap, spec.source_topic, list(purchases.generate(2000, users=300, seed=51)))

    submit = submit_spec(spec, settings)  # long-running: one micro-batch per trigger interval
    env = {**os.environ, **submit.env}
    log = open(settings.data_dir / "crash-driver.log", "w")
    driver = subprocess.Popen(submit.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    stop_producing = threading.Event()

    def keep_producing():
        seed = 100
        while not stop_producing.is_set():
            purchases.produce(bootstrap, spec.source_topic, list(purchases.generate(300, users=500, seed=seed)))
            seed += 1
            time.sleep(1.5)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        deadline = time.monotonic() + 300
        status = None
        while time.monotonic() < deadline:
            status = read_status(settings.status_dir, spec.application_id)
            if status and status["state"] == "RUNNING" and (status["progress"].get("batch_id") or 0) >= 2:
                break
            assert driver.poll() is None, f"driver exited early; see {log.name}"
            time.sleep(1)
        assert status and status["state"] == "RUNNING", f"job never reached batch 2: {status}"
        assert status["progress"]["state_rows"] > 0 and "input_lag" in status["progress"]
        os.killpg(driver.pid, signal.SIGKILL)  # kill -9, mid-stream, no chance to clean up
        driver.wait(30)
    finally:
        stop_producing.set()
        producer.join(30)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)

    # The killed driver never said goodbye: its status is stale, not NOT_RUNNING.
    assert read_status(settings.status_dir, spec.application_id)["state"] == "RUNNING"

    drain = submit_spec(spec, settings, available_now=True)
    proc = subprocess.run(drain.command(), env={**os.environ, **drain.env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_status(settings.status_dir, spec.application_id)["state"] == "NOT_RUNNING"

    expected = expected_purchase_counts(read_topic(bootstrap, spec.source_topic))
    report = json.loads((settings.status_dir / f"{spec.application_id}.last-run.json").read_text())
    assert delta_purchase_counts(spark, report["output"]) == expected
    changelog = read_changelog(bootstrap, changelog_topic_name(spec.application_id, "counts"))
    assert decode_counts(changelog.state) == expected
