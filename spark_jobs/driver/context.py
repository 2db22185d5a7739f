"""What a job's ``build`` function gets: the session, its spec, the deployment and the owners of its parts.

The context is a front over the owners of a job version's parts in its driver, each made once, on first use (the
roles of Kafka Streams' ``ProcessorContext`` over a task's ``ProcessorStateManager`` and ``RecordCollector``):

* its names and paths: :attr:`JobContext.layout` (:class:`spark_jobs.layout.JobLayout`);
* its inputs: :attr:`JobContext.sources` (:mod:`spark_jobs.driver.sources`): ``ctx.sources.stream()`` is the
  stateful stage's input, ``ctx.sources.with_dead_letters(...)`` the processor's, rejected records riding along;
* its stores: :attr:`JobContext.stores` (:mod:`spark_jobs.driver.stores`): ``ctx.stores.initial_state(changes)``
  is a processor's restored state, ``ctx.stores.handle(name)`` a store's changelog topic and snapshots;
* what it writes besides them: :attr:`JobContext.outputs` (:mod:`spark_jobs.driver.outputs`): ``ctx.outputs.table
  (keys)`` and ``ensure_table(schema)`` its output table, ``ensure_topic()`` its output topic;
* the batch sink a stateful job's query ends in (:meth:`JobContext.state_change_sink`,
  :mod:`spark_jobs.driver.batch_sink`), which writes through them, and the phases' times it keeps
  (:attr:`JobContext.phases`).
"""

from __future__ import annotations

import dataclasses
import functools

from runtime.settings import Settings
from spark_jobs.driver import failpoints
from spark_jobs.driver.outputs import JobOutputs
from spark_jobs.driver.phases import BatchPhases
from spark_jobs.driver.sources import JobSources
from spark_jobs.driver.stores import JobStores
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec
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
    #: the batch sink's time per phase, summed over the run (the run report's) and per micro-batch (its progress's)
    phases: BatchPhases = dataclasses.field(default_factory=BatchPhases)

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

    def outputs_may_repeat(self, batch_id: int) -> bool:
        """Whether micro-batch ``batch_id`` may re-derive outputs that are written already (a replay after a
        crash or a restore): then a primitive that appends its outputs must insert them only if absent
        (:meth:`JobOutputs.may_repeat`)."""
        return self.outputs.may_repeat(self.sources.batch_start(batch_id))

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

    def ensure_topics(self) -> None:
        """Create every topic this version writes, before any of its queries starts (idempotent): each store's
        changelog, the re-keying stage's repartition and progress topics, the dead-letter topic (the re-keying
        stage's first batch may already write to it) and the output topic. A broker that does not create topics
        on first use (``auto.create.topics.enable=false``, as most production clusters and the local broker run)
        then finds every one in place; the drivers' generations topic is created by the claim that first writes
        it (:class:`spark_jobs.state.fencing.WriterFence`)."""
        self.stores.ensure_changelog_topics()
        self.sources.ensure_topics()
        self.outputs.ensure_dead_letter_topic()
        self.outputs.ensure_topic()
