"""Operators over :class:`~streamstate.hooks.streaming_job.StreamingJobHook`: launch, watch, stop, check.

All of them read and change the job's supervision record only under its lock, so racing DAG runs, a
retried task and a stop request see each other's decisions. The driver's own lease
(``spark_jobs/driver/lease.py``) is the last line: even a launch that slipped through exits with code 3
without touching anything.
"""

from __future__ import annotations

import time

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator
from streamstate.alert_ledger import AlertLedger
from streamstate.hooks.streaming_job import StreamingJobHook, exit_code, log_tail, process_alive
from streamstate.operators.deferral import defer_unless_settled
from streamstate.supervision import (
    DESIRED_RUNNING,
    DESIRED_STOPPED,
    CheckResult,
    Launch,
    Observation,
    assess,
    locked_record,
)
from streamstate.triggers.events import WaitOutcome
from streamstate.triggers.streaming_job import (
    StreamingJobExitedTrigger,
    StreamingJobStartedTrigger,
    StreamingJobStoppedTrigger,
)

from spark_jobs.documents import to_json
from spark_jobs.driver.lease import JobLease
from spark_jobs.layout import JobDags
from spark_jobs.registry import JobSpec, get_job


class StreamingJobFailed(RuntimeError):
    """A launched driver did not reach RUNNING (the message carries its error and log tail)."""


def apply_submit(operator: SparkSubmitOperator, submit) -> None:
    """Hand a job's spark-submit description (``spark_jobs.driver.submit.SubmitSpec``) to the provider's operator
    (its public fields: what the task's rendered view shows, and what ``SparkSubmitOperator.execute`` runs)."""
    operator.application, operator.application_args, operator.name = (
        submit.application,
        list(submit.application_args),
        submit.name,
    )
    operator.conf, operator.jars, operator.py_files, operator.env_vars = (
        submit.conf,
        submit.jars,
        submit.py_files,
        submit.env,
    )


def run_label(context) -> str:
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/{ti.task_id}#{ti.try_number}"


def who_triggered(context) -> str:
    """The user who triggered the DAG run, or its run type (``scheduled``, ...) when nobody did."""
    run = context["dag_run"]
    return getattr(run, "triggering_user_name", None) or str(getattr(run, "run_type", "") or "unknown")


def job_spec(job: str, version: int | str | None = None, *, adopt_by: str | None = None) -> JobSpec:
    """``version`` of ``job``, or (None/empty) the current version from the version pointer."""
    if version not in (None, "", "None"):
        return get_job(job, version)
    from runtime.settings import Settings
    from spark_jobs.versions import JobVersions

    return JobVersions(Settings.from_env()).current_spec(job, adopt_by=adopt_by)


def started_trigger(jobs: StreamingJobHook, launch: Launch, carry: dict | None = None) -> StreamingJobStartedTrigger:
    """The trigger that waits for ``launch``'s driver to run (or fail, or time out)."""
    spec = jobs.spec
    return StreamingJobStartedTrigger(
        spec.application_id,
        str(jobs.status_dir),
        launch.launcher_pid,
        launch.exit_file,
        launch.previous_epoch,
        spec.supervision.start_timeout_s,
        launch_at=launch.at,
        version=spec.version,
        carry=carry,
    )


def record_outcome(jobs: StreamingJobHook, launch: Launch, outcome: WaitOutcome) -> None:
    """``launch``'s outcome from its :func:`started_trigger`'s (the caller holds the record's lock)."""
    launch.outcome = {"running": "running", "already_running": "already_running"}.get(outcome.state, "failed")
    launch.epoch = outcome.epoch
    if outcome.state == "timeout":
        jobs.stop_launch(launch.launcher_pid)
        launch.error = f"not RUNNING after {jobs.spec.supervision.start_timeout_s:.0f}s (killed)"
    elif outcome.state == "failed":
        launch.error = outcome.error


