"""Re-keying a source that is not keyed by the job's key: Kafka Streams' repartition topic.

A stateful step applies a key's records in one task, in one order. Kafka Streams guarantees it by
never grouping records by anything but their Kafka key: ``selectKey``/``groupBy`` on another field first
writes the records to an internal repartition topic keyed by it, and the stateful sub-topology reads that
topic. A job declaring ``JobSpec(repartition=True)`` gets the same, as two stages in its driver:

1. **The re-keying stage** (a query of its own, :class:`Repartitioner`): reads the source, decodes each
   record's key field with the job's decoder, and writes the record (value and timestamp untouched; its
   source topic, partition and offset in headers) to ``<application_id>-repartition`` keyed by the key
   field, partitioned by Kafka's default partitioner (murmur2, as Kafka Streams' producer does). A record
   with no key to route by (not a JSON object, key field missing or empty) is a dead letter here.
2. **The stateful stage** (the job's query, unchanged) reads the repartition topic as its input: a key
   lives in one repartition partition, its records in that partition's offset order, and stream time is
   per repartition partition, as in Kafka Streams. The changelog markers, snapshots and output marks record
   repartition-topic offsets.

**Exactly once.** Each micro-batch of the re-keying stage is written in one Kafka transaction of the
version's ``<application_id>-repartitioner`` producer, together with a record of how far the source has
been re-keyed (``<application_id>-repartition-progress``): Kafka Streams commits its consumer offsets in
the transaction the same way. The stateful stage reads committed records only. A batch replayed after a
kill (its transaction committed, Spark's commit log not yet written) finds its end in the progress record
and writes nothing again; a driver's transaction left open by a kill is aborted by the next driver's
``init_transactions``, which also fences the older driver's producer on any host. A lost checkpoint of the
re-keying stage resumes from the progress record; the stateful stage restores as any job does.

**Purging.** Records below where a stateful batch started are never read again by this version (Spark
committed the batch before it, and the changelog is complete past it; the batch itself is read again when
the driver dies before its commit log), so they are deleted from the repartition topic as Kafka Streams
purges its repartition topics below its committed offsets (:meth:`Repartitioner.purge_below`), on the job's
snapshot cadence (``JobContext.state_change_sink``).

The records pass through the driver (collected per micro-batch, at most
:data:`MAX_RECORDS_PER_BATCH` unless ``STREAMSTATE_MAX_OFFSETS_PER_TRIGGER`` says otherwise): a single
transactional producer is what makes the write atomic, and Kafka has no transaction spanning producers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from runtime.kafka_connection import client_config
from runtime.settings import Settings
from spark_jobs.io.kafka_topics import SPARK_SOURCE_FETCH, ensure_topic
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec
from spark_jobs.state.checkpoint_health import checkpoint_problem
from spark_jobs.state.checkpoint_offsets import batch_end_offsets
from spark_jobs.state.fencing import TRANSACTION_TIMEOUT_MS, WriterFenced, close_producer, producer_refused

log = logging.getLogger("streamstate.repartition")

#: the re-keying stage's micro-batch bound when the deployment sets none: its records pass through the driver
MAX_RECORDS_PER_BATCH = 200_000
#: the header prefix naming where a repartitioned record came from
ORIGIN_HEADER_PREFIX = "streamstate.origin."
#: the progress record's key (the progress topic is compacted: its newest record is the position)
PROGRESS_KEY = b"progress"
_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class RepartitionProgress:
    """How far the source has been re-keyed: the repartition topic holds every record of ``topic`` below
    ``offsets`` (partition -> next offset), committed in the transaction that wrote them."""

    topic: str
    offsets: dict[int, int]

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"topic": self.topic, "offsets": {str(p): o for p, o in sorted(self.offsets.items())}}
        ).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> RepartitionProgress:
        data = json.loads(raw)
        return cls(data["topic"], {int(p): int(o) for p, o in data["offsets"].items()})

    def covers(self, end: dict[int, int]) -> bool:
        """Every partition of ``end`` was re-keyed up to it (a batch ending there was written already)."""
        return all(self.offsets.get(int(p), -1) >= int(o) for p, o in end.items())


def origin_columns():
    """A re-keyed record's place in the source, read from its headers by a stage that reads the repartition topic
    with ``includeHeaders``: its source partition (INT) and offset (BIGINT) columns."""
    from pyspark.sql import functions as F

    def header(name: str):
        wanted = f"filter(headers, h -> h.key = '{ORIGIN_HEADER_PREFIX}{name}')"
        return F.expr(f"try_element_at({wanted}, 1).value").cast("string")

    return header("partition").cast("int"), header("offset").cast("bigint")


def origin_in(headers: list[tuple[str, bytes]] | None) -> tuple[str, int, int] | None:
    """(topic, partition, offset) in the source of a repartition topic's record, from its ``streamstate.origin.*``
    headers; None when it carries none."""
    found = dict(headers or [])
    if (ORIGIN_HEADER_PREFIX + "partition") not in found:
        return None
    return (
        found.get(ORIGIN_HEADER_PREFIX + "topic", b"").decode(),
        int(found[ORIGIN_HEADER_PREFIX + "partition"]),
        int(found[ORIGIN_HEADER_PREFIX + "offset"]),
    )


def origins_of(kafka, topic: str, places: list[tuple[int, int]]) -> dict[tuple[int, int], tuple[int, int]]:
    """(partition, offset) of records of a repartition topic -> their (partition, offset) in the source, from
    their ``streamstate.origin.*`` headers; a place whose record is gone (purged) or carries none is left out."""
    from confluent_kafka import Consumer, KafkaError

    if not places:
        return {}
    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": "streamstate-origins",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "log_level": 3,
            },
        )
    )
    found = {}
    try:
        for partition, offset in sorted(set(places)):
            consumer.assign([TopicPartition(topic, partition, offset)])
            msg = consumer.poll(30)
            if msg is None or msg.error() or msg.offset() != offset:
                if msg is not None and msg.error() and msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning(json.dumps({"event": "origin_unread", "topic": topic, "error": str(msg.error())}))
                continue
            if (origin := origin_in(msg.headers())) is not None:
                found[partition, offset] = origin[1:]
    finally:
        consumer.close()
    return found


class Repartitioner:
    """The re-keying stage of a job version (see the module docstring); its sources' owner makes it
    (:attr:`spark_jobs.driver.sources.JobSources.repartitioner`).

    ``start_offsets()``: where a reprocessing run said to start (topic -> partition -> offset), or None;
    ``write_letters(letters)``: sends a batch's dead letters where the stateful stage's go; ``failpoint(name)``:
    where a fault test may stop the driver."""

    def __init__(
        self,
        spark,
        spec: JobSpec,
        settings: Settings,
        *,
        start_offsets: Callable[[], dict[str, dict[str, int]] | None],
        write_letters: Callable,
        failpoint: Callable[[str], None],
    ) -> None:
        self.spark, self.spec, self.settings = spark, spec, settings
        self.layout = JobLayout.of(spec, settings)
        self._start_offsets, self._write_letters, self._failpoint = start_offsets, write_letters, failpoint
        self._producer: Producer | None = None
        self._progress: RepartitionProgress | None = None
        self._lock = threading.Lock()

    # ----- topics and position ---------------------------------------------------------------------
    def ensure_topics(self) -> None:
        """The repartition topic (``spec.state_partitions`` partitions; records kept until purged, as Kafka
        Streams creates its own) and the progress topic (one partition, compacted)."""
        kafka, replication = self.settings.kafka, self.settings.kafka_replication_factor
        in_sync = str(self.settings.kafka_min_insync_replicas)
        kept = {"cleanup.policy": "delete", "retention.ms": "-1", "min.insync.replicas": in_sync}
        ensure_topic(kafka, self.layout.repartition_topic, self.spec.state_partitions, replication, kept)
        compacted = {"cleanup.policy": "compact", "min.insync.replicas": in_sync}
        ensure_topic(kafka, self.layout.repartition_progress_topic, 1, replication, compacted)

    def committed_progress(self) -> RepartitionProgress | None:
        """The newest committed progress record (None before the first batch)."""
        from confluent_kafka import Consumer

        from spark_jobs.io.kafka_topics import read_partition

        consumer = Consumer(
            client_config(
                self.settings.kafka,
                {
                    "group.id": f"streamstate-repartition-{self.layout.application_id}",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "isolation.level": "read_committed",
                    "log_level": 3,
                },
            )
        )
        try:
            newest = None
            for message in read_partition(consumer, self.layout.repartition_progress_topic, 0, _TIMEOUT_S):
                if message.key() == PROGRESS_KEY and message.value():
                    newest = message.value()
            return RepartitionProgress.from_bytes(newest) if newest else None
        finally:
            consumer.close()

    def starting_offsets(self, progress: RepartitionProgress | None) -> str:
        """Kafka ``startingOffsets`` for a new re-keying query: after what the repartition topic holds, else
        where a reprocessing run said to start, else earliest."""
        source = self.spec.source_topic
        if progress is not None and progress.offsets:
            return json.dumps({source: {str(p): o for p, o in progress.offsets.items()}})
        start = (self._start_offsets() or {}).get(source)
        return json.dumps({source: start}) if start else "earliest"

    # ----- the query -------------------------------------------------------------------------------
    def writer(self):
        """The re-keying query's stream writer (the caller names it, sets its trigger and starts it)."""
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from spark_jobs.io import dead_letter

        self.ensure_topics()
        checkpoint = self.layout.repartition_checkpoint
        if checkpoint_problem(checkpoint, stateful=False):
            # stateless: the progress record says where to resume, nothing is lost with the checkpoint
            log.warning(json.dumps({"event": "repartition_checkpoint_dropped", "checkpoint": str(checkpoint)}))
            checkpoint.remove()
        self._progress = self.committed_progress()
        self._open_producer()
        key_field = self.spec.key_field
        reader = (
            self.spark.readStream.format("kafka")
            .options(**self.settings.kafka.spark_options())
            .option("subscribe", self.spec.source_topic)
            .option("startingOffsets", self.starting_offsets(self._progress))
            .option("groupIdPrefix", self.layout.repartition_transactional_id)
            .option("kafka.isolation.level", "read_committed")  # the source may be another job's output topic
            .option("maxOffsetsPerTrigger", str(self.settings.max_offsets_per_trigger or MAX_RECORDS_PER_BATCH))
            .options(**SPARK_SOURCE_FETCH)
        )
        # the key field decoded as the job decodes it; the record's other fields are the stateful stage's
        schema = T.StructType([T.StructField(key_field, T.StringType())])
        classified = dead_letter.classify_events(reader.load(), schema, key_field, None, check_key=False)
        rejected = F.col(dead_letter.ERROR_COLUMN).isNotNull()
        letter = F.when(rejected, F.struct(*dead_letter.letter_columns(self.spec.application_id)))
        rows = classified.select(
            F.encode(dead_letter.event(key_field), "UTF-8").alias("key"),
            "value",
            "partition",
            "offset",
            "timestamp",
            letter.alias(dead_letter.LETTER_COLUMN),
        )
        return rows.writeStream.foreachBatch(self.write_batch).option("checkpointLocation", str(checkpoint))

    def write_batch(self, batch, batch_id: int) -> None:
        """One micro-batch: its dead letters, then its records and the progress in one transaction; nothing
        when the progress record shows the batch was written already (a replay)."""
        from pyspark.sql import functions as F

        from spark_jobs.io import dead_letter

        ends = batch_end_offsets(self.layout.repartition_checkpoint, batch_id).get(self.spec.source_topic, {})
        end = {int(p): int(o) for p, o in ends.items()}
        if self._progress is not None and self._progress.covers(end):
            log.info(json.dumps({"event": "repartition_batch_replayed", "batch_id": batch_id, "end": end}))
            return
        cached = batch.persist()
        try:
            letters = batch.where(F.col(dead_letter.LETTER_COLUMN).isNotNull()).select(f"{dead_letter.LETTER_COLUMN}.*")
            self._write_letters(letters)
            records = batch.where(F.col(dead_letter.LETTER_COLUMN).isNull()).drop(dead_letter.LETTER_COLUMN).toArrow()
        finally:
            cached.unpersist()
        self._failpoint("before_repartition_write")
        progress = RepartitionProgress(
            self.spec.source_topic, {**(self._progress.offsets if self._progress else {}), **end}
        )
        self._commit(records, progress)
        self._progress = progress
        self._failpoint("after_repartition_write")

    def _commit(self, records, progress: RepartitionProgress) -> None:
        topic, source = self.layout.repartition_topic, self.spec.source_topic
        keys, values = records.column("key").to_pylist(), records.column("value").to_pylist()
        partitions, offsets = records.column("partition").to_pylist(), records.column("offset").to_pylist()
        stamps = records.column("timestamp").cast("int64").to_pylist()  # microseconds
        source_header = (ORIGIN_HEADER_PREFIX + "topic", source.encode())
        with self._lock:
            producer = self._producer
            try:
                producer.begin_transaction()
                for key, value, partition, offset, stamp in zip(keys, values, partitions, offsets, stamps, strict=True):
                    headers = [
                        source_header,
                        (ORIGIN_HEADER_PREFIX + "partition", str(partition).encode()),
                        (ORIGIN_HEADER_PREFIX + "offset", str(offset).encode()),
                    ]
                    timestamp = stamp // 1000 if stamp is not None else 0
                    while True:
                        try:
                            producer.produce(topic, key=key, value=value, headers=headers, timestamp=timestamp)
                            break
                        except BufferError:  # the client's queue is full: let it send, then go on
                            producer.poll(0.05)
                producer.produce(self.layout.repartition_progress_topic, key=PROGRESS_KEY, value=progress.to_bytes())
                producer.commit_transaction(_TIMEOUT_S)
            except KafkaException as err:
                error = err.args[0]
                if producer_refused(error):
                    raise WriterFenced(
                        f"{self.spec.application_id}: the re-keying stage was fenced by a newer driver of the "
                        f"job version ({error}); its batch is not visible and this driver stops"
                    ) from None
                if error.txn_requires_abort():
                    producer.abort_transaction(_TIMEOUT_S)
                raise RuntimeError(
                    f"{self.spec.application_id}: writing the repartition topic failed: {error}"
                ) from err

    def _open_producer(self) -> None:
        if self._producer is not None:
            return
        self._producer = Producer(
            client_config(
                self.settings.kafka,
                {
                    "transactional.id": self.layout.repartition_transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "acks": "all",
                    # the Java client's partitioner (Kafka Streams' repartition topics): murmur2 of the key
                    "partitioner": "murmur2_random",
                    "linger.ms": 5,
                    "compression.type": "lz4",
                    "queue.buffering.max.messages": 1_000_000,
                    "log_level": 3,
                },
            )
        )
        # fences an older driver's producer (on any host) and aborts a transaction it left open
        self._producer.init_transactions(_TIMEOUT_S)

    # ----- purging ----------------------------------------------------------------------------------
    def purge_below(self, offsets: dict[int, int]) -> None:
        """Delete the repartition topic's records below ``offsets`` (where a stateful batch started: never read
        again by this version)."""
        wanted = [
            TopicPartition(self.layout.repartition_topic, int(p), int(o)) for p, o in offsets.items() if int(o) > 0
        ]
        if not wanted:
            return
        admin = AdminClient(client_config(self.settings.kafka))
        try:
            for future in admin.delete_records(wanted, request_timeout=30).values():
                future.result()
        except KafkaException as err:
            log.warning(json.dumps({"event": "repartition_purge_failed", "error": str(err)}))

    # ----- refused records' places --------------------------------------------------------------------
    def in_source_coordinates(self, rejected):
        """Rows the stateful stage refused inside a batch (late events: Kafka source columns ``topic``,
        ``partition``, ``offset`` naming the repartition topic) with their records' places in the source topic
        instead, read from the records' ``streamstate.origin.*`` headers: a dead letter names the same place
        whichever stage refused it. Few rows (late events), read one record each; a row whose record is gone
        (purged) keeps the repartition topic's place, which its ``topic`` says."""
        from pyspark.sql import functions as F

        topic = self.layout.repartition_topic
        places = [
            (row["partition"], row["offset"])
            for row in rejected.where(F.col("topic") == topic).select("partition", "offset").collect()
        ]
        origins = origins_of(self.settings.kafka, topic, places)
        if not origins:
            return rejected
        found = rejected.sparkSession.createDataFrame(
            [(p, o, op, oo) for (p, o), (op, oo) in origins.items()],
            "partition INT, offset BIGINT, _source_partition INT, _source_offset BIGINT",
        )
        placed = F.col("_source_partition").isNotNull()
        return (
            rejected.join(found, ["partition", "offset"], "left")
            .withColumn("topic", F.when(placed, F.lit(self.spec.source_topic)).otherwise(F.col("topic")))
            .withColumn("partition", F.coalesce("_source_partition", "partition"))
            .withColumn("offset", F.coalesce("_source_offset", "offset"))
            .drop("_source_partition", "_source_offset")
        )

    def close(self) -> None:
        if self._producer is not None:
            close_producer(self._producer, 10)
            self._producer = None
