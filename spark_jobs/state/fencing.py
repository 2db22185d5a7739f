"""One writer per job version across hosts: Kafka's transactional producer epoch as the fence.

The lease (:mod:`spark_jobs.driver.lease`) keeps a second driver from starting on the same host. Drivers on two
hosts do not see each other's lease, and a driver that was paused (SIGSTOP, a long GC, a partition) may
wake up after another took over. Kafka Streams answers this with a transactional producer per task: a
new instance's ``initTransactions`` bumps the producer epoch and every later write of the old one is
refused (``ProducerFencedException``). This module does the same for a job version:

1. **Claim.** At start (beside Spark's start of the query: its first write, and any read of the state to
   restore, waits for the claim; ``JobStores.claim_in_background``), a driver opens the version's transactional producer
   (``transactional.id`` = :meth:`JobLayout.transactional_id`) and calls ``init_transactions``: any older
   driver of the version is fenced from then on. It then reads the version's generations topic and
   commits, in a transaction, a record claiming the next **generation** (1, 2, 3, ...). Of two drivers that
   both commit a claim, the later one read the earlier one's claim (it committed before the later
   ``init_transactions``, or it would have been fenced), so generations never repeat.
2. **Changelog batch ids** of generation ``g`` are ``g * GENERATION_SPAN + Spark's batch id``: above every
   id an older driver used or may still use. Each driver's markers declare the ids between the last
   complete batch it found and its first id void (:class:`~.batch_records.BatchMarker`), so the data records
   a fenced driver writes after the takeover (Spark's Kafka sink is not transactional) are never applied.
3. **Markers** are written in a transaction of the claimed producer: once fenced, a driver's markers
   are refused (:class:`WriterFenced`, which stops its query) and its batch never becomes complete.
4. **Outputs** are written as Delta idempotent writes with the changelog batch id as the transaction
   version (``JobContext.state_change_sink``): a fenced driver's late MERGE is skipped by Delta because a
   newer generation already committed a higher version.

Readers read committed (librdkafka's default; Spark's changelog reader sets it), so the markers of a
transaction a takeover aborted are never seen.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import socket
import threading
from collections.abc import Iterable, Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.io.kafka_topics import ensure_topic, read_partition
from spark_jobs.state.batch_records import MARKER_KEY, MarkerRecords, OutputRecords

#: changelog batch ids of generation g are [g * GENERATION_SPAN, (g + 1) * GENERATION_SPAN): a query would
#: need a billion micro-batches to reach the next generation's ids (31 years at one batch per second)
GENERATION_SPAN = 1_000_000_000
#: how long a transaction may stay open before the broker aborts it (a paused driver's open transaction
#: holds back read-committed readers of its partitions until then, or until a takeover aborts it)
TRANSACTION_TIMEOUT_MS = 60_000
_TIMEOUT_S = 60.0

#: the errors of a producer a newer one with its transactional.id fenced
FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def producer_refused(error: KafkaError) -> bool:
    """Whether a transactional producer can write no more: a newer one with its transactional.id fenced it,
    or it is in the fatal state a fencing leaves it in. The client learns of a fencing asynchronously (when it
    adds a partition to the transaction), so a ``produce()`` made after that fails with ``_FATAL`` ("Local:
    Fatal error"), not with the fencing's own code."""
    return error.code() in FENCED_CODES or error.code() == KafkaError._FATAL or error.fatal()


def close_producer(producer: Producer, timeout_s: float) -> None:
    """Flush a producer before it is dropped. A refused producer (:func:`producer_refused`) has nothing left
    it could deliver, and its error is the refusal already raised to the driver: closing it is no new failure."""
    try:
        producer.flush(timeout_s)
    except KafkaException as err:
        if not producer_refused(err.args[0]):
            raise


def describe_batch(changelog_batch_id: int | None) -> str:
    """A changelog batch id as users count batches: Spark's batch id within its driver's generation
    (``34 (generation 2)``, not ``2,000,000,034``)."""
    if changelog_batch_id is None:
        return "-"
    generation, batch = divmod(int(changelog_batch_id), GENERATION_SPAN)
    return f"{batch} (generation {generation})" if generation else str(batch)


class WriterFenced(RuntimeError):
    """A newer driver of the same job version claimed it: this driver's writes are refused."""


@dataclasses.dataclass(frozen=True)
class GenerationClaim:
    """One driver's claim of a job version, as committed to the generations topic."""

    application_id: str
    generation: int
    host: str
    pid: int
    claimed_at: str

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> GenerationClaim:
        data = json.loads(raw)
        return cls(
            data["application_id"],
            int(data["generation"]),
            data.get("host", "?"),
            int(data.get("pid", 0)),
            data.get("claimed_at", ""),
        )

    def describe(self) -> str:
        return f"generation {self.generation} (pid {self.pid} on {self.host}, claimed {self.claimed_at})"


def read_claims(kafka: KafkaTarget, topic: str, timeout_s: float = _TIMEOUT_S) -> list[GenerationClaim]:
    """Every committed claim in the generations topic, oldest first (the topic is compacted: at least the newest)."""
    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": f"streamstate-fence-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                # the partition ends with a commit marker no consumer receives: the end is known from an empty
                # fetch, which the broker holds back this long (librdkafka's default: 500 ms per claim read)
                "fetch.wait.max.ms": 10,
                "log_level": 3,
            },
        )
    )
    try:
        return [
            GenerationClaim.from_bytes(m.value()) for m in read_partition(consumer, topic, 0, timeout_s) if m.value()
        ]
    finally:
        consumer.close()


