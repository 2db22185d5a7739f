"""How far a job version has consumed its sources: the one answer the reprocessing plan, the catch-up
wait, the comparison and the promotion read.

For a job reading its source directly, that is the offsets its checkpoint's newest committed batch ends
at. A job that re-keys its source (``JobSpec.repartition``, :mod:`spark_jobs.io.repartition`) consumes it in
two stages: the re-keying query's checkpoint records how far the source was re-keyed (``rekeyed``), the
stateful query's how far it applied the repartition topic. A source record counts as consumed only when
both are done, as a Kafka Streams application has consumed an input only when its sub-topology behind
the repartition topic has processed what the first one wrote for it:

1. read ``rekeyed`` (the re-keying checkpoint's commit log is written after the batch's transaction
   committed: every record re-keyed below ``rekeyed`` is committed in the repartition topic);
2. read, *after* that, the repartition topic's committed end (last stable offsets): it covers those records;
3. read the stateful checkpoint's committed repartition offsets (``applied``). When they reach that end,
   the version has consumed the source up to ``rekeyed``. Otherwise the records between ``applied`` and
   the end are pending: their ``streamstate.origin.*`` headers name their source offsets, and the version
   has consumed a source partition below the smallest origin offset still pending in it (and ``rekeyed``).

A join that re-keys its left side reads its ``join_topics`` in the stateful stage itself: its position there is
the stateful checkpoint's, as for a job that does not re-key.

Reading the pending records costs as many records as the stateful stage is behind the re-keying stage
(normally a batch or less); a caught-up version reads none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from runtime.kafka_connection import KafkaTarget
from spark_jobs.layout import JobLayout
from spark_jobs.state.checkpoint_offsets import (
    KafkaOffsets,
    batch_end_offsets,
    committed_input_offsets,
    latest_committed_batch_id,
)

_TIMEOUT_S = 30.0


def committed_source_offsets(layout: JobLayout, kafka: KafkaTarget) -> KafkaOffsets | None:
    """input topic -> partition -> next offset the version has yet to consume, for each topic producers write
    (``source_topic``, and a join's ``join_topics``: one query reads them all, one offset log holds them), or None
    before its first batch (see the module docstring; ``kafka`` is read for a re-keyed version only)."""
    if not layout.repartition:
        batch = latest_committed_batch_id(layout.checkpoint)
        if batch is None:
            return None
        ends = batch_end_offsets(layout.checkpoint, batch)
        return {topic: ends.get(topic, {}) for topic in layout.state_input_topics}
    rekeyed = committed_input_offsets(layout.repartition_checkpoint, layout.source_topic)
    if rekeyed is None:
        return None
    ends = committed_ends(kafka, layout.repartition_topic)  # read after ``rekeyed``: covers its records
    applied = committed_input_offsets(layout.checkpoint, layout.repartition_topic)
    behind = pending_ranges(ends, applied or {})
    # a join's tables are read by the stateful stage itself: its checkpoint's position there
    tables = {topic: committed_input_offsets(layout.checkpoint, topic) or {} for topic in layout.join_topics}
    if not behind:
        return {layout.source_topic: dict(rekeyed), **tables}
    if applied is None:  # re-keyed records wait, and the stateful stage has not completed a batch yet
        return None
    origins = _pending_origins(kafka, layout.repartition_topic, layout.source_topic, behind)
    return {layout.source_topic: applied_source_offsets(rekeyed, origins), **tables}


def pending_ranges(ends: dict[int, int], applied: dict[int, int]) -> dict[int, tuple[int, int]]:
    """repartition partition -> (first offset not applied, committed end), for the partitions behind."""
    return {p: (applied.get(p, 0), end) for p, end in ends.items() if applied.get(p, 0) < end}


def applied_source_offsets(rekeyed: dict[int, int], pending_origins: Iterable[tuple[int, int]]) -> dict[int, int]:
    """``rekeyed``, lowered in each source partition to the smallest origin offset of a record still pending
    in the repartition topic: below it every record of that partition was re-keyed and applied."""
    position = {int(p): int(o) for p, o in rekeyed.items()}
    for partition, offset in pending_origins:
        if partition in position:
            position[partition] = min(position[partition], offset)
    return position


def source_behind(committed: KafkaOffsets | None, targets: Mapping[str, Mapping]) -> KafkaOffsets:
    """topic -> partition -> records the version has still to consume to reach ``targets`` (topic -> partition
    -> offset; partitions as ints or strings, as JSON gives them); empty: caught up."""
    committed = committed or {}
    behind: KafkaOffsets = {}
    for topic, offsets in targets.items():
        done = committed.get(topic) or {}
        late = {int(p): int(t) - done.get(int(p), 0) for p, t in offsets.items() if done.get(int(p), 0) < int(t)}
        if late:
            behind[topic] = late
    return behind


def committed_ends(kafka: KafkaTarget, topic: str) -> dict[int, int]:
    """partition -> ``topic``'s last stable offset: the end a ``read_committed`` reader (the stateful stage)
    reaches, past every committed transaction's marker, before any transaction still open."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    from runtime.kafka_connection import client_config

    admin = AdminClient(client_config(kafka))
    partitions = admin.list_topics(topic, timeout=_TIMEOUT_S).topics[topic].partitions
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    futures = admin.list_offsets(request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=_TIMEOUT_S)
    return {tp.partition: future.result().offset for tp, future in futures.items()}


def _pending_origins(
    kafka: KafkaTarget, topic: str, source_topic: str, ranges: dict[int, tuple[int, int]]
) -> list[tuple[int, int]]:
    """(source partition, source offset) of the committed records of ``topic`` in ``ranges``."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from runtime.kafka_connection import client_config
    from spark_jobs.io.repartition import origin_in

    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": "streamstate-source-position",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "log_level": 3,
            },
        )
    )
    origins: list[tuple[int, int]] = []
    try:
        for partition, (start, end) in sorted(ranges.items()):
            consumer.assign([TopicPartition(topic, partition, start)])
            while True:
                msg = consumer.poll(_TIMEOUT_S)
                if msg is None:
                    raise TimeoutError(f"reading {topic}[{partition}]: nothing for {_TIMEOUT_S}s before {end}")
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        break
                    raise RuntimeError(f"reading {topic}[{partition}]: {msg.error()}")
                if msg.offset() >= end:
                    break
                origin = origin_in(msg.headers())
                if origin is not None and origin[0] == source_topic:
                    origins.append(origin[1:])
                if msg.offset() + 1 >= end:
                    break
    finally:
        consumer.close()
    return origins
