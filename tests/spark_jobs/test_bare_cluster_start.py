"""A job's first start on a bare cluster: a broker that creates no topic on first use
(``auto.create.topics.enable=false``, as the local broker and most production clusters run) and holds only the
job's source topics, the way a user deploys a new job. The platform creates every topic a version writes before
any of its queries starts (:meth:`spark_jobs.driver.context.JobContext.ensure_topics`); a re-keyed job's re-keying stage
writes its first batch's dead letters before the stateful stage is even built, so its dead-letter topic must
already be there (it was not: the driver died after 60 s of ``Topic ... not present in metadata``, and again on
every restart).

The drivers are launched as the supervise DAG launches them (the same spark-submit command, no
``--available-now``: the stages run side by side), with records that have no routable key in the first batch;
each must reach RUNNING with its dead letters in the dead-letter topic. The other jobs' first starts go through
the same ``ensure_topics`` in every test that runs them (``spark_jobs.testing.JobHarness`` creates only sources).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from streamstate.hooks.streaming_job import StreamingJobHook

from runtime.kafka_connection import client_config
from runtime.settings import PROJECT_ROOT
from spark_jobs.driver.lifecycle import JobState
from spark_jobs.driver.run import run
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.reference.generators import purchases
from spark_jobs.reference.generators.producer import produce_unkeyed
from spark_jobs.registry import registered_versions
from spark_jobs.versions import read_rows
from tests.helpers import wait_for

pytestmark = pytest.mark.integration

MODULES = "tests.fixtures.repartition_jobs,tests.fixtures.store_kind_jobs"

#: records no re-keying can route: no key field, not JSON
UNROUTABLE = (b'{"amount": 1.0, "event_time": "2026-11-29T00:00:00Z"}', b"{not json")


def _topics(settings) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient(client_config(settings.kafka)).list_topics(timeout=30).topics)


def _records(settings, topic: str) -> int:
    return sum(high - low for low, high in partition_offsets(settings.kafka, topic).values())


@pytest.mark.parametrize(
    "job, valid",
    [
        # a re-keyed stream-stream join with an output topic: orders without keys, the payments' topic empty
        (
            "kills_order_payments_rekeyed",
            b'{"order_id": "o1", "customer_id": "c1", "amount": 3.0, "event_time": "2026-11-29T00:00:01Z"}',
        ),
    ],
)
def test_a_re_keyed_job_starts_on_a_broker_holding_only_its_sources(private_stack, job, valid):
    settings = private_stack.replace(job_modules=MODULES)
    spec = max(registered_versions(MODULES)[job].values(), key=lambda s: s.version)
    layout = JobLayout.of(spec, settings)
    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions)
    if spec.join_topics:
        ensure_topic(settings.kafka, spec.join_topics[0], spec.state_partitions)
    assert not set(layout.topics) & _topics(settings), "the test starts with the sources only"
    produce_unkeyed(settings.kafka, spec.source_topic, [*UNROUTABLE, valid], spec.source_partitions)

    hook = StreamingJobHook(spec, settings)
    submit = submit_spec(spec, settings)
    launch = hook.launch(submit.command(), {**os.environ, **submit.env, "PYTHONPATH": str(PROJECT_ROOT)}, "test")
    exit_file = Path(launch["exit_file"])
    try:

        def running_with_letters() -> bool:
            assert not exit_file.exists(), f"the driver exited ({exit_file.read_text().strip()}); see {launch['log']}"
            status = hook.status()
            return status is not None and status.state is JobState.RUNNING and (hook.dead_letters() or 0) >= 2

        wait_for(running_with_letters, 180, f"{spec.application_id} RUNNING with its dead letters")
        assert set(layout.topics) - {layout.generations_topic} <= _topics(settings)
    finally:
        if hook.stop() is None:
            hook.stop_launch(launch["launcher_pid"])
        wait_for(exit_file.exists, 60, "the driver to stop")
    assert exit_file.read_text().strip() == "0", f"the driver stopped with {exit_file.read_text()}; see {launch['log']}"


def test_a_re_keyed_job_drains_its_first_backlog_on_a_broker_holding_only_its_source(private_stack, spark):
    """The same first start drained (``--available-now``, a backfill): the re-keying stage runs to its end before
    the stateful stage is built, so its dead letters find their topic only if the platform made it first. Every
    dead letter names its record's place in the source topic, whichever stage refused it: the re-keying stage
    the unroutable records, the stateful stage a purchase of a negative amount (read from the repartition topic,
    its place in the source carried in the record's headers)."""
    from spark_jobs.io.kafka_topics import read_partition
    from tests.spark_jobs.test_dead_letter import read_with_headers

    settings = private_stack.replace(job_modules=MODULES)
    spec = registered_versions(MODULES)["rekeyed_counts"][1]
    ensure_topic(settings.kafka, spec.source_topic, spec.source_partitions)
    valid = list(purchases.generate(30, users=3, seed=4, close_rate=0))
    negative = {**valid[0], "event_id": "negative", "amount": -5.0}
    records = [*UNROUTABLE, *map(_json, [*valid, negative])]
    produce_unkeyed(settings.kafka, spec.source_topic, records, spec.source_partitions)
    report = run(spec, settings, available_now=True, spark=spark)
    assert report.error is None
    assert len(read_rows(report.output)) == 3

    consumer = Consumer(client_config(settings.kafka, {"group.id": "places", "enable.partition.eof": True}))
    try:
        place = {
            msg.value(): (spec.source_topic, str(p), str(msg.offset()))
            for p in range(spec.source_partitions)
            for msg in read_partition(consumer, spec.source_topic, p)
        }
    finally:
        consumer.close()
    letters = read_with_headers(settings.kafka_bootstrap_servers, JobLayout.of(spec, settings).dead_letter_topic)
    named = {
        letter["value"]: tuple(letter["headers"][f"source.{n}"] for n in ("topic", "partition", "offset"))
        for letter in letters
    }
    assert named == {value: place[value] for value in [*UNROUTABLE, _json(negative)]}
    reasons = {letter["value"]: letter["headers"]["reason"] for letter in letters}
    assert reasons[_json(negative)] == "failed_validation"


def _json(event: dict) -> bytes:
    return json.dumps(event).encode()
