"""One writer per job version across hosts: a driver paused (SIGSTOP) in the middle of a batch, a second
driver on "another host" (a status directory of its own, so the lease cannot see the first) takes the
version over, drains the input and stops; then the first wakes up and finishes its batch. Its output
MERGE must be skipped, its changelog records and markers refused (one transaction), and it must exit
fenced, naming who took over. Outputs and state equal the reference computation over all the input,
before and after a restore from the changelog."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from runtime.settings import PROJECT_ROOT
from spark_jobs import failpoints
from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.lease import FENCED
from spark_jobs.registry import get_job
from spark_jobs.run import report_path, run
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import last_complete_batch, read_changelog
from spark_jobs.state.fencing import GENERATION_SPAN
from spark_jobs.submit import submit_spec
from tests.faults.test_driver_kills import assert_outputs_and_changelog_equal_reference
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic, wait_for
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def _stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (state T in /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    "checkpoints",
    [
        "per host",
        # the same story, the fences met being Spark's offset log and the markers' transaction
        pytest.param("shared", marks=pytest.mark.variation(of="this test's [per host] case")),
    ],
)
def test_a_paused_driver_that_wakes_after_a_takeover_is_fenced_and_nothing_is_lost_or_doubled(
    private_stack, spark, checkpoints
):
    """``per host``: B restores from the changelog and A's late writes meet every fence (its MERGE skipped
    by Delta, its changelog records voided, its markers refused). ``shared``: B resumes A's checkpoint and
    replays A's unfinished batch; A is refused by the first fence it reaches (Spark's offset log, when it
    plans a batch B already planned, or the markers' transaction)."""
    host_a = private_stack
    # the same Kafka and lake (and checkpoint, when shared); its own status directory (lease, status, report)
    shared = {"checkpoint_uri": str(host_a.checkpoints)} if checkpoints == "shared" else {}
    host_b = host_a.replace(data_dir=host_a.data_dir.parent / "host-b", lake_uri=str(host_a.lake), **shared)
    spec = get_job("purchase_counts")
    kafka = host_a.kafka
    changelog = changelog_topic_name(spec.application_id, "counts")
    ensure_topic(kafka, spec.source_topic, spec.source_partitions)
    purchases.produce(kafka, spec.source_topic, purchases.generate(400, users=40, seed=71, close_rate=0))

    # driver A runs on: its first batch completes, its second pauses before writing anything
    submit = submit_spec(spec, host_a, available_now=False)
    env = {**os.environ, **submit.env, failpoints.ENV: "before_outputs:2:pause", "PYTHONPATH": str(PROJECT_ROOT)}
    log = open(host_a.data_dir / "driver-a.log", "w")
    driver_a = subprocess.Popen(submit.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(
            lambda: last_complete_batch(kafka, changelog) if driver_a.poll() is None else "exited",
            300,
            "driver A's first batch",
        )
        assert driver_a.poll() is None, f"driver A exited; see {log.name}"
        # the same users again: a stale write of A's would show over B's newer values
        purchases.produce(kafka, spec.source_topic, purchases.generate(300, users=40, seed=72, close_rate=0))
        paused = wait_for(lambda: failpoints.read_marker(host_a.status_dir, spec.application_id), 300, "A's pause")
        wait_for(lambda: _stopped(paused["pid"]), 30, "A's SIGSTOP")
        purchases.produce(kafka, spec.source_topic, purchases.generate(300, users=40, seed=73, close_rate=0))

        # driver B on the other host: takes over from A's checkpoint, drains everything, stops
        report_b = run(spec, host_b, available_now=True, spark=spark)
        assert report_b.error is None and report_b.generation == 2
        expected = expected_purchase_counts(read_topic(kafka, spec.source_topic))
        assert delta_purchase_counts(spark, report_b.output) == expected

        os.killpg(driver_a.pid, signal.SIGCONT)  # A wakes up in the middle of its batch
        assert driver_a.wait(300) == FENCED, f"driver A was not fenced; see {log.name}"
    finally:
        if driver_a.poll() is None:
            os.killpg(driver_a.pid, signal.SIGKILL)
            driver_a.wait(30)
        log.close()

    report_a = json.loads(report_path(spec, host_a).read_text())
    assert report_a["generation"] == 1
    if checkpoints == "per host":
        assert report_a["fenced_by"]["generation"] == 2 and "was fenced by generation 2" in report_a["error"]
    else:
        assert (
            "fenced" in report_a["error"] or "another driver wrote this job version's checkpoint" in report_a["error"]
        )
    # A's late MERGE was skipped by Delta; its changelog records are not applied
    assert delta_purchase_counts(spark, report_b.output) == expected
    read = read_changelog(kafka, changelog)
    assert decode_counts(read.state) == expected
    assert read.cut_batch_id // GENERATION_SPAN == 2
    # A's batch is small: its changelog records were in the transaction of its markers, which the broker refused
    # (A's report names generation 2 from that refusal), so none reached the changelog; a batch too big for the
    # driver writes them with Spark's sink first, and a reader drops them as an incomplete batch
    assert read.records_dropped_incomplete == 0

    # a third driver, without the checkpoint: restores from the changelog, equal again
    shutil.rmtree(host_a.checkpoints / spec.application_id)
    report_c = assert_outputs_and_changelog_equal_reference(host_a, spec, spark)
    assert report_c.generation == 3