class WriterFence:
    """A driver's claim of its job version and the transactional producer its markers go through."""

    def __init__(
        self,
        kafka: KafkaTarget,
        application_id: str,
        transactional_id: str,
        generations_topic: str,
        replication_factor: int = 1,
    ) -> None:
        self.kafka = kafka
        self.application_id = application_id
        self.transactional_id = transactional_id
        self.generations_topic = generations_topic
        self.replication_factor = replication_factor
        self.claim: GenerationClaim | None = None
        #: why a write of this driver was refused, once one was (a newer driver fenced it)
        self.refusal: WriterFenced | None = None
        #: the newer claim that fenced this driver, when the refusal found it
        self.fenced_by: GenerationClaim | None = None
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        if self.claim is None:
            raise RuntimeError(f"{self.application_id}: no generation claimed yet (call claim_generation first)")
        return self.claim.generation

    @property
    def batch_base(self) -> int:
        """Added to Spark's batch id to make the changelog batch id (see the module docstring)."""
        return self.generation * GENERATION_SPAN

    def claim_generation(self) -> GenerationClaim:
        """Fence every older driver of the version and claim the next generation.

        Raises:
            WriterFenced: a newer driver claimed the version while this one was claiming it.
        """
        ensure_topic(
            self.kafka,
            self.generations_topic,
            1,
            self.replication_factor,
            {"cleanup.policy": "compact", "min.insync.replicas": str(min(2, self.replication_factor))},
        )
        self._producer = Producer(
            client_config(
                self.kafka,
                {
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "acks": "all",
                    # a small batch's changelog records go in its markers' transaction (as Spark's sink writes
                    # the others: LZ4, see spark_jobs.state.changelog.CHANGES_PRODUCER_OPTIONS)
                    "compression.type": "lz4",
                    "linger.ms": 5,
                    "log_level": 3,
                },
            )
        )
        self._producer.init_transactions(_TIMEOUT_S)  # from here on, older drivers' transactions are refused
        newest = max((c.generation for c in read_claims(self.kafka, self.generations_topic)), default=0)
        claim = GenerationClaim(
            self.application_id,
            newest + 1,
            socket.gethostname(),
            os.getpid(),
            dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        )
        self._in_transaction(
            lambda p: p.produce(self.generations_topic, key=self.application_id.encode(), value=claim.to_bytes()),
            f"claiming {claim.describe()}",
        )
        self.claim = claim
        return claim

    def commit_markers(self, markers: Iterable[MarkerRecords], records: Sequence[OutputRecords] = ()) -> None:
        """Write ``records`` (a batch's results for the jobs that read them) and every marker (one record per
        partition of its topic) in one transaction: all of them become visible together, or none does.

        Raises:
            WriterFenced: a newer driver claimed the version; nothing of this transaction is visible.
        """
        if self.claim is None:
            raise RuntimeError(f"{self.application_id}: markers before a generation was claimed")
        markers = list(markers)

        def produce(producer: Producer) -> None:
            for batch in records:
                placed = batch.partitions if batch.partitions is not None else [-1] * len(batch.keys)
                headers = list(batch.headers) or None
                for key, value, partition in zip(batch.keys, batch.values, placed, strict=True):
                    while True:
                        try:  # partition -1: librdkafka's partitioner picks it
                            producer.produce(batch.topic, key=key, value=value, partition=partition, headers=headers)
                            break
                        except BufferError:  # the client's queue is full: let it send, then go on
                            producer.poll(0.05)
            for marker in markers:
                for partition in marker.partitions:
                    producer.produce(
                        marker.topic, key=MARKER_KEY, value=marker.value, partition=partition, headers=marker.headers
                    )

        self._in_transaction(produce, f"writing markers to {', '.join(m.topic for m in markers)}")

    def _in_transaction(self, produce, what: str) -> None:
        with self._lock:
            # A fenced producer never writes again (Kafka fences the instance, not one transaction), and what its
            # client says when asked again is librdkafka's state, not the fencing: a commit the fencing failed may
            # still count as in progress, and the next call fails with _CONFLICT (seen in a suite run).
            if self.refusal is not None:
                raise self.refusal
            producer = self._producer
            try:
                producer.begin_transaction()
                produce(producer)
                producer.commit_transaction(_TIMEOUT_S)
            except KafkaException as err:
                error = err.args[0]
                if producer_refused(error):
                    self.refusal = self._fenced(what, error)
                    raise self.refusal from None
                if error.txn_requires_abort():
                    producer.abort_transaction(_TIMEOUT_S)
                raise RuntimeError(f"{self.application_id}: {what} failed: {error}") from err

    def _fenced(self, what: str, error: KafkaError) -> WriterFenced:
        claims = read_claims(self.kafka, self.generations_topic)
        newer = [c for c in claims if self.claim is None or c.generation > self.claim.generation]
        self.fenced_by = newer[-1] if newer else None
        ours = self.claim.describe() if self.claim else "a driver claiming it"
        by = f"by {self.fenced_by.describe()}" if self.fenced_by else f"({error})"
        return WriterFenced(
            f"{self.application_id}: this driver, {ours}, was fenced {by}: another driver took the job version "
            f"over, so {what} was refused and this driver stops (nothing it wrote after the takeover is applied)"
        )

    def close(self) -> None:
        if self._producer is not None:
            close_producer(self._producer, 10)
            self._producer = None
