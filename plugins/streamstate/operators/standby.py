"""SuperviseStandbyOperator: keep a job's warm standby running and tell on-call when it falls behind.

Part of ``supervise__<job>``. The follower is supervised like a driver: started when nobody holds its
lease, restarted with the job's backoff (``SupervisionPolicy.backoff_s``) when it dies, and its alerts
are its own (``standby_down``, ``standby_lag_<store>`` when a store's lag exceeds
``STREAMSTATE_STANDBY_MAX_LAG_S``), kept in the alert ledger under the job version's application id and
the source ``standby``.
"""

from __future__ import annotations

import time

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException
from streamstate.alert_ledger import AlertLedger
from streamstate.hooks.standby import StandbyHook
from streamstate.hooks.streaming_job import exit_code, log_tail
from streamstate.operators.streaming_job import job_spec, run_label
from streamstate.supervision import DESIRED_STOPPED, Condition, Launch, locked_record, read_record
from streamstate.triggers.streaming_job import LeaseTakenTrigger

from spark_jobs.lease import JobLease, LeaseHolder

#: how long a start may take to hold the lease (a follower needs no Spark: seconds)
START_WAIT_S = 45


class SuperviseStandbyOperator(BaseOperator):
    """One check of the job's standby: start it if needed, then fire / resolve its alerts.

    A start defers on :class:`~streamstate.triggers.streaming_job.LeaseTakenTrigger` until the follower holds
    its lease (the triggerer waits, not a worker slot), and the alerts are decided when it resumes."""

    template_fields = ("job",)

    def __init__(self, *, job: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.job = job

    def execute(self, context):
        spec = job_spec(self.job)
        if not spec.stores:
            return {"action": "none", "reason": "the job has no state stores"}
        hook = StandbyHook(spec)
        now = time.time()
        with locked_record(hook.status_dir, hook.application_id) as record:
            holder = hook.running_instance()
            if holder is not None:
                action = "none"
            elif read_record(hook.status_dir, spec.application_id).desired == DESIRED_STOPPED:
                action = "job_stopped"  # stopped on request (or for a reset): its standby stays stopped too
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
                launch = Launch(at=now, by=label, previous_epoch=previous_epoch, **hook.launch_follower(label))
                record.launches.append(launch)
        if action == "start":
            self.log.info(
                "%s starting (launcher pid %s); log: %s", hook.application_id, launch.launcher_pid, launch.log
            )
            self.defer(
                trigger=LeaseTakenTrigger(
                    hook.application_id,
                    str(hook.status_dir),
                    launch.launcher_pid,
                    launch.exit_file,
                    launch.previous_epoch,
                    START_WAIT_S,
                    carry={"launch_at": launch.at},
                ),
                method_name="started",
            )
        return self._alert(context, spec, hook, action, holder)

    def started(self, context, event: dict):
        """Resumed after a start: record how it went, then the alerts."""
        spec = job_spec(self.job)
        hook = StandbyHook(spec)
        with locked_record(hook.status_dir, hook.application_id) as record:
            launch = next((item for item in record.launches if item.at == event["carry"]["launch_at"]), None)
            if launch is not None and launch.outcome is None:
                if event["state"] == "running":
                    launch.outcome, launch.epoch = "running", event["epoch"]
                else:
                    if event["state"] == "timeout":
                        hook.stop_launch(launch.launcher_pid)
                    launch.outcome = "failed"
                    launch.error = f"exit {exit_code(launch.exit_file)}: {log_tail(launch.log, 5)}"
        return self._alert(context, spec, hook, "start", hook.running_instance())

    def _alert(self, context, spec, hook: StandbyHook, action: str, holder: LeaseHolder | None) -> dict:
        delivery = AlertLedger(hook.status_dir).reconcile_and_send(
            context,
            job=spec.name,
            application_id=spec.application_id,
            source="standby",
            conditions=self._conditions(spec, hook, action, holder),
            links={"dag": f"{hook.settings.airflow_url}/dags/supervise__{spec.name}"},
        )
        fired, resolved = delivery.fired_conditions, delivery.resolved_conditions
        self.log.info("%s: %s; fired %s, resolved %s", hook.application_id, action, fired, resolved)
        if delivery.undelivered:
            undelivered = [a.dedup_key for a, _ in delivery.undelivered]
            raise AirflowFailException(f"alerts not delivered on any channel: {undelivered}")
        return {"action": action, "running": holder is not None, "fired": fired, "resolved": resolved}

    @staticmethod
    def _conditions(spec, hook: StandbyHook, action: str, holder: LeaseHolder | None) -> list[Condition]:
        if holder is None and action == "job_stopped":
            return []
        if holder is None:
            record = read_record(hook.status_dir, hook.application_id)
            last = record.last_launch
            return [
                Condition(
                    "standby_down",
                    "error",
                    f"the warm standby of {spec.application_id} is not running",
                    {
                        "launches_in_window": len(
                            record.launches_since(time.time() - spec.supervision.crash_loop_window_s)
                        ),
                        "exit_code": exit_code(last.exit_file) if last else None,
                    },
                    f"see the follower log {last.log if last else ''}; queries fall back to older snapshots and "
                    f"restores replay a longer tail until it runs",
                )
            ]
        status = hook.status()
        return [
            Condition(
                f"standby_lag_{store}",
                "warning",
                f"standby of {spec.application_id}/{store} is {view.lag_ms / 1000:.0f} s behind its changelog",
                {"lag_ms": view.lag_ms, "max_lag_ms": status.max_lag_ms, "lag_records": view.lag_records},
                "check the follower's log and the Kafka broker; a lagging standby makes restores longer",
            )
            for store, view in (status.stores if status else {}).items()
            if view.lag_ms > status.max_lag_ms
        ]
