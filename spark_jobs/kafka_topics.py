"""Create the Kafka topics the platform uses, explicitly and idempotently (auto-create is off)."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException
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
