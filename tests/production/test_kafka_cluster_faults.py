"""The main job on three brokers (replication factor 3, ``min.insync.replicas=2``) while brokers fail under it.

One supervised-style driver (spark-submit, running on, not draining) of ``purchase_counts`` with an output topic
(``published_counts``: tests/fixtures/repartition_jobs.py),
on adversarial input (duplicates, closes, invalid records for the dead letters). Four faults, one after another,
each while the job is in the middle of a micro-batch (the driver held at a failpoint, paused with SIGSTOP, while
the fault is injected) or simply running:

1. kill -9 of the leader of a source partition;
2. kill -9 of the leader of a changelog partition, before the batch's transaction writes to it;
3. kill -9 of the transaction coordinator of the driver's ``transactional.id`` (its markers' producer);
4. SIGSTOP of a broker for longer than the controllers' session timeout (9 s), then SIGCONT.

Between faults the lost broker comes back and catches up, so each fault meets three in-sync replicas. The job
keeps running through all of it (no restart), and at the end its Delta outputs, its changelog, its output topic and
its dead letters equal the reference over every event: nothing lost, nothing twice. The time from each fault to
the job's next committed batch is reported at the end of the run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import time
from decimal import Decimal
from pathlib import Path

import pytest
from streamstate.hooks.streaming_job import StreamingJobHook

from bench.answers import latest_per_key
from runtime.process import stop_process_group
from runtime.settings import PROJECT_ROOT
from spark_jobs.driver import failpoints
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import registered_versions
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.versions import read_rows
from tests.conftest import RECOVERY_PROPERTY, stack_settings
from tests.helpers import every_record, wait_for
from tests.spark_jobs.test_dead_letter import read_with_headers
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.production]

#: longer than ``broker.session.timeout.ms`` (9 s): the controllers fence the paused broker and move its leaders
PAUSE_S = 15


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except FileNotFoundError:
        return False


class RunningDriver:
    """The job's driver as supervision runs it (spark-submit, not draining), held at ``before_outputs`` the given
    times: each time it writes its failpoint file and stops itself (SIGSTOP) until :meth:`resume`."""

    def __init__(self, spec, settings, pauses: list[int], log: Path) -> None:
        self.spec, self.settings = spec, settings
        submit = submit_spec(spec, settings)
        armed = ",".join(f"before_outputs:{n}:pause" for n in pauses)
        env = {**os.environ, **submit.env, failpoints.ENV: armed, "PYTHONPATH": str(PROJECT_ROOT)}
        self.log = open(log, "w")
        self.process = subprocess.Popen(
            submit.command(), env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _alive(self):
        assert self.process.poll() is None, f"the driver exited ({self.process.returncode}); see {self.log.name}"
        return True

    def wait_paused(self, nth: int) -> int:
        """Wait until the driver holds its ``nth`` pause; returns the last batch it had committed."""

        def paused():
            self._alive()
            marker = failpoints.read_marker(self.settings.status_dir, self.spec.application_id)
            return marker if marker and marker["time"] == nth and _stopped(marker["pid"]) else None

        wait_for(paused, 300, f"the driver's pause {nth} in a micro-batch")
        return self.last_batch()

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def last_batch(self) -> int:
        status = read_status(self.settings.status_dir, self.spec.application_id)
        return status.batch_id if status and status.batch_id is not None else -1

    def wait_batch_after(self, batch: int, since: float, timeout_s: float = 300) -> float:
        """Seconds from ``since`` until a batch after ``batch`` is committed (the job recovered)."""
        wait_for(lambda: self._alive() and self.last_batch() > batch, timeout_s, f"a batch after {batch}")
        return time.monotonic() - since

    def stop(self) -> int | None:
        """Stop it as the stop operator does (SIGTERM to the driver: its queries stop cleanly); its exit code."""
        try:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGCONT)
                StreamingJobHook(self.spec, self.settings).stop()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(120)
            return stop_process_group(self.process, 30)
        finally:
            self.log.close()


def test_the_main_job_keeps_running_through_broker_faults_and_loses_and_doubles_nothing(
    kafka_cluster, tmp_path, record_property
):
    cluster = kafka_cluster
    settings = cluster.client_settings(
        stack_settings(tmp_path / "stack", job_modules="tests.fixtures.repartition_jobs")
    )
    spec = registered_versions(settings.job_modules)["published_counts"][1]  # purchase_counts with an output topic
    layout = JobLayout.of(spec, settings)
    changelog = changelog_topic_name(spec.application_id, "counts")
    # the source is the user's topic: created as a user creates it on this cluster
    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions, 3, {"min.insync.replicas": "2"})
    chunks = [list(purchases.adversarial(150, users=20, seed=seed)) for seed in range(301, 306)]
    events: list[dict] = []

    def produce(chunk: list[dict]) -> None:
        purchases.produce(settings.kafka, spec.source_topic, chunk)
        events.extend(chunk)

    def heal(node: int) -> None:
        """The lost broker back, every partition's replicas in sync again (the next fault meets three)."""
        cluster.restart(node)
        wait_for(cluster.fully_replicated, 180, f"node {node} caught up")

    def recovered(fault: str, seconds: float) -> None:
        record_property(RECOVERY_PROPERTY + fault, round(seconds, 1))

    produce(chunks[0])
    driver = RunningDriver(spec, settings, [1, 2, 3], tmp_path / "driver.log")
    try:
        # 1. the leader of source partition 0, while a batch that read it is held
        batch = driver.wait_paused(1)
        node = cluster.leader_of(spec.source_topic, 0)
        cluster.kill(node)
        started = time.monotonic()
        driver.resume()
        produce(chunks[1])  # read from the partition's new leader
        recovered("kill -9 of a source partition's leader", driver.wait_batch_after(batch, started))
        heal(node)

        # 2. the leader of changelog partition 0, before the held batch's transaction writes to it
        batch = driver.wait_paused(2)
        node = cluster.leader_of(changelog, 0)
        cluster.kill(node)
        started = time.monotonic()
        driver.resume()
        recovered("kill -9 of a changelog partition's leader", driver.wait_batch_after(batch, started))
        produce(chunks[2])
        heal(node)

        # 3. the coordinator of the markers' transactions, with the held batch's transaction about to begin
        batch = driver.wait_paused(3)
        node = cluster.transaction_coordinator(layout.transactional_id)
        cluster.kill(node)
        started = time.monotonic()
        driver.resume()
        recovered("kill -9 of the markers' transaction coordinator", driver.wait_batch_after(batch, started))
        heal(node)

        # 4. a broker leading an output-topic partition stops answering for longer than its session, then wakes
        batch = driver.last_batch()
        node = cluster.leader_of(layout.output_topic, 0)
        cluster.pause(node)
        started = time.monotonic()
        try:
            produce(chunks[3])
            time.sleep(PAUSE_S)
        finally:
            cluster.resume(node)
        recovered(f"SIGSTOP of a broker for {PAUSE_S} s", driver.wait_batch_after(batch, started))
        wait_for(cluster.fully_replicated, 180, f"node {node} caught up after its pause")
        produce(chunks[4])

        want = purchases.expected_counts(e for e in events if purchases.is_valid(e))
        wait_for(lambda: driver._alive() and _published(settings, layout) == want, 300, "the job caught up")
    finally:
        exit_code = driver.stop()
    assert exit_code == 0, f"the driver did not stop cleanly; see {tmp_path / 'driver.log'}"

    # the outputs, the changelog and the output topic equal the reference over every event
    assert {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in read_rows(layout.output_table)} == want
    assert decode_counts(read_changelog(settings.kafka, changelog).state) == want
    assert _published(settings, layout) == want
    # ... each batch's result of a key published once: a user's count grows with every batch that changes it, so
    # the same row twice in a row is a batch published again (two tombstones in a row are not: a batch that ends
    # with the user closed publishes its delete, whether or not an earlier batch closed it already)
    by_key: dict[str, list] = {}
    for _, key, value in every_record(settings.kafka, layout.output_topic):
        by_key.setdefault(key, []).append(value)
    repeated = {
        key: [a for a, b in itertools.pairwise(values) if a == b and a is not None] for key, values in by_key.items()
    }
    assert not {key: rows for key, rows in repeated.items() if rows}, f"published twice: {repeated}"
    # every invalid event dead-lettered once, naming its place in the source
    letters = read_with_headers(settings.kafka_bootstrap_servers, layout.dead_letter_topic)
    places = [(d["headers"]["source.partition"], d["headers"]["source.offset"]) for d in letters]
    assert len(places) == len(set(places)), "a dead letter written twice"
    assert len(letters) == sum(not purchases.is_valid(e) for e in events)
    assert any(e.get("type") == "account_closed" for e in events) and len(want) > 5


def _published(settings, layout) -> dict[str, tuple[int, Decimal]]:
    """The latest result per user in the version's output topic (a closed account's tombstone removes it)."""
    rows = {user: json.loads(value) for user, value in latest_per_key(settings.kafka, layout.output_topic).items()}
    return {user: (row["purchases"], Decimal(str(row["amount_spent"]))) for user, row in rows.items()}
