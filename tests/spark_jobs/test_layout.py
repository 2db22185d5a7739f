"""One owner of a job version's artifacts: every name comes from ``JobLayout``, and what a running job
and its standby leave on disk, in Kafka and in Delta is exactly what the layout lists."""

from __future__ import annotations

import dataclasses

import pytest
from confluent_kafka.admin import AdminClient
from streamstate.supervision import locked_record, record_path

from runtime.kafka_connection import client_config
from runtime.settings import Settings
from spark_jobs.driver import failpoints, lease, lifecycle
from spark_jobs.driver.context import JobContext
from spark_jobs.driver.run import report_path, run
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic, existing_topics
from spark_jobs.layout import JobLayout, standby_status_file
from spark_jobs.operations.standby.follower import SnapshotFollower, standby_id
from spark_jobs.operations.state_audit.report import chart_name, report_dir
from spark_jobs.reference.generators import pulse, purchases, votes
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.checkpoint_health import RESTORE_RECORD
from spark_jobs.state.snapshots import snapshot_path


def test_every_name_of_a_version_comes_from_its_layout(tmp_path):
    settings = Settings(data_dir=tmp_path)
    spec = get_job("patient_heart_rate")
    layout = JobLayout.of(spec, settings)
    app = spec.application_id
    assert layout.checkpoint == settings.checkpoints / app
    assert layout.changelog_topics == (f"{app}-pulse-counts-changelog",)  # Kafka Streams' name
    assert layout.topics == (*layout.changelog_topics, f"{app}-dead-letter", f"{app}-generations")
    assert layout.transactional_id == f"{app}-driver"
    assert layout.snapshot_tables == (settings.lake / "_state" / app / "pulse-counts",)
    assert layout.output_tables == (settings.lake / spec.output_table_dir,)
    # The modules that name an artifact ask the layout: one spelling of each name.
    assert changelog_topic_name(app, "pulse-counts") == layout.changelog_topic("pulse-counts")
    assert dead_letter_topic(app) == layout.dead_letter_topic
    assert snapshot_path(settings.lake, app, "pulse-counts") == layout.snapshot_table("pulse-counts")
    assert lifecycle.status_path(settings.status_dir, app) == layout.driver.lifecycle
    assert lease.lease_path(settings.status_dir, app) == layout.driver.lease
    assert record_path(settings.status_dir, app) == layout.driver.supervision
    assert failpoints.marker_path(settings.status_dir, app) == layout.driver.failpoint
    assert report_path(spec, settings) == layout.driver.last_run
    assert standby_id(app) == layout.standby.name
    assert standby_status_file(settings.status_dir, app) == layout.standby_status
    assert lease.lease_path(settings.status_dir, standby_id(app)) == layout.standby.lease
    assert layout.checkpoint / RESTORE_RECORD == layout.restore_record
    assert report_dir(settings) / chart_name(app, "pulse-counts") == layout.audit_plot("pulse-counts")
    context = JobContext(None, spec, settings)
    assert context.layout.checkpoint == layout.checkpoint and str(context.layout.output_table) == str(
        layout.output_table
    )
    assert context.stores.handle("pulse-counts").snapshots.table == layout.snapshot_table("pulse-counts")
    # Versions never share anything but their source topic.
    other = JobLayout.of(dataclasses.replace(spec, version=spec.version + 1), settings)
    assert not {a.location for a in layout.artifacts()} & {a.location for a in other.artifacts()}


def test_a_job_that_re_keys_owns_its_repartition_topics(tmp_path):
    """A job declaring repartition owns the repartition topic, its progress topic, the re-keying stage's
    transactional id and checkpoint (inside the job's); its stateful stage reads the repartition topic, and
    its changelogs have the repartition topic's partitions."""
    settings = Settings(data_dir=tmp_path)
    plain = get_job("purchase_counts")
    spec = dataclasses.replace(plain, repartition=True, repartition_partitions=5)
    layout, app = JobLayout.of(spec, settings), spec.application_id
    assert layout.repartition_topics == (f"{app}-repartition", f"{app}-repartition-progress")
    owned = (*layout.changelog_topics, *layout.repartition_topics, f"{app}-dead-letter", f"{app}-generations")
    assert layout.topics == owned
    assert {a.location for a in layout.artifacts() if a.kind == "repartition_topic"} == set(layout.repartition_topics)
    assert layout.repartition_transactional_id == f"{app}-repartitioner"
    assert layout.repartition_checkpoint.path.is_relative_to(layout.checkpoint.path)
    assert layout.state_input_topic == layout.repartition_topic
    assert JobContext(None, spec, settings).stores.handle("counts").changelog.partitions == 5
    plain_layout = JobLayout.of(plain, settings)
    assert plain_layout.repartition_topics == () and plain_layout.state_input_topic == plain.source_topic
    with pytest.raises(JobSpecError, match="repartition_partitions"):
        dataclasses.replace(plain, repartition_partitions=3)


