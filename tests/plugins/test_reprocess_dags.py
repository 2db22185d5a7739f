"""Reprocessing DAGs on the real stack: ``airflow dags test`` runs, spark-submit drivers on the broker,
Delta tables read back with delta-rs, Kafka read back with a consumer.

- side_by_side: v1 of ``gift_card_counts`` counts gift cards twice; v2 (the fix) reprocesses from
  earliest beside it, the report names exactly the users that differ, promote switches readers to v2
  and stops v1 and its warm standby.
- a join: ``joined_orders`` (a stream-table join) v2 reprocesses from a date-time beside v1, its orders from
  there and its customers table whole; promoted; v3 starts from v2's state, migrated, at its position in both,
  the report finding v3's outputs equal to v2's.
- migrate (a variation, ``TEST_VARIATIONS=1``): ``tiered_counts`` v2 keeps a field more in its store than v1;
  after the source's history is deleted, v2 starts from v1's state, migrated through the version's function,
  and its outputs equal recomputing everything.
- re-keyed (a variation): ``rekeyed_gift_counts`` re-keys an unkeyed source; v2 reprocesses from a source
  position beside v1 (its re-keying stage starts there), is waited for through both its stages, compared at
  aligned source positions and promoted.
- reset: ``reset_counts`` (re-keyed) reset to a date-time reprocesses only what came after it, with a
  changelog and a repartition topic holding nothing from before; the dry run before it changes nothing; a
  bad form is rejected; the version's warm standby is stopped first (the reset deletes the snapshots it
  writes).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from streamstate.supervision import read_record

from runtime.settings import PROJECT_ROOT
from spark_jobs.driver.lease import JobLease
from spark_jobs.io.kafka_topics import (
    ensure_topic,
    existing_topics,
    offsets_for_time,
    partition_offsets,
    truncate_topic,
)
from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.audit import audit_rows
from spark_jobs.operations.reprocess.compare import diffs_table, reports_table
from spark_jobs.reference.generators import orders
from spark_jobs.reference.generators.producer import produce_unkeyed
from spark_jobs.reference.generators.purchases import expected_counts, generate, produce
from spark_jobs.registry import get_job
from spark_jobs.state.batch_records import MARKER_KEY
from spark_jobs.state.changelog import changelog_topic_name
from spark_jobs.state.checkpoint_offsets import committed_input_offsets
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.source_position import committed_source_offsets
from spark_jobs.versions import JobVersions, current_output_path, read_rows
from tests.fixtures.reprocess_jobs import GROWN_PARTITIONS, gift_card_input, gift_cards_doubled
from tests.helpers import wait_for as _wait

pytestmark = pytest.mark.integration

JOB_MODULES = "tests.fixtures.reprocess_jobs"
FIXTURE_JOBS = ("gift_card_counts", "reset_counts", "tiered_counts", "rekeyed_gift_counts", "joined_orders")


@pytest.fixture(scope="module")
def fixture_jobs():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAMSTATE_JOB_MODULES", JOB_MODULES)
        yield


@pytest.fixture(scope="module")
def dags_test(dag_runner, kafka_broker, fixture_jobs):
    """``airflow dags test`` with the fixture jobs registered (importable by drivers and Spark's Python
    workers too); no Airflow services needed."""
    env = {"STREAMSTATE_JOB_MODULES": JOB_MODULES, "PYTHONPATH": str(PROJECT_ROOT)}

    def run(dag_id: str, conf: dict):
        dag_file = (
            PROJECT_ROOT / "dags" / ("control_jobs.py" if dag_id.endswith("streaming_job") else "reprocess_jobs.py")
        )
        return dag_runner.dags_test(dag_id, conf, env=env, dag_file=dag_file)

    return run


@pytest.fixture
def run_dag(dags_test, settings):
    """:func:`dags_test`; after the test, kills every driver its DAGs launched (they are detached, and
    would otherwise keep polling their topics through the tests after it)."""
    yield dags_test
    for name in FIXTURE_JOBS:
        for version in (1, 2, 3):
            try:
                app = get_job(name, version).application_id
            except Exception:
                continue
            for launch in read_record(settings.status_dir, app).launches:
                try:
                    os.killpg(launch.launcher_pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError, TypeError):
                    pass


def _ok(result) -> None:
    assert result.returncode == 0, f"DAG run failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"


def _caught_up(settings, spec) -> None:
    end = {p: high for p, (_, high) in partition_offsets(settings.kafka_bootstrap_servers, spec.source_topic).items()}
    checkpoint = settings.checkpoints / spec.application_id
    _wait(
        lambda: committed_input_offsets(checkpoint, spec.source_topic) == end,
        240,
        f"{spec.application_id} to commit {end}",
    )


def _consumed(settings, spec) -> None:
    """Wait until ``spec``'s version has consumed every input whole (re-keyed and applied, when it re-keys)."""
    end = {
        topic: {p: high for p, (_, high) in partition_offsets(settings.kafka, topic).items()}
        for topic in spec.input_topics
    }
    layout = JobLayout.of(spec, settings)
    _wait(
        lambda: committed_source_offsets(layout, settings.kafka) == end, 240, f"{spec.application_id} to consume {end}"
    )


