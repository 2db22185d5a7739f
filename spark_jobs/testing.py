"""Test a job the way this repository tests its own: on a real Kafka broker process and Spark, its outputs
and dead letters read back.

Example::

    from spark_jobs.testing import JobHarness

    def test_item_stock():
        with JobHarness() as harness:  # a broker and a Spark session of its own, in a temporary directory
            result = harness.run(stock_jobs.JOBS[0], [{"type": "delivered", "sku": "a", "qty": 2, ...}])
        assert result.outputs == [{"sku": "a", "on_hand": 2, ...}]

With ``pytest_plugins = ["spark_jobs.testing"]`` in a test module (or a ``conftest.py``), every test gets
``job_harness``: one stack per test session. ``streamstate new-job NAME`` writes a job and such a test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Self

from confluent_kafka import Consumer, TopicPartition

from runtime.kafka_connection import client_config
from runtime.process import free_service_ports
from runtime.settings import Settings
from spark_jobs.driver.run import RunReport, run
from spark_jobs.io import dead_letter
from spark_jobs.io.dead_letter import HEADER_PREFIX, dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets
from spark_jobs.reference.generators.producer import produce_keyed, produce_unkeyed
from spark_jobs.registry import JobSpec, get_job
from spark_jobs.versions import read_rows


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A record the job refused: its Kafka key and value as they were, why (``reason``, e.g.
    ``failed_validation``) and the message naming the rule."""

    key: bytes | None
    value: bytes | None
    reason: str
    message: str
    #: where the refused record sits: (topic, partition, offset) in the job's source topic (a re-keyed job's
    #: too, whichever stage refused it)
    source: tuple[str, int, int] | None = None


@dataclasses.dataclass(frozen=True)
class JobResult:
    """What one run left: every row of the job's output table, the dead letters of this run, the run report."""

    outputs: list[dict]
    dead_letters: list[DeadLetter]
    report: RunReport

    def outputs_by(self, column: str) -> dict[object, dict]:
        """The output rows keyed by ``column`` (e.g. the job's key field)."""
        return {row[column]: row for row in self.outputs}


