"""kill -9 of the driver mid-stream, then a restart from the checkpoint: nothing lost, nothing twice.

The job runs as users run it (spark-submit, processing-time trigger) while events keep arriving; its
whole process group is killed with SIGKILL once it has committed batches; a restart drains the rest.
The Delta output and the changelog's latest values must equal a plain-Python computation over every
event in the topic. purchase_counts' case is in tests/plugins/test_state_api.py (the same kill, with
state queries answered from the standby meanwhile).
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
from collections.abc import Callable

import pytest

from runtime.process import kill_process_group
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.driver.run import run
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import pulse, votes
from spark_jobs.registry import get_job, store
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from tests.helpers import read_topic


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One reference job under crash: its input, and how to compare its outputs with plain Python."""

    job: str
    #: tick number -> events of that tick (tick 0 is the backlog before the job starts)
    events: Callable[[int], list[dict]]
    produce: Callable[[str, str, list[dict]], int]
    #: (spark, output path, changelog state, every event in the topic) -> None, asserting equality
    check: Callable


def check_heart_rate(spark, output, changelog_state, events):
    s = store(get_job("patient_heart_rate"), "pulse-counts")
    # Device disorder (3 s) stays inside the grace (5 s): no pulse is late, however batches fall.
    want = pulse.expected([events], s.window_ms, s.grace_ms, s.retention_ms)
    assert not want.late
    rows = spark.read.format("delta").load(output).collect()
    emitted = {
        (r.patient_id, int(r.window_start.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)): r.heart_rate
        for r in rows
    }
    assert len(rows) == len(emitted) and emitted == want.emitted
    values = list(map(json.loads, changelog_state.values()))
    state = {(v["patient_id"], v["window_start_ms"]): (v["beats"], v["closed"]) for v in values if v.get("patient_id")}
    assert state == want.state
    assert {v["source_partition"]: v["stream_time_ms"] for v in values if not v.get("patient_id")} == want.stream_times


def _check_votes(spark, output, changelog_state, events):
    want = {voter: e["candidate"] for voter, e in votes.latest_votes(events).items()}
    assert {r.voter_id: r.candidate for r in spark.read.format("delta").load(output).collect()} == want
    assert {k.decode(): json.loads(v)["candidate"] for k, v in changelog_state.items()} == want
    counts = {r.candidate: r.votes for r in spark.read.format("delta").load(f"{output}_counts").collect()}
    assert counts == votes.expected_counts(events)


SCENARIOS = [
    Scenario(
        "patient_heart_rate",
        lambda tick: list(
            pulse.generate(
                patients=8,
                seconds=60 if tick == 0 else 10,
                seed=200 + tick,
                start=pulse.START + dt.timedelta(seconds=0 if tick == 0 else 50 + 10 * tick),
                checkout_rate=0,
            )
        ),
        pulse.produce,
        check_heart_rate,
    ),
    Scenario(
        "vote_counts",
        lambda tick: list(votes.generate(voters=300, seed=300 + tick, start=votes.START + dt.timedelta(hours=tick))),
        votes.produce,
        _check_votes,
    ),
]

pytestmark = pytest.mark.integration


CLOSED_WINDOWS_KILLED = "test_closed_windows_replayed_after_kills_are_written_once (tests/faults/test_driver_kills.py)"
#: vote_counts killed with kill -9 mid-stream, input still arriving, its outputs, changelog and counts checked after
#: the takeover: the same story with a warm spare resuming the checkpoint instead of a fresh driver
SPARE_TAKES_OVER = "test_the_spare_takes_over_a_killed_driver (tests/spark_jobs/test_spare_driver.py)"
KILLED_AND_RESTARTED_BY_ANOTHER = {"patient_heart_rate": CLOSED_WINDOWS_KILLED, "vote_counts": SPARE_TAKES_OVER}


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param(s, marks=pytest.mark.variation(of=KILLED_AND_RESTARTED_BY_ANOTHER[s.job]))
        if s.job in KILLED_AND_RESTARTED_BY_ANOTHER
        else s
        for s in SCENARIOS
    ],
    ids=[s.job for s in SCENARIOS],
)
def test_kill_9_of_the_driver_then_restart(private_stack, spark, scenario):
    settings = private_stack
    spec = get_job(scenario.job)
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    scenario.produce(bootstrap, spec.source_topic, scenario.events(0))

    submit = submit_spec(spec, settings)  # long-running: one micro-batch per trigger interval
    env = {**os.environ, **submit.env}
    log = open(settings.data_dir / "crash-driver.log", "w")
    driver = subprocess.Popen(submit.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    stop_producing = threading.Event()

    def keep_producing():
        tick = 1
        while not stop_producing.is_set():
            scenario.produce(bootstrap, spec.source_topic, scenario.events(tick))
            tick += 1
            time.sleep(1.5)

    producer = threading.Thread(target=keep_producing, daemon=True)
    producer.start()
    try:
        deadline = time.monotonic() + 300
        status = None
        while time.monotonic() < deadline:
            status = read_status(settings.status_dir, spec.application_id)
            if status and status.state == "RUNNING" and (status.batch_id or 0) >= 1:
                break
            assert driver.poll() is None, f"driver exited early; see {log.name}"
            time.sleep(1)
        assert status and status.state == "RUNNING", f"job never reached batch 1: {status}"
        assert status.progress.state_rows > 0 and status.progress.input_lag is not None
        kill_process_group(driver.pid)  # kill -9, mid-stream, no chance to clean up
        driver.wait(30)
    finally:
        stop_producing.set()
        producer.join(30)
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)

    # The killed driver never said goodbye: its status is stale, not NOT_RUNNING.
    assert read_status(settings.status_dir, spec.application_id).state == "RUNNING"

    # The restart: a new driver (this test's Spark session: no second JVM start) drains the rest.
    report = dataclasses.asdict(run(spec, settings, available_now=True, spark=spark))
    assert report["error"] is None and report["lease_epoch"] == 2
    assert read_status(settings.status_dir, spec.application_id).state == "NOT_RUNNING"

    changelog = read_changelog(bootstrap, changelog_topic_name(spec.application_id, spec.stores[0].name))
    scenario.check(spark, report["output"], changelog.state, read_topic(bootstrap, spec.source_topic))
