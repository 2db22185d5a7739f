"""The batch sink of a stateful job: what happens to each micro-batch the processor emits (Kafka Streams'
``RecordCollector`` and the commit of a task, in one place).

Per micro-batch, in this order:

1. **Inputs' lag** (a job with several inputs): which of them have records written beyond the batch
   (:attr:`JobSources.input_lag`), the session setting its tasks read while the batch's Spark jobs run.
2. **The state phase**: the stateful plan runs, and what the sinks below read is counted, or collected by the
   same Spark job when the batch is small (:class:`StatePhase`).
3. **Dead letters**: the rows the decoders refused (``dead_letter.LETTER_COLUMN`` set) and the rows the
   processor refused inside the batch (late events, ``refused_letters``) go to the dead-letter topic.
4. **Outputs, then the transaction** (each store's changelog records, the output topic's records, every store's
   batch markers), or the transaction first for a job whose outputs are its store's view and that has an
   output topic (see :class:`BatchSink`).
5. **Snapshots** when due, in the background; the repartition topic purged below the batch's start.

Both writes are full values or tombstones, so a batch replayed after a crash rewrites the same results
(idempotent). The markers are what a restore trusts: a batch complete in the changelog has its outputs written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from spark_jobs.driver.session import BATCH_CACHE_CONF, session_conf
from spark_jobs.io import dead_letter
from spark_jobs.io.driver_rows import DriverRows
from spark_jobs.io.kafka_topics import kafka_partition
from spark_jobs.io.output_table import OutputCommit
from spark_jobs.state.batch_records import OutputRecords
from spark_jobs.state.changelog import DRIVER_RECORDS_MAX, ChangelogWriter, collects_in_driver, write_batches
from spark_jobs.state.checkpoint_offsets import KafkaOffsets, batch_end_offsets, batch_watermark_ms, records_between
from spark_jobs.state.store_changes import StoreChanges

if TYPE_CHECKING:
    from spark_jobs.driver.outputs import JobOutputs
    from spark_jobs.driver.phases import BatchPhases
    from spark_jobs.driver.sources import JobSources
    from spark_jobs.driver.stores import JobStores

#: ``write_outputs(batch, batch_id, commit)``: updates the job's outputs from a batch's rows
WriteOutputs = Callable[[object, int, OutputCommit], None]


@dataclasses.dataclass
class StatePhase:
    """What the state phase of one micro-batch found, and the frames its sinks read."""

    #: the processor's rows without dead letters
    batch: object
    #: the processor's rows as they came (dead letters included)
    lettered: object
    #: the rows the sinks read, collected by one Spark job (None: each sink reads through Spark)
    rows: DriverRows | None
    #: dead letters by reason
    letters: dict[str, int]
    #: the processor's rows that are no dead letters
    changed: int
    #: the most change rows any store has in the batch
    store_changes: int
    #: each store's writer and its changelog records
    changelog: list
    #: the output topic's records (None: none to write)
    results: object | None


class SinkContext(Protocol):
    """What the batch sink needs of its job's context (:class:`spark_jobs.driver.context.JobContext`)."""

    spec: object  # spark_jobs.registry.JobSpec
    settings: object  # runtime.settings.Settings
    #: the phases' times, summed over the run and per batch
    phases: BatchPhases

    @property
    def layout(self): ...  # spark_jobs.layout.JobLayout
    @property
    def sources(self) -> JobSources: ...
    @property
    def stores(self) -> JobStores: ...
    @property
    def outputs(self) -> JobOutputs: ...
    def failpoint(self, name: str) -> None: ...


