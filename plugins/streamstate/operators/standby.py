"""SuperviseStandbyOperator: keep a job's warm standby running and tell on-call when it falls behind.

Part of ``supervise__<job>`` (a companion of the driver: :mod:`streamstate.operators.companion`). Its alerts are
``standby_down`` and ``standby_lag_<store>`` when a store's lag exceeds ``STREAMSTATE_STANDBY_MAX_LAG_S``, under the
source ``standby``.
"""

from __future__ import annotations

from streamstate.hooks.standby import StandbyHook
from streamstate.operators.companion import SuperviseCompanionOperator
from streamstate.supervision import Condition

from spark_jobs.registry import JobSpec

#: how long a start may take to hold the lease (a follower needs no Spark: seconds)
START_WAIT_S = 45


class SuperviseStandbyOperator(SuperviseCompanionOperator):
    """One check of the job's warm standby (the snapshot follower): start it if needed, then its alerts."""

    source = "standby"
    title = "warm standby"
    down_condition = "standby_down"
    log_title = "the follower log"
    down_consequence = "queries fall back to older snapshots and restores replay a longer tail until it runs"

    def hook(self, spec: JobSpec) -> StandbyHook:
        return StandbyHook(spec)

    def not_wanted(self, spec: JobSpec, hook) -> str | None:
        return None if spec.stores else "the job has no state stores"

    def launch(self, hook: StandbyHook, label: str) -> dict:
        return hook.launch_follower(label)

    def start_wait_s(self, spec: JobSpec) -> float:
        return START_WAIT_S

    def running_conditions(self, spec: JobSpec, hook: StandbyHook) -> list[Condition]:
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
