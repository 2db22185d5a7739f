"""The spare driver: a second driver of a job version, warm and waiting, that takes over when the running one dies.

Kafka Streams keeps standby replicas so that a failover does not wait for a restore. For a Spark driver most of a
restart is not the state but the driver itself: a JVM to start, a Spark session, the first query's classes loaded
and compiled (BENCHMARKS.md "Recovery after kill -9"). The spare pays for that in advance:

1. it takes its own lease (``<application_id>.spare.lease``, :attr:`~spark_jobs.layout.JobLayout.spare`): one spare
   per job version;
2. once the running driver is past its first batches (:func:`driver_settled`: a new spare must not compete with
   a driver that just started or just took over), it starts its Spark session and runs :func:`warm_up` (the code paths of a micro-batch and of a restore, on
   scratch data in a temporary directory: nothing of the job's is written);
3. READY, it watches the driver's lease every :data:`POLL_S`. When the driver it watched lets the lease go without
   having said that it stopped (:func:`driver_died`: kill -9, the OOM killer, a lost node), it takes the driver's
   lease (the next epoch, fenced like any new driver: :mod:`spark_jobs.state.fencing`), ends the dead driver's
   Spark JVM if it outlived its Python process (:func:`end_orphaned_jvm`), gives its own lease up (supervision
   starts the next spare) and runs the job as a freshly launched driver would: it resumes from the checkpoint,
   or restores from snapshot + changelog when the checkpoint is lost.

A driver that stopped on request (its last state NOT_RUNNING or PENDING_SHUTDOWN) or failed (ERROR) is not taken
over: a stop stays a stop, and a failure goes through supervision's check (backoff, crash loop, alerts) as before.
A spare never starts a job that is not running; a stop request stops the spare before the driver.

Its cost is a second driver's memory (a JVM and a Python process; BENCHMARKS.md measures it), so it is on where
the job's ``SupervisionPolicy.spare_driver`` and the deployment's ``STREAMSTATE_SPARE_DRIVERS`` say so.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from runtime.process import process_alive
from runtime.settings import Settings
from spark_jobs.driver.lease import JobAlreadyRunning, JobLease, LeaseHolder
from spark_jobs.driver.lifecycle import (
    SPARE_LIFECYCLE,
    JobState,
    PublishedStatus,
    SpareState,
    SpareStatus,
    published_by_holder,
    published_in_epoch,
    read_status,
    write_spare_status,
)
from spark_jobs.layout import JobLayout, application_id, rehearsal_input_topic
from spark_jobs.registry import JobSpec

log = logging.getLogger("streamstate.spare")


class RunOutcome(Protocol):
    """What the rehearsal reads of a run's report (:class:`spark_jobs.driver.run.RunReport`)."""

    error: str | None
    input_rows: int
    batches: int


#: how the spare runs the job it rehearses: :func:`spark_jobs.driver.run.run` (``spec, settings, *, available_now, spark``),
#: given by the caller: run.py starts spares, so this module does not import it
JobRunner = Callable[..., RunOutcome]

#: how often the spare looks at the driver's lease (the kernel frees it the moment the driver dies)
POLL_S = 0.1

#: a driver whose last published state is one of these was still at work when its lease went: it died
WORKING_STATES = frozenset({JobState.CREATED, JobState.RESTORING, JobState.RUNNING})
#: how long a new spare waits for the running driver to settle before it starts Spark (see :func:`driver_settled`)
SETTLE_MAX_S = 120.0


def driver_settled(status: PublishedStatus | None, holder: LeaseHolder | None) -> bool:
    """Whether a spare may warm up now: no driver runs, or the running driver (``holder``, whose own status
    ``status`` is) is past its first micro-batches (two batches done in this run, or idle: no input).

    A spare's Spark start and warm-up take seconds of both cores; a driver that just started, or just took over,
    is running its first batch then (the catch-up of an outage): they would compete for the machine exactly when
    recovery time is counted."""
    if holder is None:
        return True
    if not published_by_holder(status, holder) or status.state is not JobState.RUNNING:
        return False
    progress = status.progress
    two_batches = progress is not None and status.first_batch_id is not None and progress.batch_id is not None
    return status.idle_at is not None or (two_batches and progress.batch_id > status.first_batch_id)


