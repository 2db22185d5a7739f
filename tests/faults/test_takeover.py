"""One writer per job version across hosts: two hosts of the test's own (network namespaces, tests/faults/hosts.py),
each with its own address and its own disk (data directory), share the brokers and the lake. The driver on host A
is paused (SIGSTOP) in the middle of a batch; the driver on host B, whose lease cannot see A's, takes the version
over, drains the input and stops; then A wakes up and finishes its batch. Every write A then attempts is refused:
its changelog records, markers and output-topic records (one transaction, fenced by B's producer epoch), its
output MERGE (skipped by Delta), and it exits fenced, naming who took over. Outputs, the output topic and the state
equal the reference computation over all the input, before and after a restore from the changelog."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from runtime.kafka_broker import LocalKafkaBroker
from runtime.settings import PROJECT_ROOT
from spark_jobs.driver import failpoints
from spark_jobs.driver.lease import FENCED
from spark_jobs.driver.run import report_path
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import registered_versions
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import last_complete_batch, read_changelog
from spark_jobs.state.fencing import GENERATION_SPAN
from tests.conftest import PRIVATE_BROKER_JAVA_OPTIONS, stack_settings
from tests.faults.hosts import can_make_hosts, hosts
from tests.faults.test_driver_kills import assert_outputs_and_changelog_equal_reference
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic, wait_for
from tests.production.test_kafka_cluster_faults import _published
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
    tmp_path, spark, checkpoints
):
    """``per host``: B restores from the changelog and A's late writes meet every fence (its transaction of
    changelog records, markers and output records refused, its MERGE skipped by Delta). ``shared``: B resumes A's
    checkpoint and replays A's unfinished batch; A is refused by the first fence it reaches (Spark's offset log,
    when it plans a batch B already planned, or the markers' transaction)."""
    if (cannot := can_make_hosts()) is not None:
        pytest.skip(cannot)
    with hosts(2) as (network, (host_a, host_b)):
        _takeover(tmp_path, spark, checkpoints, network.service_address, host_a, host_b)


def _takeover(tmp_path: Path, spark, checkpoints: str, service_address: str, host_a, host_b) -> None:
    # the broker on the machine, reached by both hosts over their links
    machine = stack_settings(
        tmp_path / "machine",
        host=service_address,
        kafka_broker_java_options=PRIVATE_BROKER_JAVA_OPTIONS,
        job_modules="tests.fixtures.repartition_jobs",
    )
    broker = LocalKafkaBroker(machine)
    broker.start()
    try:
        # each host: its own address and disk (lease, status, report, checkpoint unless shared); the same lake
        on_a = machine.replace(
            data_dir=tmp_path / "host-a",
            host=host_a.address,
            kafka_external_bootstrap=machine.kafka_bootstrap_servers,
            lake_uri=str(machine.lake),
        )
        shared = {"checkpoint_uri": str(on_a.checkpoints)} if checkpoints == "shared" else {}
        on_b = on_a.replace(data_dir=tmp_path / "host-b", host=host_b.address, **shared)
        _fenced_after_takeover(spark, machine, on_a, on_b, host_a, host_b, checkpoints)
    finally:
        broker.stop()


def _driver(spec, settings, host, log: Path, armed: str = "", available_now: bool = False) -> subprocess.Popen:
    """The job's driver as spark-submit on ``host`` (its network namespace)."""
    submit = submit_spec(spec, settings, available_now=available_now)
    env = {**os.environ, **submit.env, failpoints.ENV: armed, "PYTHONPATH": str(PROJECT_ROOT)}
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        return subprocess.Popen(
            host.command(submit.command()), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _fenced_after_takeover(spark, machine, on_a, on_b, host_a, host_b, checkpoints: str) -> None:
    spec = registered_versions(machine.job_modules)["published_counts"][1]  # purchase_counts with an output topic
    layout = JobLayout.of(spec, machine)
    kafka = machine.kafka
    changelog = changelog_topic_name(spec.application_id, "counts")
    ensure_topic(kafka, spec.source_topic, spec.source_partitions)
    purchases.produce(kafka, spec.source_topic, purchases.generate(400, users=40, seed=71, close_rate=0))

    # driver A runs on: its first batch completes, its second pauses before writing anything
    log = on_a.data_dir / "driver-a.log"
    driver_a = _driver(spec, on_a, host_a, log, armed="before_outputs:2:pause")
    host_a_status = on_a.status_dir
    try:
        wait_for(
            lambda: last_complete_batch(kafka, changelog) if driver_a.poll() is None else "exited",
            300,
            "driver A's first batch",
        )
        assert driver_a.poll() is None, f"driver A exited; see {log.name}"
        # the same users again: a stale write of A's would show over B's newer values
        purchases.produce(kafka, spec.source_topic, purchases.generate(300, users=40, seed=72, close_rate=0))
        paused = wait_for(lambda: failpoints.read_marker(host_a_status, spec.application_id), 300, "A's pause")
        wait_for(lambda: _stopped(paused["pid"]), 30, "A's SIGSTOP")
        purchases.produce(kafka, spec.source_topic, purchases.generate(300, users=40, seed=73, close_rate=0))

        # driver B on the other host: takes over (from A's checkpoint when shared), drains everything, stops
        driver_b = _driver(spec, on_b, host_b, on_b.data_dir / "driver-b.log", available_now=True)
        assert driver_b.wait(600) == 0, f"driver B failed; see {on_b.data_dir / 'driver-b.log'}"
        report_b = json.loads(report_path(spec, on_b).read_text())
        assert report_b["error"] is None and report_b["generation"] == 2
        expected = expected_purchase_counts(read_topic(kafka, spec.source_topic))
        assert delta_purchase_counts(spark, report_b["output"]) == expected

        os.killpg(driver_a.pid, signal.SIGCONT)  # A wakes up in the middle of its batch
        assert driver_a.wait(300) == FENCED, f"driver A was not fenced; see {log}"
    finally:
        if driver_a.poll() is None:
            os.killpg(driver_a.pid, signal.SIGKILL)
            driver_a.wait(30)

    report_a = json.loads(report_path(spec, on_a).read_text())
    assert report_a["generation"] == 1
    if checkpoints == "per host":
        assert report_a["fenced_by"]["generation"] == 2 and "was fenced by generation 2" in report_a["error"]
    else:
        assert (
            "fenced" in report_a["error"] or "another driver wrote this job version's checkpoint" in report_a["error"]
        )
    # A's late MERGE was skipped by Delta; its changelog records and output records are not applied
    assert delta_purchase_counts(spark, report_b["output"]) == expected
    assert _published(machine, layout) == expected
    read = read_changelog(kafka, changelog)
    assert decode_counts(read.state) == expected
    assert read.cut_batch_id // GENERATION_SPAN == 2
    # A's batch is small: its changelog records were in the transaction of its markers, which the broker refused
    # (A's report names generation 2 from that refusal), so none reached the changelog; a batch too big for the
    # driver writes them with Spark's sink first, and a reader drops them as an incomplete batch
    assert read.records_dropped_incomplete == 0

    # a third driver (this test's Spark session, on the machine), without the checkpoint: restores from the
    # changelog, equal again
    shutil.rmtree(on_a.checkpoints / spec.application_id)
    report_c = assert_outputs_and_changelog_equal_reference(on_a.replace(host=machine.host), spec, spark)
    assert report_c.generation == 3
