"""The job lifecycle state machine and its published status (pure logic)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from spark_jobs.documents import from_json, to_json
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import (
    FOLLOWER_LIFECYCLE,
    BatchProgress,
    FollowerState,
    IllegalTransition,
    JobState,
    JobStatus,
    PublishedStatus,
    SnapshotTaken,
    SpareState,
    SpareStatus,
    StandbyStatus,
    StandbyStoreView,
    StoreRestore,
    observe_driver,
    observe_spare,
    observe_standby,
    read_standby_status,
    read_status,
    write_spare_status,
    write_standby_status,
)
from spark_jobs.state.fencing import describe_batch

PROGRESS = {
    "name": "app-v1",
    "batchId": 4,
    "numInputRows": 120,
    "inputRowsPerSecond": 60.0,
    "processedRowsPerSecond": 400.0,
    "timestamp": "2026-11-22T03:00:00.000Z",
    "durationMs": {"triggerExecution": 850},
    "stateOperators": [
        {
            "numRowsTotal": 300,
            "memoryUsedBytes": 4096,
            "customMetrics": {"rocksdbBytesCopied": 10, "rocksdbCommitFlushLatency": 3},
        }
    ],
    "sources": [{"endOffset": {"t": {"0": 100, "1": 50}}, "latestOffset": {"t": {"0": 130, "1": 50}}}],
}


def test_a_normal_run_moves_through_legal_states_and_publishes_them(tmp_path):
    seen = []
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json", listeners=[lambda a, b: seen.append((a, b))])
    assert read_status(tmp_path, "app-v1").state is JobState.CREATED
    for state in (JobState.RESTORING, JobState.RUNNING, JobState.PENDING_SHUTDOWN, JobState.NOT_RUNNING):
        status.transition_to(state)
        assert read_status(tmp_path, "app-v1").state is state
    assert seen[0] == (JobState.CREATED, JobState.RESTORING) and len(seen) == 4


@pytest.mark.parametrize(
    ("start", "illegal"),
    [
        (JobState.NOT_RUNNING, JobState.RUNNING),
        (JobState.RUNNING, JobState.RESTORING),
        (JobState.CREATED, JobState.NOT_RUNNING),
    ],
)
def test_illegal_moves_raise_and_name_the_job(tmp_path, start, illegal):
    status = JobStatus("app-v1", tmp_path / "s.json")
    legal_path = {
        JobState.CREATED: [],
        JobState.RUNNING: [JobState.RUNNING],
        JobState.NOT_RUNNING: [JobState.RUNNING, JobState.PENDING_SHUTDOWN, JobState.NOT_RUNNING],
    }
    for state in legal_path[start]:
        status.transition_to(state)
    with pytest.raises(IllegalTransition, match=rf"app-v1: illegal lifecycle move {start.value} -> {illegal.value}"):
        status.transition_to(illegal)


def test_errors_are_published_with_their_message(tmp_path):
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json")
    status.transition_to(JobState.RUNNING)
    status.transition_to(JobState.ERROR, error="StreamingQueryException: boom")
    published = read_status(tmp_path, "app-v1")
    assert published.state is JobState.ERROR and published.error == "StreamingQueryException: boom"


def test_the_standby_has_its_own_states_through_the_same_guard(tmp_path):
    FOLLOWER_LIFECYCLE.check("app-v1.standby", FollowerState.FOLLOWING, FollowerState.CATCHING_UP)
    with pytest.raises(IllegalTransition, match="app-v1.standby: illegal standby move ERROR -> FOLLOWING"):
        FOLLOWER_LIFECYCLE.check("app-v1.standby", FollowerState.ERROR, FollowerState.FOLLOWING)
    published = StandbyStatus(
        "app-v1", FollowerState.FOLLOWING, lease_epoch=2, stores={"counts": StandbyStoreView("t", lag_ms=5)}
    )
    write_standby_status(tmp_path, published)
    assert read_standby_status(tmp_path, "app-v1") == published
    assert read_standby_status(tmp_path, "app-v2") is None


def test_batch_progress_has_lag_per_partition_and_state_numbers(tmp_path):
    summary = BatchProgress.of(PROGRESS)
    assert summary.input_lag == {"t-0": 30, "t-1": 0} and summary.total_lag == 30
    assert summary.state_rows == 300 and summary.state_memory_bytes == 4096
    assert summary.batch_id == 4 and summary.batch_duration_ms == 850
    assert summary.phase_ms == PROGRESS["durationMs"]
    assert summary.rocksdb == {"rocksdbBytesCopied": 10, "rocksdbCommitFlushLatency": 3}
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json")
    status.record_progress(json.loads(json.dumps(PROGRESS)))
    assert read_status(tmp_path, "app-v1").progress == summary
    status.record_progress(PROGRESS, {"state": 400, "outputs": 300})  # the batch function's phases beside Spark's
    assert read_status(tmp_path, "app-v1").progress.sink_phase_ms == {"state": 400, "outputs": 300}


def test_a_rekeyed_jobs_input_lag_counts_its_rekeying_stage_too(tmp_path):
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json")
    assert status.document().input_lag_records is None
    rekeying = {"sources": [{"endOffset": {"src": {"0": 5, "1": 9}}, "latestOffset": {"src": {"0": 12, "1": 9}}}]}
    status.record_rekeying_progress(rekeying)
    assert read_status(tmp_path, "app-v1").input_lag_records == 7
    status.record_progress(PROGRESS)  # the stateful stage: 30 behind in its own input
    published = read_status(tmp_path, "app-v1")
    assert published.input_lag == {"t-0": 30, "t-1": 0, "src-0": 7, "src-1": 0}
    assert published.input_lag_records == 37 and published.progress.total_lag == 30


def test_the_published_status_reads_back_as_written(tmp_path):
    """The typed contract between the driver and Airflow: what one writes, the other reads, field for field."""
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json", lease_epoch=3, metrics_port=9100)
    status.record_progress(PROGRESS)
    status.record_restore_progress("counts", started_at="2026-11-22T03:00:00", topic="cl", records_read=7)
    status.record_restore_progress("counts", seconds=1.5, keys=3, input_offsets={"t": {0: 100}})
    status.record_snapshot("counts", SnapshotTaken(batch_id=4, taken_at="2026-11-22T03:00:01", rows=3))
    status.record_dead_letters({"late": 2})
    written = status.document()
    read = read_status(tmp_path, "app-v1")
    assert read == dataclasses.replace(written, updated_at=read.updated_at)
    assert read.restore["counts"] == StoreRestore(
        topic="cl", started_at="2026-11-22T03:00:00", records_read=7, seconds=1.5, keys=3, input_offsets={"t": {0: 100}}
    )
    with pytest.raises(TypeError):  # a misspelt restore number is refused, not published under a new name
        status.record_restore_progress("counts", record_read=1)


def test_documents_from_another_version_still_read():
    """A status file written by an older driver lacks fields; a newer one has fields this reader does not know."""
    old = from_json(PublishedStatus, {"application_id": "a", "state": "RUNNING", "progress": {"batch_id": 3}})
    assert old.state is JobState.RUNNING and old.batch_id == 3 and old.dead_letters == {}
    newer = from_json(PublishedStatus, {**to_json(old), "a_field_from_the_future": 1})
    assert newer == old


@pytest.mark.integration
def test_a_dead_drivers_last_state_is_never_shown_as_current(tmp_path):
    """One liveness rule: a status is current only while the driver that published it holds the lease."""
    assert observe_driver(tmp_path, "app-v1").summary() == "NEVER_RAN"
    lease = JobLease(tmp_path, "app-v1")
    epoch = lease.acquire()
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json", lease_epoch=epoch)
    status.transition_to(JobState.RUNNING)
    status.record_progress({"batchId": 1, "numInputRows": 5})
    live = observe_driver(tmp_path, "app-v1")
    assert live.alive and live.state == "RUNNING" and live.summary() == "RUNNING at batch 1"
    lease.release()  # what the kernel does when the driver dies (kill -9 included)
    dead = observe_driver(tmp_path, "app-v1")
    assert not dead.alive and dead.state == "NOT_RUNNING"
    assert dead.summary().startswith("DOWN since ") and dead.summary().endswith(", last RUNNING at batch 1")
    JobLease(tmp_path, "app-v1").acquire()  # a new driver, not published yet: the old status is not its own
    assert observe_driver(tmp_path, "app-v1").summary().startswith("STARTING")


def test_a_spares_and_a_standbys_status_is_current_by_the_same_rule_as_a_drivers(tmp_path):
    """A spare's or a standby's last status is shown only while the process that published it holds its own lease:
    not after it died, not when a newer incarnation holds the lease and has not published yet."""
    for name, write, observe in (
        (
            "app-v1.spare",
            lambda epoch: write_spare_status(tmp_path, SpareStatus("app-v1", SpareState.READY, lease_epoch=epoch)),
            observe_spare,
        ),
        (
            "app-v1.standby",
            lambda epoch: write_standby_status(
                tmp_path, StandbyStatus("app-v1", FollowerState.FOLLOWING, lease_epoch=epoch)
            ),
            observe_standby,
        ),
    ):
        assert observe(tmp_path, "app-v1").live_status is None  # never ran
        lease = JobLease(tmp_path, name)
        write(lease.acquire())
        assert observe(tmp_path, "app-v1").alive
        lease.release()  # died
        assert observe(tmp_path, "app-v1").live_status is None and observe(tmp_path, "app-v1").status is not None
        JobLease(tmp_path, name).acquire()  # the next one, not published yet
        assert not observe(tmp_path, "app-v1").alive, name


def test_batch_ids_are_shown_as_users_count_them():
    assert describe_batch(2_000_000_034) == "34 (generation 2)"
    assert describe_batch(7) == "7" and describe_batch(None) == "-"


def test_a_real_run_publishes_its_progress_numbers(spark, kafka_broker, settings, unique):
    """What supervision and the jobs page read: the driver's own progress in the status file."""
    import dataclasses

    from spark_jobs.driver.run import run
    from spark_jobs.io.kafka_topics import ensure_topic
    from spark_jobs.reference.generators import purchases
    from spark_jobs.registry import get_job

    job = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"progress_{unique}",
        source_topic=f"progress-{unique}",
        output_table=f"progress_{unique}",
    )
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    purchases.produce(
        settings.kafka_bootstrap_servers, job.source_topic, list(purchases.generate(500, users=50, seed=3))
    )
    run(job, settings, available_now=True, spark=spark)
    status = read_status(settings.status_dir, job.application_id)
    assert status.state is JobState.NOT_RUNNING
    assert status.progress.batch_id is not None and status.progress.state_rows == 50
    assert status.progress.total_lag == 0
    # where addBatch went, the batch function's phases of that same batch
    assert {"state", "outputs", "changelog"} <= set(status.progress.sink_phase_ms)
    assert sum(status.progress.sink_phase_ms.values()) <= status.progress.phase_ms["addBatch"] + 5  # ms rounded
    assert status.spark_ui and status.spark_ui.startswith("http")


def test_a_status_field_set_from_outside_is_refused_not_left_out_of_the_document(tmp_path):
    status = JobStatus("app-v1", tmp_path / "app-v1.status.json", started_at="2026-12-07T00:00:00+00:00")
    assert read_status(tmp_path, "app-v1").started_at == "2026-12-07T00:00:00+00:00"
    with pytest.raises(AttributeError):
        status.started_at = "2026-12-08T00:00:00+00:00"
