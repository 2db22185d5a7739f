"""Every alert condition fires once and resolves once, through the real checks: the supervise DAG's
operators (``CheckStreamingJobOperator``, ``SuperviseStandbyOperator``) reading a status directory
and Kafka, deciding with ``supervision.assess`` / the standby check, and delivering through
``routing.send`` to a local webhook. No Spark: the driver's side is its own lease and status publisher
(``JobLease``, ``JobStatus``, fed StreamingQueryProgress documents as Spark reports them); the
standby is the real follower process the operator launches. A private broker and status directory
keep the registry job's names apart from the other tests'.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import os
import signal
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred
from confluent_kafka import Producer
from streamstate.hooks.standby import StandbyHook
from streamstate.operators.standby import SuperviseStandbyOperator
from streamstate.operators.streaming_job import CheckStreamingJobOperator
from streamstate.supervision import read_record

from runtime.alert_inbox import AlertInbox
from runtime.kafka_connection import client_config
from spark_jobs.driver.context import JobContext
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import FollowerState, JobState, JobStatus, read_standby_status, status_path
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.operations.standby.follower import SnapshotFollower, StoreFollower, standby_id, standby_running
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import ChangelogWriter
from tests.helpers import wait_for, write_changelog_batch

pytestmark = pytest.mark.integration

JOB = get_job("patient_heart_rate")
APP = JOB.application_id
STORE = JOB.stores[0].name


@pytest.fixture
def stack(private_stack, monkeypatch):
    """The private stack's settings, in the environment the operators read them from, with a standby
    bound short enough to exceed in a test; alerts go to a local webhook only."""
    own = dataclasses.replace(private_stack, standby_max_lag_s=3.0, standby_commit_interval_s=1.0)
    for name, value in own.to_env().items():
        monkeypatch.setenv(name, value)
    for name in ("SLACK", "PAGERDUTY", "SMTP"):
        monkeypatch.delenv(f"AIRFLOW_CONN_STREAMSTATE_{name}", raising=False)
    inbox = AlertInbox()
    monkeypatch.setenv("AIRFLOW_CONN_STREAMSTATE_WEBHOOK", inbox.connection)
    yield SimpleNamespace(settings=own, webhook=inbox)
    inbox.close()
    for launch in read_record(own.status_dir, standby_id(APP)).launches:
        try:
            os.killpg(launch.launcher_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, TypeError):
            pass


def _context(task_id: str) -> dict:
    ti = SimpleNamespace(
        dag_id=f"supervise__{JOB.name}",
        run_id=f"test__{time.time_ns()}",
        task_id=task_id,
        try_number=1,
        xcom_push=lambda **_: None,
    )
    return {"ti": ti}


def check() -> dict:
    return CheckStreamingJobOperator(task_id="check", job=JOB.name).execute(_context("check"))


def supervise_standby() -> dict:
    """One check as Airflow runs it: a start defers until the follower holds its lease (the trigger runs here,
    as the triggerer would run it), then the task resumes with the trigger's event."""
    operator, context = SuperviseStandbyOperator(task_id="standby", job=JOB.name), _context("standby")
    try:
        return operator.execute(context)
    except TaskDeferred as deferred:
        trigger, resume = deferred.trigger, getattr(operator, deferred.method_name)

    async def first_event():
        async for event in trigger.run():
            return event.payload

    return resume(context, asyncio.run(first_event()))


def _iso(seconds_ago: float) -> str:
    return (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds_ago)).isoformat(timespec="milliseconds")


def _progress(batch_id: int, *, duration_ms: int, behind: int, seconds_ago: float = 0.0) -> dict:
    """A StreamingQueryProgress (as Spark reports it) of the job's Kafka source, ``behind`` records
    short of the topic's latest offsets."""
    topic = JOB.source_topic
    return {
        "batchId": batch_id,
        "timestamp": _iso(seconds_ago),
        "numInputRows": 10,
        "durationMs": {"triggerExecution": duration_ms},
        "sources": [{"endOffset": {topic: {"0": 1_000}}, "latestOffset": {topic: {"0": 1_000 + behind}}}],
        "stateOperators": [{"numRowsTotal": 10, "memoryUsedBytes": 1024}],
    }