class JobHarness:
    """A local stack for job tests: a Kafka broker process and a Spark ``local[*]`` session, in a temporary
    directory (or ``data_dir``), on free ports. Given ``settings`` and ``spark``, it uses that stack instead
    and starts and stops nothing."""

    def __init__(self, data_dir: Path | None = None, *, settings: Settings | None = None, spark=None) -> None:
        self._own_broker = settings is None
        self._temp_dir = None
        if settings is None and data_dir is None:
            self._temp_dir = Path(tempfile.mkdtemp(prefix="streamstate-harness-"))
        if settings is None:
            settings = Settings(data_dir=Path(data_dir or self._temp_dir), **free_service_ports())
        self.settings, self.spark, self._own_spark = settings, spark, spark is None
        self._broker = None

    def __enter__(self) -> Self:
        if self._own_broker:
            from runtime.kafka_broker import LocalKafkaBroker

            self._broker = LocalKafkaBroker(self.settings)
            self._broker.start()
        if self.spark is None:
            from pyspark.sql import SparkSession

            from spark_jobs.driver.session import build_spark_session

            # A session this process already runs is the one Spark would hand out anyway: use it, and
            # leave it running afterwards (it is not the harness's to stop).
            self._own_spark = SparkSession.getActiveSession() is None
            self.spark = build_spark_session(self.settings, "streamstate-job-harness")
        return self

    def __exit__(self, *exc) -> None:
        if self._broker is not None and self.spark is not None:
            close_spark_kafka_producers(self.spark)  # before their broker goes: see the function
        if self._own_spark and self.spark is not None:
            self.spark.stop()
        if self._broker is not None:
            self._broker.stop()
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)

    def run(
        self, job: JobSpec | str, events: Iterable[dict | bytes], version: int | None = None, *, keyed: bool = True
    ) -> JobResult:
        """Create the job's source topics when missing (what a user creates; every topic the job writes is the
        platform's to create), write ``events`` to the job's source topic (a dict as JSON keyed by the job's key field, ``bytes``
        as they are; with ``keyed=False`` without a Kafka key, spread over the partitions), run the job over
        everything available (resuming from its checkpoint when it ran before), and read back its outputs
        and the dead letters of this run."""
        spec = job if isinstance(job, JobSpec) else get_job(job, version)
        kafka = self.settings.kafka
        ensure_topic(kafka, spec.source_topic, spec.source_partitions)
        for topic in spec.join_topics:  # co-partitioned with the stateful stage's input (a re-keyed source's)
            ensure_topic(kafka, topic, spec.state_partitions)
        letters_topic = dead_letter_topic(spec.application_id)  # the job creates it on its first start
        letters_from = {p: high for p, (_, high) in partition_offsets(kafka, letters_topic).items()}
        if keyed:
            produce_keyed(kafka, spec.source_topic, events, spec.key_field)
        else:
            produce_unkeyed(kafka, spec.source_topic, events, spec.source_partitions)
        report = run(spec, self.settings, available_now=True, spark=self.spark)
        if report.error:
            raise RuntimeError(f"{spec.application_id} failed: {report.error}")
        return JobResult(read_rows(report.output), self._letters(letters_topic, letters_from), report)

    def _letters(self, topic: str, start: dict[int, int]) -> list[DeadLetter]:
        end = {p: high for p, (_, high) in partition_offsets(self.settings.kafka, topic).items()}
        wanted = {p for p in end if end[p] > start.get(p, 0)}
        if not wanted:
            return []
        consumer = Consumer(client_config(self.settings.kafka, {"group.id": "streamstate-harness", "log_level": 3}))
        consumer.assign([TopicPartition(topic, p, start.get(p, 0)) for p in sorted(wanted)])
        letters, remaining = [], sum(end[p] - start.get(p, 0) for p in wanted)
        try:
            while remaining:
                msg = consumer.poll(10)
                if msg is None:
                    raise TimeoutError(f"{remaining} dead letters of {topic} did not arrive")
                if msg.error():
                    continue
                headers = {k.removeprefix(HEADER_PREFIX): v.decode() for k, v in msg.headers() or []}
                source = None
                if "source.topic" in headers:
                    source = (headers["source.topic"], int(headers["source.partition"]), int(headers["source.offset"]))
                reason, message = headers.get("reason", ""), headers.get("message", "")
                letters.append(DeadLetter(msg.key(), msg.value(), reason, message, source))
                remaining -= 1
        finally:
            consumer.close()
        return letters


def close_spark_kafka_producers(spark) -> None:
    """Close the Kafka producers Spark's Kafka sink keeps in this JVM (a pool shared by every query and
    session; an idle producer stays open for ``spark.kafka.producer.cache.timeout``, 10 minutes, and
    stopping the session does not close it). Call it before stopping their broker: a producer left open
    retries the stopped broker with a ``NetworkClient`` warning per attempt until the process exits, a screen
    of warnings after a test run. A later write opens new producers."""
    from py4j.protocol import Py4JError

    try:
        package = spark.sparkContext._jvm.org.apache.spark.sql.kafka010.producer
        getattr(getattr(package, "InternalKafkaProducerPool$"), "MODULE$").reset()
    except Py4JError:  # another Spark's connector, or none loaded: nothing of ours to close
        pass


try:
    import pytest
except ImportError:  # the harness works without pytest; only the fixture needs it
    pytest = None

if pytest is not None:

    @pytest.fixture(scope="session")
    def job_harness():
        """A :class:`JobHarness` with a stack of its own, shared by the test session."""
        with JobHarness() as harness:
            yield harness


@contextlib.contextmanager
def decoding_with(decoder: dead_letter.Decoder) -> Iterator[None]:
    """Inside the block, every job decodes its JSON events with ``decoder`` (see
    :func:`spark_jobs.io.dead_letter.decode_json`): to check that a job classifies its input alike with the JVM
    decoder and with Spark's functions, or to measure one against the other."""
    real = dead_letter.decode_json
    dead_letter.decode_json = lambda raw, schema, _=None: real(raw, schema, decoder)
    try:
        yield
    finally:
        dead_letter.decode_json = real