def settle_unrecorded_launch(jobs: StreamingJobHook) -> Launch | None:
    """The last launch, its outcome recorded now, when the task that waited for it never did and its trigger can
    tell already (None: nothing to record, or still starting). Airflow 3.3 fails a deferred task that resumes
    before the scheduler has seen its worker's exit from the deferral (apache/airflow#72716, a watch whose
    driver died as it deferred): that task launched the driver and never waited for it; its retry watches the
    driver and records the launch here."""
    with locked_record(jobs.status_dir, jobs.spec.application_id) as record:
        launch = record.last_launch
        if launch is None or launch.outcome is not None or launch.launcher_pid is None:
            return None
        outcome = started_trigger(jobs, launch).check()
        if outcome is None:
            return None
        record_outcome(jobs, launch, outcome)
        return launch


class LaunchStreamingJobOperator(BaseOperator):
    """Start a registered job's driver with spark-submit on the Spark connection ``conn_id``, unless it runs already.

    The driver is started detached and the task waits until it is RUNNING (or failed): up to
    :data:`~streamstate.operators.deferral.SETTLE_BEFORE_DEFER_S` in its worker, then deferred, so neither a
    slow start nor the job's lifetime holds a worker slot. Idempotent: a retried or cleared task, or a
    second DAG run, finds the running driver (or the launch in flight) and starts nothing.

    :param job: registered job name (templated: the start DAG takes it from a Param).
    :param version: the version to start (templated); default: the current one (version pointer).
    :param manual: a person asked for it: clears a stop request and the crash-loop mark.
    :param conn_id: the Spark connection (:class:`~streamstate.hooks.streaming_job.StreamingJobHook` resolves it
        and builds the command; a ``deploy-mode`` other than client fails the launch).
    """

    template_fields = ("job", "version")

    def __init__(
        self,
        *,
        job: str,
        version: int | str | None = None,
        manual: bool = False,
        conn_id: str = StreamingJobHook.default_conn_name,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.job = job
        self.version = version
        self.manual = manual

    def execute(self, context):
        label = run_label(context)
        return self._start(context, job_spec(self.job, self.version, adopt_by=label), "execute_complete")

    def _start(self, context, spec: JobSpec, method_name: str, carry: dict | None = None):
        """Launch ``spec``'s driver unless it runs or a launch is in flight, and wait until it is RUNNING
        (:func:`~streamstate.operators.deferral.defer_unless_settled`); ``method_name`` receives the trigger's
        event (with ``carry`` in it)."""
        label = run_label(context)
        jobs = StreamingJobHook(spec, conn_id=self.conn_id)
        now = time.time()
        with locked_record(jobs.status_dir, spec.application_id) as record:
            if self.manual:
                record.desired, record.stop_reason = DESIRED_RUNNING, None
                record.crash_loop_since, record.restarts_reset_at = None, now
            elif record.desired == DESIRED_STOPPED:
                self.log.info(
                    "%s was stopped on request (%s); not starting it", spec.application_id, record.stop_reason
                )
                return {"state": "stopped"}
            holder = jobs.running_instance()
            if holder is not None:
                self.log.info(
                    "%s already runs (pid %s, lease epoch %s); nothing to start",
                    spec.application_id,
                    holder.pid,
                    holder.epoch,
                )
                return {"state": "already_running", "epoch": holder.epoch, "pid": holder.pid}
            last = record.last_launch
            in_flight = (
                last is not None
                and last.outcome is None
                and process_alive(last.launcher_pid)
                and now - last.at < spec.supervision.start_timeout_s
            )
            if in_flight:
                self.log.info(
                    "a launch by %s is in flight (pid %s); waiting for it instead", last.by, last.launcher_pid
                )
                launch = last
            else:
                previous_epoch = JobLease(jobs.status_dir, spec.application_id).last_epoch()
                launch = Launch(at=now, by=label, previous_epoch=previous_epoch, **jobs.launch_driver(label))
                record.launches.append(launch)
        self.log.info(
            "driver of %s starting (launcher pid %s); log: %s", spec.application_id, launch.launcher_pid, launch.log
        )
        return defer_unless_settled(self, context, started_trigger(jobs, launch, carry), method_name)

    def execute_complete(self, context, event: dict):
        outcome = WaitOutcome.of(event)
        spec = job_spec(self.job, outcome.version)  # (events of triggers from before versions: current)
        jobs = StreamingJobHook(spec)
        with locked_record(jobs.status_dir, spec.application_id) as record:
            launch = next((item for item in record.launches if item.at == outcome.launch_at), None)
            if launch is not None and launch.outcome is None:
                record_outcome(jobs, launch, outcome)
        if outcome.state in ("running", "already_running"):
            self.log.info("%s: %s", spec.application_id, event)
            return event
        log = launch.log if launch else None
        raise StreamingJobFailed(
            f"{spec.application_id} did not start: {launch.error if launch else outcome.state}\n"
            f"--- {log} (tail) ---\n{log_tail(log)}"
        )


class WatchStreamingJobOperator(LaunchStreamingJobOperator):
    """Keep the job running until the next scheduled check: restart its driver the moment it exits.

    The task defers on :class:`~streamstate.triggers.streaming_job.StreamingJobExitedTrigger` (the
    triggerer polls the driver's lease every second; no worker slot is held), after its first seconds in the
    worker (:func:`~streamstate.operators.deferral.defer_unless_settled`). When the driver lets the
    lease go without a stop request (kill -9, OOM, a lost node: the kernel drops its flock), the task
    resumes, runs the same supervision check as the ``check`` task (:func:`check_job`: alerts once,
    backoff, crash loop) and, when it says start or restart, launches the driver as the launch task
    does (one instance, fenced by the lease), waits for RUNNING and watches again. A check that says
    anything else (stopped on request, backoff, crash loop) ends the watch; the next scheduled run
    takes over.

    :param watch_s: how long to watch (templated); None: until ``WATCH_MARGIN_S`` before the next
        scheduled check, so the DAG's runs (``max_active_runs=1``) keep their cadence (not at all when
        the job's ``SupervisionPolicy.watch`` is off); 0: not at all.
    """

    #: the watch ends this long before the next scheduled check is due
    WATCH_MARGIN_S = 15.0

    template_fields = (*LaunchStreamingJobOperator.template_fields, "watch_s")

    def __init__(self, *, job: str, watch_s: float | str | None = None, **kwargs) -> None:
        super().__init__(job=job, **kwargs)
        self.watch_s = watch_s

    def execute(self, context):
        spec = job_spec(self.job)
        window = spec.supervision.check_every_s - self.WATCH_MARGIN_S if spec.supervision.watch else 0.0
        if self.watch_s not in (None, "", "None"):
            window = float(self.watch_s)
        if window <= 0:
            self.log.info("not watching (watch_s=%s)", self.watch_s)
            return {"state": "not_watched"}
        return self._watch(context, time.time() + max(window, 1.0), restarts=0)

    def _watch(self, context, deadline: float, restarts: int):
        spec = job_spec(self.job)
        jobs = StreamingJobHook(spec)
        remaining = deadline - time.time()
        if remaining <= 0:
            return {"state": "watched", "restarts": restarts}
        holder = jobs.running_instance()
        if holder is None:
            return self._restart(context, spec, deadline, restarts)
        if settled := settle_unrecorded_launch(jobs):
            self.log.info("recorded the outcome of %s's launch, which its task never did: %s", settled.by, settled)
        self.log.info(
            "watching %s (driver pid %s, lease epoch %s) for %.0fs",
            spec.application_id,
            holder.pid,
            holder.epoch,
            remaining,
        )
        trigger = StreamingJobExitedTrigger(
            spec.application_id,
            str(jobs.status_dir),
            holder.epoch,
            remaining,
            carry={"deadline": deadline, "restarts": restarts},
        )
        return defer_unless_settled(self, context, trigger, "driver_exited")

    def driver_exited(self, context, event: dict):
        outcome = WaitOutcome.of(event)
        deadline, restarts = outcome.carry["deadline"], outcome.carry["restarts"]
        if outcome.state == "timeout":
            return {"state": "watched", "restarts": restarts}
        error = f": {outcome.error}" if outcome.error else ""
        self.log.warning("driver of lease epoch %s exited (last state %s%s)", outcome.epoch, outcome.final_state, error)
        return self._restart(context, job_spec(self.job), deadline, restarts)

    def _restart(self, context, spec: JobSpec, deadline: float, restarts: int):
        assessment = check_job(self, context, spec)
        if assessment.action == "none" and StreamingJobHook(spec).running_instance() is not None:
            # another driver holds the lease already (the spare took over, or a launch was quicker): watch it
            return self._watch(context, deadline, restarts)
        if assessment.action == "none" and assessment.state == "starting":
            # a launch in flight that no task waits for (a try Airflow failed as it resumed, see
            # settle_unrecorded_launch): wait for it as its own task would have (nothing is launched), then watch;
            # _start defers, or returns when the driver took the lease meanwhile (or within the wait before a deferral)
            self._start(context, spec, "driver_restarted", {"deadline": deadline, "restarts": restarts})
            return self._watch(context, deadline, restarts)
        if assessment.action not in ("start", "restart"):
            self.log.info("not restarting %s: %s (%s)", spec.application_id, assessment.action, assessment.reason)
            return {"state": assessment.state, "action": assessment.action, "restarts": restarts}
        return self._start(context, spec, "driver_restarted", {"deadline": deadline, "restarts": restarts + 1})

    def driver_restarted(self, context, event: dict):
        self.execute_complete(context, event)  # records the launch's outcome; raises if it did not start
        carry = WaitOutcome.of(event).carry
        return self._watch(context, carry["deadline"], carry["restarts"])


class DrainStreamingJobOperator(SparkSubmitOperator):
    """Process everything available in a job's input now (``--available-now``), then stop.

    A plain ``SparkSubmitOperator`` run in client mode (the task holds its slot, but the run ends);
    the spark-submit description is built when the task runs, not when the DAG file is parsed. If
    the job is running, the driver exits with code 3 and nothing is touched.
    """

    template_fields = (*SparkSubmitOperator.template_fields, "job")

    def __init__(self, *, job: str, conn_id: str = "spark_default", **kwargs) -> None:
        super().__init__(conn_id=conn_id, **kwargs)
        self.job = job

    def execute(self, context):
        from runtime.settings import Settings
        from spark_jobs.driver.submit import submit_spec

        apply_submit(self, submit_spec(job_spec(self.job), Settings.from_env(), available_now=True))
        return super().execute(context)


class StopStreamingJobOperator(BaseOperator):
    """Stop a job on request and keep it stopped (supervision will not restart it, nor its warm
    standby and spare driver, until it is started again). SIGTERM lets the driver finish its batch and stop
    its queries; ``force`` kills. The version's spare driver is stopped first, always (it would take over a
    driver killed by ``force``). With ``stop_standby`` the version's warm standby is stopped first too (a
    reset deletes the snapshots it writes; a retired version's standby has nothing left to follow)."""

    template_fields = ("job", "version", "reason", "force", "timeout_s", "stop_standby")

    def __init__(
        self,
        *,
        job: str,
        reason: str,
        version: int | str | None = None,
        force: bool | str = False,
        timeout_s: float | str = 180,
        stop_standby: bool | str = False,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.job, self.version, self.reason, self.force, self.timeout_s = job, version, reason, force, timeout_s
        self.stop_standby = stop_standby

    def execute(self, context):
        spec = job_spec(self.job, self.version)
        jobs = StreamingJobHook(spec)
        with locked_record(jobs.status_dir, spec.application_id) as record:
            record.desired, record.stop_reason = DESIRED_STOPPED, f"{self.reason} ({run_label(context)})"
        from streamstate.hooks.spare import SpareDriverHook

        self._stop_companion(SpareDriverHook(spec))
        if str(self.stop_standby).lower() == "true":
            from streamstate.hooks.standby import StandbyHook

            self._stop_companion(StandbyHook(spec))
        holder = jobs.stop(force=str(self.force).lower() == "true")
        if holder is None:
            self.log.info("%s is not running; it stays stopped", spec.application_id)
            return {"state": "not_running"}
        self.log.info(
            "signalled driver pid %s (lease epoch %s) of %s",
            holder.pid,
            holder.epoch,
            spec.application_id,
        )
        self.job = spec.application_id  # for the messages after the deferral
        trigger = StreamingJobStoppedTrigger(
            spec.application_id, str(jobs.status_dir), float(self.timeout_s), pid=holder.pid, host=holder.host
        )
        return defer_unless_settled(self, context, trigger, "execute_complete")

    def _stop_companion(self, companion: StreamingJobHook) -> None:
        """SIGTERM a companion of the driver (its spare, its standby) and wait for its lease (neither holds a
        running query: they stop in seconds)."""
        holder = companion.stop(force=str(self.force).lower() == "true")
        if holder is None:
            return
        deadline = time.monotonic() + float(self.timeout_s)
        while companion.running_instance() is not None:
            if time.monotonic() > deadline:
                raise StreamingJobFailed(
                    f"{companion.application_id} still runs after {self.timeout_s}s; run again with force=true"
                )
            time.sleep(0.5)
        self.log.info("stopped %s (pid %s)", companion.application_id, holder.pid)

    def execute_complete(self, context, event: dict):
        outcome = WaitOutcome.of(event)
        if outcome.state != "stopped":
            raise StreamingJobFailed(
                f"{self.job} still runs after {float(self.timeout_s):.0f}s; run again with force=true"
            )
        self.log.info("%s stopped (final state %s)", self.job, outcome.final_state)
        return event


class CheckStreamingJobOperator(BaseOperator):
    """One supervision check: observe the job, decide, and tell on-call about what changed.

    Returns (XCom) the assessment: ``action`` says whether the launch task should run.
    """

    template_fields = ("job",)

    def __init__(self, *, job: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.job = job

    def execute(self, context):
        return to_json(check_job(self, context, job_spec(self.job)))


def check_job(operator: BaseOperator, context, spec: JobSpec) -> CheckResult:
    """Observe the job, decide (:func:`~streamstate.supervision.assess`), fire and resolve its alerts, and
    record it all under the supervision lock. Returns the decision (``action``: what to do next)."""
    jobs = StreamingJobHook(spec)
    with locked_record(jobs.status_dir, spec.application_id) as record:
        last = record.last_launch
        seen = Observation(
            now=time.time(),
            holder=jobs.running_instance(),
            status=jobs.status(),
            launcher_alive=process_alive(last.launcher_pid) if last else False,
            dead_letters=jobs.dead_letters(),
            last_exit_code=exit_code(last.exit_file) if last else None,
        )
        assessment = assess(spec, seen, record)
        if assessment.action == "give_up" and record.crash_loop_since is None:
            record.crash_loop_since = seen.now
        links = {"dag": f"{jobs.settings.airflow_url}/dags/{JobDags(spec.name).supervise}"}
        if seen.status and seen.status.spark_ui and seen.holder:
            links["spark_ui"] = seen.status.spark_ui
        delivery = AlertLedger(jobs.status_dir).reconcile_and_send(
            context,
            job=spec.name,
            application_id=spec.application_id,
            source="supervision",
            conditions=list(assessment.conditions),
            links=links,
        )
        fire, resolve, undelivered = delivery.fired, delivery.resolved, delivery.undelivered
        if seen.dead_letters is not None:
            record.dead_letters_seen = seen.dead_letters
        record.last_check_at = seen.now
        record.last_assessment = assessment
    operator.log.info(
        "%s: state=%s action=%s (%s); fired %s, resolved %s",
        spec.application_id,
        assessment.state,
        assessment.action,
        assessment.reason,
        [a.condition for a in fire],
        [a.condition for a in resolve],
    )
    result = CheckResult(
        assessment.state,
        assessment.action,
        assessment.reason,
        fired=tuple(a.condition for a in fire),
        resolved=tuple(a.condition for a in resolve),
    )
    if undelivered:
        # The decision still reaches the launch task (it runs on all_done); the failed task is the signal.
        context["ti"].xcom_push(key="return_value", value=to_json(result))
        raise StreamingJobFailed(
            "alerts not delivered on any channel: "
            + "; ".join(f"{a.dedup_key} ({a.status}): {r}" for a, r in undelivered)
        )
    return result