def _owned_on_disk(settings: Settings, layout: JobLayout, output_table: str) -> set[str]:
    """Everything under the data directory whose name says it belongs to ``layout``'s application id."""
    app = layout.application_id
    found = {str(p) for p in settings.checkpoints.path.glob(f"{app}*") if p.name == app or p.name.startswith(f"{app}.")}
    found |= {str(p) for p in settings.status_dir.rglob(f"{app}.*") if not p.name.endswith(".tmp")}
    found |= {str(p) for p in (settings.logs_dir / "jobs").glob(f"{app}[-.]*")}
    found |= {str(p) for p in (settings.lake.path / "_state" / app).glob("*")}
    found |= {str(p) for p in settings.lake.path.glob(f"{output_table}_v*")}
    return found


def _purchases(settings, topic):
    purchases.produce(settings.kafka, topic, list(purchases.generate(300, users=40, seed=3)))


def _pulses(settings, topic):
    pulse.produce(settings.kafka, topic, list(pulse.generate(patients=4, seconds=120, seed=3)))


def _votes(settings, topic):
    votes.produce(settings.kafka, topic, list(votes.generate(voters=30, seed=3)))


@pytest.mark.integration
@pytest.mark.parametrize(
    "job_name, produce", [("purchase_counts", _purchases), ("patient_heart_rate", _pulses), ("vote_counts", _votes)]
)
def test_what_a_version_owns_is_what_its_layout_lists(spark, kafka_broker, settings, unique, job_name, produce):
    spec = get_job(job_name)
    job = dataclasses.replace(
        spec,
        name=f"layout_{unique}",
        source_topic=f"layout-{unique}",
        output_table=f"layout_{unique}",
        snapshot_every_batches=1,
    )
    layout = JobLayout.of(job, settings)
    ensure_topic(settings.kafka, job.source_topic, job.source_partitions)
    produce(settings, job.source_topic)
    # As supervision runs it: the driver, Airflow's records of it and of its standby, the standby.
    for name in (layout.driver.name, layout.standby.name):
        with locked_record(settings.status_dir, name):
            pass
    run(job, settings, available_now=True, spark=spark)
    SnapshotFollower(job, settings).run(max_seconds=3)

    listed = {a.location for a in layout.artifacts()}
    on_disk = _owned_on_disk(settings, layout, job.output_table)
    assert on_disk <= listed, f"owned by {layout.application_id} but not in its layout: {sorted(on_disk - listed)}"
    cluster = AdminClient(client_config(settings.kafka)).list_topics(timeout=30).topics
    topics = {t for t in cluster if t.startswith(f"{layout.application_id}-")}
    assert topics == set(layout.topics) == existing_topics(settings.kafka, list(layout.topics))
    required = [
        layout.checkpoint,
        *layout.snapshot_tables,
        *layout.output_tables,
        layout.driver.lifecycle,
        layout.driver.last_run,
        layout.standby_status,
        *layout.driver.supervised(),
        *layout.standby.supervised(),
    ]
    assert [str(p) for p in required if not p.exists()] == []


def test_a_jobs_dag_ids_come_from_one_place_and_a_batch_dag_names_its_job():
    from spark_jobs.layout import JobDags, batch_dag_id, batch_job_of

    assert (JobDags("purchase_counts").supervise, JobDags("purchase_counts").drain) == (
        "supervise__purchase_counts",
        "drain__purchase_counts",
    )
    assert batch_job_of(batch_dag_id("daily_top_movers")) == "daily_top_movers"
    with pytest.raises(ValueError, match="is not a batch job's DAG"):
        batch_job_of("supervise__daily_top_movers")


def test_the_job_of_a_versions_name():
    from spark_jobs.layout import application_id, job_of, spare_name

    app = application_id("top-v2-movers", 12)  # a job whose own name holds "-v"
    assert [job_of(name) for name in (app, spare_name(app), f"{app}.standby")] == ["top-v2-movers"] * 3
    assert job_of("not-a-version") == "not-a-version" and job_of("x-vy") == "x-vy"


def test_a_comparisons_report_is_named_after_both_versions_and_a_safe_run_id(tmp_path):
    from spark_jobs.layout import comparison_name, comparison_report_file

    assert comparison_name("gift_card_counts", 1, 2) == "gift_card_counts-v1-v2"
    path = comparison_report_file(tmp_path, "gift_card_counts", 1, 2, "manual__2026-12-07T06:00:00+00:00")
    assert path == tmp_path / "reports" / "gift_card_counts-v1-v2-manual__2026-12-07T06_00_00_00_00.md"
