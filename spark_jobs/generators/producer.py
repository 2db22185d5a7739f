"""Write generated events to Kafka the way a real producer would: keyed, JSON, acknowledged."""

from __future__ import annotations

import json
from collections.abc import Iterable

from confluent_kafka import Producer

from runtime.kafka_connection import KafkaTarget, client_config


def produce_keyed(kafka: KafkaTarget, topic: str, events: Iterable[dict], key_field: str) -> int:
    """Write ``events`` to ``topic`` keyed by ``event[key_field]`` in list order. Returns the count acked.

    murmur2 is the Java client's (and Spark's) partitioner: a key lands on the same partition number
    in the source topic and in the changelog topics Spark writes. Idempotence keeps one key's events
    in order through retries.
    """
    producer = Producer(client_config(kafka, {"linger.ms": 20, "enable.idempotence": True,
                         "partitioner": "murmur2_random", "log_level": 3}))  # fmt: skip
    failures: list[str] = []
    sent = 0

    def on_delivery(err, _msg):
        if err is not None:
            failures.append(str(err))

    for event in events:
        key = event.get(key_field)
        while True:
            try:
                producer.produce(topic, key=key.encode() if isinstance(key, str) else None,
                                 value=json.dumps(event).encode(), on_delivery=on_delivery)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        sent += 1
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining} events unsent, {len(failures)} failed (first: {failures[:1]})")
    return sent
