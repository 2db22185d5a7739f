"""SuperviseCompanionOperator: keep a process that runs beside a job's driver started, and alert on it.

A job version's companions are its warm standby (the snapshot follower) and its spare driver. Each is supervised
like a driver under a name of its own (its lease, status and supervision record): started when nobody holds its
lease, restarted with the job's backoff (``SupervisionPolicy.backoff_s``) when it dies, kept stopped while the job
is stopped on request, and its alerts are its own, kept in the alert ledger under the job version's application id
and the companion's ``source``.
"""

from __future__ import annotations

import time

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from streamstate.alert_ledger import AlertLedger
from streamstate.alerts import Source
from streamstate.hooks.streaming_job import StreamingJobHook, exit_code, log_tail
from streamstate.operators.deferral import defer_unless_settled
from streamstate.operators.streaming_job import job_spec, run_label
from streamstate.supervision import DESIRED_STOPPED, Condition, Launch, locked_record, read_record
from streamstate.triggers.events import WaitOutcome
from streamstate.triggers.streaming_job import LeaseTakenTrigger

from spark_jobs.driver.lease import JobLease, LeaseHolder
from spark_jobs.layout import JobDags
from spark_jobs.registry import JobSpec


class SuperviseCompanionOperator(BaseOperator):
    """One check of a companion: start it if needed, then fire / resolve its alerts.

    A start waits on :class:`~streamstate.triggers.streaming_job.LeaseTakenTrigger` until the companion holds
    its lease (in the worker first, then deferred: :func:`~streamstate.operators.deferral.defer_unless_settled`),
    and the alerts are decided when it resumes. Subclasses
    say which companion (:meth:`hook`), whether the job wants it (:meth:`not_wanted`), how it starts
    (:meth:`launch`) and what to alert on while it runs (:meth:`running_conditions`)."""

    template_fields = ("job",)
    #: the alert ledger's source of this companion's alerts
    source: Source
    #: what on-call reads it as
    title: str
    #: the condition that fires while it is down
    down_condition: str
    down_severity: str = "error"  # critical | error | warning (Condition.severity)
    #: the log the alert's hint points to ("the follower log")
    log_title: str
    #: what on-call loses while it is down (the alert's hint)
    down_consequence: str

    def __init__(self, *, job: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.job = job

    # ----- what subclasses say ----------------------------------------------------------------------------
    def hook(self, spec: JobSpec) -> StreamingJobHook:
        raise NotImplementedError

    def not_wanted(self, spec: JobSpec, hook: StreamingJobHook) -> str | None:
        """Why the job has no such companion (None: it should run)."""
        return None

    def launch(self, hook: StreamingJobHook, label: str) -> dict:
        """Start the companion detached (``StreamingJobHook.launch``); returns the launch's files."""
        raise NotImplementedError

    def start_wait_s(self, spec: JobSpec) -> float:
        """How long a start may take to hold the lease."""
        return spec.supervision.start_timeout_s

    def running_conditions(self, spec: JobSpec, hook: StreamingJobHook) -> list[Condition]:
        """Alerts while the companion runs (none by default)."""
        return []

    # ----- the check ---------------------------------------------------------------------------------------
    def execute(self, context):
        spec = job_spec(self.job)
        hook = self.hook(spec)
        if (reason := self.not_wanted(spec, hook)) is not None:
            result = self._alert(context, spec, hook, "not_wanted", hook.running_instance())
            return {**result, "reason": reason}
        now = time.time()
        with locked_record(hook.status_dir, hook.application_id) as record:
            holder = hook.running_instance()
            if holder is not None:
                action = "none"
            elif read_record(hook.status_dir, spec.application_id).desired == DESIRED_STOPPED:
                action = "job_stopped"  # stopped on request (or for a reset): its companions stay stopped too
            else:
                recent = record.launches_since(now - spec.supervision.crash_loop_window_s)
                last = record.last_launch
                action = (
                    "wait_backoff"
                    if last is not None and now - last.at < spec.supervision.backoff_s(len(recent))
                    else "start"
                )
            if action == "start":
                label = run_label(context)
                previous_epoch = JobLease(hook.status_dir, hook.application_id).last_epoch()
                launch = Launch(at=now, by=label, previous_epoch=previous_epoch, **self.launch(hook, label))
                record.launches.append(launch)
        if action == "start":
            self.log.info(
                "%s starting (launcher pid %s); log: %s", hook.application_id, launch.launcher_pid, launch.log
            )
            trigger = LeaseTakenTrigger(
                hook.application_id,
                str(hook.status_dir),
                launch.launcher_pid,
                launch.exit_file,
                launch.previous_epoch,
                self.start_wait_s(spec),
                carry={"launch_at": launch.at},
            )
            return defer_unless_settled(self, context, trigger, "started")
        return self._alert(context, spec, hook, action, holder)

    def started(self, context, event: dict):
        """Resumed after a start: record how it went, then the alerts."""
        spec = job_spec(self.job)
        hook = self.hook(spec)
        outcome = WaitOutcome.of(event)
        with locked_record(hook.status_dir, hook.application_id) as record:
            launch = next((item for item in record.launches if item.at == outcome.carry["launch_at"]), None)
            if launch is not None and launch.outcome is None:
                if outcome.state == "running":
                    launch.outcome, launch.epoch = "running", outcome.epoch
                else:
                    if outcome.state == "timeout":
                        hook.stop_launch(launch.launcher_pid)
                    launch.outcome = "failed"
                    launch.error = f"exit {exit_code(launch.exit_file)}: {log_tail(launch.log, 5)}"
        return self._alert(context, spec, hook, "start", hook.running_instance())

    def _alert(self, context, spec: JobSpec, hook: StreamingJobHook, action: str, holder: LeaseHolder | None) -> dict:
        delivery = AlertLedger(hook.status_dir).reconcile_and_send(
            context,
            job=spec.name,
            application_id=spec.application_id,
            source=self.source,
            conditions=self._conditions(spec, hook, action, holder),
            links={"dag": f"{hook.settings.airflow_url}/dags/{JobDags(spec.name).supervise}"},
        )
        fired, resolved = delivery.fired_conditions, delivery.resolved_conditions
        self.log.info("%s: %s; fired %s, resolved %s", hook.application_id, action, fired, resolved)
        if delivery.undelivered:
            undelivered = [a.dedup_key for a, _ in delivery.undelivered]
            raise AirflowFailException(f"alerts not delivered on any channel: {undelivered}")
        return {"action": action, "running": holder is not None, "fired": fired, "resolved": resolved}

    def _conditions(self, spec, hook: StreamingJobHook, action: str, holder: LeaseHolder | None) -> list[Condition]:
        if action in ("job_stopped", "not_wanted"):
            return []
        if holder is None:
            record = read_record(hook.status_dir, hook.application_id)
            last = record.last_launch
            return [
                Condition(
                    self.down_condition,
                    self.down_severity,
                    f"the {self.title} of {spec.application_id} is not running",
                    {
                        "launches_in_window": len(
                            record.launches_since(time.time() - spec.supervision.crash_loop_window_s)
                        ),
                        "exit_code": exit_code(last.exit_file) if last else None,
                    },
                    f"see {self.log_title} {last.log if last else ''}; {self.down_consequence}",
                )
            ]
        return self.running_conditions(spec, hook)
