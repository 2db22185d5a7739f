"""The broker stops and comes back while the readers of a changelog run: the warm standby
(spark_jobs/operations/standby) and the state API's live view wait it out and carry on, nothing lost.

Both follow the changelog with a librdkafka consumer; a broker restart reaches them as transport
errors, timed-out watermark requests and metadata timeouts. Giving up on those would take the standby
down (and its lease with it) every time the broker blinks.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from streamstate.state_api.views import LiveView

from runtime.kafka_broker import LocalKafkaBroker
from spark_jobs.driver.lifecycle import read_standby_status
from spark_jobs.operations.standby.follower import SnapshotFollower
from spark_jobs.registry import get_job
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
from spark_jobs.state.snapshots import SnapshotStore, latest_snapshot, snapshot_path
from tests.conftest import stack_settings
from tests.helpers import wait_for, write_changelog_batch

pytestmark = [pytest.mark.integration, pytest.mark.faults]


def test_standby_and_live_view_survive_a_broker_restart(tmp_path):
    settings = stack_settings(tmp_path / "stack", standby_commit_interval_s=1.0, standby_max_lag_s=60.0)
    broker = LocalKafkaBroker(settings)
    broker.start()
    bootstrap = settings.kafka_bootstrap_servers
    job = dataclasses.replace(get_job("purchase_counts"), name="broker_restart", source_topic="broker-restart-in")
    topic = ChangelogTopic(job.application_id, "counts", partitions=2)
    topic.ensure(bootstrap)
    writer = ChangelogWriter(topic, bootstrap)
    follower = SnapshotFollower(job, settings)
    running = threading.Thread(target=follower.run, daemon=True)
    path = str(snapshot_path(settings.lake, job.application_id, "counts"))
    view = None
    try:
        write_changelog_batch(writer, 0, {b"a": b"1", b"b": b"1"})
        running.start()
        wait_for(lambda: latest_snapshot(path), 60, "the standby's first snapshot")
        view = LiveView(SnapshotStore(path, job.application_id, "counts"), bootstrap, topic.name, poll_s=0.1)
        assert view.wait_ready(30) and view.table.state == {"a": "1", "b": "1"}

        broker.stop()
        time.sleep(8)  # both readers meet transport errors and timed-out requests
        assert running.is_alive(), "the standby gave up while the broker was down"
        assert view.alive and view.error is None and view.table.get("a") == "1"  # still answering

        broker.start()
        write_changelog_batch(writer, 1, {b"a": b"2", b"b": None, b"c": b"1"})
        wait_for(lambda: view.batch_id == 1, 90, "the live view to apply the batch written after the restart")
        assert view.table.state == {"a": "2", "c": "1"} and view.error is None
        wait_for(lambda: latest_snapshot(path).batch_id == 1, 90, "the standby to commit the batch after the restart")
        status = read_standby_status(settings.status_dir, job.application_id)
        assert status.state == "FOLLOWING" and status.error is None, status
    finally:
        follower.stop_requested.set()
        if running.ident is not None:
            running.join(60)
        if view is not None:
            view.stop(5)
        writer.close()
        broker.stop()
    assert not running.is_alive()
    assert read_standby_status(settings.status_dir, job.application_id).state == "NOT_RUNNING"