def _produce_dead_letters(settings, count: int) -> None:
    producer = Producer(client_config(settings.kafka))
    for i in range(count):
        producer.produce(dead_letter_topic(APP), key=b"%d" % i, value=b"not json")
    assert producer.flush(30) == 0


def test_every_driver_condition_fires_once_and_resolves_once(stack):
    settings, webhook = stack.settings, stack.webhook
    policy = JOB.supervision
    ensure_topic(settings.kafka, dead_letter_topic(APP), 1)
    lease = JobLease(settings.status_dir, APP)
    epoch = lease.acquire()  # the driver holds its lease and publishes its status, as spark_jobs/driver/run.py does
    # a run that started longer ago than the no-progress limit (its first batches below are as old)
    quiet = max(120.0, policy.no_progress_triggers * JOB.trigger_interval_s) + 60
    driver = JobStatus(APP, status_path(settings.status_dir, APP), lease_epoch=epoch, started_at=_iso(quiet))

    # Restoring for longer than the budget.
    driver.transition_to(JobState.RESTORING)
    driver.record_restore_progress(STORE, started_at=_iso(policy.restore_budget_s + 60), records_read=5_000)
    assert check()["fired"] == ["restore_slow"]
    assert read_record(settings.status_dir, APP).dead_letters_seen == 0

    # Running after a restore within budget, but far behind its input, with a slow batch, silent for
    # longer than the no-progress limit, and dead letters piling up.
    driver.record_restore_progress(STORE, seconds=12.5)
    driver.transition_to(JobState.RUNNING)
    driver.record_progress(_progress(0, duration_ms=4_000, behind=0, seconds_ago=quiet + 30))
    driver.record_progress(
        _progress(
            1,
            duration_ms=int(policy.batch_duration_budget_s * 1000) + 15_000,
            behind=policy.max_input_lag_records + 50_000,
            seconds_ago=quiet,
        )
    )
    _produce_dead_letters(settings, policy.dead_letter_growth_records + 200)
    result = check()
    assert sorted(result["fired"]) == ["batch_duration", "dead_letters_growing", "input_lag", "no_progress"]
    assert result["resolved"] == ["restore_slow"]
    result = check()  # still holding: nothing new is sent; dead letters are counted between checks
    assert result["fired"] == [] and result["resolved"] == ["dead_letters_growing"]

    # Healthy again: a fast batch just now, caught up.
    driver.record_progress(_progress(2, duration_ms=2_000, behind=10))
    result = check()
    assert result["fired"] == []
    assert sorted(result["resolved"]) == ["batch_duration", "input_lag", "no_progress"]

    # The driver dies (the kernel drops its lease): down; back (a new holder publishes RUNNING): resolved.
    lease.release()
    result = check()
    assert result["fired"] == ["down"] and result["action"] == "restart"
    lease = JobLease(settings.status_dir, APP)
    driver = JobStatus(APP, status_path(settings.status_dir, APP), lease_epoch=lease.acquire())
    driver.transition_to(JobState.RUNNING)
    try:
        assert check()["resolved"] == ["down"]
    finally:
        lease.release()

    conditions = ["restore_slow", "input_lag", "batch_duration", "no_progress", "dead_letters_growing", "down"]
    for condition in conditions:
        assert webhook.of(APP).count((condition, "firing")) == 1, condition
        assert webhook.of(APP).count((condition, "resolved")) == 1, condition
    assert len(webhook.of(APP)) == 2 * len(conditions)
    lag = next(a for a in webhook.received if a["condition"] == "input_lag" and a["status"] == "firing")
    assert lag["numbers"]["lag_records"] == policy.max_input_lag_records + 50_000
    dead = next(a for a in webhook.received if a["condition"] == "dead_letters_growing" and a["status"] == "firing")
    assert dead["numbers"]["new_records"] == policy.dead_letter_growth_records + 200


