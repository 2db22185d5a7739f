"""What a job version writes besides its state, in its driver: the role of Kafka Streams' ``RecordCollector`` and
its sink nodes.

One owner for:

* the version's output tables (:meth:`JobOutputs.table`, :meth:`JobOutputs.ensure_table`), how far their writes
  reached (:attr:`JobOutputs.written_through`) and whether a batch may repeat rows written already
  (:meth:`JobOutputs.may_repeat`);
* its output topic (:meth:`JobOutputs.ensure_topic`);
* its dead-letter topic and the records sent to it, counted by reason for whoever listens (the run's status:
  :meth:`JobOutputs.send_letters`).

The job context (:class:`spark_jobs.driver.context.JobContext`) makes one (``ctx.outputs``); a declaration's
``build`` and the batch sink write through it (``ctx.outputs.table(keys)``, ``ctx.outputs.send_letters``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from runtime.settings import Settings
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.io.output_table import OutputTable
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec
from spark_jobs.state import output_marks

#: ``listener({reason: records})``, called after every batch that wrote dead letters
DeadLetterListener = Callable[[dict[str, int]], None]


class JobOutputs:
    """Every table and topic one job version writes besides its stores, in this driver (see the module docstring)."""

    def __init__(self, spark, spec: JobSpec, settings: Settings, listeners: Sequence[DeadLetterListener]) -> None:
        self.spark, self.spec, self.settings = spark, spec, settings
        self.layout = JobLayout.of(spec, settings)
        #: told of every batch's dead letters (the context's list: the runner adds to it after the job is built)
        self._listeners = listeners

    # ----- output tables ----------------------------------------------------------------------------
    def table(self, keys: tuple[str, ...]) -> OutputTable:
        """The version's main output table, its rows identified by ``keys`` (see :mod:`spark_jobs.io.output_table`)."""
        return OutputTable(self.layout.output_table, keys)

    def ensure_table(self, schema) -> None:
        """Create the main output table of this version with ``schema`` (a StructType),
        or add the columns of ``schema`` it lacks (nullable). A version whose outputs gained a column may
        start from a copy of the previous version's tables (a migration copies them), whose rows then read
        the new column as null, as Delta's schema evolution gives them. A column removed or retyped is
        not changed here: the job's writes meet Delta's own error for it.

        Read and created with delta-rs (a Spark create costs ~0.5 s of a small job's start, delta-rs ~0.01 s);
        a column added through Spark."""
        from deltalake import DeltaTable
        from pyspark.sql.pandas.types import to_arrow_schema

        table = self.layout.output_table
        path, options = str(table), table.storage_options()
        if not DeltaTable.is_deltatable(path, storage_options=options):
            # TIMESTAMP columns as UTC instants: Delta's timestamp type, as Spark creates it
            DeltaTable.create(path, to_arrow_schema(schema, timezone="UTC"), mode="ignore", storage_options=options)
            return
        present = {f.name.lower() for f in DeltaTable(path, storage_options=options).schema().fields}
        if missing := [f for f in schema.fields if f.name.lower() not in present]:
            columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
            self.spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")

    def hold_nothing(self) -> bool:
        """No output table of the version holds a file. Read with delta-rs: asking Spark (DESCRIBE DETAIL) costs
        as much as a small MERGE."""
        from deltalake import DeltaTable

        for table in self.layout.output_tables:
            options = table.storage_options()
            if (
                DeltaTable.is_deltatable(str(table), storage_options=options)
                and DeltaTable(str(table), storage_options=options).file_uris()
            ):
                return False
        return True

    @functools.cached_property
    def written_through(self) -> dict[int, int] | None:
        """The highest source offsets any output write of this version reached (read once, before this
        driver's first write; see :func:`spark_jobs.state.output_marks.written_input_end`)."""
        return output_marks.written_input_end(self.layout.output_table)

    def may_repeat(self, batch_start: dict[int, int] | None) -> bool:
        """Whether a micro-batch starting at ``batch_start`` (its input's offsets; None: not known exactly) may
        re-derive outputs that are written already (a replay after a crash or a restore): then a primitive that
        appends its outputs must insert them only if absent."""
        return output_marks.may_repeat(batch_start, self.written_through)

    # ----- topics -----------------------------------------------------------------------------------
    def ensure_topic(self) -> str | None:
        """Create the version's output topic when the job has one; returns its name. What it holds is the
        declaration's (``JobSpec.output_topic_kind``). ``upserts`` (an aggregate's rows): compacted, the latest
        result per key is what a reader restores from it, a deleted key's tombstone removes it. ``events`` (a
        join's results): deleted by retention, never compacted (two results of a key are two events), each
        record in the partition Kafka's Java clients would put its key in (murmur2), as a Kafka Streams ``to()``
        writes it, so a job reading it is co-partitioned with other Java-keyed topics."""
        topic = self.layout.output_topic
        if topic is not None:
            replication = self.settings.kafka_replication_factor
            policy = "compact" if self.spec.output_topic_kind() == "upserts" else "delete"
            configs = {"cleanup.policy": policy, "min.insync.replicas": str(self.settings.kafka_min_insync_replicas)}
            ensure_topic(self.settings.kafka, topic, self.spec.output_partitions, replication, configs)
        return topic

    def ensure_dead_letter_topic(self) -> None:
        """Create the version's dead-letter topic (one partition per source partition)."""
        ensure_topic(
            self.settings.kafka,
            self.layout.dead_letter_topic,
            self.spec.source_partitions,
            self.settings.kafka_replication_factor,
        )

    # ----- dead letters -----------------------------------------------------------------------------
    def write_letters(self, letters) -> None:
        """Dead-letter records (key, value, headers) of a batch to the dead-letter topic, counted by reason for
        the listeners (the count is the one Spark job that finds there are none)."""
        from spark_jobs.io import dead_letter

        if counts := dead_letter.count_by_reason(letters):
            self.send_letters(letters, counts)

    def send_letters(self, letters, counts: dict[str, int]) -> None:
        """Dead-letter records (key, value, headers), ``counts`` of them by reason, to the dead-letter topic; then
        the listeners hear the counts."""
        from spark_jobs.io import dead_letter

        dead_letter.write_letters(letters, self.spec.application_id, self.settings.kafka)
        for listener in self._listeners:
            listener(counts)
