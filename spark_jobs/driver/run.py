"""The one entry point that runs a registered job: ``run(spec, settings)``.

Also the file ``spark-submit`` executes (see :mod:`spark_jobs.driver.submit`)::

    spark-submit ... spark_jobs/driver/run.py purchase_counts --version 2 --available-now

``--available-now`` processes everything in the topic and stops (demo, tests, backfills); without it
the job runs until stopped, one micro-batch per ``trigger_interval``. At the end (or on stop) a run
report with what the job did is written to ``<status_dir>/<application_id>.last-run.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import json
import logging
import signal
import sys
import threading
import types
from collections.abc import Callable, Mapping
from pathlib import Path

from runtime.settings import Settings
from spark_jobs.driver import failpoints
from spark_jobs.driver.context import JobContext
from spark_jobs.driver.lease import ALREADY_RUNNING, FENCED, JobAlreadyRunning, JobLease
from spark_jobs.driver.lifecycle import JobState, JobStatus, SnapshotTaken, StoreRestore, status_path
from spark_jobs.driver.metrics import Budgets, DriverMetrics, MetricsServer
from spark_jobs.driver.session import build_spark_session, release_state_stores, session_conf, stop_built_session
from spark_jobs.driver.spare import SpareDriver
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec, get_job
from spark_jobs.state.checkpoint_health import NEW_QUERY_DIRS, checkpoint_problem, new_query_leftovers, quarantine
from spark_jobs.state.checkpoint_offsets import STATE_ENCODING_CONF, StateEncoding, latest_batch_id, state_encoding
from spark_jobs.state.fencing import WriterFenced
from spark_jobs.state.restore import LoggingRestoreListener


@dataclasses.dataclass
class RunReport:
    """What one run of a job did, from Spark's own progress events."""

    job: str
    application_id: str
    started_at: str
    finished_at: str | None = None
    batches: int = 0
    input_rows: int = 0
    state_rows: int = 0
    state_memory_bytes: int = 0
    last_batch_id: int | None = None
    end_offsets: dict = dataclasses.field(default_factory=dict)
    checkpoint: str = ""
    output: str = ""
    error: str | None = None
    #: store -> restore summary, when the run started without a usable checkpoint
    restores: dict[str, StoreRestore] = dataclasses.field(default_factory=dict)
    #: where an unusable checkpoint was moved (and why), when one was found
    quarantined_checkpoint: dict | None = None
    #: the single-instance lease epoch this run held
    lease_epoch: int | None = None
    #: seconds per phase of the state-change batches, summed (state, changelog, outputs, snapshot)
    phase_seconds: dict = dataclasses.field(default_factory=dict)
    #: the generation this driver claimed for the job version (spark_jobs/state/fencing.py)
    generation: int | None = None
    #: the newer driver's claim that fenced this one, when it was fenced
    fenced_by: dict | None = None
    #: the checkpoint's state encoding: "avro" evolves in place, "unsaferow" refuses any change of a store
    state_encoding: StateEncoding | None = None
    #: the driver lease epoch this run took over from, when it was the version's spare driver (spark_jobs/driver/spare.py)
    took_over_from_epoch: int | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    def add_progress(self, progress: Mapping) -> None:
        """Fold one StreamingQueryProgress (as JSON) of the job's query into the report."""
        if progress.get("numInputRows", 0) > 0:
            self.batches += 1
        self.input_rows += progress.get("numInputRows", 0)
        self.last_batch_id = progress.get("batchId")
        operators = progress.get("stateOperators") or []
        if operators:
            self.state_rows = sum(op.get("numRowsTotal", 0) for op in operators)
            self.state_memory_bytes = sum(op.get("memoryUsedBytes", 0) for op in operators)
        for source in progress.get("sources") or []:
            end = source.get("endOffset")
            if isinstance(end, str):
                end = json.loads(end)
            if end:
                self.end_offsets = end


log = logging.getLogger("streamstate.run")


def report_path(spec: JobSpec, settings: Settings) -> Path:
    return JobLayout.of(spec, settings).driver.last_run


