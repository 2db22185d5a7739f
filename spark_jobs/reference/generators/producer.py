"""Write generated events to Kafka the way a real producer would: keyed, JSON, acknowledged."""

from __future__ import annotations

import json
from collections.abc import Iterable

from confluent_kafka import Producer

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.io.kafka_topics import kafka_partition, murmur2  # noqa: F401 - the generators' partitioner


def produce_keyed(kafka: KafkaTarget, topic: str, events: Iterable[dict | bytes], key_field: str) -> int:
    """Write ``events`` to ``topic`` keyed by ``event[key_field]`` in list order (JSON); a ``bytes`` event is
    written as it is, without a key (a record no job can decode, for tests). Returns the count acked.

    murmur2 is the Java client's (and Spark's) partitioner: a key lands on the same partition number
    in the source topic and in the changelog topics Spark writes. Idempotence keeps one key's events
    in order through retries.
    """
    producer, failures, on_delivery = _keyed_producer(kafka)
    sent = 0

    for event in events:
        key = event.get(key_field) if isinstance(event, dict) else None
        value = event if isinstance(event, bytes) else json.dumps(event).encode()
        while True:
            try:
                producer.produce(
                    topic, key=key.encode() if isinstance(key, str) else None, value=value, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining} events unsent, {len(failures)} failed (first: {failures[:1]})")
    return sent


def _keyed_producer(kafka: KafkaTarget):
    """(producer, failures, on_delivery): an idempotent producer partitioning by murmur2 (the Java client's), and
    the list its delivery callback appends each failure to."""
    producer = Producer(
        client_config(
            kafka, {"linger.ms": 20, "enable.idempotence": True, "partitioner": "murmur2_random", "log_level": 3}
        )
    )
    failures: list[str] = []

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(str(err))

    return producer, failures, on_delivery


def produce_encoded(kafka: KafkaTarget, topic: str, records: Iterable[tuple[str, bytes, int | None]]) -> int:
    """Write ``(key, value, timestamp ms)`` records, already encoded, to ``topic`` in iteration order (a None
    timestamp: the producer's clock), each key to its murmur2 partition as :func:`produce_keyed` does: the
    benchmarks' fast path for millions of records (no JSON encoding here, no per-record callback). Returns the
    count acked."""
    producer, failures, on_delivery = _keyed_producer(kafka)
    sent = 0

    for key, value, timestamp in records:
        while True:
            try:
                if timestamp is None:
                    producer.produce(topic, key=key.encode(), value=value, on_delivery=on_delivery)
                else:
                    producer.produce(topic, key=key.encode(), value=value, timestamp=timestamp, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
        if sent % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining} records unsent, {len(failures)} failed (first: {failures[:1]})")
    return sent


def produce_unkeyed(
    kafka: KafkaTarget, topic: str, events: Iterable[dict | bytes], partitions: int, seed: int = 0
) -> int:
    """Write ``events`` to ``topic`` without a Kafka key, as many producers do (a client's default, or a
    service that does not know the consumers' key), each to a partition drawn by a generator seeded with
    ``seed`` over ``partitions``, in list order within a partition. Returns the count acked."""
    import random

    draw = random.Random(seed)
    producer = Producer(client_config(kafka, {"linger.ms": 20, "enable.idempotence": True, "log_level": 3}))
    sent = 0
    for event in events:
        value = event if isinstance(event, bytes) else json.dumps(event).encode()
        while True:
            try:
                producer.produce(topic, value=value, partition=draw.randrange(partitions))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
    if remaining := producer.flush(60):
        raise RuntimeError(f"{remaining} events unsent")
    return sent