def _start_standby(settings, spec) -> subprocess.Popen:
    """The version's warm standby, launched as supervision launches it (a detached follower process)."""
    env = {**os.environ, **settings.to_env(), "STREAMSTATE_JOB_MODULES": JOB_MODULES, "PYTHONPATH": str(PROJECT_ROOT)}
    follower = subprocess.Popen(
        [sys.executable, "-m", "spark_jobs.operations.standby", spec.name, "--version", str(spec.version)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    lease = JobLease(settings.status_dir, JobLayout.of(spec, settings).standby.name)
    _wait(lambda: lease.holder() is not None, 60, f"the standby of {spec.application_id} to hold its lease")
    return follower


def _counts(path: str) -> dict[str, tuple[int, Decimal]]:
    return {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in read_rows(path)}


def test_side_by_side_report_and_promote(settings, kafka_broker, run_dag):
    v1, v2 = get_job("gift_card_counts", 1), get_job("gift_card_counts", 2)
    events, correct, buggy, changed = gift_card_input(400, users=30, seed=21, every=9)
    ensure_topic(settings.kafka_bootstrap_servers, v1.source_topic, v1.source_partitions)
    produce(settings.kafka_bootstrap_servers, v1.source_topic, events)
    assert changed and len(changed) < len(correct)  # the bug shows for some users, not all

    versions = JobVersions(settings)
    versions.promote(v1.name, 1, by="test: v1 was deployed first")
    _ok(run_dag("start_streaming_job", {"job": v1.name}))
    _caught_up(settings, v1)
    assert _counts(current_output_path(settings, v1.name)) == buggy

    _ok(run_dag("reprocess_job", {"job": v1.name, "mode": "side_by_side", "dry_run": False}))
    # running it again is safe: v2 resumes from its checkpoint, the launch finds it running, a new report
    again = run_dag("reprocess_job", {"job": v1.name, "mode": "side_by_side", "dry_run": False})
    _ok(again)
    assert "it resumes from there" in again.stdout + again.stderr
    reports = sorted(
        (r for r in read_rows(reports_table(settings)) if r["job"] == v1.name), key=lambda r: r["created_at"]
    )
    assert len(reports) == 2 and reports[0]["run_id"] != reports[1]["run_id"]
    assert {k: v for k, v in reports[0].items() if k not in ("run_id", "created_at")} == {
        k: v for k, v in reports[1].items() if k not in ("run_id", "created_at")
    }
    report = reports[-1]
    assert (report["old_version"], report["new_version"], report["aligned"]) == (1, 2, True)
    assert (report["different"], report["only_old"], report["only_new"]) == (len(changed), 0, 0)
    assert report["equal"] == len(correct) - len(changed)
    diffs = [r for r in read_rows(diffs_table(settings)) if r["run_id"] == report["run_id"]]
    assert {r["key"] for r in diffs} == {f'{{"user_id":"{user}"}}' for user in changed}
    assert list((settings.status_dir / "reports").glob("gift_card_counts-v1-v2-*.md"))
    # v2 runs on 6 state partitions, v1 on its source's 2: moved by reprocessing, its outputs differ by the fix only
    assert (v1.state_partitions, v2.state_partitions) == (2, GROWN_PARTITIONS)
    changelogs = [changelog_topic_name(spec.application_id, "counts") for spec in (v1, v2)]
    assert [len(partition_offsets(settings.kafka, topic)) for topic in changelogs] == [2, GROWN_PARTITIONS]
    # still side by side: readers see v1, both drivers run
    assert versions.current(v1.name) == 1 and current_output_path(settings, v1.name).endswith("gift_card_counts_v1")
    assert (
        JobLease(settings.status_dir, v1.application_id).holder()
        and JobLease(settings.status_dir, v2.application_id).holder()
    )

    standby = _start_standby(settings, v1)
    result = run_dag("promote_job_version", {"job": v1.name, "version": 2, "dry_run": False})  # no confirmation
    assert result.returncode != 0 and "type 'gift_card_counts' in 'confirm'" in result.stdout + result.stderr
    assert versions.current(v1.name) == 1
    _ok(
        run_dag(
            "promote_job_version",
            {"job": v1.name, "version": 2, "dry_run": False, "confirm": v1.name, "retain_days": 0},
        )
    )
    assert versions.current(v1.name) == 2
    assert _counts(current_output_path(settings, v1.name)) == correct
    assert JobLease(settings.status_dir, v1.application_id).holder() is None  # the old version stopped
    assert standby.wait(30) == 0  # and its standby, cleanly (SIGTERM)
    assert JobLease(settings.status_dir, v2.application_id).holder() is not None
    assert [e.version for e in versions.retired(v1.name)] == [1]
    assert read_record(settings.status_dir, v1.application_id).desired == "stopped"  # supervision leaves it

    outcomes = Counter((r["dag_id"], r["outcome"]) for r in audit_rows(settings) if r["job"] == v1.name)
    assert outcomes == {
        ("reprocess_job", "succeeded"): 2,
        ("promote_job_version", "rejected"): 1,
        ("promote_job_version", "succeeded"): 1,
    }

    # retained 0 days: the daily purge deletes what v1 owned, and nothing of v2
    old_output, old_checkpoint = settings.lake / v1.output_table_dir, settings.checkpoints / v1.application_id
    assert old_output.exists() and old_checkpoint.exists()
    _ok(run_dag("purge_retired_versions", {}))
    assert not old_output.exists() and not old_checkpoint.exists()
    bootstrap = settings.kafka_bootstrap_servers
    assert not existing_topics(bootstrap, [changelog_topic_name(v1.application_id, "counts")])
    assert existing_topics(bootstrap, [changelog_topic_name(v2.application_id, "counts")])
    assert _counts(current_output_path(settings, v1.name)) == correct
    assert versions.retired(v1.name) == []  # purged: not a candidate any more
    purge = [r for r in audit_rows(settings) if r["dag_id"] == "purge_retired_versions"]
    assert [r["outcome"] for r in purge] == ["succeeded"] and "gift_card_counts-v1" in purge[0]["plan"]


@pytest.mark.variation(of="test_side_by_side_report_and_promote (a re-keyed job: test_reset_from_a_datetime...)")
def test_a_rekeyed_version_reprocessed_from_a_position_beside_the_current_one_and_promoted(
    settings, kafka_broker, run_dag
):
    """Both versions re-key a source produced without keys through their own repartition topics. v2 reprocesses
    from an explicit source position: its re-keying stage starts there, its stateful stage reads its new
    repartition topic from the beginning; the catch-up wait sees it consume the source through both stages
    (reading the stateful checkpoint's offsets as source offsets, it would time out); the report compares
    at aligned source positions; promote switches readers to v2."""
    v1, v2 = get_job("rekeyed_gift_counts", 1), get_job("rekeyed_gift_counts", 2)
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, v1.source_topic, v1.source_partitions)
    # no account closings: the counts do not depend on the order re-keying gives a user's events
    before, *_ = gift_card_input(150, users=12, seed=41, every=7, close_rate=0.0)
    after, correct, _, _ = gift_card_input(200, users=12, seed=42, every=7, close_rate=0.0)
    produce_unkeyed(bootstrap, v1.source_topic, before, v1.source_partitions, seed=1)
    start = {p: high for p, (_, high) in partition_offsets(bootstrap, v1.source_topic).items()}
    produce_unkeyed(bootstrap, v1.source_topic, after, v1.source_partitions, seed=2)
    end = {p: high for p, (_, high) in partition_offsets(bootstrap, v1.source_topic).items()}
    old = expected_counts(gift_cards_doubled(before + after))

    versions = JobVersions(settings)
    versions.promote(v1.name, 1, by="test: v1 was deployed first")
    _ok(run_dag("start_streaming_job", {"job": v1.name}))
    _consumed(settings, v1)
    assert _counts(current_output_path(settings, v1.name)) == old

    form = {"job": v1.name, "mode": "side_by_side", "start_from": "offsets", "start_offsets": start}
    dry = run_dag("reprocess_job", {**form, "dry_run": True})
    _ok(dry)
    assert f"{v2.application_id}-repartition from its beginning" in dry.stdout + dry.stderr
    _ok(run_dag("reprocess_job", {**form, "dry_run": False, "catch_up_timeout_min": 5}))
    assert committed_source_offsets(JobLayout.of(v2, settings), settings.kafka) == {v1.source_topic: end}
    assert _counts(str(settings.lake / v2.output_table_dir)) == correct  # only what came after the start

    report = next(r for r in read_rows(reports_table(settings)) if r["job"] == v1.name)
    assert (
        json.loads(report["old_position"])
        == json.loads(report["new_position"])
        == {v1.source_topic: {str(p): o for p, o in end.items()}}
    )
    assert report["aligned"] is True
    users = set(old) | set(correct)
    expected = Counter(
        "only_old"
        if u not in correct
        else "only_new"
        if u not in old
        else "equal"
        if old[u] == correct[u]
        else "different"
        for u in users
    )
    assert {k: report[k] for k in ("equal", "different", "only_old", "only_new")} == {
        k: expected[k] for k in ("equal", "different", "only_old", "only_new")
    }

    _ok(
        run_dag(
            "promote_job_version",
            {"job": v1.name, "version": 2, "dry_run": False, "confirm": v1.name, "retain_days": 0},
        )
    )
    assert versions.current(v1.name) == 2
    assert _counts(current_output_path(settings, v1.name)) == correct
    assert JobLease(settings.status_dir, v1.application_id).holder() is None
    assert JobLease(settings.status_dir, v2.application_id).holder() is not None


@pytest.mark.variation(
    of="test_a_join_reprocessed_from_a_datetime...then_migrated (a migration function: test_migration.py)"
)
def test_migrate_starts_the_new_version_from_the_current_versions_state(settings, kafka_broker, run_dag):
    v1, v2 = get_job("tiered_counts", 1), get_job("tiered_counts", 2)
    bootstrap = settings.kafka_bootstrap_servers
    first, later = list(generate(300, users=40, seed=31)), list(generate(120, users=50, seed=32))
    ensure_topic(bootstrap, v1.source_topic, v1.source_partitions)
    produce(bootstrap, v1.source_topic, first)
    JobVersions(settings).promote(v1.name, 1, by="test: v1 was deployed first")
    _ok(run_dag("start_streaming_job", {"job": v1.name}))
    _caught_up(settings, v1)
    assert truncate_topic(bootstrap, v1.source_topic) == len(first)  # the source no longer holds the history

    new_snapshots = SnapshotStore.of(JobLayout.of(v2, settings), "counts")
    migration = run_dag("reprocess_job", {"job": v1.name, "mode": "migrate", "dry_run": False})
    _ok(migration)
    printed = migration.stdout + migration.stderr  # the plan task's plan
    assert "migrated snapshot" in printed and "through tests.fixtures.reprocess_jobs:add_tier" in printed
    assert f"copy of {settings.lake / v1.output_table_dir} as of the migration point" in printed
    (migrated, *_) = new_snapshots.history()
    assert migrated.writer == "migration" and migrated.migrated_from.startswith("tiered_counts-v1/counts@batch ")
    report = next(r for r in read_rows(reports_table(settings)) if r["job"] == v1.name)
    assert (report["old_version"], report["new_version"], report["different"], report["only_new"]) == (1, 2, 0, 0)
    assert report["equal"] == len(expected_counts(first))
    # v2 runs on from there: what recomputing everything would give, though the source lost its history
    produce(bootstrap, v1.source_topic, later)
    _caught_up(settings, v2)
    assert _counts(str(settings.lake / v2.output_table_dir)) == expected_counts(first + later)
    outcomes = Counter((r["mode"], r["outcome"]) for r in audit_rows(settings) if r["job"] == v1.name)
    assert outcomes == {("migrate", "succeeded"): 1}


def _read_changelog(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    # the end of a partition may be a transaction's commit marker (the changelog's markers): wait for EOF
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    records = []
    try:
        for p, (low, high) in partition_offsets(bootstrap, topic).items():
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                msg = consumer.poll(30)
                assert msg is not None, f"read-back of {topic}[{p}] stalled"
                if msg.error() and msg.error().code() == KafkaError._PARTITION_EOF:
                    break
                assert not msg.error(), f"read-back of {topic}[{p}] failed: {msg.error()}"
                records.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return records


def _state_of_the_world(settings, spec) -> dict:
    """What a dry run must not change: topics and offsets, checkpoint logs, Delta table versions."""
    from deltalake import DeltaTable

    bootstrap = settings.kafka_bootstrap_servers
    topics = [
        spec.source_topic,
        changelog_topic_name(spec.application_id, "counts"),
        f"{spec.application_id}-dead-letter",
        *JobLayout.of(spec, settings).repartition_topics,
    ]
    checkpoint = (settings.checkpoints / spec.application_id).path
    tables = [settings.lake / spec.output_table_dir, settings.lake / "_state" / spec.application_id / "counts"]
    return {
        "topics": {t: partition_offsets(bootstrap, t) for t in sorted(existing_topics(bootstrap, topics))},
        "checkpoint": sorted(
            str(p.relative_to(checkpoint))
            for d in ("offsets", "commits", "streamstate")
            for p in (checkpoint / d).rglob("*")
            if p.is_file()
        ),
        # the snapshot table exists once the job reached its snapshot cadence (5 batches here), or not yet
        "tables": {str(t): DeltaTable(str(t)).version() if DeltaTable.is_deltatable(str(t)) else None for t in tables},
        "driver": JobLease(settings.status_dir, spec.application_id).holder(),
    }


def test_reset_from_a_datetime_after_a_dry_run(settings, kafka_broker, run_dag):
    spec = get_job("reset_counts")
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)
    before = list(generate(150, users=12, seed=31))
    produce(bootstrap, spec.source_topic, before)
    time.sleep(0.3)  # record timestamps (ms) fall clearly before and after the cut
    cut = dt.datetime.now(dt.timezone.utc)
    time.sleep(0.3)
    after = list(generate(120, users=12, seed=32))
    for event in after:  # half of the users are new, half also bought before the cut
        if int(event["user_id"][1:]) % 2 == 0:
            event["user_id"] = "w" + event["user_id"][1:]
    produce(bootstrap, spec.source_topic, after)
    only_before = set(expected_counts(before)) - {e["user_id"] for e in after}
    assert only_before

    _ok(run_dag("start_streaming_job", {"job": spec.name}))
    _consumed(settings, spec)
    assert _counts(current_output_path(settings, spec.name)) == expected_counts(before + after)
    repartition_topic = JobLayout.of(spec, settings).repartition_topic

    conf = {
        "job": spec.name,
        "mode": "reset",
        "start_from": "datetime",
        "start_datetime": cut.isoformat(),
        "truncate_outputs": True,
    }
    world = _state_of_the_world(settings, spec)
    dry = run_dag("reprocess_job", conf)  # dry_run defaults to true
    _ok(dry)
    printed = dry.stdout + dry.stderr
    assert (
        "DRY RUN" in printed and f"{spec.application_id}-counts-changelog" in printed and repartition_topic in printed
    )
    assert _state_of_the_world(settings, spec) == world

    bad = run_dag("reprocess_job", {**conf, "start_from": "offsets", "start_offsets": {"5": 0}})
    assert bad.returncode != 0 and "has no partition [5]" in bad.stdout + bad.stderr
    assert _state_of_the_world(settings, spec) == world

    standby = _start_standby(settings, spec)
    _ok(run_dag("reprocess_job", {**conf, "dry_run": False, "confirm": spec.name}))
    assert standby.wait(30) == 0  # stopped before the reset deleted the snapshots it writes
    _consumed(settings, spec)
    assert _counts(current_output_path(settings, spec.name)) == expected_counts(after)
    # the repartition topic was deleted with the state it fed: the re-keying stage wrote it anew from the cut
    written = sum(high for _low, high in partition_offsets(bootstrap, repartition_topic).values())
    assert len(after) <= written <= len(after) + 20, written  # the records after the cut, and commit markers
    changelog = _read_changelog(bootstrap, changelog_topic_name(spec.application_id, "counts"))
    keys = {key.decode() for key, _value in changelog if key != MARKER_KEY}
    assert keys == set(expected_counts(after)) and not keys & only_before  # nothing from before the reset

    outcomes = [
        (r["outcome"], r["detail"])
        for r in sorted(audit_rows(settings), key=lambda r: r["finished_at"])
        if r["job"] == spec.name
    ]
    assert [o for o, _ in outcomes] == ["dry_run", "rejected", "succeeded"]
    assert "has no partition [5]" in outcomes[1][1]


def _enriched(path) -> dict[tuple[int, int], tuple]:
    """An enrichment output table as the reference gives it: (partition, offset of the order) -> the row."""
    return {
        (r["source_partition"], r["source_offset"]): (
            r["customer_id"],
            r["order_id"],
            r["amount"],
            orders.iso_time(int(r["event_time"].timestamp() * 1000)),
            r["name"],
            r["tier"],
        )
        for r in read_rows(path)
    }


def test_a_join_reprocessed_from_a_datetime_beside_the_current_version_then_migrated(settings, kafka_broker, run_dag):
    """``joined_orders`` (orders LEFT JOIN a versioned customers table) over three sets of orders and customer
    changes two hours apart. v2 reprocesses from a date-time between the first two sets: its orders from there,
    its customers table whole (an order of the second set joins a row last written in the first); the report
    sees the first set's orders only in v1, the rest equal; promoted. v3 then starts from v2's state, migrated
    at v2's position in both topics (the orders still waiting out their grace included), and joins the third
    set as recomputing everything would."""
    v1, v2, v3 = (get_job("joined_orders", version) for version in (1, 2, 3))
    hour, grace_ms, retention_ms = 3_600_000, 60_000, 24 * 3_600_000
    t0 = int(time.time() * 1000) - 8 * hour
    sets = [
        orders.adversarial(orders=100, customers=8, seed=51 + n, start_ms=t0 + 2 * n * hour, span_ms=20 * 60_000)
        for n in range(3)
    ]
    for topic in v1.input_topics:
        ensure_topic(settings.kafka, topic, v1.source_partitions)

    def produce_set(n: int) -> None:
        # the customers' changes first: a running version reading the orders in a micro-batch before their
        # customers' rows arrived would join older rows, as Kafka Streams would (the reference has them all)
        stream, table = sets[n]
        orders.produce(settings.kafka, v1.join_topics[0], table, v1.source_partitions)
        orders.produce(settings.kafka, v1.source_topic, stream, v1.source_partitions)

    def expected(stream_sets: list[int], table_sets: list[int]) -> dict[tuple[int, int], tuple]:
        stream = [r for n in stream_sets for r in sets[n][0]]
        table = [r for n in table_sets for r in sets[n][1]]
        return orders.expected_enrichment(stream, table, v1.source_partitions, grace_ms, retention_ms)

    produce_set(0)
    produce_set(1)
    versions = JobVersions(settings)
    versions.promote(v1.name, 1, by="test: v1 was deployed first")
    _ok(run_dag("start_streaming_job", {"job": v1.name}))
    _consumed(settings, v1)
    everything = expected([0, 1], [0, 1])
    assert _enriched(settings.lake / v1.output_table_dir) == everything

    between = orders.iso_time(t0 + hour)
    starts = offsets_for_time(settings.kafka, v1.source_topic, t0 + hour)
    side = run_dag(
        "reprocess_job",
        {
            "job": v1.name,
            "mode": "side_by_side",
            "version": 2,
            "start_from": "datetime",
            "start_datetime": between,
            "dry_run": False,
            "catch_up_timeout_min": 5,
        },
    )
    _ok(side)
    assert f"input {v1.join_topics[0]} (table), start: earliest (a table is read whole)" in side.stdout + side.stderr
    later = {place: row for place, row in everything.items() if place[1] >= starts[place[0]]}
    assert 0 < len(later) < len(everything)
    assert _enriched(settings.lake / v2.output_table_dir) == later
    # the table read whole is what makes them equal: read from the date-time, it lacks rows of the first set
    from_the_datetime_only = expected([1], [1])
    assert sorted(map(repr, from_the_datetime_only.values())) != sorted(map(repr, later.values()))
    report = next(r for r in read_rows(reports_table(settings)) if r["job"] == v1.name)
    assert report["aligned"] is True
    assert {k: report[k] for k in ("equal", "different", "only_old", "only_new")} == {
        "equal": len(later),
        "different": 0,
        "only_old": len(everything) - len(later),
        "only_new": 0,
    }
    _ok(
        run_dag(
            "promote_job_version",
            {"job": v1.name, "version": 2, "dry_run": False, "confirm": v1.name, "retain_days": 0},
        )
    )
    assert versions.current(v1.name) == 2

    migration = run_dag(
        "reprocess_job", {"job": v1.name, "mode": "migrate", "version": 3, "dry_run": False, "catch_up_timeout_min": 5}
    )
    _ok(migration)
    printed = migration.stdout + migration.stderr  # the plan task's plan
    assert "migrated snapshot" in printed
    assert f"copy of {settings.lake / v2.output_table_dir} as of the migration point" in printed
    (migrated, *_) = SnapshotStore.of(JobLayout.of(v3, settings), "customer-profiles").history()
    assert migrated.writer == "migration" and migrated.migrated_from.startswith("joined_orders-v2/customer-profiles@")
    assert set(migrated.input_offsets) == set(v1.input_topics)  # a position in both inputs
    # v3 starts from v2's outputs as of the migration point, at its position: the report finds them equal
    migrated_report = next(r for r in read_rows(reports_table(settings)) if r["new_version"] == 3)
    assert (migrated_report["old_version"], migrated_report["aligned"]) == (2, True)
    assert {k: migrated_report[k] for k in ("equal", "different", "only_old", "only_new")} == {
        "equal": len(later),
        "different": 0,
        "only_old": 0,
        "only_new": 0,
    }
    produce_set(2)
    _consumed(settings, v3)
    all_three = expected([0, 1, 2], [0, 1, 2])
    assert _enriched(settings.lake / v3.output_table_dir) == {
        place: row for place, row in all_three.items() if place[1] >= starts[place[0]]
    }
    audited = [r for r in audit_rows(settings) if r["job"] == v1.name]
    outcomes = Counter((r["dag_id"], r["outcome"]) for r in audited)
    assert outcomes == {("reprocess_job", "succeeded"): 2, ("promote_job_version", "succeeded"): 1}
    assert sorted(r["mode"] for r in audited if r["dag_id"] == "reprocess_job") == ["migrate", "side_by_side"]