def _logged(method):
    """A listener callback that raises is dropped by py4j without a trace: log it instead."""

    def wrapper(self, event):
        try:
            method(self, event)
        except Exception:
            log.exception("progress listener %s failed", method.__name__)

    return wrapper


def _progress_collector(
    report: RunReport, status: JobStatus, rekeying_query: str | None = None, batch_phases=lambda batch_id: {}
):
    from pyspark.sql.streaming import StreamingQueryListener
    from pyspark.sql.streaming.listener import JStreamingQueryListener

    class ProgressAsJson(JStreamingQueryListener):
        """PySpark's Java-facing side of a listener, a progress event passed on as its JSON only (``.progress.json``).
        PySpark's own converts every field of every event first, through the JVM: ~100 calls, and its reading of
        Java maps ends each in a Java exception that PySpark converts (another ~500 calls), ~630 per batch in the
        listener's thread beside the next batch; a steady batch of 1,000 events took 1.22-1.24 s with this against
        1.43-1.58 s (bench/batch_cost.py, a slow day)."""

        def onQueryProgress(self, jevent) -> None:  # noqa: N802 - Spark's listener API
            progress = types.SimpleNamespace(json=jevent.progress().json())
            self.pylistener.onQueryProgress(types.SimpleNamespace(progress=progress))

    class ProgressCollector(StreamingQueryListener):
        """Folds every progress event of the job's query into the run report, and publishes it in the status
        with the batch function's own phases of that batch (``batch_phases(batch_id)``)."""

        def __init__(self) -> None:
            self.lock = threading.Lock()
            #: the job's own query (idle events carry no name, only the query id)
            self.main_query_id: str | None = None

        @property
        def _jlistener(self):
            """What ``spark.streams.addListener`` registers: PySpark's wrapper around :class:`ProgressAsJson`."""
            from pyspark import SparkContext

            if not hasattr(self, "_jlistenerobj"):
                jvm = SparkContext._jvm
                self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(ProgressAsJson(self))
            return self._jlistenerobj

        def onQueryStarted(self, event) -> None:  # noqa: N802 - Spark's listener API
            pass

        @_logged
        def onQueryProgress(self, event) -> None:  # noqa: N802
            progress = json.loads(event.progress.json)
            if rekeying_query is not None and progress.get("name") == rekeying_query:
                status.record_rekeying_progress(progress)
                return
            if progress.get("name") != report.application_id:
                return  # another query of this session (e.g. a test's)
            status.record_progress(progress, batch_phases(progress.get("batchId")))
            with self.lock:
                report.add_progress(progress)

        @_logged
        def onQueryIdle(self, event) -> None:  # noqa: N802
            # Spark 4 reports an idle trigger here, not as progress: still a sign of life for supervision.
            if self.main_query_id is not None and str(event.id) == self.main_query_id:
                status.record_idle(event.timestamp)

        @_logged
        def onQueryTerminated(self, event) -> None:  # noqa: N802
            if event.exception:
                report.error = (report.error + "; " if report.error else "") + str(event.exception).splitlines()[0]

    return ProgressCollector()


def run(spec: JobSpec, settings: Settings, *, available_now: bool = False, spark=None) -> RunReport:
    """Run ``spec`` until the input is drained (``available_now``) or the query stops.

    Raises:
        JobAlreadyRunning: another driver of this job version is running (nothing was touched).
    """
    lease = JobLease(settings.status_dir, spec.application_id)
    epoch = lease.acquire()  # before anything is written: a duplicate must leave no trace
    try:
        return _run_leased(spec, settings, available_now, spark, epoch)
    finally:
        if spark is None:  # the session this run built: stopped while the lease still says the driver runs
            stop_built_session()
        lease.release()


