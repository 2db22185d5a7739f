"""The warm standby MERGEs the changelog into the snapshot a driver wrote, and restores use it
(real Kafka, Spark, Delta)."""

from __future__ import annotations

import dataclasses
import shutil
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from spark_jobs.driver.context import JobContext
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.operations.standby.follower import StoreFollower, standby_id
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.state.snapshotting import take_snapshot
from tests.helpers import expected_purchase_counts

pytestmark = pytest.mark.integration


def _follow_to_head(follower: StoreFollower, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        follower.step(0.5)
        if follower.at_head and follower.pending_batch is not None:
            return
    raise AssertionError(f"follower not at the changelog head after {timeout_s}s: {follower.view()}")


def _table_state(path: str) -> dict[bytes, bytes]:
    """The state a snapshot table holds, read without SnapshotStore: the base rows (no layer), then each
    layer's rows in batch order (a null value deletes)."""
    rows = pa.table(DeltaTable(path).scan(columns=["key", "value", "layer"])).to_pylist()
    state: dict[bytes, bytes] = {}
    for row in sorted(rows, key=lambda r: -1 if r["layer"] is None else r["layer"]):
        if row["value"] is None:
            state.pop(row["key"].encode(), None)
        else:
            state[row["key"].encode()] = row["value"].encode()
    return state


def test_standby_follows_the_changelog_and_shortens_restores(spark, kafka_broker, settings, unique):
    job = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"standby_{unique}",
        source_topic=f"standby-{unique}",
        output_table=f"standby_{unique}",
    )
    ctx = JobContext(spark, job, settings)
    bootstrap = settings.kafka_bootstrap_servers
    changelog = ctx.stores.handle("counts").changelog.name
    snapshots = ctx.stores.handle("counts").snapshots
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    first, second, third = (
        list(purchases.generate(n, users=u, seed=s)) for n, u, s in ((2000, 300, 41), (1500, 500, 42), (700, 600, 43))
    )

    purchases.produce(bootstrap, job.source_topic, first)
    run(job, settings, available_now=True, spark=spark)
    driver_snapshot = take_snapshot(snapshots, bootstrap, changelog)  # written by Spark
    assert driver_snapshot.writer == "driver"

    purchases.produce(bootstrap, job.source_topic, second)
    run(job, settings, available_now=True, spark=spark)

    # The follower starts from the driver's snapshot, reads only the tail and appends it as a layer (delta-rs).
    follower = StoreFollower(job, "counts", settings)
    try:
        assert follower.snapshot == driver_snapshot
        _follow_to_head(follower)
        assert follower.lag_ms() >= 0 and follower.lag_records == 0
        standby = follower.commit()
    finally:
        follower.close()
    full = read_changelog(bootstrap, changelog)
    assert standby.writer == "standby" and standby.delta_version > driver_snapshot.delta_version
    assert standby.batch_id == full.cut_batch_id and standby.changelog_offsets == full.resume_offsets
    assert snapshots.count(standby) == len(expected_purchase_counts(first + second)) == len(full.state)
    assert _table_state(snapshots.path) == full.state  # the layer (or its fold) applied updates and deletes exactly
    assert snapshots.latest() == standby  # the driver's reader sees the standby's commit as a snapshot
    assert standby.as_of_ms > 0

    # While a follower holds its lease the driver writes no snapshot of its own (one writer per table).
    lease = JobLease(settings.status_dir, standby_id(job.application_id))
    lease.acquire()
    try:
        assert ctx.stores.snapshot_if_due("counts", 0) is None
    finally:
        lease.release()

    # Checkpoint lost: the restore starts from the standby's snapshot, so it replays nothing already in it.
    shutil.rmtree(ctx.layout.checkpoint)
    purchases.produce(bootstrap, job.source_topic, third)
    report = run(job, settings, available_now=True, spark=spark)
    restore = report.restores["counts"]
    assert restore.snapshot_version == standby.delta_version and restore.changelog_records_read == 0
    after = read_changelog(bootstrap, changelog)
    assert {k: v for k, v in after.state.items()} and len(after.state) == len(
        expected_purchase_counts(first + second + third)
    )
