"""Checkpoint lost -> rebuilt from the latest Delta snapshot + the changelog tail, nothing lost or
counted twice, and the restore read only the tail (real Kafka, Spark, Delta)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from spark_jobs.driver.context import JobContext
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state import snapshotting
from spark_jobs.state.changelog_reader import read_changelog
from spark_jobs.state.fencing import GENERATION_SPAN
from spark_jobs.state.restore import restore_from_snapshot
from spark_jobs.state.restore_history import restore_measurements
from spark_jobs.state.snapshotting import take_snapshot
from tests.helpers import delta_purchase_counts, end_offsets, expected_purchase_counts
from tests.spark_jobs.test_purchase_counts import decode_counts

pytestmark = pytest.mark.integration


def _state(restored) -> dict[bytes, bytes]:
    """A restore's state, collected from Spark when it was restored there."""
    if restored.frame is None:
        return restored.state
    return {row.key.encode(): row.value.encode() for row in restored.frame.collect()}


def _plan(frame) -> str:
    return frame._jdf.queryExecution().executedPlan().toString()


@pytest.mark.parametrize("restore_in", ["driver", "spark"])
def test_rebuild_from_snapshot_and_tail(spark, kafka_broker, settings, unique, restore_in, monkeypatch):
    in_spark = restore_in == "spark"
    settings = settings.replace(restore_in_spark_min_records=0 if in_spark else 10**12)
    if in_spark:  # every tail is long: layers are read and written by Spark's executors too
        monkeypatch.setattr(snapshotting, "LAYER_IN_DRIVER_MAX_RECORDS", 0)
    job = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"restore_{unique}",
        source_topic=f"restore-{unique}",
        output_table=f"restore_{unique}",
    )
    ctx = JobContext(spark, job, settings)
    bootstrap = settings.kafka_bootstrap_servers
    changelog = ctx.stores.handle("counts").changelog.name
    snapshots = ctx.stores.handle("counts").snapshots
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    batches = [
        list(purchases.generate(n, users=users, seed=seed))
        for n, users, seed in ((3000, 400, 31), (1000, 600, 32), (500, 700, 33))
    ]

    purchases.produce(bootstrap, job.source_topic, batches[0])
    run(job, settings, available_now=True, spark=spark)
    on = {"spark": spark} if in_spark else {}  # snapshots and restores by Spark's executors
    first = take_snapshot(snapshots, bootstrap, changelog, **on)
    assert first is not None and first.batch_id == GENERATION_SPAN  # the first driver's first batch
    assert first.rows == len(expected_purchase_counts(batches[0]))
    assert first.input_offsets == {job.source_topic: end_offsets(bootstrap, job.source_topic)}
    assert take_snapshot(snapshots, bootstrap, changelog, **on) == first  # nothing new: no new snapshot

    purchases.produce(bootstrap, job.source_topic, batches[1])
    run(job, settings, available_now=True, spark=spark)
    tail_records = sum(
        end_offsets(bootstrap, changelog)[p] - first.changelog_offsets[p] for p in first.changelog_offsets
    )
    # what the Python reader counts: the records delivered (a transaction's commit marker takes an offset too)
    tail_delivered = read_changelog(bootstrap, changelog, first.changelog_offsets).records_read

    # Lose the checkpoint, then more input arrives.
    shutil.rmtree(ctx.layout.checkpoint)
    purchases.produce(bootstrap, job.source_topic, batches[2])
    report = run(job, settings, available_now=True, spark=spark)

    restore = report.restores["counts"]
    assert restore.full_replay is False and restore.snapshot_batch_id == GENERATION_SPAN
    assert restore.in_spark is in_spark and (restore.keys is None) is in_spark
    # only the tail, not the whole changelog (Spark counts offsets, the Python reader records)
    assert restore.changelog_records_read == (tail_records if in_spark else tail_delivered)
    # the restore recorded its own throughput (restore-time estimates use this deployment's numbers)
    recorded = [m for m in restore_measurements(settings) if m["application_id"] == job.application_id]
    assert len(recorded) == 1 and recorded[0]["mode"] == "snapshot_and_tail"
    assert (recorded[0]["snapshot_rows"], recorded[0]["changelog_records_read"]) == (
        first.rows,
        restore.changelog_records_read,
    )
    assert 0 < recorded[0]["snapshot_seconds"] < recorded[0]["seconds"]
    assert report.input_rows == 500  # the new query started exactly after the restored state
    everything = expected_purchase_counts(batches[0] + batches[1] + batches[2])
    assert delta_purchase_counts(spark, report.output) == everything

    # The changelog still equals the state; a full replay agrees with snapshot + tail but reads more.
    full = restore_from_snapshot(snapshots, bootstrap, changelog, use_snapshot=False, **on)
    assert decode_counts(_state(full)) == everything
    if in_spark:  # without a snapshot the state is the tail's live values: Kafka read once, no join on an empty base
        assert _plan(full.frame).count("KafkaRelation") == 1
    after = restore_from_snapshot(snapshots, bootstrap, changelog, **on)
    assert decode_counts(_state(after)) == everything
    if in_spark:  # the tail's few changes were read from Kafka by the call: the frame scans the snapshot alone
        assert "KafkaRelation" not in _plan(after.frame) and "Scan ExistingRDD" in _plan(after.frame)
    assert full.changelog_records_read > after.changelog_records_read

    # Old snapshots stay readable (time travel) next to newer ones.
    second = take_snapshot(snapshots, bootstrap, changelog, **on)
    assert second.batch_id > first.batch_id and second.delta_version > first.delta_version
    # the keys the tail changed, appended as a layer on the previous snapshot (by this process from a short
    # tail, by Spark from a long one)
    changed = read_changelog(bootstrap, changelog, first.changelog_offsets, keep_changes=True).changes
    assert (second.mode, second.layer_rows, snapshots.count(second)) == ("layered", len(changed), len(everything))
    assert len(changed) < len(everything)
    if in_spark:  # a retried snapshot of the same batch commits nothing (Delta's txnAppId/txnVersion)
        position = (after.batch_id, after.input_offsets, after.changelog_resume_offsets, after.watermark_ms)
        assert snapshots.append_layer_frame(after.changes, first, *position) == second
        assert snapshots.write_frame(after.frame, *position) == second and snapshots.version() == second.delta_version
    if in_spark:  # a layered snapshot read by Spark: its few layers' rows were read by the call, once
        layered = snapshots.frame(spark, second)
        assert _plan(layered).count("FileScan") == 1 and "Scan ExistingRDD" in _plan(layered)  # the base
        assert decode_counts(_state(dataclasses.replace(after, frame=layered))) == everything
    assert decode_counts(snapshots.read(first)) == expected_purchase_counts(batches[0])
    assert decode_counts(snapshots.read(second)) == everything
    # restored to the second driver's (generation 2) Spark batch 1
    assert (
        json.loads((ctx.layout.checkpoint / "streamstate" / "restore.json").read_text())["counts"]["batch_id"]
        == 2 * GENERATION_SPAN + 1
    )


def test_job_takes_snapshots_on_its_cadence(spark, kafka_broker, settings, unique):
    job = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"cadence_{unique}",
        source_topic=f"cadence-{unique}",
        output_table=f"cadence_{unique}",
        snapshot_every_batches=1,
    )
    ensure_topic(settings.kafka_bootstrap_servers, job.source_topic, job.source_partitions)
    events = list(purchases.generate(600, users=50, seed=61))
    purchases.produce(settings.kafka_bootstrap_servers, job.source_topic, events)
    run(job, settings, available_now=True, spark=spark)

    latest = JobContext(spark, job, settings).stores.handle("counts").snapshots.latest()
    assert latest is not None and latest.batch_id == GENERATION_SPAN
    assert latest.input_offsets == {job.source_topic: end_offsets(settings.kafka_bootstrap_servers, job.source_topic)}
    assert latest.rows == len(expected_purchase_counts(events))
