"""kill -9 of the Spark driver at random moments, trial after trial, while input keeps arriving; then
a last restart drains everything. The Delta output and the changelog must equal the reference
computation over every event in the topic: nothing lost, nothing counted twice.

The moments are drawn from a seeded generator, uniformly over the driver's whole life from launch:
JVM start, lease, restore, the first batch, later batches, snapshot writes. The kills are repeatable
(same seed, same delays; the machine's speed decides which phase each one hits, and the test reports
it). A last, targeted kill hits a driver restoring state after its checkpoint was lost. CI runs a
few trials; for many::

    FAULT_TRIALS=30 FAULT_SEED=7 .venv/bin/python -m pytest tests/faults/test_driver_kills.py -s
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import threading
import time

import pytest

from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.lease import JobLease
from spark_jobs.lifecycle import read_status
from spark_jobs.registry import get_job
from spark_jobs.run import run
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.submit import submit_spec
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = [pytest.mark.integration, pytest.mark.faults]

TRIALS = int(os.environ.get("FAULT_TRIALS", "3"))
SEED = int(os.environ.get("FAULT_SEED", "0"))
#: kills land uniformly in [0, this) seconds after a launch (a start takes ~20-40 s here, then batches)
KILL_WINDOW_S = 60.0


def _phase(status: dict | None, epoch_before: int, epoch_after: int) -> str:
    """Where the driver was when it died, from the lease's epoch and its status file."""
    if epoch_after == epoch_before:
        return "starting (before the lease)"
    if not status or status.get("lease_epoch") != epoch_after:
        return "holding the lease, no status yet"
    state = status.get("state")
    if state == "RUNNING":
        batch = (status.get("progress") or {}).get("batch_id")
        return "running, no batch yet" if batch is None else f"running, after batch {batch}"
    return (state or "created").lower()


def test_random_kill_9s_of_the_driver_lose_nothing_and_double_nothing(private_stack, spark):
    settings = private_stack
    spec = get_job("purchase_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    purchases.produce(bootstrap, spec.source_topic, purchases.generate(4000, users=500, seed=900))
    rng = random.Random(SEED)
    delays = [rng.uniform(0, KILL_WINDOW_S) for _ in range(TRIALS)]

    stop = threading.Event()

    def keep_producing():
        seed = 1000
        while not stop.is_set():
            seed += 1
            purchases.produce(bootstrap, spec.source_topic, purchases.generate(150, users=700, seed=seed))
            time.sleep(1.0)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    submit = submit_spec(spec, settings)
    lease = JobLease(settings.status_dir, spec.application_id)
    hit: list[tuple[float, str]] = []
    driver = None
    try:
        for trial, delay in enumerate(delays, start=1):
            epoch_before = lease.last_epoch()
            log = open(settings.data_dir / f"driver-{trial}.log", "w")
            driver = subprocess.Popen(submit.command(), env={**os.environ, **submit.env}, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            time.sleep(delay)
            assert driver.poll() is None, f"trial {trial}: the driver exited by itself; see {log.name}"
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
            status = read_status(settings.status_dir, spec.application_id)
            hit.append((delay, _phase(status, epoch_before, lease.last_epoch())))
        # A targeted kill: the checkpoint is lost, so the next driver rebuilds state from the snapshot
        # and the changelog (RESTORING); it is killed as soon as its status says so.
        shutil.rmtree(settings.checkpoint_dir / spec.application_id, ignore_errors=True)
        epoch_before = lease.last_epoch()
        log = open(settings.data_dir / "driver-restore.log", "w")
        driver = subprocess.Popen(submit.command(), env={**os.environ, **submit.env}, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        launched = time.monotonic()
        while driver.poll() is None and time.monotonic() - launched < 180:
            status = read_status(settings.status_dir, spec.application_id) or {}
            if status.get("lease_epoch", 0) > epoch_before and status.get("state") != "CREATED":
                break
            time.sleep(0.01)
        assert driver.poll() is None, f"the restoring driver exited by itself; see {log.name}"
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(30)
        hit.append((time.monotonic() - launched, "lost checkpoint: " + _phase(status, epoch_before, lease.last_epoch())))
        restore_kill = hit[-1][1]
    finally:
        stop.set()
        producer.join(30)
        if driver is not None and driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
    print(f"\nseed {SEED}, {TRIALS} kills:\n" + "\n".join(f"  {d:5.1f} s after launch: {phase}" for d, phase in hit))

    # The last restart (this test's Spark session) restores and drains everything that arrived.
    report = run(spec, settings, available_now=True, spark=spark)
    assert report.error is None
    expected = expected_purchase_counts(read_topic(bootstrap, spec.source_topic))
    assert delta_purchase_counts(spark, report.output) == expected  # nothing lost, nothing twice
    changelog = read_changelog(bootstrap, changelog_topic_name(spec.application_id, "counts"))
    assert decode_counts(changelog.state) == expected
    assert report.lease_epoch == 1 + sum(1 for _, phase in hit if not phase.startswith("starting"))
    assert restore_kill.endswith("restoring") or "running" in restore_kill, restore_kill
