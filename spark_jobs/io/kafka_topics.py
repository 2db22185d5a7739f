"""Create the Kafka topics the platform uses, explicitly and idempotently (auto-create is off), and
read small topics back whole (checks, demos, tests)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.kafka_connection import KafkaTarget, client_config

#: librdkafka's prefetch for reading a topic range to its end (a changelog's restore, snapshot, audit or
#: measurement; a copy): a short queue (10,000 records, fetches of 4 MB: its memory, about 15 MB) refilled 10 ms
#: after it fell below that. librdkafka's default back-off (1 s) leaves the reader waiting, none (0) has its
#: fetcher spin on the reader's cores: 800,000 changelog records were polled in 5.6 s with the defaults, 4.7 s
#: with no back-off and 1.8 s with this (BENCHMARKS.md, "The changelog reader's prefetch", 2026-12-01).
BOUNDED_READ_PREFETCH = {
    "fetch.max.bytes": 4 << 20,
    "queued.max.messages.kbytes": 4096,
    "queued.min.messages": 10_000,
    "fetch.queue.backoff.ms": 10,
}

#: Spark's Kafka source, as the platform's queries read (the stateful stage's source, the repartition stage's, a
#: changelog range read by Spark): Spark asks the broker for the partition's offset range (two ListOffsets round
#: trips) after every poll of its consumer, and the Java consumer returns at most ``max.poll.records`` (500 by
#: default) records a poll. Larger polls out of larger fetches make those round trips rare; a poll still returns
#: what the log holds at once, so a small micro-batch waits no longer (bench/kafka_read_cost.py).
SPARK_SOURCE_FETCH = {
    "kafka.max.poll.records": "20000",
    "kafka.max.partition.fetch.bytes": str(4 << 20),
}


def ensure_topic(
    kafka: KafkaTarget,
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
    admin = AdminClient(client_config(kafka))
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
    _wait_for_leaders(admin, topic, timeout_s)
    return True


def _wait_for_leaders(admin: AdminClient, topic: str, timeout_s: float) -> None:
    """Creation returns before every partition has an elected leader; the first reads and writes
    would then fail with NOT_LEADER / LEADER_NOT_AVAILABLE (seen in CI right after creation)."""
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and meta.partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r}: partitions still without a leader after {timeout_s}s")
        time.sleep(0.1)


def watermark_offsets(consumer: Consumer, partition: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """(low, high) offsets of ``partition``, retrying transient errors (a leader election after topic
    creation, a broker restart, a request that timed out on a busy machine) until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        # Each attempt gets a slice of the budget, so one timed-out request leaves time for another.
        attempt_s = max(0.5, min(timeout_s / 3, deadline - time.monotonic()))
        try:
            return consumer.get_watermark_offsets(partition, timeout=attempt_s)
        except KafkaException as err:
            if not is_transient(err.args[0]) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def is_transient(error: KafkaError) -> bool:
    """Whether a client error is one that passes by itself: retrying (or waiting) is the right answer.

    librdkafka reports a broker that is restarting or a request that timed out under load as errors;
    a follower of a changelog that gave up on them would fail every time the broker blinks.
    """
    return error.retriable() or error.code() in _TRANSIENT_CODES


_TRANSIENT_CODES = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._UNKNOWN_PARTITION,  # the client forgot the partition while the broker was away
    # a request in flight when the client dropped its handle of the broker that went away (seen in CI: the
    # standby's watermark request as the broker stopped); the client connects to it again when it is back
    KafkaError._DESTROY_BROKER,
}


def partition_offsets(kafka: KafkaTarget, topic: str, timeout_s: float = 30.0) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) watermark offsets of ``topic``; high is the next offset to be written."""
    consumer = Consumer(client_config(kafka, {"group.id": "streamstate-offsets", "log_level": 3}))
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        return {p: watermark_offsets(consumer, TopicPartition(topic, p), timeout_s) for p in sorted(partitions)}
    finally:
        consumer.close()


def read_partition(consumer: Consumer, topic: str, partition: int, timeout_s: float = 30.0) -> Iterator[Message]:
    """Every record of ``topic[partition]`` from its low to its current high watermark, in offset order
    (``consumer`` is assigned to it). Raises when the partition stalls or fails before the end.

    Give ``consumer`` ``enable.partition.eof``: the last offset of a partition written in transactions
    (a changelog's markers) is a commit marker no consumer receives, only the end of the partition."""
    low, high = watermark_offsets(consumer, TopicPartition(topic, partition), timeout_s)
    if high <= low:
        return
    consumer.assign([TopicPartition(topic, partition, low)])
    while True:
        msg = consumer.poll(timeout_s)
        if msg is None:
            raise TimeoutError(f"reading {topic}[{partition}]: no record for {timeout_s}s before offset {high}")
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return
            raise RuntimeError(f"reading {topic}[{partition}]: {msg.error()}")
        yield msg
        if msg.offset() + 1 >= high:
            return


def read_json_records(kafka: KafkaTarget, topic: str, timeout_s: float = 30) -> list[dict]:
    """Every record currently in ``topic``, decoded from JSON, partition by partition in offset order
    (so one key's records keep their order). Records that are not JSON objects are skipped."""
    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": f"streamstate-readback-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 3,
                **BOUNDED_READ_PREFETCH,
            },
        )
    )
    try:
        partitions = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        records: list[dict] = []
        for p in sorted(partitions):
            for msg in read_partition(consumer, topic, p, timeout_s):
                try:
                    value = json.loads(msg.value()) if msg.value() is not None else None
                except ValueError:
                    value = None
                if isinstance(value, dict):
                    records.append(value)
        return records
    finally:
        consumer.close()