def run_spare(spec: JobSpec, settings: Settings) -> RunReport | None:
    """Run as ``spec``'s spare driver (:mod:`spark_jobs.driver.spare`): start Spark and warm it up, wait, and when the
    running driver dies take its lease and run the job in its place until it stops. None: stopped while still a
    spare.

    Raises:
        JobAlreadyRunning: another spare of this job version is running (nothing was started).
    """
    spare = SpareDriver(spec, settings, run, STOP_REQUEST.requested)
    try:  # a stop while it warms up or waits is no failure: the spare has nothing of the job's to finish
        spark = spare.prepare(lambda: build_spark_session(settings, spec.application_id))
        takeover = spare.wait_for_takeover()
    except KeyboardInterrupt:
        return None
    try:
        return _run_leased(spec, settings, False, spark, takeover.epoch, took_over_from_epoch=takeover.from_epoch)
    finally:
        spark.stop()
        takeover.lease.release()


def _run_leased(
    spec: JobSpec, settings: Settings, available_now: bool, spark, epoch: int, took_over_from_epoch: int | None = None
) -> RunReport:
    layout = JobLayout.of(spec, settings)
    metrics = DriverMetrics(spec.application_id, layout.dead_letter_topic, settings.kafka, Budgets.of(spec))
    metrics_server = MetricsServer(settings, layout.driver)
    try:
        status = JobStatus(
            spec.application_id,
            status_path(settings.status_dir, spec.application_id),
            lease_epoch=epoch,
            metrics_port=metrics_server.port,
            publish_listeners=[metrics.update],
        )
        return _run_published(spec, settings, available_now, spark, status, took_over_from_epoch)
    finally:
        metrics_server.close()
        metrics.close()


def _run_published(
    spec: JobSpec,
    settings: Settings,
    available_now: bool,
    spark,
    status: JobStatus,
    took_over_from_epoch: int | None = None,
) -> RunReport:
    """The run, with its lifecycle published to ``status`` (and from there to its metrics)."""
    spark, build, context, quarantined = _prepare(spec, settings, spark, status)
    report = RunReport(
        job=spec.name,
        application_id=spec.application_id,
        started_at=_now(),
        checkpoint=str(context.layout.checkpoint),
        output=str(context.layout.output_table),
        restores=status.restore,
        quarantined_checkpoint=quarantined,
        lease_epoch=status.lease_epoch,
        took_over_from_epoch=took_over_from_epoch,
    )
    rekeying_query = context.layout.repartition_topic if context.sources.repartitioner is not None else None
    collector = _progress_collector(report, status, rekeying_query, context.phases.pop)
    spark.streams.addListener(collector)
    try:
        _run_queries(context, build, available_now, status, report, collector, rekeying_query)
        # The listener bus is asynchronous: let it deliver the last progress events.
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(10_000)
        report.state_encoding = state_encoding(context.layout.checkpoint) if spec.stores else None
        if status.state is JobState.RUNNING:
            status.transition_to(JobState.PENDING_SHUTDOWN)
        status.transition_to(JobState.NOT_RUNNING)
    except Exception as err:
        refusal = taken_over(context, err) or state_format_changed(context, err)
        if status.state is not JobState.ERROR:
            error = str(refusal) if refusal else f"{type(err).__name__}: {str(err).splitlines()[0]}"
            status.transition_to(JobState.ERROR, error=error)
        report.error = str(refusal) if refusal else report.error or status.error
        if refusal is not None:
            raise refusal from err
        raise
    finally:
        spark.streams.removeListener(collector)
        _finish(context, report)
    return report


