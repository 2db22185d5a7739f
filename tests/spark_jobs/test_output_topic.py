"""A job's outputs in Kafka, for the jobs that read them: the version's upsert topic holds, per key, the
latest output row (a deleted key's tombstone), written in the transaction of the batch's changelog
markers: equal to the Delta outputs and the reference, and across kill -9 between a batch's Delta write and
its markers a read-committed reader never sees that batch's results before its changelog is complete."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal

import pytest

from bench.answers import latest_per_key
from spark_jobs.generators import purchases
from spark_jobs.kafka_topics import ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.testing import JobHarness

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
    from spark_jobs.jobs.patient_heart_rate import HEART_RATE
    from spark_jobs.jobs.user_sessions import VISITS

    VISITS.check(dataclasses.replace(get_job("user_sessions"), output_topic="sessions"))
    HEART_RATE.check(dataclasses.replace(get_job("patient_heart_rate"), output_topic="windows"))
    with pytest.raises(JobSpecError, match="output_topic_partitions"):
        dataclasses.replace(get_job("patient_heart_rate"), output_topic_partitions=1)


@pytest.mark.faults
def test_a_batch_killed_before_its_markers_publishes_nothing(settings, kafka_broker, spark):
    """kill -9 after a batch's Delta write, before its markers: a read-committed reader of the output topic
    sees none of that batch; after the restart and a drain, the topic equals the reference."""
    from spark_jobs.registry import registered_versions
    from spark_jobs.run import run
    from tests.faults.test_driver_kills import Kill, kill_at

    stack = settings.replace(job_modules="tests.fixtures.repartition_jobs")
    spec = registered_versions(stack.job_modules)["published_counts"][1]
    ensure_topic(stack.kafka, spec.source_topic, spec.source_partitions)
    events = list(purchases.generate(600, users=50, seed=17, close_rate=0.05))
    purchases.produce(stack.kafka, spec.source_topic, events)
    kill_at(stack, spec, Kill("between_outputs_and_markers", 1), "published-kill.log")
    layout = JobLayout.of(spec, stack)
    assert latest_per_key(stack.kafka, layout.output_topic) == {}, "a batch without markers published results"

    report = run(spec, stack, available_now=True, spark=spark)
    assert report.error is None
    want = purchases.expected_counts(e for e in events if purchases.is_valid(e))
    assert _published(stack, spec) == want
