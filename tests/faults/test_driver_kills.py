"""kill -9 of the Spark driver at chosen *phases of the job* while input keeps arriving; then a last
restart drains everything. The Delta output and the changelog must equal the reference computation
over every event in the topic: nothing lost, nothing counted twice, no stale row.

A kill lands where a failpoint (:mod:`spark_jobs.driver.failpoints`) holds the driver: while it restores,
inside a batch before anything is written, or between the batch's outputs and its changelog markers
(the moment that matters most: the outputs are ahead of what a restore trusts), or with a snapshot
due and not yet written. Wall-clock delays
do not work for this: on a slow machine every "random" kill hit "running, no batch yet". Some kills
also lose the checkpoint, so the next driver restores from the changelog. The trials are drawn from a
seeded generator; CI runs a few, the ``deep`` mode many::

    FAULT_TRIALS=30 FAULT_SEED=7 .venv/bin/python -m pytest tests/faults/test_driver_kills.py -s
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import random
import shutil
import subprocess
import threading
import time

import pytest

from runtime.process import kill_process_group
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.driver import failpoints
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.driver.run import run
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import JobSpec, get_job, registered_versions
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = [pytest.mark.integration, pytest.mark.faults]

TRIALS = int(os.environ.get("FAULT_TRIALS", "3"))
SEED = int(os.environ.get("FAULT_SEED", "0"))


@dataclasses.dataclass(frozen=True)
class Kill:
    """One trial: where the driver is killed, and whether its checkpoint is lost with it."""

    failpoint: failpoints.Failpoint
    nth: int = 1
    lose_checkpoint: bool = False

    def __str__(self) -> str:
        return f"{self.failpoint}:{self.nth}" + (" + checkpoint lost" if self.lose_checkpoint else "")


def draw_kills(rng: random.Random, count: int) -> list[Kill]:
    """``count`` trials; the first three always cover the riskiest moments (outputs ahead of the
    markers, then a restore, then a snapshot being taken), the rest are drawn."""
    kills = [
        Kill("between_outputs_and_markers", 1, lose_checkpoint=True),
        Kill("restoring", lose_checkpoint=True),
        Kill("before_snapshot", 1),
    ]
    while len(kills) < count:
        point = rng.choice(["restoring", "before_outputs", "between_outputs_and_markers", "before_snapshot"])
        lose = point == "restoring" or rng.random() < 0.5
        kills.append(Kill(point, 1 if point == "restoring" else rng.randint(1, 3), lose))
    return kills[:count]


def kill_at(settings: Settings, spec: JobSpec, kill: Kill, log_name: str, timeout_s: float = 300) -> dict:
    """Launch the job's driver by spark-submit, wait until it stops at the failpoint, kill -9 its
    process group. Returns what the driver wrote at the failpoint."""
    marker = failpoints.marker_path(settings.status_dir, spec.application_id)
    marker.unlink(missing_ok=True)
    if kill.lose_checkpoint and kill.failpoint == "restoring":
        shutil.rmtree(settings.checkpoints / spec.application_id, ignore_errors=True)
    submit = submit_spec(spec, settings)
    # PYTHONPATH: the driver may run a job of tests/fixtures (STREAMSTATE_JOB_MODULES)
    env = {**os.environ, **submit.env, failpoints.ENV: f"{kill.failpoint}:{kill.nth}", "PYTHONPATH": str(PROJECT_ROOT)}
    log = open(settings.data_dir / log_name, "w")
    driver = subprocess.Popen(submit.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while (stopped := failpoints.read_marker(settings.status_dir, spec.application_id)) is None:
            assert driver.poll() is None, f"{kill}: the driver exited by itself; see {log.name}"
            assert time.monotonic() < deadline, f"{kill}: failpoint not reached in {timeout_s} s; see {log.name}"
            time.sleep(0.05)
        # The phase the job itself published when it stopped: a kill meant for RESTORING must land there.
        last = read_status(settings.status_dir, spec.application_id)
        stopped["lifecycle_state"] = last.state.value if last else None
        if kill.failpoint == "restoring":
            assert stopped["lifecycle_state"] == "RESTORING", f"{kill}: the driver was {stopped['lifecycle_state']}"
    finally:
        kill_process_group(driver.pid)
        driver.wait(30)
    marker.unlink()
    if kill.lose_checkpoint and kill.failpoint != "restoring":
        shutil.rmtree(settings.checkpoints / spec.application_id, ignore_errors=True)
    return stopped


def assert_outputs_and_changelog_equal_reference(settings: Settings, spec: JobSpec, spark) -> None:
    """The last restart (this test's Spark session) restores and drains everything that arrived."""
    report = run(spec, settings, available_now=True, spark=spark)
    assert report.error is None
    bootstrap = settings.kafka_bootstrap_servers
    expected = expected_purchase_counts(read_topic(bootstrap, spec.source_topic))
    outputs = delta_purchase_counts(spark, report.output)
    stale = {user: row for user, row in outputs.items() if user not in expected}
    assert not stale, f"{len(stale)} output rows for users the input deleted, e.g. {list(stale.items())[:3]}"
    assert outputs == expected  # nothing lost, nothing twice
    changelog = read_changelog(bootstrap, changelog_topic_name(spec.application_id, "counts"))
    assert decode_counts(changelog.state) == expected
    return report


def test_outputs_ahead_of_the_markers_and_a_lost_checkpoint_leave_no_stale_row(private_stack, spark):
    """The failure found on a slow machine, made deterministic: a driver MERGEs a batch's outputs and
    dies before its changelog markers, the checkpoint is lost, so the restore finds nothing and the
    replay runs the whole history in one batch, where users created *and* closed inside that batch
    once emitted nothing: their rows from the killed batch stayed in the outputs forever."""
    settings = private_stack
    spec = get_job("purchase_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    first = list(purchases.generate(600, users=60, seed=901, close_rate=0))
    purchases.produce(bootstrap, spec.source_topic, first)

    kill_at(settings, spec, Kill("between_outputs_and_markers", 1, lose_checkpoint=True), "driver-killed.log")
    killed_outputs = delta_purchase_counts(spark, str(settings.lake / spec.output_table_dir))
    assert killed_outputs, "the killed batch wrote its outputs"

    closed_at = dt.datetime(2026, 11, 1, 12, tzinfo=dt.timezone.utc).isoformat().replace("+00:00", "Z")
    closes = [
        {"event_id": f"close-{user}", "type": "account_closed", "user_id": user, "event_time": closed_at}
        for user in sorted(killed_outputs)[:10]
    ]
    purchases.produce(bootstrap, spec.source_topic, closes)

    assert_outputs_and_changelog_equal_reference(settings, spec, spark)


def test_kill_9s_at_every_phase_of_the_driver_lose_nothing_and_double_nothing(private_stack, spark):
    # purchase_counts with a snapshot after every batch: a kill while one is due is reachable
    settings = private_stack.replace(job_modules="tests.fixtures.fault_jobs")
    spec = registered_versions(settings.job_modules)["snapshotting_counts"][1]
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    purchases.produce(bootstrap, spec.source_topic, purchases.generate(4000, users=500, seed=900))
    kills = draw_kills(random.Random(SEED), TRIALS)

    stop = threading.Event()

    def keep_producing():
        seed = 1000
        while not stop.is_set():
            seed += 1
            purchases.produce(bootstrap, spec.source_topic, purchases.generate(150, users=700, seed=seed))
            time.sleep(1.0)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    lease = JobLease(settings.status_dir, spec.application_id)
    try:
        for trial, kill in enumerate(kills, start=1):
            started = time.monotonic()
            kill_at(settings, spec, kill, f"driver-{trial}.log")
            print(f"trial {trial}: killed at {kill} after {time.monotonic() - started:.1f} s")
    finally:
        stop.set()
        producer.join(30)
    report = assert_outputs_and_changelog_equal_reference(settings, spec, spark)
    assert report.lease_epoch == lease.last_epoch() == len(kills) + 1  # every killed driver held the lease


def test_closed_windows_replayed_after_kills_are_written_once(private_stack, spark):
    """Closed windows are appended to the outputs, except by a batch that may re-derive windows an earlier
    driver wrote (spark_jobs/state/output_marks.py): killed between its outputs and its markers, a driver
    leaves windows in the outputs that the next one derives again, from its checkpoint (Spark replays the
    batch) or, the checkpoint lost, from the changelog. Each window must be written once, and batches
    past the replays must append."""
    from deltalake import DeltaTable

    from spark_jobs.reference.generators import pulse
    from tests.spark_jobs.test_crash_recovery import check_heart_rate

    settings = private_stack
    spec = get_job("patient_heart_rate")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)

    def produce(minute: int, seed: int) -> None:  # 2 minutes of pulses: windows close in the first batch
        start = pulse.START + dt.timedelta(minutes=minute)
        pulse.produce(
            bootstrap, spec.source_topic, list(pulse.generate(6, 120, seed=seed, start=start, checkout_rate=0))
        )

    produce(0, 31)
    kill_at(settings, spec, Kill("between_outputs_and_markers", 1), "driver-killed-1.log")  # Spark replays it
    output = str(settings.lake / spec.output_table_dir)
    assert spark.read.format("delta").load(output).count() > 0, "the killed batch wrote closed windows"
    produce(2, 32)
    kill_at(settings, spec, Kill("between_outputs_and_markers", 1, lose_checkpoint=True), "driver-killed-2.log")
    produce(4, 33)
    assert run(spec, settings, available_now=True, spark=spark).error is None  # restores, replays, catches up
    app_id = JobLayout.of(spec, settings).output_transaction_app_id
    replayed_through = DeltaTable(output).transaction_version(app_id)
    produce(6, 34)
    report = run(spec, settings, available_now=True, spark=spark)  # starts past every written window
    assert report.error is None
    assert DeltaTable(output).transaction_version(app_id) > replayed_through  # appends are idempotent writes too

    changelog = read_changelog(bootstrap, changelog_topic_name(spec.application_id, spec.stores[0].name))
    check_heart_rate(spark, report.output, changelog.state, read_topic(bootstrap, spec.source_topic))
    # appended while nothing was written, merged by the two replays, appended past them. A replay that
    # re-derives only windows written already changes no row: a Spark MERGE commits that as a MERGE, delta-rs
    # (a small batch's writer, spark_jobs/io/output_table.py) as an empty commit ("EMPTY": a WRITE without metrics)
    writes = [
        "EMPTY" if c["operation"] == "WRITE" and not c.get("operationMetrics") else c["operation"]
        for c in reversed(DeltaTable(report.output).history())
        if c["operation"] != "CREATE TABLE"
    ]
    assert len(writes) == 4 and writes[0] == writes[3] == "WRITE" and {*writes[1:3]} <= {"MERGE", "EMPTY"}, writes
