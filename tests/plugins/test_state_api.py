"""State queries on the real local stack: live while the job runs, from the warm standby when it is
killed (with the right staleness, never an error), live again after a restart; the standby's lag
stays under its bound while the job runs at a steady rate. Answers are compared with a plain-Python
computation over every event in the topic.

The kill is a kill -9 of the spark-submit driver mid-stream, input still arriving, so this is also
purchase_counts' crash-recovery case (tests/spark_jobs/test_crash_recovery.py has the other jobs):
after the restart the state and the Delta output equal the reference, nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from decimal import Decimal

import pytest
from confluent_kafka import Producer
from fastapi.testclient import TestClient
from streamstate.state_api.app import create_app

from runtime.process import kill_process_group, stop_process_group
from runtime.settings import Settings
from spark_jobs.driver import failpoints
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import (
    JobState,
    JobStatus,
    StandbyStatus,
    current_state,
    read_standby_status,
    read_status,
    status_path,
)
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.state.fencing import GENERATION_SPAN
from tests.helpers import delta_purchase_counts, expected_purchase_counts, read_topic, scrape_metrics, wait_for
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = pytest.mark.integration

JOB = get_job("purchase_counts")
BASE = f"/jobs/{JOB.name}/stores/counts"


def _start_driver(settings, log_name: str, env: dict | None = None) -> subprocess.Popen:
    submit = submit_spec(JOB, settings)
    log = open(settings.data_dir / log_name, "w")
    return subprocess.Popen(
        submit.command(),
        env={**os.environ, **submit.env, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _all_state(client: TestClient, page_size: int = 150) -> tuple[dict[str, tuple[int, Decimal]], list[dict]]:
    """Every key through the paged range scan; also the page answers (their sources and batches)."""
    state, pages, token = {}, [], None
    while True:
        params = {"page_size": page_size, **({"page_token": token} if token else {})}
        answer = client.get(f"{BASE}/keys", params=params)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        pages.append(page)
        for item in page["items"]:
            state[item["key"]["user_id"]] = (
                item["value"]["purchases"],
                Decimal(str(item["value"]["amount_spent"])).quantize(Decimal("0.01")),
            )
        token = page["next_page_token"]
        if token is None:
            return state, pages


def _answers_match(client, expected, source: str):
    state, pages = _all_state(client)
    return state == expected and all(p["source"] == source for p in pages) and pages


def _wait_for_answers(client, expected, source: str, timeout_s: float, what: str) -> list[dict]:
    try:
        return wait_for(lambda: _answers_match(client, expected, source), timeout_s, what)
    except AssertionError:
        state, pages = _all_state(client)
        wrong = {
            k: (state.get(k), expected.get(k)) for k in set(state) | set(expected) if state.get(k) != expected.get(k)
        }
        raise AssertionError(
            f"{what}: {len(wrong)} of {len(expected)} keys differ (answer, expected), e.g. "
            f"{dict(list(wrong.items())[:5])}; sources {[(p['source'], p['batch_id']) for p in pages]}"
        ) from None


def _steady_input(bootstrap: str, stop: threading.Event, first_seed: int) -> threading.Thread:
    def produce():
        seed = first_seed
        while not stop.is_set():
            seed += 1
            purchases.produce(bootstrap, JOB.source_topic, list(purchases.generate(200, users=600, seed=seed)))
            time.sleep(1.0)

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    return thread


NOT_JSON = [b"not json", b"{broken", b"\xff\xfe"]


def _produce_raw(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, key=b"u00001", value=value)
    assert producer.flush(30) == 0


def _diagnosis(settings, standby: StandbyStatus | None) -> str:
    """What a failed assertion prints: the standby's status and the tails of the follower and driver logs."""
    logs = sorted(settings.data_dir.glob("*.log"), key=lambda p: p.stat().st_mtime)
    tails = "\n".join(f"--- {p.name} (tail)\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
    return f"standby status: {standby}\n{tails}"


def test_live_then_standby_then_live_again(private_stack, spark):
    settings = private_stack.replace(standby_commit_interval_s=2.0, standby_max_lag_s=15.0)
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, JOB.source_topic, JOB.source_partitions)
    purchases.produce(bootstrap, JOB.source_topic, list(purchases.generate(3000, users=400, seed=71)))
    _produce_raw(bootstrap, JOB.source_topic, NOT_JSON)  # dead letters (the reference computation skips them)
    follower = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.operations.standby", JOB.name, "--version", str(JOB.version)],
        env={**os.environ, **settings.to_env()},
        stdout=open(settings.data_dir / "follower.log", "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    driver = _start_driver(settings, "driver-1.log")
    client = TestClient(create_app(settings))

    def why() -> str:
        return _diagnosis(settings, read_standby_status(settings.status_dir, JOB.application_id))

    try:
        wait_for(
            lambda: current_state(settings.status_dir, JOB.application_id) == "RUNNING",
            300,
            "the job to run",
            diagnose=why,
        )
        wait_for(
            lambda: client.get(f"{BASE}/keys/u00001").json()["source"] == "live", 60, "the live view", diagnose=why
        )

        # Steady input for 20 s (longer than the standby's 15-s bound): answers are live, and the standby never falls
        # further behind than its bound.
        stop = threading.Event()
        producer = _steady_input(bootstrap, stop, 1000)
        lags, sources = [], set()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                standby = read_standby_status(settings.status_dir, JOB.application_id)
                lags.append(standby.lag_ms if standby else 0)
                answer = client.get(f"{BASE}/keys/u00001").json()
                sources.add((answer["source"], answer["fallback_reason"]))
                time.sleep(0.5)
        finally:
            stop.set()
            producer.join(30)
        standby = read_standby_status(settings.status_dir, JOB.application_id)
        assert standby.state == "FOLLOWING" and standby.stores["counts"].commits > 0, why()
        assert max(lags) <= standby.max_lag_ms == 15_000, f"lags {lags}\n{why()}"
        assert sources == {("live", None)}, f"sources {sources}\n{why()}"

        # Both processes serve Prometheus metrics on the port their status names; they agree with the status.
        app = (("application_id", JOB.application_id),)
        status = read_status(settings.status_dir, JOB.application_id)
        driver_metrics = scrape_metrics(settings.host, status.metrics_port)
        assert driver_metrics[("streamstate_job_state", (*app, ("state", "RUNNING")))] == 1
        assert driver_metrics[("streamstate_batch_id", app)] >= status.progress.batch_id > 0
        assert driver_metrics[("streamstate_state_rows", app)] > 0
        assert driver_metrics[("streamstate_batch_duration_seconds", app)] > 0
        lag_series = {labels for name, labels in driver_metrics if name == "streamstate_input_lag_records"}
        assert len(lag_series) == JOB.source_partitions
        assert (
            driver_metrics[("streamstate_dead_letter_records", app)]
            == sum(
                high - low
                for low, high in partition_offsets(
                    settings.kafka, JobLayout.of(JOB, settings).dead_letter_topic
                ).values()
            )
            >= len(NOT_JSON)
        )
        standby_metrics = scrape_metrics(settings.host, standby.metrics_port)
        store = (*app, ("store", "counts"))
        assert standby_metrics[("streamstate_standby_commits_total", store)] > 0
        assert ("streamstate_standby_lag_ms", store) in standby_metrics

        # Input stops: live answers equal the reference computation, key by key through the paged scan.
        expected = expected_purchase_counts(read_topic(bootstrap, JOB.source_topic))
        pages = _wait_for_answers(client, expected, "live", 120, "live answers to match the reference")
        live_batch = pages[-1]["batch_id"] % GENERATION_SPAN  # the changelog's batch id: Spark's, in this generation
        assert all(p["staleness_ms"] < 5_000 for p in pages) and len(pages) == -(-len(expected) // 150)
        one = client.get(f"{BASE}/keys/u00007").json()
        assert (one["found"], one["value"]["purchases"] if one["found"] else None) == (
            "u00007" in expected,
            expected["u00007"][0] if "u00007" in expected else None,
        )
        assert client.get(f"{BASE}/keys/no-such-user").json()["found"] is False

        # kill -9 mid-stream (input arriving again): the same queries answer from the standby, with no
        # error, and once it has everything the changelog holds its staleness is 0.
        stop = threading.Event()
        producer = _steady_input(bootstrap, stop, 2000)
        try:
            wait_for(
                lambda: read_status(settings.status_dir, JOB.application_id).progress.batch_id > live_batch + 1,
                120,
                "batches over the new input",
                diagnose=why,
            )
            kill_process_group(driver.pid)
            driver.wait(30)
        finally:
            stop.set()
            producer.join(30)
        assert read_status(settings.status_dir, JOB.application_id).state == "RUNNING"  # stale: it never said goodbye
        down = client.get(f"{BASE}/keys/u00007")
        assert down.status_code == 200 and down.json()["source"] == "standby"
        assert down.json()["fallback_reason"] == "job_not_running"
        changelog = read_changelog(bootstrap, changelog_topic_name(JOB.application_id, "counts"))
        pages = _wait_for_answers(
            client, decode_counts(changelog.state), "standby", 60, "the standby to hold the changelog"
        )
        assert {p["batch_id"] for p in pages} == {changelog.cut_batch_id} and {p["staleness_ms"] for p in pages} == {0}
        assert pages[0]["snapshot_version"] is not None and pages[0]["as_of"]

        # While a restarted driver really restores (its checkpoint set aside: it rebuilds from the snapshot
        # and the changelog, held in RESTORING by a failpoint), queries stay on the standby and say why.
        layout = JobLayout.of(JOB, settings)
        aside = layout.checkpoint.path.with_name(layout.checkpoint.name + ".aside")
        layout.checkpoint.path.rename(aside)
        before = client.get(f"{BASE}/keys/u00007").json()
        restoring = _start_driver(settings, "driver-restoring.log", {failpoints.ENV: "restoring:1"})
        try:
            wait_for(
                lambda: failpoints.read_marker(settings.status_dir, JOB.application_id) is not None,
                300,
                "the restarted driver to restore",
                diagnose=why,
            )
            restoring_status = read_status(settings.status_dir, JOB.application_id)
            assert restoring_status.state == "RESTORING"
            restoring_metrics = scrape_metrics(settings.host, restoring_status.metrics_port)
            assert restoring_metrics[("streamstate_job_state", (*app, ("state", "RESTORING")))] == 1
            assert ("streamstate_restore_records_read", (*app, ("store", "counts"))) in restoring_metrics
            during = client.get(f"{BASE}/keys/u00007").json()
            assert (during["source"], during["fallback_reason"]) == ("standby", "restoring")
            assert during["value"] == before["value"] and during["snapshot_version"] == before["snapshot_version"]
        finally:
            kill_process_group(restoring.pid)
            restoring.wait(30)
            failpoints.marker_path(settings.status_dir, JOB.application_id).unlink(missing_ok=True)
            shutil.rmtree(layout.checkpoint, ignore_errors=True)
            aside.rename(layout.checkpoint)

        # Restart from the checkpoint: back to live; state and output equal the reference over every event.
        driver = _start_driver(settings, "driver-2.log")
        wait_for(
            lambda: current_state(settings.status_dir, JOB.application_id) == "RUNNING",
            300,
            "the restarted job to run",
            diagnose=why,
        )
        expected = expected_purchase_counts(read_topic(bootstrap, JOB.source_topic))
        pages = _wait_for_answers(client, expected, "live", 120, "live answers after the restart")
        assert pages[0]["batch_id"] > changelog.cut_batch_id
        output = str(settings.lake / JOB.output_table_dir)
        wait_for(
            lambda: delta_purchase_counts(spark, output) == expected, 60, "the Delta output to equal the reference"
        )
    finally:
        for proc in (driver, follower):
            stop_process_group(proc, timeout_s=60)
        client.app.state.service.close()
    assert follower.returncode == 0, why()
    assert read_standby_status(settings.status_dir, JOB.application_id).state == "NOT_RUNNING"


def test_only_registered_stores_and_valid_keys_are_addressable(tmp_path):
    settings = Settings(data_dir=tmp_path)  # nothing ever ran here
    client = TestClient(create_app(settings))
    assert client.get("/jobs/no_such_job/stores/counts/keys/a").status_code == 404
    assert client.get(f"/jobs/{JOB.name}/stores/nope/keys/a").status_code == 404
    assert client.get(f"/jobs/{JOB.name}/stores/counts/keys/a", params={"version": 99}).status_code == 404
    assert client.get(f"{BASE}/keys/" + "x" * 300).status_code == 422
    assert client.get(f"{BASE}/keys/a%07b").status_code == 422  # a control character
    assert client.get(f"{BASE}/keys", params={"page_size": settings.state_api_max_page_size + 1}).status_code == 422
    assert client.get(f"{BASE}/keys", params={"page_token": "%%%"}).status_code == 422
    heart = "/jobs/patient_heart_rate/stores/pulse-counts/keys/p1"
    assert client.get(heart).status_code == 422  # a windowed store needs the window
    assert client.get(heart, params={"window_start": 61_000}).status_code == 422  # not a window start
    answer = client.get(heart, params={"window_start": 60_000}).json()
    assert answer["key"] == {"patient_id": "p1", "window_start": 60_000} and answer["found"] is False
    # nothing ever ran here: an answer with provenance, not an error
    assert (answer["source"], answer["fallback_reason"], answer["job_state"]) == (
        "standby",
        "job_not_running",
        "NEVER_RAN",
    )
    spec = client.get("/openapi.json").json()
    assert {
        "/jobs",
        "/jobs/{job}/stores/{store}",
        "/jobs/{job}/stores/{store}/keys",
        "/jobs/{job}/stores/{store}/keys/{key}",
    } <= set(spec["paths"])


def test_token_authentication_when_configured(tmp_path):
    client = TestClient(create_app(Settings(data_dir=tmp_path, state_api_token="s3cret-token")))
    assert client.get("/jobs").status_code == 401
    assert client.get("/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    answer = client.get("/jobs", headers={"Authorization": "Bearer s3cret-token"})
    assert answer.status_code == 200 and "s3cret-token" not in answer.text
    assert {j["job"] for j in answer.json()["jobs"]} >= {"purchase_counts", "patient_heart_rate", "vote_counts"}
    assert (
        json.dumps(client.get("/openapi.json", headers={"Authorization": "Bearer s3cret-token"}).json()).count(
            "HTTPBearer"
        )
        >= 1
    )


def test_a_live_view_that_is_not_ready_in_time_falls_back_to_the_standby(tmp_path):
    from runtime.process import free_port

    # The job holds its lease and says RUNNING, but the live view cannot load (no broker answers).
    settings = Settings(data_dir=tmp_path, kafka_port=free_port(), state_api_timeout_s=0.2, state_api_first_load_s=0.3)
    lease = JobLease(settings.status_dir, JOB.application_id)
    epoch = lease.acquire()
    client = TestClient(create_app(settings))
    try:
        status = JobStatus(JOB.application_id, status_path(settings.status_dir, JOB.application_id), lease_epoch=epoch)
        status.transition_to(JobState.RUNNING)
        started = time.monotonic()
        answer = client.get(f"{BASE}/keys/u00001")
        assert time.monotonic() - started < 5  # bounded by the query timeout, not the broker's
        assert answer.status_code == 200
        assert (answer.json()["source"], answer.json()["fallback_reason"], answer.json()["job_state"]) == (
            "standby",
            "timeout",
            "RUNNING",
        )
    finally:
        lease.release()
        client.app.state.service.close()


def test_a_versioned_key_is_read_as_of_an_event_time(settings, kafka_broker, tmp_path):
    """``valid_at``: the version of vote_counts' voter valid at a time, from the stored history (the
    standby snapshot answers here: the job never ran); refused for a store that keeps no versions."""
    from spark_jobs.primitives.versioned import version_valid_at
    from spark_jobs.state.snapshots import SnapshotStore

    # A lake of its own on the suite's broker (without a broker, each standby answer waits out the Kafka
    # client's timeouts while it measures the snapshot's staleness).
    settings = settings.replace(data_dir=tmp_path)
    votes = get_job("vote_counts")

    def version(candidate: str, at: str, event_id: str) -> dict:  # the time first, as the store keeps it
        return {"voted_at": at, "candidate": candidate, "event_id": event_id}

    history = [
        version("red", "2026-11-01T09:00:00.000Z", "e-1"),
        version("blue", "2026-11-01T09:05:00.000Z", "e-2"),
        version("green", "2026-11-01T09:05:00.000Z", "e-3"),
    ]  # a tie in time: the larger id is later
    value = {"candidate": "green", "voted_at": "2026-11-01T09:05:00.000Z", "event_id": "e-3", "history": history}
    SnapshotStore.of(JobLayout.of(votes, settings), "latest-votes").write(
        {b"voter5": json.dumps(value).encode()}, 0, {votes.source_topic: {0: 3}}, {0: 3}
    )
    nine = 1793523600000  # 2026-11-01T09:00:00Z
    assert version_valid_at(value, nine - 1) is None
    assert version_valid_at(value, nine) == history[0] and version_valid_at(value, nine + 299_999) == history[0]
    assert version_valid_at(value, nine + 300_000) == history[2]

    client = TestClient(create_app(settings))
    try:
        path = f"/jobs/{votes.name}/stores/latest-votes/keys/voter5"
        assert client.get(path).json()["value"] == value
        answer = client.get(path, params={"valid_at": nine + 60_000}).json()
        assert (answer["found"], answer["value"], answer["source"]) == (True, history[0], "standby")
        assert client.get(path, params={"valid_at": nine - 1}).json()["found"] is False  # before any version
        refused = client.get(f"{BASE}/keys/u1", params={"valid_at": nine})
        assert refused.status_code == 422 and "valid_at applies to versioned stores only" in refused.text
    finally:
        client.app.state.service.close()


def test_while_kafka_is_down_the_standby_answers_at_once(tmp_path):
    """A snapshot to answer from, no broker: the first answer waits at most the query timeout for Kafka
    (to measure the snapshot's staleness), the next ones do not wait for it at all."""
    from runtime.process import free_port
    from spark_jobs.state.snapshots import SnapshotStore

    settings = Settings(data_dir=tmp_path, kafka_port=free_port(), state_api_timeout_s=0.5)
    SnapshotStore.of(JobLayout.of(JOB, settings), "counts").write(
        {b"u1": b'{"purchases": 2}'}, 0, {JOB.source_topic: {0: 2}}, {0: 2}
    )
    client = TestClient(create_app(settings))
    try:
        for _ in range(3):
            started = time.monotonic()
            answer = client.get(f"{BASE}/keys/u1").json()
            assert time.monotonic() - started < 5, "waited out the Kafka client's timeouts"
            assert (answer["source"], answer["value"]) == ("standby", {"purchases": 2})
            assert answer["staleness_ms"] is not None  # an upper bound: the snapshot's age
    finally:
        client.app.state.service.close()