def driver_died(watched_epoch: int, status: PublishedStatus | None) -> bool:
    """Whether the driver that held lease epoch ``watched_epoch``, whose lease is free now, died (take over) rather
    than ended (stand down), from the status it last published (``status``).

    A driver that ends says so before it lets its lease go: NOT_RUNNING after a stop, PENDING_SHUTDOWN while one
    (a stop forced after its timeout), ERROR when it failed. One that published nothing for its epoch died while
    starting. The rule reads only the driver's own word for its own epoch: a status left by an earlier epoch
    says nothing about this one.
    """
    if not published_in_epoch(status, watched_epoch):
        return True
    return status.state in WORKING_STATES


@dataclasses.dataclass
class Takeover:
    """The driver lease a spare took, and whose it was."""

    lease: JobLease
    epoch: int
    from_epoch: int


class SpareDriver:
    """One job version's spare driver: warm up, watch the driver's lease, take over when the driver dies."""

    def __init__(
        self, spec: JobSpec, settings: Settings, run_job: JobRunner, stop_requested: threading.Event | None = None
    ) -> None:
        self.spec, self.settings, self.run_job = spec, settings, run_job
        #: set by the process's SIGTERM handler (spark_jobs/driver/run.py): a stop noticed between py4j calls
        self.stop_requested = stop_requested or threading.Event()
        self.layout = JobLayout.of(spec, settings)
        self.own_lease = JobLease(settings.status_dir, self.layout.spare.name)
        self.driver_lease = JobLease(settings.status_dir, spec.application_id)
        self.name = self.layout.spare.name
        self.status = SpareStatus(spec.application_id, pid=os.getpid(), host=socket.gethostname())

    # ----- lifecycle -------------------------------------------------------------------------------------------
    def transition_to(self, state: SpareState, **fields) -> None:
        """The one way the spare's state changes (:data:`~spark_jobs.driver.lifecycle.SPARE_LIFECYCLE`), published."""
        SPARE_LIFECYCLE.check(self.name, self.status.state, state)
        self._publish(state=state, **fields)

    def _publish(self, **fields) -> None:
        self.status = dataclasses.replace(self.status, **fields, updated_at=_now())
        write_spare_status(self.settings.status_dir, self.status)

    # ----- the spare's life ------------------------------------------------------------------------------------
    def prepare(self, spark_factory) -> object:
        """Take the spare's lease, start Spark (``spark_factory()``) and warm it up; returns the session.

        Raises:
            JobAlreadyRunning: another spare of this job version runs (nothing was started).
        """
        epoch = self.own_lease.acquire()
        self._publish(lease_epoch=epoch, started_at=_now())
        self.transition_to(SpareState.WARMING)
        started = time.monotonic()
        try:
            self._wait_for_a_settled_driver()
            spark = spark_factory()
            warm_up(spark, self.spec, self.settings, self.run_job, self.stop_requested)
            if self.stop_requested.is_set():
                raise KeyboardInterrupt
        except BaseException as err:
            self._fail(err)
            raise
        self.transition_to(SpareState.READY, warm_up_s=round(time.monotonic() - started, 3))
        log.info(json.dumps({"event": "spare_ready", "name": self.name, "warm_up_s": self.status.warm_up_s}))
        return spark

    def _wait_for_a_settled_driver(self) -> None:
        """Hold the warm-up back (at most :data:`SETTLE_MAX_S`) while the driver runs its first batches."""
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline and not self.stop_requested.is_set():
            if driver_settled(
                read_status(self.settings.status_dir, self.spec.application_id), self.driver_lease.holder()
            ):
                return
            time.sleep(0.5)

    def wait_for_takeover(self, timeout_s: float | None = None) -> Takeover | None:
        """Watch the driver's lease until its driver dies, then take the lease; None after ``timeout_s`` (None:
        wait for ever). A stop request raises KeyboardInterrupt (the caller's signal handler) and stops the spare."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while deadline is None or time.monotonic() < deadline:
                if self.stop_requested.is_set():
                    raise KeyboardInterrupt
                holder = self.driver_lease.holder()
                watched = self.status.watching_epoch
                if holder is not None:
                    if holder.epoch != watched:
                        self._publish(watching_epoch=holder.epoch)
                elif watched is not None:
                    last = read_status(self.settings.status_dir, self.spec.application_id)
                    if not driver_died(watched, last):
                        log.info(
                            json.dumps(
                                {
                                    "event": "spare_stands_down",
                                    "name": self.name,
                                    "driver_epoch": watched,
                                    "driver_state": last.state.value if last else None,
                                }
                            )
                        )
                        # it ended on its own: the next driver supervision starts is the one to watch
                        self._publish(watching_epoch=None)
                    elif (taken := self._take(watched, last)) is not None:
                        return taken
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.stop()
            raise
        return None

    def _take(self, from_epoch: int, last: PublishedStatus | None) -> Takeover | None:
        lease = JobLease(self.settings.status_dir, self.spec.application_id)
        try:
            epoch = lease.acquire()
        except JobAlreadyRunning:
            return None  # supervision's own restart was quicker: watch that driver instead
        ended = end_orphaned_jvm(from_epoch, last)
        self.transition_to(SpareState.TAKING_OVER, took_over_from=from_epoch, took_over_epoch=epoch)
        self.own_lease.release()  # supervision may start the next spare while this one runs the job
        log.warning(
            json.dumps(
                {
                    "event": "spare_took_over",
                    "application_id": self.spec.application_id,
                    "from_epoch": from_epoch,
                    "epoch": epoch,
                    "orphaned_jvm_ended": ended,
                }
            )
        )
        return Takeover(lease, epoch, from_epoch)

    def stop(self) -> None:
        if self.status.state in (SpareState.CREATED, SpareState.WARMING, SpareState.READY):
            self.transition_to(SpareState.PENDING_SHUTDOWN)
        if self.status.state in (SpareState.PENDING_SHUTDOWN, SpareState.ERROR):
            self.transition_to(SpareState.NOT_RUNNING)
        self.own_lease.release()

    def _fail(self, err: BaseException) -> None:
        if isinstance(err, KeyboardInterrupt):
            self.stop()
            return
        self.transition_to(
            SpareState.ERROR, error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        )
        self.transition_to(SpareState.NOT_RUNNING)
        self.own_lease.release()


def spare_driver_settings(settings: Settings) -> Settings:
    """``settings`` for a spare driver's JVM: its heap committed whole at start (``-Xms`` = ``spark.driver.memory``).

    A spare exists to take over at full speed. A JVM whose heap starts small grows it under the load that needs
    it: a lost checkpoint's restore of 1e7 keys ran 83 collection pauses and 16 concurrent marking cycles (each
    ~0.35 s of one of the cores the restore runs on) in a heap growing from 380 MB to 715 MB, against 16 pauses
    and no cycle with the heap committed (BENCHMARKS.md "Restore of a large store: the spare's heap committed at
    start"). The cost is resident memory: the pages the warm-up touches stay the spare's. A ``-Xms`` of the
    deployment's own (``spark_driver_java_options``) comes later on the command line and wins."""
    options = " ".join(filter(None, [f"-Xms{settings.spark_driver_memory}", settings.spark_driver_java_options]))
    return settings.replace(spark_driver_java_options=options)


def end_orphaned_jvm(epoch: int, status: PublishedStatus | None, wait_s: float = 10.0) -> int | None:
    """SIGKILL the dead driver's Spark JVM when it outlived the driver's Python process; returns its pid (None:
    nothing to end).

    Under spark-submit the Python driver is the JVM's child: killed alone, it leaves its JVM running until the JVM
    notices, and meanwhile the JVM's query thread may still write the next batch's offsets to the checkpoint the
    spare is about to resume (two writers of one offset log). The JVM of a dead Python driver can do nothing
    useful, so the new lease holder ends it first (what a cluster manager's fencing of a lost node does). The pid
    comes from the dead driver's own status for its own epoch, on this host, and must still be a Java process (a
    reused pid is left alone)."""
    if not published_in_epoch(status, epoch) or not status.jvm_pid or status.host != socket.gethostname():
        return None
    pid = status.jvm_pid
    if pid in (os.getpid(), os.getppid()):
        return None
    try:
        if b"java" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
        os.kill(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    deadline = time.monotonic() + wait_s
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def warm_up(
    spark, spec: JobSpec, settings: Settings, run_job: JobRunner, stop_requested: threading.Event | None = None
) -> None:
    """Run what a driver's first micro-batch and restore run, so that their classes are loaded and their plans
    compiled before the spare is needed: :func:`rehearse` (the job itself, on a scratch copy), then, on scratch
    data, the paths a rehearsal's few records do not take (a Spark Delta MERGE of a large batch), a Kafka read of
    the job's input, and the job's own Delta logs read as the driver's first batch and a restore read them.
    Nothing the job owns is written. A stop request (``stop_requested`` set) raises KeyboardInterrupt between the
    steps (a stopped rehearsal returns on its own), so a spare stopped while it warms up stops within a step."""
    from delta.tables import DeltaTable

    def unless_stopped() -> None:
        if stop_requested is not None and stop_requested.is_set():
            raise KeyboardInterrupt

    importlib.import_module(spec.entrypoint.split(":")[0])  # the job's own code, and the primitives it declares
    rehearse(spark, spec, settings, run_job)
    unless_stopped()
    rehearse_restore(spark, spec, settings)
    unless_stopped()
    layout = JobLayout.of(spec, settings)
    # a stop (SIGTERM) interrupts the scratch query mid-write: what it leaves is scratch, never an error of its own
    with tempfile.TemporaryDirectory(
        prefix=f"{spec.application_id}-warm-up-", ignore_cleanup_errors=True
    ) as scratch_dir:
        scratch = Path(scratch_dir)
        (scratch / "input").mkdir()
        for batch in range(2):
            lines = [json.dumps({"key": f"k{i % 7}", "value": i}) for i in range(batch * 50, batch * 50 + 50)]
            (scratch / "input" / f"{batch}.json").write_text("\n".join(lines))

        def write(batch_df, batch_id: int) -> None:
            import deltalake

            rows = batch_df.toArrow()
            deltalake.write_deltalake(str(scratch / "by_delta_rs"), rows, mode="append")
            target = str(scratch / "by_spark")
            if batch_id == 0:
                batch_df.write.format("delta").save(target)
            else:
                merge = DeltaTable.forPath(spark, target).alias("t").merge(batch_df.alias("s"), "t.key = s.key")
                merge.whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

        query = (
            spark.readStream.schema("key string, value long")
            .option("maxFilesPerTrigger", 1)
            .json(str(scratch / "input"))
            .groupBy("key")
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(write)
            .option("checkpointLocation", str(scratch / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    unless_stopped()
    reads = [
        lambda: (
            spark.read.format("kafka")
            .options(**settings.kafka.spark_options())
            .option("subscribe", ",".join(layout.state_input_topics))
            .option("startingOffsets", "latest")
            .option("endingOffsets", "latest")
            .load()
            .count()
        ),
        *(
            lambda table=table: spark.read.format("delta").load(str(table)).limit(1).collect()
            for table in (*layout.output_tables, *layout.snapshot_tables)
        ),
    ]
    for read in reads:
        try:
            read()
        except Exception as err:  # noqa: BLE001 - a topic or table the job has not made yet: nothing to read
            log.info("warm-up read skipped: %s", str(err).splitlines()[0] if str(err) else type(err).__name__)


#: the suffix of a rehearsal's job name (its application id, topics and tables are all its own)
REHEARSAL_SUFFIX = "_spare_rehearsal"
#: records per source partition a rehearsal processes (the newest ones)
REHEARSAL_RECORDS = 32


def rehearse(spark, spec: JobSpec, settings: Settings, run_job: JobRunner) -> str:
    """Run the job itself on a scratch copy, in this Spark session: its own plan compiled, its processor
    started, a restore (there is no checkpoint), micro-batches (two at least) of the newest
    :data:`REHEARSAL_RECORDS` records of each source partition (of each input, for a join) through every sink;
    then once more, its last batch replayed from the checkpoint (:func:`replay_last_batch`), as a takeover's first
    batch is: its state stores loaded from the checkpoint's files, its changelog transaction found committed.

    The copy is the job under another name (``<job>_spare_rehearsal``: its own application id, changelog,
    dead-letter and generations topics, output topic) reading a scratch copy of those newest records (topics
    ``<job>_spare_rehearsal-v<N>-input-<i>``: a live source would give the replay everything produced since), with
    its checkpoint, tables and status in a temporary directory. Its topics are deleted after.

    Returns what happened (also logged). Best effort: a rehearsal that fails (a broker that refuses to create
    topics, say) is logged, and the spare is still warm from the rest of :func:`warm_up`."""
    from spark_jobs.io.kafka_topics import copy_newest_records, delete_topics

    name = spec.name + REHEARSAL_SUFFIX
    copy_id = application_id(name, spec.version)
    inputs = {topic: rehearsal_input_topic(copy_id, i) for i, topic in enumerate(spec.input_topics)}
    copy = dataclasses.replace(
        spec,
        name=name,
        source_topic=inputs[spec.source_topic],
        join_topics=tuple(inputs[t] for t in spec.join_topics),
        output_topic=spec.output_topic + REHEARSAL_SUFFIX if spec.output_topic else None,
    )
    started, topics = time.monotonic(), list(inputs.values())
    with tempfile.TemporaryDirectory(
        prefix=f"{spec.application_id}-rehearsal-", ignore_cleanup_errors=True
    ) as scratch_dir:
        scratch = settings.replace(data_dir=Path(scratch_dir), lake_uri=None, checkpoint_uri=None, metrics_port=0)
        layout = JobLayout.of(copy, scratch)
        topics += layout.topics
        try:
            records = sum(
                copy_newest_records(
                    settings.kafka, topic, scratch_topic, REHEARSAL_RECORDS, settings.kafka_replication_factor
                )
                for topic, scratch_topic in inputs.items()
            )
            halves = scratch.replace(max_offsets_per_trigger=max(1, records // 2))
            report = run_job(copy, halves, available_now=True, spark=spark)
            outcome = report.error or f"{report.input_rows} records in {report.batches} batches"
            if report.error is None and replay_last_batch(layout.checkpoint):
                replayed = run_job(copy, scratch, available_now=True, spark=spark)
                outcome += f", the last replayed: {replayed.error or 'ok'}"
        except Exception as err:  # noqa: BLE001 - best effort (see the docstring)
            outcome = f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        finally:
            try:
                delete_topics(settings.kafka, topics)
            except Exception as err:  # noqa: BLE001 - a leftover, said in the log
                log.warning("spare rehearsal: its topics %s were not deleted: %s", topics, err)
    event = {"event": "spare_rehearsal", "application_id": spec.application_id, "outcome": outcome}
    log.info(json.dumps({**event, "seconds": round(time.monotonic() - started, 1)}))
    return outcome


def replay_last_batch(checkpoint) -> bool:
    """Take the newest batch's entry out of a local checkpoint's commit log, so that the next run of its query
    replays that batch (as Spark does for a batch its dead driver planned but did not commit); False when the
    checkpoint has no batch after its first (replaying batch 0 would load no state)."""
    from spark_jobs.state.checkpoint_offsets import latest_committed_batch_id

    last = latest_committed_batch_id(checkpoint)
    if not last:
        return False
    for name in (str(last), f".{last}.crc"):
        (checkpoint.path / "commits" / name).unlink(missing_ok=True)
    return True


#: the scratch store of :func:`rehearse_restore`: keys in its snapshot, and changes in its changelog after it (a
#: tail as long as a large store's: with 30,000 changes, a 1e7 restore's tail read and reduction still ran partly
#: interpreted in the takeover, BENCHMARKS.md "the spare's first restore against its repeats")
REHEARSAL_RESTORE_KEYS, REHEARSAL_RESTORE_TAIL = 400_000, 200_000


def rehearse_restore(spark, spec: JobSpec, settings: Settings, *, force: bool = False) -> int | None:
    """A lost checkpoint's restore by Spark's executors, on a scratch store large enough for the JVM to compile its
    hot loops: a snapshot of :data:`REHEARSAL_RESTORE_KEYS` keys and a changelog tail of
    :data:`REHEARSAL_RESTORE_TAIL` changes and deletes after it (written by Spark's Kafka sink, as a large batch's
    are), read back as :func:`~spark_jobs.state.restore.restore_from_snapshot` does: the snapshot's scan, the
    tail's Kafka read, cut and latest value per key, the overlay. A rehearsal of the job (:func:`rehearse`)
    restores nothing but its few records, so without this the real restore's scale paths would run, and be
    compiled, for the first time in the restore a takeover waits for (BENCHMARKS.md "Restore of a lost checkpoint
    by the warm spare").

    Only for a job whose restore would run in Spark (a store of ``restore_in_spark_min_records`` or more, as
    :meth:`~spark_jobs.driver.context.JobContext.spark_for_state` decides), unless ``force``: a smaller store is
    restored in the driver's process, which this does not warm. Returns the keys restored (None: not run, or
    failed). Its topic is deleted after; best effort, like :func:`rehearse`."""
    from spark_jobs.driver.context import JobContext
    from spark_jobs.io.kafka_topics import delete_topics
    from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter
    from spark_jobs.state.restore import SilentRestoreListener, restore_from_snapshot
    from spark_jobs.state.snapshots import SnapshotStore

    if not force:
        context = JobContext(spark, spec, settings)
        try:
            if not any(context.stores.spark_for_state(s.name) is not None for s in spec.stores):
                return None
        except Exception as err:  # noqa: BLE001 - a broker or table not reachable now: the takeover finds out
            log.info("restore rehearsal skipped: %s", str(err).splitlines()[0] if str(err) else type(err).__name__)
            return None
    started, keys = time.monotonic(), None
    topic = ChangelogTopic(
        spec.application_id + REHEARSAL_SUFFIX,
        "restore",
        partitions=spec.state_partitions,
        replication_factor=settings.kafka_replication_factor,
    )
    try:
        with tempfile.TemporaryDirectory(
            prefix=f"{spec.application_id}-restore-rehearsal-", ignore_cleanup_errors=True
        ) as scratch_dir:
            topic.ensure(settings.kafka)
            store = SnapshotStore(str(Path(scratch_dir) / "snapshot"), topic.application_id, topic.store)
            # the snapshot of batch 0, before any changelog record (delta-rs: quicker than Spark's Delta writer)
            state = {f"k{i:09d}".encode(): b'{"count": %d}' % i for i in range(REHEARSAL_RESTORE_KEYS)}
            store.write(state, 0, {"rehearsal": {0: 1}}, {p: 0 for p in range(topic.partitions)})
            every = REHEARSAL_RESTORE_KEYS // REHEARSAL_RESTORE_TAIL
            tail = spark.range(0, REHEARSAL_RESTORE_KEYS, every).selectExpr(
                "format_string('k%09d', id) AS key",
                "IF(id % 3 = 0, NULL, to_json(named_struct('count', -id))) AS value",
            )
            ChangelogWriter(topic, settings.kafka).write_batch(tail, 1, {"rehearsal": {0: 2}})
            restored = restore_from_snapshot(store, settings.kafka, topic.name, SilentRestoreListener(), spark=spark)
            keys = restored.frame.count()
            outcome = f"{keys} keys"
    except Exception as err:  # noqa: BLE001 - best effort (see the docstring)
        outcome = f"failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    finally:
        try:
            delete_topics(settings.kafka, [topic.name])
        except Exception as err:  # noqa: BLE001 - a leftover, said in the log
            log.warning("restore rehearsal: its topic %s was not deleted: %s", topic.name, err)
    event = {"event": "spare_restore_rehearsal", "application_id": spec.application_id, "outcome": outcome}
    log.info(json.dumps({**event, "seconds": round(time.monotonic() - started, 1)}))
    return keys


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