def _prepare(
    spec: JobSpec, settings: Settings, spark, status: JobStatus
) -> tuple[object, Callable, JobContext, dict | None]:
    """Everything before the queries start: the session, the job's ``build``, its topics, the claim of the version,
    the checkpoint checked (and quarantined when unusable), the stores restored. Returns the session, ``build``, the
    job context and what was quarantined (None: nothing)."""
    try:
        spark = spark or build_spark_session(settings, spec.application_id)
        module_name, function_name = spec.entrypoint.split(":")
        build = getattr(importlib.import_module(module_name), function_name)
        if check := getattr(build, "check", None):  # a declaration: refused before anything is touched
            check(spec)
        status.record_driver(spark.sparkContext.uiWebUrl, int(spark._jvm.java.lang.ProcessHandle.current().pid()))
        context = JobContext(spark, spec, settings)
        context.stores.snapshot_listeners.append(
            lambda store, snap: status.record_snapshot(store, SnapshotTaken.of(snap))
        )
        context.dead_letter_listeners.append(status.record_dead_letters)
        context.ensure_topics()  # every topic a query below writes: none may start before its topics exist
        if spec.join_topics:
            context.sources.check_co_partitioned()  # refused before a stage starts
        if spec.stores:
            # claim the version (fence older drivers, on any host) beside the query's start; its first write,
            # and any read of the state to restore, waits for the claim
            context.stores.claim_in_background()
        quarantined = quarantine_if_unusable(context)
        if spec.stores and latest_batch_id(context.layout.checkpoint) is None:
            _ = context.stores.writer_fence  # claimed before the state is read
            status.transition_to(JobState.RESTORING)
        restores = context.stores.restore_if_needed(StatusRestoreListener(status, settings.status_dir))
        status.record_restores({name: restored.summary() for name, restored in restores.items()})
        set_aside_new_query_leftovers(context)
    except Exception as err:
        status.transition_to(JobState.ERROR, error=f"{type(err).__name__}: {err}")
        raise
    return spark, build, context, quarantined


def _run_queries(
    context: JobContext,
    build: Callable,
    available_now: bool,
    status: JobStatus,
    report: RunReport,
    collector,
    rekeying_query: str | None,
) -> None:
    """Start the job's queries (the re-keying stage first, when the job has one) and wait until they end, fail or
    are asked to stop (SIGTERM, Ctrl-C: the stateful query stopped between batches)."""
    spec = context.spec

    def with_trigger(w):
        return w.trigger(availableNow=True) if available_now else w.trigger(processingTime=spec.trigger_interval)

    rekeying = query = None
    try:
        if context.sources.repartitioner is not None:
            # the source re-keyed into the repartition topic by a query of its own (spark_jobs/io/repartition.py);
            # drained first when the run drains, so that the stateful stage then finds every record there
            rekeying = with_trigger(context.sources.repartitioner.writer().queryName(rekeying_query)).start()
            if available_now:
                _await_stoppable(rekeying)
        writer = build(context).option("checkpointLocation", report.checkpoint).queryName(spec.application_id)
        query = start_stateful_query(context, with_trigger(writer))
        collector.main_query_id = str(query.id)
        status.transition_to(JobState.RUNNING)
        _await_stoppable(query, beside=None if available_now else rekeying)
    except KeyboardInterrupt:
        status.transition_to(JobState.PENDING_SHUTDOWN)
        if query is not None:
            query.stop()
    finally:
        STOP_REQUEST.queries_running = False
        if rekeying is not None and rekeying.isActive:
            rekeying.stop()


def _finish(context: JobContext, report: RunReport) -> None:
    """After the run, whatever its end: no state store of it left open, the report completed and written (also
    when closing what the job opened fails)."""
    spec, settings = context.spec, context.settings
    # the session may run the next query over this checkpoint, deleted or not: no stopped query's state
    # store may write into it after this returns
    release_state_stores(context.spark)
    report.phase_seconds = dict(context.phases.seconds)
    if spec.stores and context.stores.claim_refused is None:
        fence = context.stores.writer_fence
        report.generation = fence.generation
        if fence.fenced_by is not None:
            report.fenced_by = dataclasses.asdict(fence.fenced_by)
    try:
        context.close()
    finally:
        report.finished_at = _now()
        settings.status_dir.mkdir(parents=True, exist_ok=True)
        report_path(spec, settings).write_text(report.to_json())


def _await_stoppable(query, beside=None) -> None:
    """Wait until ``query`` ends (raising its failure, or ``beside``'s: a query the job runs alongside);
    a stop request raises KeyboardInterrupt. Short waits, so a stop request is noticed between py4j calls,
    never inside one."""
    STOP_REQUEST.queries_running = True
    while not STOP_REQUEST.requested.is_set():
        if query.awaitTermination(0.5):  # raises if the query failed
            return
        if beside is not None and not beside.isActive:
            beside.awaitTermination()  # raises its failure
            if not query.isActive:
                return
            raise RuntimeError(f"{beside.name} stopped while {query.name} runs")
    raise KeyboardInterrupt