def existing_topics(kafka: KafkaTarget, names: list[str], timeout_s: float = 30.0) -> set[str]:
    """Which of ``names`` exist on the cluster."""
    topics = AdminClient(client_config(kafka)).list_topics(timeout=timeout_s).topics
    return {name for name in names if name in topics and topics[name].error is None}


def partition_counts(kafka: KafkaTarget, names: list[str], timeout_s: float = 30.0) -> dict[str, int | None]:
    """Each of ``names``' partition count (None: the topic does not exist)."""
    topics = AdminClient(client_config(kafka)).list_topics(timeout=timeout_s).topics
    return {
        name: len(topics[name].partitions) if name in topics and topics[name].error is None else None for name in names
    }


def offsets_for_time(kafka: KafkaTarget, topic: str, at_ms: int, timeout_s: float = 30.0) -> dict[int, int]:
    """partition -> the first offset whose record timestamp is at or after ``at_ms`` (the high watermark
    when there is none: nothing to read yet). Kafka's ListOffsets by timestamp. A time before 1970 asks for
    1970: record timestamps are not negative, and a negative one in ListOffsets is a sentinel (-1 latest, -2
    earliest, -3 the largest timestamp...), which a broker refuses with UNSUPPORTED_VERSION for other values."""
    consumer = Consumer(client_config(kafka, {"group.id": "streamstate-offsets", "log_level": 3}))
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions)
        wanted = [TopicPartition(topic, p, max(at_ms, 0)) for p in partitions]
        found = consumer.offsets_for_times(wanted, timeout=timeout_s)
        result = {}
        for tp in found:
            if tp.error:
                raise RuntimeError(f"{topic}[{tp.partition}]: offset lookup by time failed: {tp.error}")
            result[tp.partition] = tp.offset if tp.offset >= 0 else watermark_offsets(consumer, tp, timeout_s)[1]
        return result
    finally:
        consumer.close()


def delete_topics(kafka: KafkaTarget, names: list[str], timeout_s: float = 60.0) -> list[str]:
    """Delete the topics of ``names`` that exist and wait until the cluster no longer lists them (a
    topic re-created while its deletion is pending would fail). Returns the ones deleted."""
    admin = AdminClient(client_config(kafka))
    present = sorted(existing_topics(kafka, names, timeout_s))
    if not present:
        return []
    for _topic, future in admin.delete_topics(present, operation_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    deadline = time.monotonic() + timeout_s
    while existing_topics(kafka, present, timeout_s):
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {present} still listed {timeout_s}s after their deletion")
        time.sleep(0.2)
    return present


def copy_newest_records(
    kafka: KafkaTarget,
    topic: str,
    target: str,
    per_partition: int,
    replication_factor: int = 1,
    timeout_s: float = 30.0,
) -> int:
    """Copy the newest ``per_partition`` committed records of each partition of ``topic`` to the same partition of
    ``target`` (created with as many partitions), keys, values, headers and timestamps as they are. Returns how
    many were copied.

    Raises:
        LookupError: ``topic`` does not exist.
    """
    from confluent_kafka import Producer

    bounds = partition_offsets(kafka, topic, timeout_s)
    if not bounds:
        raise LookupError(f"topic {topic} does not exist")
    # kept whatever their timestamps (a copy of old records would otherwise be due for deletion at once)
    ensure_topic(kafka, target, len(bounds), replication_factor, config={"retention.ms": "-1"})
    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": f"streamstate-copy-{target}",
                "enable.partition.eof": True,
                "log_level": 3,
                **BOUNDED_READ_PREFETCH,
            },
        )
    )
    producer = Producer(client_config(kafka, {"enable.idempotence": True, "linger.ms": 5, "log_level": 3}))
    copied = 0
    try:
        for partition, (low, high) in bounds.items():
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, max(low, high - per_partition))])
            while (msg := consumer.poll(timeout_s)) is not None:
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        break
                    raise RuntimeError(f"copying {topic}[{partition}]: {msg.error()}")
                producer.produce(
                    target,
                    key=msg.key(),
                    value=msg.value(),
                    headers=msg.headers(),
                    timestamp=msg.timestamp()[1],
                    partition=partition,
                )
                copied += 1
                if msg.offset() + 1 >= high:
                    break
        if producer.flush(timeout_s):
            raise TimeoutError(f"copying {topic} to {target}: records unsent after {timeout_s}s")
    finally:
        consumer.close()
    return copied


def truncate_topic(kafka: KafkaTarget, topic: str, timeout_s: float = 30.0) -> int:
    """Delete every record currently in ``topic`` (DeleteRecords up to the high watermark; the topic
    and its configuration stay). Returns how many records were deleted."""
    if topic not in existing_topics(kafka, [topic], timeout_s):
        return 0
    offsets = partition_offsets(kafka, topic, timeout_s)
    targets = [TopicPartition(topic, p, high) for p, (low, high) in offsets.items() if high > low]
    if targets:
        admin = AdminClient(client_config(kafka))
        for future in admin.delete_records(targets, operation_timeout=timeout_s).values():
            future.result(timeout=timeout_s)
    return sum(high - low for low, high in offsets.values())


def kafka_partition(key: str, partitions: int) -> int:
    """The partition the Java client's default partitioner (and :func:`produce_keyed`) puts ``key`` in:
    murmur2 of the key's bytes, made positive, modulo the partition count."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (``org.apache.kafka.common.utils.Utils.murmur2``) as an unsigned 32-bit int."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    whole = len(data) - len(data) % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = data[whole:]
    if len(rest) == 3:
        h ^= rest[2] << 16
    if len(rest) >= 2:
        h ^= rest[1] << 8
    if rest:
        h = ((h ^ rest[0]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)
