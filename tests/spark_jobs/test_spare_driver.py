"""The spare driver takes over a killed driver (spark_jobs/driver/spare.py): nothing lost, nothing twice.

The driver and its spare run as users run them (spark-submit, processing-time trigger) while events keep
arriving. Once the driver has committed batches and the spare is warm, the driver's whole process group is
killed with SIGKILL; the spare must take the driver's lease (the next epoch), resume from the checkpoint and
commit batches, and the outputs and the changelog must equal a plain-Python computation over every event.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import threading
import time

import pytest
from confluent_kafka.admin import AdminClient

from runtime.kafka_connection import client_config
from runtime.process import kill_process_group
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import JobState, SpareState, read_spare_status, read_status
from spark_jobs.driver.run import run
from spark_jobs.driver.spare import (
    REHEARSAL_RECORDS,
    REHEARSAL_RESTORE_KEYS,
    REHEARSAL_RESTORE_TAIL,
    REHEARSAL_SUFFIX,
    rehearse,
    rehearse_restore,
)
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic, existing_topics, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases, votes
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from tests.helpers import purchase_counts_copy, read_topic

pytestmark = pytest.mark.integration


def _command_line(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return [arg.decode() for arg in cmdline.read().split(b"\0") if arg]


def _wait(predicate, timeout_s: float, what: str, processes=()):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        for name, proc, log in processes:
            assert proc.poll() is None, f"{name} exited ({proc.returncode}); see {log}"
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s:.0f}s")


def test_the_spare_takes_over_a_killed_driver(private_stack, spark):
    settings = private_stack
    spec = get_job("vote_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)

    def events(tick: int) -> list[dict]:
        return list(votes.generate(voters=300, seed=700 + tick, start=votes.START + dt.timedelta(hours=tick)))

    votes.produce(bootstrap, spec.source_topic, events(0))

    def start(name: str, *, spare: bool):
        submit = submit_spec(spec, settings, spare=spare)
        log = settings.data_dir / f"{name}.log"
        proc = subprocess.Popen(
            submit.command(),
            env={**os.environ, **submit.env},
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return name, proc, log

    driver = start("driver", spare=False)
    spare = start("spare", spare=True)
    stop_producing = threading.Event()

    def keep_producing():
        tick = 1
        while not stop_producing.is_set():
            votes.produce(bootstrap, spec.source_topic, events(tick))
            tick += 1
            time.sleep(1.0)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        running = _wait(
            lambda: (
                (s := read_status(settings.status_dir, spec.application_id))
                and s.state is JobState.RUNNING
                and (s.batch_id or 0) >= 1
                and s
            ),
            300,
            "the driver's batch 1",
            [driver, spare],
        )
        ready = _wait(
            lambda: (
                (s := read_spare_status(settings.status_dir, spec.application_id))
                and s.state is SpareState.READY
                and s.watching_epoch == running.lease_epoch
                and s
            ),
            300,
            "the spare READY, watching the driver",
            [driver, spare],
        )
        assert ready.warm_up_s is not None and os.getpgid(ready.pid) == spare[1].pid  # the spare's Python process
        # spark-submit's process is the driver's JVM: the spare's committed its whole heap at start, the driver's not
        assert f"-Xms{settings.spark_driver_memory}" in _command_line(spare[1].pid)
        assert not any(option.startswith("-Xms") for option in _command_line(driver[1].pid))
        # the spare's own lease, not the driver's
        assert JobLease(settings.status_dir, spec.application_id).holder().pid != ready.pid

        batch_before = read_status(settings.status_dir, spec.application_id).batch_id
        killed_at = time.monotonic()
        kill_process_group(driver[1].pid)  # kill -9, mid-stream, no chance to clean up
        driver[1].wait(30)
        took_over = _wait(
            lambda: (
                (s := read_status(settings.status_dir, spec.application_id))
                and s.lease_epoch == running.lease_epoch + 1
                and s.state is JobState.RUNNING
                and s
            ),
            120,
            "the spare RUNNING as the driver",
            [spare],
        )
        to_running = time.monotonic() - killed_at
        first = _wait(
            lambda: (
                (s := read_status(settings.status_dir, spec.application_id))
                and s.lease_epoch == took_over.lease_epoch
                and s.progress is not None
                and (s.batch_id or 0) > batch_before
                and s.progress.input_rows > 0
                and s
            ),
            120,
            "a batch committed by the spare",
            [spare],
        )
        to_batch = time.monotonic() - killed_at
        timings = {"kill_to_running_s": round(to_running, 2), "kill_to_batch_s": round(to_batch, 2)}
        phases = {"first_batch_ms": dict(first.progress.phase_ms), "add_batch_ms": dict(first.progress.sink_phase_ms)}
        print(json.dumps({**timings, **phases}))
        assert took_over.pid == ready.pid
        spare_status = read_spare_status(settings.status_dir, spec.application_id)
        assert spare_status.state is SpareState.TAKING_OVER
        assert (spare_status.took_over_from, spare_status.took_over_epoch) == (
            running.lease_epoch,
            took_over.lease_epoch,
        )
        # it let its own lease go: supervision may start the next spare
        assert JobLease(settings.status_dir, f"{spec.application_id}.spare").holder() is None
    finally:
        stop_producing.set()
        producer.join(30)
        holder = JobLease(settings.status_dir, spec.application_id).holder()
        if holder is not None:  # a clean stop, as the stop DAG asks for it: SIGTERM to the driver's Python process
            os.kill(holder.pid, signal.SIGTERM)
        for _, proc, _ in (driver, spare):
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # the former spare stopped cleanly, as a driver does
    last = json.loads((settings.status_dir / f"{spec.application_id}.last-run.json").read_text())
    assert last["took_over_from_epoch"] == running.lease_epoch and last["error"] is None
    assert read_status(settings.status_dir, spec.application_id).state is JobState.NOT_RUNNING

    # a new driver drains the rest; every event counted once
    report = dataclasses.asdict(run(spec, settings, available_now=True, spark=spark))
    assert report["error"] is None
    output = report["output"]
    every_event = read_topic(bootstrap, spec.source_topic)
    want = {voter: e["candidate"] for voter, e in votes.latest_votes(every_event).items()}
    assert {r.voter_id: r.candidate for r in spark.read.format("delta").load(output).collect()} == want
    changelog = read_changelog(bootstrap, changelog_topic_name(spec.application_id, spec.stores[0].name))
    assert {k.decode(): json.loads(v)["candidate"] for k, v in changelog.state.items()} == want
    counts = {r.candidate: r.votes for r in spark.read.format("delta").load(f"{output}_counts").collect()}
    assert counts == votes.expected_counts(every_event)


def test_the_spare_rehearses_the_job_and_its_replayed_batch_on_a_copy_of_the_newest_records(
    settings, kafka_broker, spark, unique
):
    """The rehearsal runs the job on a scratch copy of its source's newest records in two batches, then replays the
    last one from the checkpoint (a takeover's first batch); the job's own source is only read, the scratch topics
    are deleted, and nothing of the job's is written."""
    spec = purchase_counts_copy("rehearsed", unique, settings.kafka_bootstrap_servers)
    events = list(purchases.generate(3 * REHEARSAL_RECORDS * spec.source_partitions, users=40, seed=5))
    purchases.produce(settings.kafka_bootstrap_servers, spec.source_topic, events)
    before = partition_offsets(settings.kafka, spec.source_topic)

    outcome = rehearse(spark, spec, settings, run)

    assert outcome == f"{REHEARSAL_RECORDS * spec.source_partitions} records in 2 batches, the last replayed: ok"
    assert partition_offsets(settings.kafka, spec.source_topic) == before
    topics = AdminClient(client_config(settings.kafka)).list_topics(timeout=30).topics
    scratch = [t for t in topics if t.startswith(spec.name + REHEARSAL_SUFFIX)]
    assert scratch == []
    layout = JobLayout.of(spec, settings)
    assert not layout.checkpoint.exists() and not layout.output_table.exists()


def test_the_spare_rehearses_a_restore_at_scale_for_a_store_spark_restores(settings, kafka_broker, spark):
    """A spare warms a Spark restore's scale paths on scratch state, only for a job whose restore runs in Spark,
    and leaves nothing behind."""
    spec = get_job("vote_counts")  # a few records at most on the shared broker: restored in the driver's process
    assert rehearse_restore(spark, spec, settings) is None

    as_if_large = settings.replace(restore_in_spark_min_records=0)  # every store's restore in Spark
    deleted = len(range(0, REHEARSAL_RESTORE_KEYS, 3 * (REHEARSAL_RESTORE_KEYS // REHEARSAL_RESTORE_TAIL)))
    assert rehearse_restore(spark, spec, as_if_large) == REHEARSAL_RESTORE_KEYS - deleted  # the overlay applied
    scratch_topic = changelog_topic_name(spec.application_id + REHEARSAL_SUFFIX, "restore")
    assert existing_topics(settings.kafka, [scratch_topic]) == set()
