"""What a job's ``build`` function gets: the session, its spec, the deployment and its artifacts.

The context is a front over the owners of a job version's parts in its driver, each made once, on first use:
its inputs (:attr:`JobContext.sources`, :mod:`spark_jobs.driver.sources`), its stores (:attr:`JobContext.stores`,
:mod:`spark_jobs.driver.stores`) and what it writes besides them (:attr:`JobContext.outputs`,
:mod:`spark_jobs.driver.outputs`); the batch sink a stateful job's query ends in (:meth:`JobContext.state_change_sink`,
:mod:`spark_jobs.driver.batch_sink`) writes through them."""

from __future__ import annotations

import dataclasses
import functools

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.driver import failpoints
from spark_jobs.driver.outputs import JobOutputs
from spark_jobs.driver.sources import JobSources
from spark_jobs.driver.stores import JobStores
from spark_jobs.io.output_table import OutputTable
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec
from spark_jobs.state.changelog import (
    ChangelogTopic,
)
from spark_jobs.state.checkpoint_offsets import (
    latest_batch_id,
)
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.store_changes import StoreChanges


@dataclasses.dataclass(frozen=True)
class JobContext:
    spark: object  # pyspark.sql.SparkSession (not imported here: DAG files import this module)
    spec: JobSpec
    settings: Settings
    #: session settings the job's queries must start with (applied by the runner around start)
    query_conf: dict = dataclasses.field(default_factory=dict)
    #: called with {reason: records} after every batch that wrote dead letters (the runner publishes the
    #: run's totals in the status: metrics by reason, and on-call hears of records not keyed by the key)
    dead_letter_listeners: list = dataclasses.field(default_factory=list)
    #: seconds spent per phase of the state-change batches (state, changelog, outputs, snapshot), summed
    #: over the run: the run report's answer to "where does a batch's time go"
    phase_seconds: dict = dataclasses.field(default_factory=dict)
    #: micro-batch id -> its own milliseconds per phase, until its progress is published (:meth:`pop_batch_phases`)
    batch_phase_ms: dict = dataclasses.field(default_factory=dict)

    @property
    def layout(self) -> JobLayout:
        """Every name and path this job version owns."""
        return JobLayout.of(self.spec, self.settings)

    @functools.cached_property
    def stores(self) -> JobStores:
        """The job version's stores in this driver: their changelogs and the claim they are written under, their
        restore, their snapshots (:mod:`spark_jobs.driver.stores`)."""
        return JobStores(self.spark, self.spec, self.settings, self.failpoint)

    @functools.cached_property
    def outputs(self) -> JobOutputs:
        """What the job version writes besides its state in this driver: its output tables, output topic and dead
        letters (:mod:`spark_jobs.driver.outputs`)."""
        return JobOutputs(self.spark, self.spec, self.settings, self.dead_letter_listeners)

    @functools.cached_property
    def sources(self) -> JobSources:
        """The job version's inputs in this driver: the topics its stateful stage reads, where it starts reading
        them, the re-keying stage (:mod:`spark_jobs.driver.sources`)."""
        return JobSources(
            self.spark, self.spec, self.settings, self.stores.restored, self.outputs.write_letters, self.failpoint
        )

    def kafka_source(self):
        """The stateful stage's input as a streaming DataFrame (:meth:`JobSources.stream`)."""
        return self.sources.stream()

    @property
    def input_topic(self) -> str:
        """The topic the stateful stage reads; a join's left side (:attr:`JobSources.input_topic`)."""
        return self.sources.input_topic

    @property
    def input_topics(self) -> tuple[str, ...]:
        """Every topic the stateful stage reads (:attr:`JobSources.input_topics`)."""
        return self.sources.input_topics

    def with_dead_letters(self, classified, *source_columns: str, key: str | None = None):
        """The processor's input: every record of ``classified`` (see spark_jobs.io.dead_letter.classify) with
        its decoded fields and the named Kafka source columns; a rejected one carries its dead-letter record
        instead, which the processor passes on and :meth:`state_change_sink` writes to the job's dead-letter
        topic in the same micro-batch. ``key``: the field the processor groups by, kept on rejected records
        (see :func:`spark_jobs.io.dead_letter.with_dead_letters`)."""
        from spark_jobs.io import dead_letter

        return dead_letter.with_dead_letters(classified, self.spec.application_id, key, *source_columns)

    def snapshot_store(self, store_name: str) -> SnapshotStore:
        """The store's snapshot table (:attr:`stores`)."""
        return self.stores.handle(store_name).snapshots

    @property
    def checkpoint(self) -> Location:
        """The query checkpoint of this job version (one per application id)."""
        return self.layout.checkpoint

    @property
    def output_path(self) -> str:
        return str(self.layout.output_table)

    def output_table(self, keys: tuple[str, ...]) -> OutputTable:
        """The version's main output table, its rows identified by ``keys`` (:meth:`JobOutputs.table`)."""
        return self.outputs.table(keys)

    def ensure_output_table(self, schema) -> None:
        """Create the main output table with ``schema``, or add the columns it lacks (:meth:`JobOutputs.ensure_table`)."""
        self.outputs.ensure_table(schema)

    def changelog_topic(self, store_name: str) -> ChangelogTopic:
        """The store's changelog topic (:attr:`stores`)."""
        return self.stores.handle(store_name).changelog

    @property
    def restore_record(self) -> Location:
        """``restore.json`` in the checkpoint: how this checkpoint's state was restored, if it was."""
        return self.layout.restore_record

    def initial_state(self, changes: StoreChanges):
        """The restored store as typed rows for ``transformWithState``'s ``initialState``, or None when nothing
        was restored (:meth:`JobStores.initial_state`)."""
        return self.stores.initial_state(changes)

    def initial_states(self, stores: tuple[StoreChanges, ...]):
        """Several stores' restored rows for one processor's ``initialState`` (:meth:`JobStores.initial_states`)."""
        return self.stores.initial_states(stores)

    @property
    def starts_without_checkpoint(self) -> bool:
        """The query starts from restored state (or none), not from a checkpoint of its own."""
        return latest_batch_id(self.checkpoint) is None

    def state_change_sink(
        self,
        changes: StoreChanges | tuple[StoreChanges, ...],
        write_outputs,
        reconcile_outputs=None,
        output_records=None,
        refused_letters=None,
    ):
        """The ``foreachBatch`` function of a job whose processor emits store changes: a
        :class:`spark_jobs.driver.batch_sink.BatchSink` (its docstring says what it does with each micro-batch, and what
        each argument is). ``changes``: the store the processor keeps, or the stores (each picking its rows, see
        :func:`spark_jobs.state.store_changes.several_stores`); the outputs are the first one's view. When the
        query starts without a checkpoint, ``reconcile_outputs`` makes the outputs equal to the restored store
        now, before the query starts."""
        from spark_jobs.driver.batch_sink import BatchSink

        stores = changes if isinstance(changes, tuple) else (changes,)
        sink = BatchSink(self, stores, write_outputs, reconcile_outputs, output_records, refused_letters)
        sink.reconcile()
        return sink

    def new_batch_phases(self, batch_id: int) -> dict:
        """Batch ``batch_id``'s phases, new (a replayed batch's count again); the oldest go when the progress of
        their batches was never asked for (a query stopped before Spark reported it)."""
        for old in list(self.batch_phase_ms):  # a copy: the progress listener's thread pops from it
            if old < batch_id - 10:
                self.batch_phase_ms.pop(old, None)
        self.batch_phase_ms[batch_id] = {}
        return self.batch_phase_ms[batch_id]

    def pop_batch_phases(self, batch_id: int | None) -> dict[str, int]:
        """The milliseconds per phase the batch function spent on micro-batch ``batch_id`` (empty: it did not
        run it), forgotten once asked for (the progress listener publishes them with the batch's progress)."""
        return self.batch_phase_ms.pop(batch_id, {})

    def outputs_may_repeat(self, batch_id: int) -> bool:
        """Whether micro-batch ``batch_id`` may re-derive outputs that are written already (a replay after a
        crash or a restore): then a primitive that appends its outputs must insert them only if absent
        (:meth:`JobOutputs.may_repeat`)."""
        return self.outputs.may_repeat(self.sources.batch_start(batch_id))

    def write_dead_letters(self, batch, counts: dict[str, int]) -> None:
        """Send the batch's dead letters (the rows carrying one, ``counts`` of them by reason) to the job's
        dead-letter topic."""
        from spark_jobs.io import dead_letter

        letter = dead_letter.LETTER_COLUMN
        self.outputs.send_letters(batch.where(f"`{letter}` IS NOT NULL").select(f"{letter}.*"), counts)

    def write_letters(self, letters) -> None:
        """Dead-letter records (key, value, headers) of this batch to the job's dead-letter topic, counted by
        reason for :attr:`dead_letter_listeners` (:meth:`JobOutputs.write_letters`)."""
        self.outputs.write_letters(letters)

    def write_rejected(self, rejected) -> None:
        """Records a processor rejected inside a batch (late events: Kafka source columns, the reason and the
        message, see :func:`spark_jobs.io.dead_letter.dead_letter_records`) as dead letters, counted. A re-keyed
        job's name their records' places in the source topic (:meth:`Repartitioner.in_source_coordinates`)."""
        from spark_jobs.io import dead_letter

        letters = dead_letter.dead_letter_records(rejected, self.spec.application_id)
        if not (counts := dead_letter.count_by_reason(letters)):
            return
        if (repartitioner := self.sources.repartitioner) is not None:
            rejected = repartitioner.in_source_coordinates(rejected)
            letters = dead_letter.dead_letter_records(rejected, self.spec.application_id)
        self.outputs.send_letters(letters, counts)

    def nothing_to_reconcile(self, changes: StoreChanges) -> bool:
        """Nothing was restored and no output table of the version holds a file: the outputs already equal
        the (empty) store. A new version's first start then skips the reconciling MERGE (seconds, most of
        a small job's start)."""
        return changes.store not in self.stores.restored and self.outputs.hold_nothing()

    def failpoint(self, name: failpoints.Failpoint) -> None:
        """Where a fault test may stop this driver (see :mod:`spark_jobs.driver.failpoints`; off by default)."""
        failpoints.reached(name, self.settings.status_dir, self.spec.application_id)

    def close(self) -> None:
        """Flush and close what the job opened (the stores' producers, once a snapshot being taken is committed;
        the re-keying stage's producer)."""
        if "stores" in self.__dict__:
            self.stores.close()
        if "sources" in self.__dict__:
            self.sources.close()

    def ensure_output_topic(self) -> str | None:
        """Create the version's output topic when the job has one; returns its name (:meth:`JobOutputs.ensure_topic`)."""
        return self.outputs.ensure_topic()

    def ensure_topics(self) -> None:
        """Create every topic this version writes, before any of its queries starts (idempotent): each store's
        changelog, the re-keying stage's repartition and progress topics, the dead-letter topic (the re-keying
        stage's first batch may already write to it) and the output topic. A broker that does not create topics
        on first use (``auto.create.topics.enable=false``, as most production clusters and the local broker run)
        then finds every one in place; the drivers' generations topic is created by the claim that first writes
        it (:class:`spark_jobs.state.fencing.WriterFence`)."""
        self.ensure_changelog_topics()
        self.sources.ensure_topics()
        self.outputs.ensure_dead_letter_topic()
        self.outputs.ensure_topic()

    def ensure_changelog_topics(self) -> list[str]:
        """Create every store's changelog topic (idempotent); returns the topic names."""
        return self.stores.ensure_changelog_topics()