def test_standby_down_and_standby_lag_fire_once_and_resolve_once(stack):
    settings, webhook = stack.settings, stack.webhook
    standby = standby_id(APP)
    lag_alert = f"standby_lag_{STORE}"

    # First check: the operator starts the follower (the real process), which takes its lease.
    result = supervise_standby()
    assert result["action"] == "start" and result["running"] and result["fired"] == []
    first = standby_running(settings.status_dir, APP)

    # The follower is killed; the check that sees it gone waits out the restart backoff and says so.
    # (A check that comes after the backoff restarts it instead: kill again, the backoff doubles.)
    for _attempt in range(4):
        holder = standby_running(settings.status_dir, APP)
        os.kill(holder.pid, signal.SIGKILL)
        wait_for(
            lambda: standby_running(settings.status_dir, APP) is None, 30, "the killed follower's lease to be free"
        )
        result = supervise_standby()
        if result["action"] == "wait_backoff":
            break
        assert result["running"]
    assert result["fired"] == ["standby_down"] and not result["running"]

    # After the backoff it is restarted: resolved.
    record = read_record(settings.status_dir, standby)
    recent = record.launches_since(time.time() - JOB.supervision.crash_loop_window_s)
    time.sleep(max(0.0, record.last_launch.at + JOB.supervision.backoff_s(len(recent)) - time.time()) + 0.5)
    result = supervise_standby()
    assert result["action"] == "start" and result["running"] and result["resolved"] == ["standby_down"]
    assert standby_running(settings.status_dir, APP).epoch > first.epoch

    # The follower reads a changelog batch and stalls before committing it: the lag its status file
    # reports (the real follower's lag and publisher) passes the bound, and standby_lag_<store> fires.
    StandbyHook(JOB).stop()
    wait_for(lambda: standby_running(settings.status_dir, APP) is None, 30, "the follower to stop")
    topic = (
        JobContext(None, JOB, settings).stores.handle(STORE).changelog
    )  # (no Spark: only the topic's names and configs)
    topic.ensure(settings.kafka)
    follower = SnapshotFollower(JOB, settings)
    follower.lease.acquire()
    try:
        follower.stores[STORE] = store = StoreFollower(JOB, STORE, settings)
        follower.transition_to(FollowerState.CATCHING_UP)
        write_changelog_batch(ChangelogWriter(topic, settings.kafka), 0, {b"patient-1": b"72"})
        wait_for(lambda: store.step(0.5) or store.pending_batch, 30, "the follower to read the batch")
        time.sleep(settings.standby_max_lag_s + 0.5)
        follower.publish(force=True)
        assert read_standby_status(settings.status_dir, APP).stores[STORE].lag_ms > 3_000
        assert supervise_standby()["fired"] == [lag_alert]
        assert supervise_standby()["fired"] == []  # still lagging: nothing new

        # It resumes: the batch is committed to the snapshot table and the lag is gone.
        follower.step()
        follower.publish(force=True)
        assert store.commits == 1 and read_standby_status(settings.status_dir, APP).stores[STORE].lag_ms == 0
        assert supervise_standby()["resolved"] == [lag_alert]
    finally:
        store.close()
        follower.lease.release()

    assert webhook.of(APP) == [
        ("standby_down", "firing"),
        ("standby_down", "resolved"),
        (lag_alert, "firing"),
        (lag_alert, "resolved"),
    ]
    down, lag = (next(a for a in webhook.received if a["condition"] == c) for c in ("standby_down", lag_alert))
    assert down["dedup_key"] == f"streamstate/{APP}/standby_down" and "follower log" in down["next_step"]
    assert lag["numbers"]["max_lag_ms"] == 3_000 and lag["numbers"]["lag_ms"] > 3_000
