"""Create the Kafka topics the platform uses, explicitly and idempotently (auto-create is off), and
read small topics back whole (checks, demos, tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def ensure_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> bool:
    """Create ``topic`` unless it exists. Returns True when it was created.

    Raises:
        ValueError: the topic exists with a different partition count (a silent mismatch would
            break the key -> partition mapping that state depends on).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    existing = admin.list_topics(timeout=timeout_s).topics
    if topic in existing:
        have = len(existing[topic].partitions)
        if have != partitions:
            raise ValueError(f"topic {topic!r} exists with {have} partitions, the platform expects {partitions}")
        return False
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor, config=dict(config or {}))
    try:
        admin.create_topics([new], operation_timeout=timeout_s)[topic].result(timeout=timeout_s)
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        return False
    return True


def read_json_records(bootstrap_servers: str, topic: str, timeout_s: float = 30) -> list[dict]:
    """Every record currently in ``topic``, decoded from JSON, partition by partition in offset order
    (so one key's records keep their order). Records that are not JSON objects are skipped."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"streamstate-readback-{topic}",
                         "enable.auto.commit": False, "log_level": 3})  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        records: list[dict] = []
        for p in sorted(partitions):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, p, low)])
            while True:
                msg = consumer.poll(timeout_s)
                if msg is None:
                    raise TimeoutError(f"read-back of {topic}[{p}] stalled before offset {high}")
                if msg.error():
                    raise RuntimeError(msg.error())
                try:
                    value = json.loads(msg.value()) if msg.value() is not None else None
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    records.append(value)
                if msg.offset() + 1 >= high:
                    break
        return records
    finally:
        consumer.close()