def taken_over(context: JobContext, err: Exception) -> WriterFenced | None:
    """Why the query failed, when it was because another driver took the job version over: a write the
    fence refused (its error crosses the JVM wrapped in a query failure), or a batch Spark's offset log
    refused because another driver wrote the shared checkpoint first."""
    if context.spec.stores:
        if (refused := context.stores.claim_refused) is not None:  # the claim itself (in the background) failed
            return refused if isinstance(refused, WriterFenced) else None
        if context.stores.writer_fence.refusal is not None:
            return context.stores.writer_fence.refusal
    if "CONCURRENT_STREAM_LOG_UPDATE" in str(err):
        return WriterFenced(
            f"{context.spec.application_id}: another driver wrote this job version's checkpoint {context.layout.checkpoint} "
            "(Spark's offset log refused this driver's next batch): it took the version over, so this driver stops"
        )
    return None


#: Spark's refusal of Avro state for an operator other than transformWithState (the text of its error)
AVRO_REFUSED = "encoding format as avro is not supported"


def start_stateful_query(context: JobContext, writer):
    """Start the job's query with Avro-encoded state, so that a compatible change of a store's value (a field
    added or removed, a type widened as Avro allows: int to long, float to double) keeps the job's version,
    checkpoint and state: Spark evolves the schema as it reads. Spark supports Avro only for ``transformWithState``: a query with a built-in
    stateful operator (an aggregation, ``dropDuplicates``, a stream-stream join) runs with UnsafeRow
    state, which refuses any change. The encoding only matters for a new checkpoint: Spark keeps the one
    an existing checkpoint recorded (checkpoints from before Avro stay UnsafeRow)."""
    try:
        # a query copies the session conf when it starts
        with session_conf(context.spark, {STATE_ENCODING_CONF: "avro", **context.query_conf}):
            return writer.start()
    except Exception as err:
        if AVRO_REFUSED not in str(err):
            raise
    reason = "a built-in stateful operator: its state cannot evolve in place"
    log.info(
        json.dumps(
            {"event": "state_encoding_unsaferow", "application_id": context.spec.application_id, "reason": reason}
        )
    )
    with session_conf(context.spark, {STATE_ENCODING_CONF: "unsaferow", **context.query_conf}):
        return writer.start()


class StateFormatChanged(RuntimeError):
    """The job's stores no longer match the state in its checkpoint: the change needs a new version."""


#: Spark's refusals of a stateful query whose state (its schema, or the operator that keeps it) changed
#: incompatibly with its checkpoint's
STATE_SCHEMA_REFUSALS = (
    "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
    "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
    # Avro state evolves in place, a bounded number of times per store
    "STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED",
    "STATE_STORE_STATE_SCHEMA_FILES_THRESHOLD_EXCEEDED",
)


def state_format_changed(context: JobContext, err: Exception) -> StateFormatChanged | None:
    """Why the query failed, when Spark refused the job's state format against its checkpoint's: said so
    that on-call and the job's author know what to do (a new version, its state migrated)."""
    found = next((name for name in STATE_SCHEMA_REFUSALS if name in str(err)), None)
    if found is None:
        return None
    return StateFormatChanged(
        f"{context.spec.application_id}: the job's state format changed incompatibly with the state in its "
        f"checkpoint {context.layout.checkpoint} (Spark: {found}). Register the change as a new version and start it "
        "from this version's state: reprocess_job mode migrate (or side_by_side to recompute it from the source)"
    )


