"""The stores of a job version in its driver: the role of Kafka Streams' ``ProcessorStateManager``.

One owner for everything a driver does with its stores' state outside the processor:

* each store's handle, made once (:class:`StoreHandle`): its changelog topic and its snapshot store;
* the claim of the version that every changelog write goes under (:attr:`JobStores.writer_fence`, fencing older
  drivers on any host: :mod:`spark_jobs.state.fencing`), and each store's changelog writer;
* the restore when the query has no checkpoint to resume from (:meth:`JobStores.restore_if_needed`), and the
  restored state as a query's ``initialState``;
* the snapshot cadence, and the snapshots taken in the background (:meth:`JobStores.start_snapshots_if_due`).

The job context (:class:`spark_jobs.driver.context.JobContext`) makes one (``ctx.stores``); the batch sink writes
through it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
from collections.abc import Callable

from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.phases import PhaseClock
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec, store
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter, fenced_writer
from spark_jobs.state.checkpoint_offsets import latest_batch_id
from spark_jobs.state.fencing import GENERATION_SPAN, WriterFence
from spark_jobs.state.restore import STORE_SCHEMA, RestoredState, RestoreListener, restore_from_snapshot
from spark_jobs.state.restore_history import record_restore
from spark_jobs.state.snapshots import SnapshotStore
from spark_jobs.state.store_changes import STORE_COLUMN, StoreChanges, restored_rows


@dataclasses.dataclass(frozen=True)
class StoreHandle:
    """One store of the job version, as its driver writes, snapshots and restores it."""

    name: str
    #: its changelog topic (``<application_id>-<store>-changelog``) and the topic's configs
    changelog: ChangelogTopic
    #: its Delta snapshot table's only reader and writer
    snapshots: SnapshotStore


class JobStores:
    """Every store of one job version in this driver (see the module docstring)."""

    def __init__(self, spark, spec: JobSpec, settings: Settings, failpoint: Callable[[str], None]) -> None:
        self.spark, self.spec, self.settings = spark, spec, settings
        self.layout = JobLayout.of(spec, settings)
        self._failpoint = failpoint
        #: store -> its handle, made once
        self.handles: dict[str, StoreHandle] = {
            s.name: StoreHandle(
                s.name,
                ChangelogTopic(
                    application_id=spec.application_id,
                    store=s.name,
                    partitions=spec.state_partitions,
                    replication_factor=settings.kafka_replication_factor,
                    kind=s.kind,
                    retention_ms=s.retention_ms,
                    overrides=s.changelog_configs,
                ),
                SnapshotStore.of(self.layout, s.name),
            )
            for s in spec.stores
        }
        #: store -> state rebuilt from snapshot + changelog when the query starts without a checkpoint
        self.restored: dict[str, RestoredState] = {}
        #: called with (store, SnapshotInfo) after every snapshot (the runner publishes it in the status)
        self.snapshot_listeners: list[Callable] = []
        #: changelog writers handed out, closed (their producers flushed) when the run ends
        self._open_writers: list[ChangelogWriter] = []
        #: store -> its changelog writer, made beside the query's start by :meth:`claim_in_background`
        self._prepared_writers: dict[str, concurrent.futures.Future] = {}
        self._claim: concurrent.futures.Future | None = None

    def handle(self, store_name: str) -> StoreHandle:
        """The store's handle (a store the job does not declare is refused: :class:`JobSpecError`)."""
        return self.handles[store(self.spec, store_name).name]

    def ensure_changelog_topics(self) -> list[str]:
        """Create every store's changelog topic (idempotent); returns the topic names."""
        for handle in self.handles.values():
            handle.changelog.ensure(self.settings.kafka)
        return [handle.changelog.name for handle in self.handles.values()]

    # ----- the claim and the changelog writers ---------------------------------------------------------------
    @functools.cached_property
    def writer_fence(self) -> WriterFence:
        """This driver's claim of the job version (claimed on first use, or by :meth:`claim_in_background`):
        every older driver of the version, on any host, is fenced from then on (:mod:`spark_jobs.state.fencing`).

        Raises:
            WriterFenced: a newer driver claimed the version while this one was claiming it.
        """
        return self._claim.result() if self._claim is not None else self._claim_fence()

    def claim_in_background(self) -> None:
        """Claim the job version, then make each store's changelog writer (it reads where the changelog's last
        complete batch is), in a thread of their own, beside what comes next (Spark's start of the query and
        the first batch's state phase: over a second, when a spare driver takes over). Whatever writes uses
        :attr:`writer_fence`, which waits for the claim."""
        if "writer_fence" in self.__dict__ or self._claim is not None:
            return
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="writer-fence")
        self._claim = pool.submit(self._claim_fence)
        for name in self.handles:
            self._prepared_writers[name] = pool.submit(self._open_writer, name)
        pool.shutdown(wait=False)

    @property
    def claimed(self) -> bool:
        """Whether this driver claimed the version (or is claiming it in the background, successfully)."""
        return "writer_fence" in self.__dict__ or (self._claim is not None and self._claim.exception() is None)

    @property
    def claim_refused(self) -> BaseException | None:
        """Why the claim of the job version failed, if it was claimed in the background and failed."""
        return self._claim.exception() if self._claim is not None else None

    def _claim_fence(self) -> WriterFence:
        fence = WriterFence(
            self.settings.kafka,
            self.spec.application_id,
            self.layout.transactional_id,
            self.layout.generations_topic,
            self.settings.kafka_replication_factor,
        )
        fence.claim_generation()
        return fence

    def changelog_writer(self, store_name: str) -> ChangelogWriter:
        """The store's changelog writer: batch ids of this driver's generation, markers in its transactions,
        and every id between the last complete batch and its own declared void."""
        prepared = self._prepared_writers.pop(store_name, None)
        return prepared.result() if prepared is not None else self._open_writer(store_name)

    def _open_writer(self, store_name: str) -> ChangelogWriter:
        writer = fenced_writer(self.handle(store_name).changelog, self.settings.kafka, self.writer_fence)
        self._open_writers.append(writer)
        return writer

    # ----- restore ------------------------------------------------------------------------------------------
    def restore_if_needed(self, listener: RestoreListener | None = None) -> dict[str, RestoredState]:
        """Rebuild every store when the query has no checkpoint to resume from.

        A checkpoint with a committed offset log resumes by itself (Spark restores RocksDB from it). Without
        one, each store is rebuilt from its latest snapshot + changelog tail and the query starts at the
        input offsets of that state; the result is also written to ``<checkpoint>/streamstate/restore.json``.
        A store of ``restore_in_spark_min_records`` records or more is rebuilt by Spark's executors (the
        query's ``initialState`` reads it lazily), a smaller one in this process.
        """
        if latest_batch_id(self.layout.checkpoint) is not None:
            return {}
        for name, handle in self.handles.items():
            restored = restore_from_snapshot(
                handle.snapshots,
                self.settings.kafka,
                handle.changelog.name,
                listener,
                spark=self.spark_for_state(name),
            )
            record_restore(self.settings, self.spec, restored)  # this deployment's restore throughput
            if restored.batch_id is not None or restored.next_batch_id > 0:
                self.restored[name] = restored
        if self.restored:
            summaries = {n: r.summary() for n, r in self.restored.items()}
            self.layout.restore_record.write_text(json.dumps(summaries, indent=2))
        return self.restored

    def spark_for_state(self, store_name: str):
        """The Spark session when the store is large enough to be restored and snapshotted by Spark's
        executors (``restore_in_spark_min_records``), else None: a small store is faster in this process."""
        from spark_jobs.state.restore import restore_size

        handle = self.handle(store_name)
        size = restore_size(handle.snapshots, self.settings.kafka, handle.changelog.name)
        return self.spark if size >= self.settings.restore_in_spark_min_records else None

    def initial_state(self, changes: StoreChanges):
        """The restored store as typed rows (``key`` + value columns) for ``transformWithState``'s
        ``initialState``, or None when nothing was restored. Spark reads it only in the first batch
        of a query without a checkpoint: exactly when a restore happened."""
        if changes.store not in self.restored:
            return None
        return restored_rows(self.restored[changes.store].store_frame(self.spark), changes.value_ddl)

    def initial_states(self, stores: tuple[StoreChanges, ...]):
        """Several stores' restored rows for one processor's ``initialState`` (see :meth:`initial_state`):
        ``key``, ``store`` (:data:`STORE_COLUMN`) and every store's value columns, null but the row's
        store's; None when nothing was restored. A store restored empty has no rows (one added since)."""
        from pyspark.sql import functions as F

        frames = [
            self.initial_state(s).withColumn(STORE_COLUMN, F.lit(s.store)) for s in stores if s.store in self.restored
        ]
        return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), frames) if frames else None

    def restored_store(self, changes: StoreChanges):
        """The store as it was restored (``key`` + value columns), empty when nothing was restored."""
        if changes.store in self.restored:
            store = self.restored[changes.store].store_frame(self.spark)
        else:
            store = self.spark.createDataFrame([], STORE_SCHEMA)
        return restored_rows(store, changes.value_ddl)

    # ----- snapshots ----------------------------------------------------------------------------------------
    def snapshot_due(self, changelog_batch_id: int) -> bool:
        """Whether the job's snapshot cadence (``snapshot_every_batches``) falls on this batch: counted within
        the driver's generation, after every N Spark batches, not at its first one."""
        every = self.spec.snapshot_every_batches
        return every > 0 and (changelog_batch_id % GENERATION_SPAN + 1) % every == 0

    def snapshot_if_due(self, store_name: str, changelog_batch_id: int):
        """Take a snapshot of ``store_name`` when the job's cadence says so; returns it, or None.

        Called after the batch's changelog write, so the snapshot includes that batch.
        """
        if not self.snapshot_due(changelog_batch_id):
            return None
        from spark_jobs.state.snapshotting import take_snapshot

        if JobLease(self.settings.status_dir, self.layout.standby.name).holder() is not None:
            return None  # the warm standby runs: it keeps this store's snapshots (one writer per table)

        self._failpoint("before_snapshot")
        handle = self.handle(store_name)
        snapshot = take_snapshot(
            handle.snapshots, self.settings.kafka, handle.changelog.name, spark=self.spark_for_state(store_name)
        )
        for listener in self.snapshot_listeners:
            listener(store_name, snapshot)
        return snapshot

    def start_snapshots_if_due(self, store_names: list[str], changelog_batch_id: int, phase_seconds: dict) -> bool:
        """The stores' snapshots when the job's cadence says so, taken off the micro-batch's path by
        :attr:`snapshot_worker` (skipped while one runs; its time added to ``phase_seconds``); returns whether
        they started."""
        if not self.snapshot_due(changelog_batch_id):
            return False

        def take() -> None:
            clock = PhaseClock(phase_seconds)
            for name in store_names:
                self.snapshot_if_due(name, changelog_batch_id)
            clock.lap("snapshot_background")

        return self.snapshot_worker.start(take)

    @functools.cached_property
    def snapshot_worker(self):
        """The thread this driver's snapshots are taken in (:class:`spark_jobs.state.snapshotting.SnapshotWorker`)."""
        from spark_jobs.state.snapshotting import SnapshotWorker

        return SnapshotWorker(self.spark)

    def close(self) -> None:
        """Flush and close the changelog writers' and the fence's producers, once a snapshot being taken is
        committed."""
        if "snapshot_worker" in self.__dict__:  # started
            self.snapshot_worker.wait()
        for prepared in self._prepared_writers.values():  # made, or failed, before their producers are closed
            prepared.exception()
        while self._open_writers:
            self._open_writers.pop().close()
        if self.claimed:
            self.writer_fence.close()
