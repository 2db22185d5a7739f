"""The inputs of a job version in its driver: the role of Kafka Streams' ``StreamThread`` consumer and its
partition groups.

One owner for everything a driver does with the topics its stateful stage reads:

* which topics they are (:attr:`JobSources.input_topics`: the source, or its repartition topic, and a join's
  other inputs), and the rule that a join's inputs are co-partitioned (:meth:`JobSources.check_co_partitioned`);
* the re-keying stage when the job declares ``repartition`` (:attr:`JobSources.repartitioner`);
* where a new query starts reading (:attr:`JobSources.starting_offsets`: after the restored state, else where a
  reprocessing run said, else the earliest record; :attr:`JobSources.starts_without_checkpoint`), and where each
  micro-batch started (:meth:`batch_start`);
* the stateful stage's streaming DataFrame (:meth:`JobSources.stream`), and its records decoded with the rejected
  ones' dead letters riding along (:meth:`JobSources.with_dead_letters`);
* for a job with several inputs, which of them had records written beyond each micro-batch
  (:attr:`JobSources.input_lag`).

The job context (:class:`spark_jobs.driver.context.JobContext`) makes one (``ctx.sources``); a declaration's
``build`` reads through it (``ctx.sources.stream()``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping

from runtime.settings import Settings
from spark_jobs.io.kafka_topics import SPARK_SOURCE_FETCH
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec, JobSpecError
from spark_jobs.state.checkpoint_offsets import KafkaOffsets, batch_end_offsets, latest_batch_id
from spark_jobs.state.restore import RestoredState

#: Kafka's "earliest" in a ``startingOffsets`` JSON document
EARLIEST = -2


class JobSources:
    """Every topic one job version's stateful stage reads, in this driver (see the module docstring)."""

    def __init__(
        self,
        spark,
        spec: JobSpec,
        settings: Settings,
        restored: Mapping[str, RestoredState],
        write_letters: Callable,
        failpoint: Callable[[str], None],
    ) -> None:
        self.spark, self.spec, self.settings = spark, spec, settings
        self.layout = JobLayout.of(spec, settings)
        #: store -> what its restore found (filled by the stores' owner before the query starts)
        self._restored = restored
        #: the re-keying stage's dead letters go where the stateful stage's go (the context's writer)
        self._write_letters = write_letters
        self._failpoint = failpoint

    # ----- which topics -----------------------------------------------------------------------------
    @property
    def input_topic(self) -> str:
        """The topic the stateful stage reads (:attr:`JobLayout.state_input_topic`); a join's left side."""
        return self.layout.state_input_topic

    @property
    def input_topics(self) -> tuple[str, ...]:
        """Every topic the stateful stage reads (:attr:`JobLayout.state_input_topics`)."""
        return self.layout.state_input_topics

    def check_co_partitioned(self) -> None:
        """A join's inputs must have ``state_partitions`` partitions each (Kafka Streams' co-partitioning
        rule: a key's records of every input in the same task; a re-keyed left side's repartition topic has
        ``repartition_partitions``); raises :class:`JobSpecError` naming every topic and its count otherwise."""
        from spark_jobs.io.kafka_topics import partition_counts

        counts = partition_counts(self.settings.kafka, list(self.input_topics))
        wanted = self.spec.state_partitions
        if set(counts.values()) != {wanted}:
            shown = ", ".join(
                f"{topic} has {n if n is not None else 'no topic, no'} partitions" for topic, n in counts.items()
            )
            declared = "repartition_partitions" if self.spec.repartition else "source_partitions"
            raise JobSpecError(
                f"job {self.spec.name}: a join's inputs must be co-partitioned, {wanted} partitions each "
                f"({declared}), keyed by {self.spec.key_field}: {shown}"
            )

    @functools.cached_property
    def repartitioner(self):
        """The stage re-keying the source into the repartition topic (:mod:`spark_jobs.io.repartition`), when
        the job declares ``repartition``; else None."""
        if not self.spec.repartition:
            return None
        from spark_jobs.io.repartition import Repartitioner

        return Repartitioner(
            self.spark,
            self.spec,
            self.settings,
            start_offsets=self.start_offsets,
            write_letters=self._write_letters,
            failpoint=self._failpoint,
        )

    # ----- where reading starts ---------------------------------------------------------------------
    @property
    def starting_offsets(self) -> str:
        """Kafka ``startingOffsets`` for a new query: right after the restored state, else where a
        reprocessing run said to start (:meth:`start_offsets`; for a job that re-keys, the repartition topic
        from its beginning and a join's other inputs from their start), else earliest."""
        positions = {json.dumps(r.input_offsets, sort_keys=True) for r in self._restored.values() if r.input_offsets}
        if not positions:
            start = self.start_offsets()
            if start is None:
                return "earliest"
            # (a repartition topic is not in it: the re-keying stage starts at the start, its topic is new)
            offsets = {topic: start.get(topic) for topic in self.input_topics}
        elif len(positions) > 1:
            raise RuntimeError(f"{self.spec.application_id}: stores restored to different input positions {positions}")
        else:
            offsets = json.loads(positions.pop())
        # a topic without a position (a join's side without records yet, a new repartition topic): its earliest
        earliest = {str(p): EARLIEST for p in range(self.spec.state_partitions)}
        return json.dumps({topic: offsets.get(topic) or earliest for topic in self.input_topics})

    @property
    def starts_without_checkpoint(self) -> bool:
        """The query starts from restored state (or none), not from a checkpoint of its own."""
        return latest_batch_id(self.layout.checkpoint) is None

    def start_offsets(self) -> dict[str, dict[str, int]] | None:
        """Where a reprocessing run said to start (``streamstate/start-offsets.json`` in the checkpoint): input
        topic -> partition -> offset, for each of the spec's ``input_topics``; None without one. A re-keyed
        job's ``source_topic`` position is its re-keying stage's start."""
        start_file = self.layout.start_offsets_file
        return json.loads(start_file.read_text()) if start_file.exists() else None

    def batch_start_offsets(self, batch_id: int) -> KafkaOffsets | None:
        """Where micro-batch ``batch_id`` starts reading every input: the end of the batch before it in the
        offset log (None for the first batch)."""
        return batch_end_offsets(self.layout.checkpoint, batch_id - 1) if batch_id else None

    def batch_start(self, batch_id: int) -> dict[int, int] | None:
        """The offsets of :attr:`input_topic` micro-batch ``batch_id`` starts reading at, partition -> offset
        (None when not known exactly: a first batch starting at Kafka's earliest or latest)."""
        if batch_id > 0:
            return batch_end_offsets(self.layout.checkpoint, batch_id - 1).get(self.input_topic)
        start = self.starting_offsets
        offsets = json.loads(start).get(self.input_topic) if start.startswith("{") else None
        if not offsets or any(int(o) < 0 for o in offsets.values()):  # -2/-1: Kafka's earliest/latest
            return None
        return {int(p): int(o) for p, o in offsets.items()}

    # ----- the stream -------------------------------------------------------------------------------
    def stream(self):
        """The stateful stage's input as a streaming DataFrame, starting at :attr:`starting_offsets`: the job's
        source topic, or its repartition topic when the job re-keys its source (``JobSpec.repartition``,
        :mod:`spark_jobs.io.repartition`), and a join's other inputs (``JobSpec.join_topics``: one source reads
        them all, so one checkpoint offset, one changelog marker and one restore position cover them; refused
        unless co-partitioned, :meth:`check_co_partitioned`). Read committed, as Kafka Streams reads under
        exactly-once: a repartition topic and another job's output topic are written in transactions, and a
        batch a killed writer aborted must never be read (a source of plain producers reads the same either way).
        A re-keyed job's records carry their place in the source topic (:data:`spark_jobs.io.dead_letter.ORIGIN_COLUMNS`,
        from the repartition topic's headers): a dead letter of either stage names its record's place there."""
        if len(self.input_topics) > 1:
            self.check_co_partitioned()
        reader = (
            self.spark.readStream.format("kafka")
            .options(**self.settings.kafka.spark_options())
            .option("subscribe", ",".join(self.input_topics))
            .option("startingOffsets", self.starting_offsets)
            # Consumer groups named after the version (Kafka Streams: application.id is the group).
            .option("groupIdPrefix", self.spec.application_id)
            .option("kafka.isolation.level", "read_committed")
            # a re-keyed record's place in the source (spark_jobs.io.repartition.origin_columns)
            .option("includeHeaders", str(self.spec.repartition).lower())
            .options(**SPARK_SOURCE_FETCH)
        )
        if self.settings.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(self.settings.max_offsets_per_trigger))
        source = reader.load()
        if not self.spec.repartition:
            return source
        # a re-keyed record's place in the source topic, which its dead letter names (as the re-keying stage's do)
        from pyspark.sql import functions as F

        from spark_jobs.io.dead_letter import ORIGIN_COLUMNS
        from spark_jobs.io.repartition import origin_columns

        rekeyed = F.col("topic") == F.lit(self.input_topic)
        origin = (F.lit(self.spec.source_topic), *origin_columns())
        return source.select(
            "*", *(F.when(rekeyed, c).alias(name) for c, name in zip(origin, ORIGIN_COLUMNS, strict=True))
        )

    def with_dead_letters(self, classified, *source_columns: str, key: str | None = None):
        """The processor's input: every record of ``classified`` (see :func:`spark_jobs.io.dead_letter.classify`)
        with its decoded fields and the named Kafka source columns; a rejected one carries its dead-letter record
        instead, which the processor passes on and the batch sink writes to the job's dead-letter topic in the same
        micro-batch. ``key``: the field the processor groups by, kept on rejected records (see
        :func:`spark_jobs.io.dead_letter.with_dead_letters`)."""
        from spark_jobs.io import dead_letter

        return dead_letter.with_dead_letters(classified, self.spec.application_id, key, *source_columns)

    @functools.cached_property
    def input_lag(self):
        """The record of which inputs had records written beyond each micro-batch, for a job with several inputs
        (:class:`spark_jobs.state.input_lag.InputLagRecord`); None for a job with one, or whose inputs are all
        tables (a table-table join applies each update as it comes, waiting for none)."""
        if len(self.input_topics) < 2 or "stream" not in self.spec.input_kinds().values():
            return None
        from spark_jobs.state.input_lag import InputLagRecord
        from spark_jobs.state.source_position import committed_ends

        return InputLagRecord(
            self.layout.input_lag,
            self.input_topics,
            lambda topic: committed_ends(self.settings.kafka, topic),
            self.spec.max_task_idle_ms,
        )

    def ensure_topics(self) -> None:
        """Create the topics the re-keying stage writes (its repartition and progress topics), if the job re-keys."""
        if self.repartitioner is not None:
            self.repartitioner.ensure_topics()

    def close(self) -> None:
        """Close the re-keying stage's producer, if it opened one."""
        if self.__dict__.get("repartitioner") is not None:
            self.repartitioner.close()
