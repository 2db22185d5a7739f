"""Independent reference computations and Kafka read-back used by the tests (plain Python)."""

from __future__ import annotations

from decimal import Decimal

from confluent_kafka import Consumer, TopicPartition

from spark_jobs.generators.purchases import expected_counts as expected_purchase_counts  # noqa: F401
from spark_jobs.kafka_topics import read_json_records as read_topic  # noqa: F401


def delta_purchase_counts(spark, path: str) -> dict[str, tuple[int, Decimal]]:
    return {r.user_id: (r.purchases, r.amount_spent) for r in spark.read.format("delta").load(path).collect()}


def end_offsets(bootstrap_servers: str, topic: str) -> dict[int, int]:
    """partition -> high watermark (the next offset to be written) of ``topic``."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "tests-end-offsets"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        consumer.close()
