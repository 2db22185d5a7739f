"""The changelog compaction tuning DAG on the real broker: ``airflow dags test`` runs, topic configs
read back with the AdminClient, the broker's log cleaner doing the compaction, alerts to a webhook.

``tuned_counts`` (tests/fixtures/tuning_jobs.py) has one store of each kind; its changelogs are
written in the changelog writer's format with many updates per key (churn), under default configs.
One run of the DAG after another: dry run -> dry run (alert) -> apply -> the job writes an idle batch
and the cleaner compacts -> the DAG measures the drop and resolves the alert -> rollback.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from streamstate.ui.jobs_page import render_rows
from streamstate.ui.view_model import job_row

from runtime.settings import PROJECT_ROOT
from spark_jobs.operations.changelog_tuning import history, topic_configs
from spark_jobs.operations.changelog_tuning.measure import broker_log_dirs, measure_changelog
from spark_jobs.registry import get_job
from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.changelog import ChangelogTopic, changelog_topic_name
from tests.helpers import wait_for as _wait

pytestmark = pytest.mark.integration

JOB_MODULES = "tests.fixtures.tuning_jobs"
KEYS, BATCHES = 60, 80
#: a tight policy, so the effect shows within seconds: roll segments every 2.5 s, target 1.5 records
#: per live key (-> min.cleanable.dirty.ratio 0.33), alert after 2 runs above it
POLICY = {
    "STREAMSTATE_COMPACTION_TARGET_REPLAY_RATIO": "1.5",
    "STREAMSTATE_COMPACTION_MAX_UNCOMPACTED_MS": "5000",
    "STREAMSTATE_COMPACTION_MIN_SEGMENT_MS": "1000",
    "STREAMSTATE_COMPACTION_ALERT_AFTER_RUNS": "2",
}


@pytest.fixture(scope="module")
def run_dag(dag_runner, kafka_broker, webhook):
    env = {
        "STREAMSTATE_JOB_MODULES": JOB_MODULES,
        "PYTHONPATH": str(PROJECT_ROOT),
        **POLICY,
        "AIRFLOW_CONN_STREAMSTATE_WEBHOOK": json.dumps({"conn_type": "http", "host": webhook.url}),
    }

    def run(conf: dict):
        result = dag_runner.dags_test(
            "tune_changelog_compaction", conf, env=env, dag_file=PROJECT_ROOT / "dags" / "tune_changelogs.py"
        )
        assert result.returncode == 0, f"DAG run failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STREAMSTATE_JOB_MODULES", JOB_MODULES)
        yield run


def _write_batches(bootstrap: str, topic: str, partitions: int, batches: range, keys: int) -> None:
    """What the changelog writer does per micro-batch: each changed key's full value, tagged with the
    batch id, then a batch marker in every partition. ``keys=0``: an idle batch (markers only)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "log_level": 3})
    for batch in batches:
        header = [(BATCH_HEADER, str(batch).encode())]
        for k in range(keys):
            value = json.dumps({"user_id": f"user-{k:03d}", "purchases": batch, "note": "x" * 80}).encode()
            producer.produce(topic, key=f"user-{k:03d}".encode(), value=value, headers=header)
        producer.flush(30)
        marker = BatchMarker(batch, {"tuning-purchases": {0: batch}}, keys).to_bytes()
        for p in range(partitions):
            producer.produce(topic, key=MARKER_KEY, value=marker, partition=p, headers=header)
    assert producer.flush(30) == 0


def _configs(bootstrap: str, topics: list[str]) -> dict:
    return topic_configs.describe(AdminClient({"bootstrap.servers": bootstrap}), topics)


