"""Tables and checkpoints in an object store: a job whose lake and checkpoints are ``s3a://`` on a real
S3-API server (S3Proxy, started here from its Maven jar) writes its outputs, snapshots, checkpoint and the
platform's tables there, and when its checkpoint is damaged there, moves it aside and restores from the
snapshots there (real Kafka, Spark through Hadoop's S3A, delta-rs, pyarrow)."""

from __future__ import annotations

import dataclasses

import pytest
from deltalake import DeltaTable

from runtime.process import free_port
from runtime.s3_server import LocalS3Server
from spark_jobs.driver.context import JobContext
from spark_jobs.driver.run import run
from spark_jobs.driver.session import session_conf
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.io.table_maintenance import maintain_table
from spark_jobs.operations.reprocess.plan import delta_size
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state.restore_history import restore_measurements
from spark_jobs.state.snapshotting import take_snapshot
from tests.helpers import delta_purchase_counts
from tests.spark_jobs.test_purchase_counts import expected_purchase_counts

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    server = LocalS3Server(tmp_path_factory.mktemp("s3"), free_port())
    server.start()
    server.create_bucket("lake")
    yield server
    server.stop()


@pytest.fixture
def on_s3(settings, s3_server, spark, unique):
    """The suite's settings with the lake and the checkpoints in the S3 server; the shared Spark session
    reaches it through S3A settings on its SQL conf (a driver of its own gets them at start from ``spark_conf``)."""
    moved = settings.replace(
        lake_uri=f"s3a://lake/{unique}",
        checkpoint_uri=f"s3a://lake/{unique}-checkpoints",
        **s3_server.settings_fields(),
    )
    with session_conf(spark, moved.object_store.hadoop_conf()):
        yield moved


def test_a_job_keeps_its_tables_in_the_object_store_and_restores_from_there(
    spark, kafka_broker, on_s3, s3_server, unique
):
    settings = on_s3.replace(restore_in_spark_min_records=0)  # snapshots and the restore by Spark's executors
    job = dataclasses.replace(
        get_job("purchase_counts"), name=f"s3_{unique}", source_topic=f"s3-{unique}", output_table=f"s3_{unique}"
    )
    ctx = JobContext(spark, job, settings)
    bootstrap, changelog = settings.kafka_bootstrap_servers, ctx.stores.handle("counts").changelog.name
    snapshots = ctx.stores.handle("counts").snapshots
    assert snapshots.path == f"s3a://lake/{unique}/_state/{job.application_id}/counts"
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    batches = [
        list(purchases.generate(n, users=users, seed=seed))
        for n, users, seed in ((2000, 300, 41), (600, 400, 42), (300, 450, 43))
    ]

    purchases.produce(bootstrap, job.source_topic, batches[0])
    report = run(job, settings, available_now=True, spark=spark)
    assert report.output == f"s3a://lake/{unique}/{job.output_table_dir}"
    first = take_snapshot(snapshots, bootstrap, changelog, spark=spark)  # written whole by Spark
    assert first.mode == "full" and first.rows == len(expected_purchase_counts(batches[0]))

    purchases.produce(bootstrap, job.source_topic, batches[1])
    run(job, settings, available_now=True, spark=spark)
    second = take_snapshot(snapshots, bootstrap, changelog, spark=spark)  # a layer committed by delta-rs
    assert second.mode == "layered" and second.base_batch == first.batch_id

    # The checkpoint loses its state files, then more input: it is moved aside (in the store: objects
    # copied, then deleted) and the state comes back from the snapshots.
    assert str(ctx.layout.checkpoint) == f"s3a://lake/{unique}-checkpoints/{job.application_id}"
    assert (ctx.layout.checkpoint / "state").remove()
    purchases.produce(bootstrap, job.source_topic, batches[2])
    report = run(job, settings, available_now=True, spark=spark)
    moved = report.quarantined_checkpoint
    assert "no state store files" in moved["reason"] and moved["path"].startswith(
        str(ctx.layout.checkpoint) + ".corrupt-"
    )
    assert (
        ctx.layout.quarantined_checkpoints()[0].exists() and ctx.layout.checkpoint.exists()
    )  # a new one, written by Spark
    restore = report.restores["counts"]
    assert restore.in_spark and restore.full_replay is False and restore.snapshot_batch_id == second.batch_id
    assert report.input_rows == len(batches[2])
    everything = expected_purchase_counts(batches[0] + batches[1] + batches[2])
    assert delta_purchase_counts(spark, report.output) == everything

    # Everything of the job's lake and checkpoint is in the server's storage; nothing of it on the local disk
    # (the suite's other tests share this data directory: look for this job's own names)
    local = [
        settings.data_dir / "lake" / job.output_table_dir,
        settings.data_dir / "lake" / "_state" / job.application_id,
        settings.data_dir / "checkpoints" / job.application_id,
    ]
    assert not [str(path) for path in local if path.exists()]
    bucket = s3_server.blobs / "lake" / unique
    assert (bucket / "_state" / job.application_id / "counts" / "_delta_log").is_dir()
    assert (bucket / job.output_table_dir / "_delta_log").is_dir()
    assert (s3_server.blobs / "lake" / f"{unique}-checkpoints" / job.application_id / "commits" / "0").is_file()
    # the platform's own tables (delta-rs) too: the restore's measurement
    assert [m for m in restore_measurements(settings) if m["application_id"] == job.application_id]
    assert {t.name for t in settings.lake.children()} >= {"_state", "_streamstate", job.output_table_dir}

    # Maintenance, plans and resets work on it the same way: compaction by delta-rs, sizes from the log.
    latest = snapshots.latest()
    before = snapshots.read(latest)
    maintained = maintain_table(snapshots.table, "snapshot", dry_run=False)
    assert maintained.error is None and maintained.files >= 2
    assert snapshots.read(latest) == before
    assert "Delta version" in delta_size(snapshots.table)
    assert DeltaTable(report.output, storage_options=settings.lake.storage_options()).version() >= 2
    assert snapshots.table.size_bytes() > 0 and snapshots.table.remove() and not snapshots.table.exists()
    assert snapshots.latest() is None
