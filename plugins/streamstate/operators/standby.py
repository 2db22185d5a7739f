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
from streamstate.hooks.streaming_job import exit_code, log_tail, process_alive
from streamstate.operators.streaming_job import job_spec, run_label
from streamstate.supervision import DESIRED_STOPPED, Condition, Launch, locked_record, read_record

from spark_jobs.lease import LeaseHolder

#: how long a start may take to hold the lease (a follower needs no Spark: seconds)
START_WAIT_S = 45


class SuperviseStandbyOperator(BaseOperator):
    """One check of the job's standby: start it if needed, then fire / resolve its alerts."""

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
            action, conditions = "none", []
            holder = hook.running_instance()
            if holder is None and read_record(hook.status_dir, spec.application_id).desired == DESIRED_STOPPED:
                action = "job_stopped"  # stopped on request (or for a reset): its standby stays stopped too
            elif holder is None:
                recent = record.launches_since(now - spec.supervision.crash_loop_window_s)
                backoff = spec.supervision.backoff_s(len(recent))
                last = record.last_launch
                if last is not None and now - last.at < backoff:
                    action = "wait_backoff"
                else:
                    action = "start"
                    launch = Launch(at=now, by=run_label(context), **hook.launch_follower(run_label(context)))
                    record.launches.append(launch)
                    holder = self._wait_started(hook, launch)
                if holder is None:
                    last = record.last_launch
                    conditions.append(
                        Condition(
                            "standby_down",
                            "error",
                            f"the warm standby of {spec.application_id} is not running",
                            {
                                "launches_in_window": len(recent) + (action == "start"),
                                "exit_code": exit_code(last.exit_file) if last else None,
                            },
                            f"see the follower log {last.log if last else ''}; queries fall back to older snapshots and "
                            f"restores replay a longer tail until it runs",
                        )
                    )
            else:
                status = hook.status()
                for store, view in (status.stores if status else {}).items():
                    if view.lag_ms > status.max_lag_ms:
                        conditions.append(
                            Condition(
                                f"standby_lag_{store}",
                                "warning",
                                f"standby of {spec.application_id}/{store} is {view.lag_ms / 1000:.0f} s behind its changelog",
                                {
                                    "lag_ms": view.lag_ms,
                                    "max_lag_ms": status.max_lag_ms,
                                    "lag_records": view.lag_records,
                                },
                                "check the follower's log and the Kafka broker; a lagging standby makes restores longer",
                            )
                        )
            delivery = AlertLedger(hook.status_dir).reconcile_and_send(
                context,
                job=spec.name,
                application_id=spec.application_id,
                source="standby",
                conditions=conditions,
                links={"dag": f"{hook.settings.airflow_url}/dags/supervise__{spec.name}"},
            )
            fire, resolve = delivery.fired, delivery.resolved
            undelivered = [a.dedup_key for a, _ in delivery.undelivered]
        self.log.info(
            "%s: %s; fired %s, resolved %s",
            hook.application_id,
            action,
            [a.condition for a in fire],
            [a.condition for a in resolve],
        )
        if undelivered:
            raise AirflowFailException(f"alerts not delivered on any channel: {undelivered}")
        return {
            "action": action,
            "running": holder is not None,
            "fired": [a.condition for a in fire],
            "resolved": [a.condition for a in resolve],
        }

    def _wait_started(self, hook: StandbyHook, launch: Launch) -> LeaseHolder | None:
        deadline = time.monotonic() + START_WAIT_S
        while time.monotonic() < deadline:
            holder = hook.running_instance()
            if holder is not None:
                launch.outcome, launch.epoch = "running", holder.epoch
                return holder
            if exit_code(launch.exit_file) is not None or not process_alive(launch.launcher_pid):
                break
            time.sleep(0.5)
        launch.outcome = "failed"
        launch.error = f"exit {exit_code(launch.exit_file)}: {log_tail(launch.log, 5)}"
        return None
