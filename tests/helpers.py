"""Independent reference computations and Kafka read-back used by the tests (plain Python)."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal

from confluent_kafka import Consumer, TopicPartition


def read_topic(bootstrap_servers: str, topic: str, timeout_s: float = 30) -> list[dict]:
    """Every record currently in ``topic``, decoded from JSON, read with a throwaway consumer."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"tests-readback-{topic}",
                         "enable.auto.commit": False, "log_level": 3})  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        ends = {}
        assignment = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if high > low:
                ends[p] = high
                assignment.append(TopicPartition(topic, p, low))
        consumer.assign(assignment)
        records: list[dict] = []
        while ends:
            msg = consumer.poll(timeout_s)
            if msg is None:
                raise TimeoutError(f"read-back of {topic} stalled with {ends} left")
            if msg.error():
                raise RuntimeError(msg.error())
            records.append(json.loads(msg.value()))
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
        return records
    finally:
        consumer.close()


def expected_purchase_counts(events: list[dict]) -> dict[str, tuple[int, Decimal]]:
    """user_id -> (purchases, amount spent), computed without Spark."""
    totals: dict[str, list] = defaultdict(lambda: [0, Decimal("0")])
    for event in events:
        if event.get("type") == "purchase" and event.get("user_id"):
            totals[event["user_id"]][0] += 1
            totals[event["user_id"]][1] += Decimal(str(event["amount"]))
    return {user: (n, amount) for user, (n, amount) in totals.items()}


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
