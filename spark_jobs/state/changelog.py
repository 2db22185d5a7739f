"""Changelog topics: every state change of every micro-batch, as (key, full value) or (key, null).

Kafka Streams logs each store to ``<application.id>-<store>-changelog``, a compacted topic whose
latest record per key *is* the store. Here the same topic is written once per micro-batch (the
trigger interval plays the seeds' ``commit.interval.ms``: one record per changed key per batch):

1. the changed keys of the batch, full value each (idempotent: a replayed batch rewrites the same
   values), deletes and evictions as tombstones, every record tagged with a ``streamstate.batch``
   header: for a small batch (:data:`DRIVER_RECORDS_MAX`) from the driver, in the markers' transaction
   below; for a larger one through Spark's Kafka sink, before it;
2. then one **batch marker** per partition, key :data:`MARKER_KEY`, carrying the batch id and the
   input offsets the batch consumed, in one Kafka transaction of the driver's claim of the job version
   (:mod:`.fencing`: a driver another one took over from has its markers refused). A reader cuts the
   log after the last batch whose markers reached every partition, so a half-written batch is never
   restored.

:class:`ChangelogWriter` owns the topic's contents; it does not know about Delta or snapshots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Producer

from runtime.kafka_connection import KafkaTarget, as_connection, client_config
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.layout import changelog_topic_name  # noqa: F401 - re-exported: the name has one owner
from spark_jobs.registry import StoreKind  # key_value, lru and in_memory stores' changelogs are alike: compacted
from spark_jobs.state.batch_records import (
    BATCH_HEADER,
    MARKER_KEY,
    BatchMarker,
    MarkerRecords,
    OutputRecords,
    carried_void,
)
from spark_jobs.state.changelog_reader import last_complete_batch
from spark_jobs.state.checkpoint_offsets import KafkaOffsets

if TYPE_CHECKING:
    from spark_jobs.io.driver_rows import DriverRows
    from spark_jobs.state.fencing import WriterFence

#: store kinds whose entries expire by time: their changelogs also delete by time (``compact,delete``)
TIME_DELETED_KINDS = ("windowed", "session")

#: Kafka Streams' ``windowstore.changelog.additional.retention.ms`` (its default): a windowed store's
#: changelog keeps records this much longer than the store keeps windows. Records carry the write's
#: wall-clock time, so a window written while stream time lags the clock (a replay) must outlive it.
WINDOWED_CHANGELOG_EXTRA_RETENTION_MS = 86_400_000

#: Spark's Kafka sink writing a batch's changes: LZ4-compressed record batches of up to 512 KB (the
#: client's 16 KB default makes one request per ~100 changes). The stored values are JSON of one schema,
#: which compresses several-fold: fewer bytes to write, keep and read back in every restore. Readers
#: (Spark's, this package's, Kafka's tools) decompress transparently.
CHANGES_PRODUCER_OPTIONS = {
    "kafka.compression.type": "lz4",
    "kafka.batch.size": str(512 * 1024),
    "kafka.linger.ms": "20",
}


#: A batch of at most this many change records per store goes to the changelog from the driver, in the one
#: transaction of its markers: one Spark job (collecting them) instead of two (a count, then Spark's Kafka sink
#: before the markers' transaction). A steady small batch's changelog phase is most of its fixed cost (issue 48's
#: profile, BENCHMARKS "A steady micro-batch's cost"). A larger batch is written by Spark's sink, its rows never
#: entering the driver.
DRIVER_RECORDS_MAX = 20_000


def windowed_changelog_retention_ms(retention_ms: int) -> int:
    """The changelog ``retention.ms`` of a windowed store that keeps each window ``retention_ms``."""
    return retention_ms + WINDOWED_CHANGELOG_EXTRA_RETENTION_MS


@dataclasses.dataclass(frozen=True)
class ChangelogTopic:
    """A store's changelog topic and its configs (the seeds' ``withLoggingEnabled(map)``).

    Attributes:
        application_id: the job version's application id.
        store: the state store name.
        partitions: the source topic's partition count (same key, same partition number).
        replication_factor: from the deployment settings.
        kind: ``windowed`` and ``session`` stores also delete by time (``compact,delete``); the others only compact.
        retention_ms: windowed stores: how long a window is kept after its start (the topic keeps
            records a day longer: :func:`windowed_changelog_retention_ms`); versioned: the history kept.
        overrides: any topic config, applied last.
    """

    application_id: str
    store: str
    partitions: int
    replication_factor: int = 1
    kind: StoreKind = "key_value"
    retention_ms: int | None = None
    overrides: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind in (*TIME_DELETED_KINDS, "versioned") and not self.retention_ms:
            raise ValueError(f"changelog of {self.kind} store {self.store!r} needs retention_ms")

    @property
    def name(self) -> str:
        return changelog_topic_name(self.application_id, self.store)

    def configs(self) -> dict[str, str]:
        configs = {
            "cleanup.policy": "compact,delete" if self.kind in TIME_DELETED_KINDS else "compact",
            # An acknowledged state change survives one broker loss where there are brokers to lose.
            "min.insync.replicas": str(min(2, self.replication_factor)),
            "message.timestamp.type": "CreateTime",
        }
        if self.kind in TIME_DELETED_KINDS:
            configs["retention.ms"] = str(windowed_changelog_retention_ms(self.retention_ms))
        if self.kind == "versioned":
            # Compaction must not remove history a versioned store still answers for.
            configs["min.compaction.lag.ms"] = str(self.retention_ms)
        configs.update({k: str(v) for k, v in self.overrides.items()})
        return configs

    def ensure(self, kafka: KafkaTarget) -> bool:
        """Create the topic with :meth:`configs` unless it exists. True when created."""
        return ensure_topic(kafka, self.name, self.partitions, self.replication_factor, self.configs())


class ChangelogWriter:
    """Appends one micro-batch of state changes, then its markers, to a store's changelog topic."""

    def __init__(
        self,
        topic: ChangelogTopic,
        kafka: KafkaTarget,
        *,
        batch_base: int = 0,
        void: tuple[tuple[int, int], ...] = (),
        fence: WriterFence | None = None,
        last_complete: BatchMarker | None = None,
    ) -> None:
        """``batch_base`` is added to Spark's batch id (a driver's: its generation's, ``fence.batch_base``);
        ``void`` goes on every marker. With a ``fence`` the markers are written in its transactions (a
        fenced driver's are refused); without one (tools, tests), by an idempotent producer.
        ``last_complete``: the topic's newest complete batch when the writer was opened (see
        :meth:`committed_already`)."""
        self.topic = topic
        self.kafka = kafka
        self.batch_base = batch_base
        self.void = void
        self.fence = fence
        self.last_complete = last_complete
        self._producer: Producer | None = None

    def write_batch(self, changes, spark_batch_id: int, input_offsets: KafkaOffsets, watermark_ms: int = 0) -> int:
        """Write ``changes`` (a Spark DataFrame with string columns ``key`` and ``value``; a null
        value is a tombstone), then the batch markers (:func:`write_batches`). Returns the number
        of change records written.

        The records are acknowledged before any marker is sent, or are in the markers' transaction, so a
        marker in a partition means the whole batch is in that partition.

        Raises:
            WriterFenced: a newer driver claimed the job version; this batch's markers were refused.
        """
        return write_batches([(self, changes)], spark_batch_id, input_offsets, watermark_ms)[self.topic.store]

    def committed_already(self, input_offsets: KafkaOffsets) -> bool:
        """Whether a batch ending at ``input_offsets`` was committed before this writer opened: Spark replays a
        batch from its checkpoint when the driver that ran it died after its transaction committed but before
        Spark's own commit log was written. (The replay writes its changes and markers again under new batch
        ids, which is harmless: full values; records read once, like a join's events, must not be written
        again.)"""
        last = self.last_complete
        return (
            last is not None
            and any(input_offsets.values())
            and all(
                offset <= last.input_offsets.get(topic, {}).get(int(partition), -1)
                for topic, offsets in input_offsets.items()
                for partition, offset in offsets.items()
            )
        )

    def collect_records(self, changes, spark_batch_id: int, rows: DriverRows | None = None) -> OutputRecords | None:
        """``changes`` as the records of the batch's transaction (:func:`write_batches`), each in the partition
        Spark's Kafka sink (the Java client's partitioner: murmur2 of the key) puts it in, tagged with the batch
        id; None when there are more than :data:`DRIVER_RECORDS_MAX` (then :meth:`write_records`). With ``rows``,
        ``changes`` is read through the batch's :class:`~spark_jobs.io.driver_rows.DriverRows` (announced there,
        known to be within the bound), else collected on its own."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark.sql import functions as F

        from spark_jobs.io.kafka_topics import kafka_partition

        if rows is not None:
            collected = rows.arrow(changes)
        else:
            bounded = changes.select(F.col("key").cast("string"), F.col("value")).limit(DRIVER_RECORDS_MAX + 1)
            collected = bounded.toArrow()
        if collected.num_rows > DRIVER_RECORDS_MAX:
            return None
        keys = collected.column("key").to_pylist()
        partitions = [kafka_partition(key, self.topic.partitions) for key in keys]
        header = (BATCH_HEADER, str(self.batch_base + spark_batch_id).encode())
        return OutputRecords(
            self.topic.name,
            [key.encode() for key in keys],
            pc.cast(collected.column("value"), pa.binary()).to_pylist(),  # the JSON text's UTF-8 bytes
            partitions,
            (header,),
        )

    def write_records(self, changes, spark_batch_id: int) -> int:
        """The data half of :meth:`write_batch`: ``changes`` to the topic through Spark's Kafka sink, each record
        tagged with the batch id, every one acknowledged on return; no marker. Returns the number of records."""
        from pyspark.sql import functions as F

        batch_id = self.batch_base + spark_batch_id
        header = F.array(F.struct(F.lit(BATCH_HEADER).alias("key"), F.lit(str(batch_id)).cast("binary").alias("value")))
        records = changes.select(
            F.col("key").cast("binary").alias("key"),
            F.col("value").cast("binary").alias("value"),
            header.alias("headers"),
        )
        count = records.count()
        if count:
            (
                records.write.format("kafka")
                .options(**as_connection(self.kafka).spark_options())
                .options(**CHANGES_PRODUCER_OPTIONS)
                .option("kafka.acks", "all")
                .option("topic", self.topic.name)
                .save()
            )
        return count

    def marker(
        self, spark_batch_id: int, input_offsets: KafkaOffsets, records: int, watermark_ms: int = 0
    ) -> BatchMarker:
        """The marker that completes batch ``spark_batch_id`` of ``records`` change records in this topic."""
        return BatchMarker(
            self.batch_base + spark_batch_id, input_offsets, records, void=self.void, watermark_ms=watermark_ms
        )

    def marker_records(self, marker: BatchMarker) -> MarkerRecords:
        """The marker as the records to write: one per partition of the topic."""
        return MarkerRecords(
            self.topic.name,
            range(self.topic.partitions),
            marker.to_bytes(),
            [(BATCH_HEADER, str(marker.batch_id).encode())],
        )

    def _write_markers(self, marker: BatchMarker) -> None:
        markers = self.marker_records(marker)
        if self.fence is not None:
            self.fence.commit_markers([markers])
            return
        if self._producer is None:
            self._producer = Producer(
                client_config(self.kafka, {"enable.idempotence": True, "acks": "all", "log_level": 3})
            )
        failures: list[str] = []
        for partition in markers.partitions:
            self._producer.produce(
                markers.topic,
                key=MARKER_KEY,
                value=markers.value,
                partition=partition,
                headers=markers.headers,
                on_delivery=lambda err, _msg: failures.append(str(err)) if err else None,
            )
        if self._producer.flush(60) or failures:
            raise RuntimeError(f"batch {marker.batch_id} markers not acknowledged on {self.topic.name}: {failures[:1]}")

    def close(self) -> None:
        """Flush and drop the marker producer (a later batch would open a new one)."""
        if self._producer is not None:
            self._producer.flush(30)
            self._producer = None


def fenced_writer(topic: ChangelogTopic, kafka: KafkaTarget, fence: WriterFence) -> ChangelogWriter:
    """A store's changelog writer for the driver that claimed ``fence``: batch ids of its generation, markers
    in its transactions, and the ids between the last complete batch and its first one declared void."""
    last = last_complete_batch(kafka, topic.name)
    void = carried_void(last.void if last else (), last.batch_id if last else -1, fence.batch_base)
    return ChangelogWriter(topic, kafka, batch_base=fence.batch_base, void=void, fence=fence, last_complete=last)


def write_batches(
    writers: Sequence[tuple[ChangelogWriter, object]],
    spark_batch_id: int,
    input_offsets: KafkaOffsets,
    watermark_ms: int = 0,
    records: Sequence = (),
    at_most: int | None = None,
    rows: DriverRows | None = None,
) -> dict[str, int]:
    """One micro-batch of several stores (``(writer, changes)`` each, see :meth:`ChangelogWriter.write_batch`):
    every store's records first, then every store's markers, **in one transaction** when the writers share
    a fence. A driver killed anywhere in between leaves every store at the same last complete batch, so a
    restore finds them at one input position (per-store transactions could leave one a batch ahead, and
    the restore would refuse to start). Returns the records written per store.

    With a fence, a store's records of a small batch (:data:`DRIVER_RECORDS_MAX`) are in that transaction too,
    collected to the driver; a larger batch's go through Spark's Kafka sink before it. Either way a reader
    cuts the log at the last complete markers, so what a restore sees is the same.

    ``records`` (``OutputRecords``: the batch's results in Kafka) go in that transaction, before the markers;
    they need a fence. ``at_most``: a bound on any store's records known beforehand (the store's change rows
    as the batch's count found them, or the processor's row count): above :data:`DRIVER_RECORDS_MAX`, Spark's sink
    writes them without a collection tried first.
    ``rows``: the batch's frames read in the driver, each store's ``changes`` among them (announced when
    :func:`collects_in_driver`).

    Raises:
        WriterFenced: a newer driver claimed the job version; no store's markers of this batch are visible.
    """
    fence = _shared_fence([w for w, _ in writers])
    collect = collects_in_driver([w for w, _ in writers], at_most)
    counts, in_transaction = {}, []
    for writer, changes in writers:
        collected = writer.collect_records(changes, spark_batch_id, rows) if collect else None
        if collected is None:
            counts[writer.topic.store] = writer.write_records(changes, spark_batch_id)
        else:
            counts[writer.topic.store] = len(collected.keys)
            in_transaction.append(collected)
    markers = [(w, w.marker(spark_batch_id, input_offsets, counts[w.topic.store], watermark_ms)) for w, _ in writers]
    if fence is not None:
        fence.commit_markers([w.marker_records(m) for w, m in markers], [*in_transaction, *records])
    else:
        if records:
            raise ValueError(
                "a batch's output records are written in its fenced transaction only"
            )  # tools and tests without a claim: each writer's markers on its own
        for writer, marker in markers:
            writer._write_markers(marker)
    return counts


def _shared_fence(writers: Sequence[ChangelogWriter]):
    """The fence every writer shares (one transaction writes their batch), or None."""
    fences = {id(w.fence): w.fence for w in writers}
    return next(iter(fences.values())) if len(fences) == 1 else None


def collects_in_driver(writers: Sequence[ChangelogWriter], at_most: int | None) -> bool:
    """Whether :func:`write_batches` collects the stores' records of a batch with at most ``at_most`` changes
    to the driver (and writes them in the markers' transaction), rather than through Spark's Kafka sink."""
    return _shared_fence(writers) is not None and (at_most is None or at_most <= DRIVER_RECORDS_MAX)
