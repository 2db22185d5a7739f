"""A micro-batch of a job with several stores reaches their changelogs together (real broker, real Spark)."""

from __future__ import annotations

import pytest

from spark_jobs.state.changelog import ChangelogTopic, fenced_writer, write_batches
from spark_jobs.state.changelog_reader import last_complete_batch
from spark_jobs.state.fencing import WriterFence
from tests.helpers import wait_for

pytestmark = pytest.mark.integration


def test_several_stores_complete_a_batch_together_or_not_at_all(spark, kafka_broker, settings, unique):
    from pyspark.sql import functions as F

    kafka, app = settings.kafka, f"stores-{unique}"
    fence = WriterFence(kafka, app, f"{app}-transactions", f"{app}-generations")
    fence.claim_generation()
    writers = []
    for store in ("counts", "items"):
        topic = ChangelogTopic(app, store, partitions=2)
        topic.ensure(kafka)
        writers.append(fenced_writer(topic, kafka, fence))
    counts, items = writers
    changes = spark.createDataFrame([("u1", '{"n": 1}'), ("u2", None)], "key STRING, value STRING")

    # The driver dies while writing the second store's records: the first store's records are written,
    # but no store's batch is complete (its markers would have made the first one a batch ahead).
    dying = changes.select("key", F.expr("raise_error('the driver died here')").cast("string").alias("value"))
    with pytest.raises(Exception, match="the driver died here"):
        write_batches([(counts, changes), (items, dying)], 0, {"in": {0: 2}})
    assert last_complete_batch(kafka, counts.topic.name) is None
    assert last_complete_batch(kafka, items.topic.name) is None

    # The replayed batch completes both, at one batch id and one input position.
    assert write_batches([(counts, changes), (items, changes)], 0, {"in": {0: 2}}) == {"counts": 2, "items": 2}
    for writer in writers:
        # A commit returns once the coordinator has decided it; the markers that make the records readable to
        # read_committed consumers reach the topic's partitions just after (Kafka's two-phase commit), later
        # still on a busy machine (a suite run read nothing yet here).
        complete = wait_for(lambda w=writer: last_complete_batch(kafka, w.topic.name), 30, "the batch's markers")
        assert (complete.batch_id, complete.input_offsets) == (fence.batch_base, {"in": {0: 2}})
    fence.close()