class BatchSink:
    """The ``foreachBatch`` function of a job whose processor emits store changes
    (:meth:`JobContext.state_change_sink` makes it).

    ``changes``: the stores the processor keeps, each picking its rows (see
    :func:`spark_jobs.state.store_changes.several_stores`); the outputs are the first one's view.

    ``reconcile_outputs(restored)``, for jobs whose outputs are a view of the store: when the query starts
    without a checkpoint, it is called before the query starts (:meth:`reconcile`), with the restored store
    (``key`` + value columns; empty when nothing was restored), and makes the outputs equal to it (not called
    when nothing was restored and the outputs hold nothing: they are equal already). Without it a row written by
    a batch whose changelog never completed (a driver killed between the two writes) could outlive the restore:
    the replay re-derives every key it touches, but not a key whose later history no longer reaches the outputs.

    ``write_outputs(batch, batch_id, commit)`` updates the job's outputs from the rows that are no dead letters
    (not called when there are none: nothing changed), each of its table writes carrying ``commit``
    (:class:`spark_jobs.io.output_table.OutputCommit`; a Spark write in the call carries it too, through the
    session's conf). Its writes are Delta idempotent writes whose version is the changelog batch id, so it writes
    each output table at most once per batch, and a driver fenced by a newer one has its late writes skipped.

    ``refused_letters(batch)``: the rows the processor refused inside the batch (late events) as
    :func:`spark_jobs.io.dead_letter.dead_letter_records` takes them (None: none).

    ``output_records(batch)``, for a job with an output topic (``JobSpec.output_topic``): the batch's results as
    Kafka records (``key`` and ``value`` binary, a null value a tombstone), written to the topic in the transaction
    of the batch's markers: a consumer reading committed sees a batch's results whole, only once its changelog is
    complete (a driver killed before the markers leaves none of them), and once (a batch Spark replays after its
    transaction committed writes none: :meth:`ChangelogWriter.committed_already`).

    The markers come after the outputs because they are what a restore trusts. (Changelog first lost outputs when
    a driver died between the two and the checkpoint was then lost: the restore resumed after a batch whose
    outputs were never written. Found by tests/faults/test_driver_kills.py.) A job whose outputs are the store's
    view (``reconcile_outputs``) and that has an output topic commits the transaction first and writes its outputs
    after it (failpoint ``between_markers_and_outputs``): a reader of the topic gets a batch's results without
    waiting for the Delta commit, and nothing is lost by the order, since a restore without the checkpoint makes
    the outputs equal to the restored store, and with it Spark replays the batch, whose Delta write is still
    missing and whose transaction is not repeated.

    A batch of few input records (at most ``min(driver_output_max_rows, DRIVER_RECORDS_MAX)``, from the offset
    log), after this driver's first, is run by the Spark job that collects what its sinks read and its dead-letter
    counts (:mod:`spark_jobs.io.driver_rows`); a larger one is first materialised and counted by a job of its own,
    and enters the driver only when its rows are few (``driver_output_max_rows``); its stores' change rows,
    counted by that job too, go into the markers' transaction when they are few
    (:data:`~spark_jobs.state.changelog.DRIVER_RECORDS_MAX`), else through Spark's Kafka sink. (The bound on a
    small batch is its input: a record that closes many windows brings all their rows with it.)
    """

    def __init__(
        self,
        context: SinkContext,
        changes: tuple[StoreChanges, ...],
        write_outputs: WriteOutputs,
        reconcile_outputs: Callable[[object], None] | None = None,
        output_records: Callable[[object], object] | None = None,
        refused_letters: Callable[[object], object | None] | None = None,
    ) -> None:
        self.context = context
        self.changes = changes
        self.write_outputs = write_outputs
        self.reconcile_outputs = reconcile_outputs
        self.output_records = output_records
        self.refused_letters = refused_letters
        # made at the first batch, after its state phase: the claim of the version they write under (the batch
        # base, from its generation) may still be under way in the background until then
        self.writers: list[tuple[ChangelogWriter, StoreChanges]] = []
        #: the outputs' delta-rs tables, reused by the next batches (OutputCommit)
        self.open_tables: dict = {}
        self.events = output_records is not None and context.spec.output_topic_kind() == "events"
        self.transaction_first = output_records is not None and reconcile_outputs is not None
        settings = context.settings
        #: a batch reading at most this many input records (known from the offset log) has the rows its sinks
        #: read collected by the job that runs its plan: as many rows as the processor emits for them
        self.few_inputs_max = min(settings.driver_output_max_rows, DRIVER_RECORDS_MAX)
        self.driver_rows_max = settings.driver_output_max_rows
        #: the last batch's id and end offsets: where the next one starts
        self.last_end: tuple[int, KafkaOffsets] | None = None

    def reconcile(self) -> None:
        """Make the outputs equal to the restored store, before the query starts without a checkpoint (see the
        class docstring); nothing to do for a job without ``reconcile_outputs``."""
        context, shown = self.context, self.changes[0]
        if self.reconcile_outputs is None or not context.sources.starts_without_checkpoint:
            return
        # nothing restored and no output table holds a file: the outputs already equal the (empty) store, and a
        # new version's first start skips the reconciling MERGE (seconds, most of a small job's start)
        if shown.store not in context.stores.restored and context.outputs.hold_nothing():
            return
        clock = context.phases.clock()
        self.reconcile_outputs(context.stores.restored_store(shown))
        clock.lap("reconcile")

    def __call__(self, batch, batch_id: int) -> None:
        context = self.context
        end_offsets = batch_end_offsets(context.layout.checkpoint, batch_id)
        # a join's tasks take both topics in time order across batches: which inputs have records written
        # beyond this batch, read once before it runs (spark_jobs/state/input_lag.py)
        lag = {}
        if (input_lag := context.sources.input_lag) is not None:
            start = context.sources.batch_start_offsets(batch_id) if context.spec.max_task_idle_ms else None
            lag = input_lag.reading(batch_id, end_offsets, start).conf()
        with session_conf(batch.sparkSession, lag):
            self._write(batch, batch_id, end_offsets)

    def _write(self, batch, batch_id: int, end_offsets: KafkaOffsets) -> None:
        context = self.context
        clock = context.phases.clock(batch_id)
        with session_conf(batch.sparkSession, BATCH_CACHE_CONF):  # read as the cache is declared
            cached = batch.persist()  # several writes from one batch: run the stateful plan once
        try:
            started = self._start_of(batch_id)
            inputs = records_between(started, end_offsets) if started is not None else None
            self.last_end = (batch_id, end_offsets)
            if self.writers and inputs is not None and inputs <= self.few_inputs_max:
                phase = self._state_phase_of_few(batch, end_offsets)
            else:
                phase = self._state_phase(batch, end_offsets)
            clock.lap("state")
            self._write_letters(phase)
            clock.lap("dead_letters")
            context.failpoint("before_outputs")
            if self.transaction_first:
                self._commit_transaction(phase, batch_id, end_offsets)
                clock.lap("changelog")
                context.failpoint("between_markers_and_outputs")
                self._write_outputs(phase, batch_id, end_offsets)
                clock.lap("outputs")
            else:
                self._write_outputs(phase, batch_id, end_offsets)
                clock.lap("outputs")
                context.failpoint("between_outputs_and_markers")
                self._commit_transaction(phase, batch_id, end_offsets)
                clock.lap("changelog")
        finally:
            cached.unpersist()
        self._after(batch_id, started)
        clock.lap("snapshot")

    def _start_of(self, batch_id: int) -> KafkaOffsets | None:
        """Where micro-batch ``batch_id`` starts: the previous batch's end, known without reading the offset log
        when this driver ran it."""
        if self.last_end is not None and self.last_end[0] == batch_id - 1:
            return self.last_end[1]
        return self.context.sources.batch_start_offsets(batch_id)

    def _state_phase_of_few(self, batch, end_offsets: KafkaOffsets) -> StatePhase:
        """A batch of few input records: the Spark job that runs its plan also collects what its sinks will read
        and its rows' dead-letter reasons (the counts), so no job of its own materialises it first
        (spark_jobs/io/driver_rows.py)."""
        rows = DriverRows()
        reasons = dead_letter.letter_reasons(batch)
        kept = dead_letter.without_letters(batch)
        changelog, results = self._sink_frames(kept, end_offsets, rows, at_most=None)
        letters = dead_letter.counted_reasons(rows.arrow(reasons))
        changed = letters.pop(None, 0)
        # a store's changes are some of the processor's rows
        results = results if changed else None
        return StatePhase(kept, batch, rows, letters, changed, changed, changelog, results)

    def _state_phase(self, batch, end_offsets: KafkaOffsets) -> StatePhase:
        """One Spark job materialises the batch (so the state phase is timed apart from the writes), counting the
        processor's rows and the dead letters it passed on as they pass (by reason: a second job, over the cached
        rows, only when there are some), and each store's change rows: a large batch's few changes are then
        collected into the markers' transaction, not written by a Spark job of Kafka's sink."""
        count = dead_letter.count_batch(batch, {s.store: s.rows or "true" for s in self.changes})
        letters = count.by_reason
        changed = letters.pop(None, 0)
        store_changes = max(count.matching.values(), default=0)
        if not self.writers:
            self.writers.extend((self.context.stores.changelog_writer(s.store), s) for s in self.changes)
        kept = dead_letter.without_letters(batch, some=bool(letters))
        # a small batch's driver-side reads (its outputs, output records, changelog records) in one Spark job:
        # each frame announced before the outputs read theirs (spark_jobs/io/driver_rows.py)
        rows = DriverRows() if changed <= self.driver_rows_max else None
        changelog, results = self._sink_frames(kept, end_offsets, rows, at_most=store_changes, publish=bool(changed))
        return StatePhase(kept, batch, rows, letters, changed, store_changes, changelog, results)

    def _sink_frames(self, batch, end_offsets, rows: DriverRows | None, at_most: int | None, publish: bool = True):
        """Each store's changelog records and the output topic's (None: none to write), announced to ``rows``
        (the changelog's when the markers' transaction takes them, see ``collects_in_driver``)."""
        changelog = [(writer, kept.changelog_records(batch)) for writer, kept in self.writers]
        results = None
        # not for a batch replayed after its transaction committed: its records are in the topic once
        if publish and self.output_records is not None and not self.writers[0][0].committed_already(end_offsets):
            results = self.output_records(batch)  # through the driver: one transaction writes them
        if rows is not None:
            rows.announce(results)
            if collects_in_driver([writer for writer, _ in changelog], at_most=at_most):
                rows.announce(*(frame for _, frame in changelog))
        return changelog, results

    def _write_letters(self, phase: StatePhase) -> None:
        """The batch's dead letters (the rows carrying one) and the records its processor refused (late events),
        to the job's dead-letter topic, counted by reason. A re-keyed job's refused records are named by their
        places in the source topic (:meth:`Repartitioner.in_source_coordinates`)."""
        context = self.context
        application_id = context.spec.application_id
        if phase.letters:
            letter = dead_letter.LETTER_COLUMN
            context.outputs.send_letters(
                phase.lettered.where(f"`{letter}` IS NOT NULL").select(f"{letter}.*"), phase.letters
            )
        if self.refused_letters is None or not phase.changed:
            return
        refused = self.refused_letters(phase.batch)
        if refused is None:
            return
        letters = dead_letter.dead_letter_records(refused, application_id)
        if not (counts := dead_letter.count_by_reason(letters)):
            return
        if (repartitioner := context.sources.repartitioner) is not None:
            letters = dead_letter.dead_letter_records(repartitioner.in_source_coordinates(refused), application_id)
        context.outputs.send_letters(letters, counts)

    def _write_outputs(self, phase: StatePhase, batch_id: int, end_offsets: KafkaOffsets) -> None:
        """An idempotent Delta write: skipped when a newer driver already wrote a higher batch id (a fenced
        driver's late MERGE, see spark_jobs/state/fencing.py); its commits carry the input position they reached
        (spark_jobs/state/output_marks.py). A batch that changed nothing (e.g. only moved the watermark) writes
        nothing."""
        if not phase.changed:
            return
        context = self.context
        through_driver = phase.changed <= self.driver_rows_max
        commit = OutputCommit(
            context.layout.output_transaction_app_id,
            self.batch_base + batch_id,
            end_offsets.get(context.sources.input_topic, {}),
            through_driver=through_driver,
            rows=phase.rows if through_driver else None,
            open_tables=self.open_tables,
        )
        with session_conf(phase.batch.sparkSession, commit.spark_conf()):
            self.write_outputs(phase.batch, batch_id, commit)

    def _commit_transaction(self, phase: StatePhase, batch_id: int, end_offsets: KafkaOffsets) -> None:
        """Each store's changelog records, the output topic's and every store's markers, in one transaction."""
        context = self.context
        write_batches(
            phase.changelog,
            batch_id,
            end_offsets,
            batch_watermark_ms(context.layout.checkpoint, batch_id),
            self._output_records(phase),
            at_most=phase.store_changes,
            rows=phase.rows,
        )

    def _output_records(self, phase: StatePhase) -> tuple[OutputRecords, ...]:
        if phase.results is None:
            return ()
        published = phase.rows.arrow(phase.results) if phase.rows is not None else phase.results.toArrow()
        keys = published.column("key").to_pylist()
        values = published.column("value").to_pylist()
        partitions = None
        if self.events:  # where Kafka's Java clients would put each key (see JobOutputs.ensure_topic)
            count = self.context.spec.output_partitions
            partitions = [kafka_partition(key.decode(), count) for key in keys]
        return (OutputRecords(self.context.layout.output_topic, keys, values, partitions),)

    @property
    def batch_base(self) -> int:
        """Added to Spark's batch id to make the changelog batch id (this driver's generation's)."""
        return self.writers[0][0].batch_base

    def _after(self, batch_id: int, started: KafkaOffsets | None) -> None:
        context = self.context
        changelog_batch_id = self.batch_base + batch_id
        stores = context.stores
        stores.start_snapshots_if_due([kept.store for kept in self.changes], changelog_batch_id, context.phases.seconds)
        repartitioner = context.sources.repartitioner
        if repartitioner is not None and batch_id > 0 and stores.snapshot_due(changelog_batch_id):
            # below where this batch started, never its end: Spark replays this batch when killed before its
            # commit log, reading from its start; the batch before it is committed, and the changelog complete
            # past it, so neither a resume nor a restore reads below that start again
            repartitioner.purge_below(started.get(context.sources.input_topic, {}))
