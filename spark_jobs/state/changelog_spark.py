"""A store's changelog read by Spark's Kafka batch source, cut where the Python reader cuts it, with
no record passing through the driver.

Two passes over the range ``[start, end)`` of every partition:

1. a summary: every batch marker, and one row per (partition, batch header) with its count and its
   first and last offset. That is O(batches x partitions) rows, whatever the size of the store. The
   planner of :mod:`.cut_rules` turns them into the cut, the resume offsets and the ranges kept. A
   range of up to ``SUMMARY_IN_DRIVER_MAX_RECORDS`` is summarized by this process's consumer (values
   dropped as read): a Spark job costs seconds whatever its size, more in a JVM that has run nothing yet;
2. the changes (lazy): the data records of the kept ranges, reduced to the latest value per key in
   the order the rules apply them. After a checkpoint loss (void batches) the kept ranges are joined
   as a small broadcast table; otherwise the offset range ``[start, resume)`` is enough.

The result is a DataFrame ``(key STRING, value STRING)``, a null value being a delete: exactly the
changes :func:`.changelog_reader.read_changelog` would apply, for a snapshot (or an empty store) to
take in. Spark evaluates it where it is used (a restore's overlay, at once for a short tail, see
:func:`.snapshots.overlay`; the job's ``initialState``; a snapshot's layer).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from confluent_kafka import Consumer, TopicPartition

from runtime.kafka_connection import KafkaTarget, as_connection, client_config
from spark_jobs.io.kafka_topics import SPARK_SOURCE_FETCH, watermark_offsets
from spark_jobs.state.batch_records import BATCH_HEADER, MARKER_KEY, BatchMarker
from spark_jobs.state.changelog_reader import summarize_range
from spark_jobs.state.checkpoint_offsets import KafkaOffsets
from spark_jobs.state.cut_rules import BatchSpan, CutPlan, MarkerRecord, plan_cut

#: a range of up to this many offsets is summarized (pass 1) by the driver's consumer, not a Spark job
SUMMARY_IN_DRIVER_MAX_RECORDS = 1_000_000
#: ``fetch.max.wait.ms`` of the Kafka batch reads here (the Java consumer's default is 500)
BOUNDED_READ_FETCH_WAIT_MS = 10


@dataclasses.dataclass
class ChangelogFrame:
    """What a Spark read of a changelog range found (the fields of ``ChangelogRead`` but the state)."""

    topic: str
    plan: CutPlan
    #: DataFrame(key STRING, value STRING): the latest change per key of the applied batches (null: delete)
    changes: object
    #: per partition: where the range started (clamped to the log start) and where it ended
    start_offsets: dict[int, int]
    end_offsets: dict[int, int]

    @property
    def cut_batch_id(self) -> int | None:
        return self.plan.cut

    @property
    def input_offsets(self) -> KafkaOffsets:
        return self.plan.marker.input_offsets if self.plan.marker else {}

    @property
    def watermark_ms(self) -> int:
        return self.plan.marker.watermark_ms if self.plan.marker else 0

    @property
    def max_batch_seen(self) -> int | None:
        return self.plan.max_batch_seen

    @property
    def resume_offsets(self) -> dict[int, int]:
        return {**self.start_offsets, **self.plan.resume_offsets}

    @property
    def records_read(self) -> int:
        return sum(self.end_offsets[p] - self.start_offsets[p] for p in self.end_offsets)


def topic_range(
    kafka: KafkaTarget, topic: str, start_offsets: Mapping[int, int] | None, timeout_s: float = 30.0
) -> tuple[dict[int, int], dict[int, int]]:
    """Per partition of ``topic``: (start, end) of the range to read. A start below the log start
    (records compacted or deleted away) reads from the log start, as the Python reader does."""
    consumer = Consumer(client_config(kafka, {"group.id": f"streamstate-restore-{topic}", "log_level": 3}))
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        if metadata.error is not None:
            raise LookupError(f"changelog topic {topic}: {metadata.error}")
        start, end = {}, {}
        for p in sorted(metadata.partitions):
            low, high = watermark_offsets(consumer, TopicPartition(topic, p), timeout_s)
            start[p], end[p] = max(low, (start_offsets or {}).get(p, 0)), high
        return start, end
    finally:
        consumer.close()


def read_changelog_frame(
    spark, kafka: KafkaTarget, topic: str, start_offsets: Mapping[int, int] | None = None
) -> ChangelogFrame:
    """The changes of ``topic`` from ``start_offsets`` (default: the beginning) to its current end."""
    from pyspark.sql import functions as F

    start, end = topic_range(kafka, topic, start_offsets)
    records = _records(spark, kafka, topic, start, end)
    is_marker = F.col("key") == F.lit(MARKER_KEY)
    if sum(end[p] - start[p] for p in end) <= SUMMARY_IN_DRIVER_MAX_RECORDS:
        markers, spans = summarize_range(kafka, topic, start, end)
    else:
        markers, spans = _summarize_in_spark(records, is_marker)
    plan = plan_cut(end, markers, spans)

    data = records.where(~is_marker)
    if plan.offset_range_only:
        in_range = F.lit(False)
        for p, resume in plan.resume_offsets.items():
            in_range = in_range | ((F.col("partition") == p) & (F.col("offset") < resume))
        kept = data.where(in_range).withColumn("absorbed_at", F.col("offset"))
    else:
        # records without a batch header join as batch -1
        rows = [
            (k.partition, -1 if k.batch_id is None else k.batch_id, k.first_offset, k.end_offset, k.absorbed_at)
            for k in plan.kept
        ]
        ranges = spark.createDataFrame(
            rows, "k_partition INT, k_batch BIGINT, k_first BIGINT, k_end BIGINT, absorbed_at BIGINT"
        )
        kept = data.join(
            F.broadcast(ranges),
            (F.col("partition") == F.col("k_partition"))
            & (F.coalesce("batch_id", F.lit(-1)) == F.col("k_batch"))
            & (F.col("offset") >= F.col("k_first"))
            & (F.col("offset") < F.col("k_end")),
        )
    # the last change per key in apply order: (partition, absorbing marker, offset). Grouped by the key as text:
    # the aggregation sorts the records by key, and compares text in place where it copies a binary key out of
    # its row for every comparison (the keys of a store share long prefixes, so most comparisons go past the
    # sort's 8-byte prefix).
    latest = kept.groupBy(F.col("key").cast("string").alias("key")).agg(
        F.max(F.struct("partition", "absorbed_at", "offset", "value")).alias("last")
    )
    changes = latest.select("key", F.col("last.value").cast("string").alias("value"))
    return ChangelogFrame(topic, plan, changes, start, end)


def _summarize_in_spark(records, is_marker) -> tuple[list[MarkerRecord], list[BatchSpan]]:
    """Pass 1 by a Spark job: what :func:`.changelog_reader.summarize_range` finds, for a long range."""
    from pyspark.sql import functions as F

    # A marker is a group of its own (its offset, value and time are grouping keys, null for the data records), so
    # every aggregate is fixed-width: Spark's generated hash aggregation, where a list of the markers made it the
    # interpreted object aggregation (0.44 -> 0.33 s over 2e6 records: bench/changelog_summary_cost.py)
    marker_fields = [F.when(is_marker, F.col(c)).alias(f"marker_{c}") for c in ("offset", "value", "timestamp_ms")]
    summary = (
        records.groupBy("partition", "batch_id", is_marker.alias("is_marker"), *marker_fields)
        .agg(
            F.count(F.lit(1)).alias("records"),
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
        )
        .collect()
    )
    markers = [
        MarkerRecord(
            row["partition"],
            row["marker_offset"],
            BatchMarker.from_bytes(bytes(row["marker_value"])),
            row["marker_timestamp_ms"],
        )
        for row in summary
        if row["is_marker"]
    ]
    spans = [
        BatchSpan(row["partition"], row["batch_id"], row["records"], row["first_offset"], row["last_offset"])
        for row in summary
        if not row["is_marker"]
    ]
    return markers, spans


def _records(spark, kafka: KafkaTarget, topic: str, start: dict[int, int], end: dict[int, int]):
    """DataFrame(partition, offset, key, value, timestamp_ms, batch_id) of ``[start, end)`` per partition."""
    from pyspark.sql import functions as F

    # Spark wants every partition in both offset maps; an empty range (start == end) reads nothing.
    starting, ending = ({topic: {str(p): o for p, o in offsets.items()}} for offsets in (start, end))
    raw = (
        spark.read.format("kafka")
        .options(**as_connection(kafka).spark_options())
        .option("assign", json.dumps({topic: sorted(end)}))
        .option("startingOffsets", json.dumps(starting))
        .option("endingOffsets", json.dumps(ending))
        .option("includeHeaders", "true")
        .option("failOnDataLoss", "true")
        # a takeover aborts the fenced driver's open marker transaction: its markers must stay unseen
        .option("kafka.isolation.level", "read_committed")
        # every record of the range is in the log already, so there is nothing to wait for: with the Java
        # consumer's default (500 ms) a warm read of 2e5 records took 1.2 s, with 10 ms 0.6 s
        .option("kafka.fetch.max.wait.ms", str(BOUNDED_READ_FETCH_WAIT_MS))
        .option("groupIdPrefix", f"streamstate-restore-{topic}")
        .options(**SPARK_SOURCE_FETCH)
        .load()
    )
    header = F.filter("headers", lambda h: h["key"] == F.lit(BATCH_HEADER))
    return raw.select(
        "partition",
        "offset",
        "key",
        "value",
        (F.unix_millis("timestamp")).alias("timestamp_ms"),
        F.try_element_at(header, F.lit(1))["value"].cast("string").cast("bigint").alias("batch_id"),
    )