def quarantine_if_unusable(context: JobContext) -> dict | None:
    """Move a damaged checkpoint aside so the job restores instead of failing (or resuming on
    empty state). Returns {"path", "reason"} of what it moved, if anything."""
    checkpoint = context.layout.checkpoint
    problem = checkpoint_problem(checkpoint, stateful=bool(context.spec.stores))
    if problem is None:
        return None
    moved = {"path": str(quarantine(checkpoint)), "reason": problem}
    log.warning(
        json.dumps(
            {
                "event": "checkpoint_quarantined",
                "application_id": context.spec.application_id,
                "reason": problem,
                "moved_to": moved["path"],
            }
        )
    )
    return moved


def set_aside_new_query_leftovers(context: JobContext) -> None:
    """Just before a query starts with no offset log: move aside whatever is left in its offset, state
    and commit directories, which Spark refuses to start over and which nothing can resume from without
    an offset log. Such leftovers appeared in object storage after a checkpoint was moved aside (a
    directory left behind); the restore record beside them stays."""
    if leftovers := new_query_leftovers(context.layout.checkpoint):
        moved = quarantine(context.layout.checkpoint, entries=NEW_QUERY_DIRS)
        event = {"event": "checkpoint_leftovers_set_aside", "application_id": context.spec.application_id}
        log.warning(json.dumps({**event, "leftovers": leftovers, "moved_to": str(moved)}))


class StatusRestoreListener(LoggingRestoreListener):
    """Logs and metrics as usual, and the restore's progress in the status file (the Airflow page shows it)."""

    def __init__(self, status: JobStatus, status_dir: Path) -> None:
        super().__init__(status.application_id)
        self.status, self.status_dir = status, status_dir

    def on_restore_start(self, store, topic, starting_offsets) -> None:
        super().on_restore_start(store, topic, starting_offsets)
        self.status.record_restore_progress(store, started_at=_now(), topic=topic, records_read=0)
        failpoints.reached("restoring", self.status_dir, self.status.application_id)

    def on_batch_restored(self, store, records_so_far) -> None:
        super().on_batch_restored(store, records_so_far)
        self.status.record_restore_progress(store, records_read=records_so_far)

    def on_restore_end(self, store, result) -> None:
        super().on_restore_end(store, result)
        self.status.record_restore_progress(store, **result.summary(), finished_at=_now())


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


class _StopRequest:
    """SIGTERM (Airflow's stop, a supervisor): before the queries run it interrupts like Ctrl-C; while
    they run it is only noted and the wait loop stops them. Interrupting a py4j call mid-answer breaks
    the gateway connection the clean stop needs (seen as "Answer from Java side is empty")."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.queries_running = False

    def __call__(self, signum, frame) -> None:
        self.requested.set()
        if not self.queries_running:
            raise KeyboardInterrupt


STOP_REQUEST = _StopRequest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="spark_jobs.driver.run", description="Run a registered streaming job.")
    parser.add_argument("job", help="registered job name")
    parser.add_argument("--version", type=int, default=None, help="job version (default: the newest registered)")
    parser.add_argument("--available-now", action="store_true", help="process all available input, then stop")
    parser.add_argument(
        "--spare",
        action="store_true",
        help="run as the version's spare driver: warm up, and take over when the running driver dies",
    )
    args = parser.parse_args(argv)
    if args.spare and args.available_now:
        parser.error("--spare and --available-now exclude each other")
    # SIGTERM (Airflow's on_kill, a supervisor) stops the queries cleanly, like Ctrl-C.
    signal.signal(signal.SIGTERM, STOP_REQUEST)
    spec, settings = get_job(args.job, args.version), Settings.from_env()
    try:
        if args.spare:
            report = run_spare(spec, settings)
            if report is None:
                print(f"streamstate: the spare driver of {spec.application_id} stopped")
                return 0
        else:
            report = run(spec, settings, available_now=args.available_now)
    except JobAlreadyRunning as err:
        print(f"streamstate: {err}", file=sys.stderr)
        return ALREADY_RUNNING
    except WriterFenced as err:
        print(f"streamstate: {err}", file=sys.stderr)
        return FENCED
    print(report.to_json())
    return 1 if report.error else 0


if __name__ == "__main__":
    sys.exit(main())
