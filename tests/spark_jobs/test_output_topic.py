"""A job's outputs in Kafka, for the jobs that read them: the version's upsert topic holds, per key, the
latest output row (a deleted key's tombstone), written in the transaction of the batch's changelog
markers, before the Delta write: equal to the Delta outputs and the reference, and across kill -9 between the
transaction and the Delta write each batch's results published once."""

from __future__ import annotations

import dataclasses
import itertools
import json
from decimal import Decimal

import pytest

from bench.answers import latest_per_key
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.testing import JobHarness
from spark_jobs.versions import read_rows

pytestmark = pytest.mark.integration


def _published(settings, spec) -> dict[str, tuple[int, Decimal]]:
    rows = latest_per_key(settings.kafka, JobLayout.of(spec, settings).output_topic)
    parsed = {user: json.loads(value) for user, value in rows.items()}
    assert all(row["user_id"] == user for user, row in parsed.items()), "keyed by the job's key"
    return {user: (row["purchases"], Decimal(str(row["amount_spent"]))) for user, row in parsed.items()}


def test_the_upsert_topic_holds_what_the_outputs_hold(settings, kafka_broker, spark, unique):
    spec = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"published_{unique}",
        source_topic=f"published-{unique}",
        output_table=f"published_{unique}",
        output_topic=f"counts-{unique}",
    )
    harness = JobHarness(settings=settings, spark=spark)
    events = list(purchases.adversarial(400, users=15, seed=5))
    first = harness.run(spec, events[:200])
    second = harness.run(spec, events[200:])
    want = purchases.expected_counts(e for e in events if purchases.is_valid(e))
    assert {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in second.outputs} == want
    assert _published(settings, spec) == want, "latest per key, deleted users tombstoned"
    assert first.outputs and any(e.get("type") == "account_closed" for e in events)
    layout = JobLayout.of(spec, settings)
    assert layout.output_topic == f"counts-{unique}-v{spec.version}" and layout.output_topic in layout.topics


def test_windowed_and_session_jobs_take_an_output_topic_and_its_partitions_need_one():
    from spark_jobs.reference.jobs.patient_heart_rate import HEART_RATE
    from spark_jobs.reference.jobs.user_sessions import VISITS

    VISITS.check(dataclasses.replace(get_job("user_sessions"), output_topic="sessions"))
    HEART_RATE.check(dataclasses.replace(get_job("patient_heart_rate"), output_topic="windows"))
    with pytest.raises(JobSpecError, match="output_topic_partitions"):
        dataclasses.replace(get_job("patient_heart_rate"), output_topic_partitions=1)


@pytest.mark.faults
def test_a_batch_killed_between_its_transaction_and_its_outputs_publishes_it_once(settings, kafka_broker, spark):
    """A job whose outputs are its store's view commits a batch's transaction (changelog, markers, output
    records) before its Delta write, so the topic's readers need not wait for the outputs. kill -9 between the
    two: a read-committed reader of the topic has the batch's results, the outputs have not; the restart
    replays the batch from the checkpoint and publishes nothing again; killed there once more with the
    checkpoint lost, the last run restores the store and makes the outputs equal to it. After a drain the
    topic and the outputs equal the reference, each key's results published once per batch that changed it."""
    from spark_jobs.driver.run import run
    from spark_jobs.registry import registered_versions
    from tests.faults.test_driver_kills import Kill, kill_at
    from tests.helpers import every_record

    stack = settings.replace(job_modules="tests.fixtures.repartition_jobs")
    spec = registered_versions(stack.job_modules)["published_counts"][1]
    ensure_topic(stack.kafka, spec.source_topic, spec.source_partitions)
    events = list(purchases.generate(600, users=50, seed=17, close_rate=0.05))
    purchases.produce(stack.kafka, spec.source_topic, events)
    kill_at(stack, spec, Kill("between_markers_and_outputs", 1), "published-kill-1.log")
    layout = JobLayout.of(spec, stack)
    assert latest_per_key(stack.kafka, layout.output_topic), "the committed transaction published the batch"
    assert not read_rows(layout.output_table), "the outputs were written before the transaction"
    # the next driver replays that batch (its transaction committed already: nothing published again) and is
    # killed at the same point, its checkpoint lost: the last run restores the store and rebuilds the outputs
    kill_at(stack, spec, Kill("between_markers_and_outputs", 1, lose_checkpoint=True), "published-kill-2.log")

    report = run(spec, stack, available_now=True, spark=spark)
    assert report.error is None
    want = purchases.expected_counts(e for e in events if purchases.is_valid(e))
    assert _published(stack, spec) == want
    assert {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in read_rows(report.output)} == want
    # a key's result changes with every batch that touches it (a count grows; a closed account's tombstone
    # follows a row): the same value twice in a row is a batch published again by its replay
    by_key: dict[str, list] = {}
    for _, key, value in every_record(stack.kafka, layout.output_topic):
        by_key.setdefault(key, []).append(value)
    repeated = [key for key, values in by_key.items() if any(a == b for a, b in itertools.pairwise(values))]
    assert not repeated, f"published twice: {repeated[:3]}"