def test_tuning_compacts_a_churny_changelog_and_rolls_back(settings, run_dag, webhook):
    bootstrap = settings.kafka_bootstrap_servers
    spec = get_job("tuned_counts")

    def ours(webhook) -> list[dict]:
        """This job's alerts: the DAG tunes every registered job's changelogs, the built-in jobs' too, which
        another test on this worker's broker may have left above the tight target."""
        return [a for a in webhook.received if a["application_id"] == spec.application_id]

    stores = {s.name: s for s in spec.stores}
    topics = {name: changelog_topic_name(spec.application_id, name) for name in stores}
    # topics as an older platform version created them: the windowed one only compacted and kept no longer
    # than the store keeps windows, the versioned one without protection for its history
    overrides = {
        "windows": {"cleanup.policy": "compact", "retention.ms": "3600000"},
        "history": {"min.compaction.lag.ms": "0"},
    }
    for name, store in stores.items():
        ChangelogTopic(
            spec.application_id,
            name,
            spec.source_partitions,
            kind=store.kind,
            retention_ms=store.retention_ms,
            overrides=overrides.get(name, {}),
        ).ensure(bootstrap)
        _write_batches(bootstrap, topics[name], spec.source_partitions, range(BATCHES), KEYS)
    records = KEYS * BATCHES + spec.source_partitions * BATCHES
    original = _configs(bootstrap, list(topics.values()))

    # 1. dry run: measured and recommended (with reasons), no topic config changes
    run_dag({"mode": "dry_run"})
    assert _configs(bootstrap, list(topics.values())) == original
    rows = {r["topic"]: r for r in history.measurements(settings) if r["job"] == "tuned_counts"}
    assert set(rows) == set(topics.values())
    counts = rows[topics["counts"]]
    assert (counts["records"], counts["live_keys"], counts["bytes_source"]) == (records, KEYS, "log_dirs")
    assert counts["obsolete"] == records - KEYS - spec.source_partitions and counts["tombstones"] == 0
    proposed = {(r["topic"], r["config"]): r for r in history.changes(settings) if r["action"] == history.DRY_RUN}
    assert proposed[(topics["counts"], "segment.ms")]["new_value"] == "2500"
    assert proposed[(topics["counts"], "min.cleanable.dirty.ratio")]["new_value"] == "0.33"
    assert proposed[(topics["windows"], "cleanup.policy")]["new_value"] == "compact,delete"
    assert proposed[(topics["windows"], "retention.ms")]["new_value"] == str(3_600_000 + 86_400_000)
    assert proposed[(topics["history"], "min.compaction.lag.ms")]["new_value"] == "7200000"
    assert all(r["reason"] for r in proposed.values())
    assert ours(webhook) == []  # one run above target is not an alert yet

    # 2. a second run above target: on-call hears it, once per store
    run_dag({"mode": "dry_run"})
    firing = [(a["condition"], a["status"]) for a in ours(webhook)]
    assert sorted(firing) == sorted((f"changelog_replay_{name}", "firing") for name in stores)
    # the jobs page shows the numbers and the open alert
    row = job_row(spec, settings)
    assert row.changelogs["counts"].records == records
    assert ("changelog_tuning", "changelog_replay_counts") in {(a.source, a.condition) for a in row.open_alerts}
    assert f"counts: {records:,} / {KEYS}" in render_rows([row])

    # 3. apply: the recommendations are applied, verified, and the previous values kept
    run_dag({"mode": "apply"})
    tuned = _configs(bootstrap, list(topics.values()))
    assert tuned[topics["counts"]]["segment.ms"] == topic_configs.ConfigValue("2500", False)
    assert tuned[topics["windows"]]["cleanup.policy"].value == "compact,delete"
    assert int(tuned[topics["history"]]["min.compaction.lag.ms"].value) >= stores["history"].retention_ms
    assert len(ours(webhook)) == len(stores)  # still above target: no second alert

    # the job keeps running (an idle batch: markers only), its segments roll, the log cleaner compacts
    for name in ("counts", "windows"):
        _write_batches(bootstrap, topics[name], spec.source_partitions, range(BATCHES, BATCHES + 1), 0)
    log_dirs = broker_log_dirs(AdminClient({"bootstrap.servers": bootstrap}))
    _wait(
        lambda: (
            measure_changelog(bootstrap, topics["counts"], max_records=10**6, log_dirs=log_dirs).records * 5 <= records
        ),
        180,
        "the log cleaner to compact the tuned changelog",
    )

    # 4. the DAG's own measurement shows the drop; nothing more to change; the alerts resolve
    run_dag({"mode": "dry_run"})
    measured = history.measurements(settings, topics["counts"])
    before, after = measured[0], measured[-1]
    assert before["records"] >= 5 * after["records"] and after["live_keys"] == KEYS
    assert history.before_and_after(measured, history.changes(settings, topics["counts"]))["records_reduction"] >= 5
    assert not [
        r for r in history.changes(settings) if r["action"] == history.DRY_RUN and r["at"] > measured[-2]["measured_at"]
    ]
    assert sorted((a["condition"], a["status"]) for a in ours(webhook)[len(stores) :]) == sorted(
        (f"changelog_replay_{name}", "resolved") for name in stores
    )

    # 5. rollback restores the previous values exactly (defaults become defaults again)
    run_dag({"mode": "rollback", "topics": [topics["counts"]]})
    assert _configs(bootstrap, [topics["counts"]])[topics["counts"]] == original[topics["counts"]]
    assert history.is_held(history.changes(settings, topics["counts"]))
