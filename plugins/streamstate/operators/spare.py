"""SuperviseSpareOperator: keep a job's spare driver started (spark_jobs/driver/spare.py), and tell on-call when it is not.

Part of ``supervise__<job>`` (a companion of the driver: :mod:`streamstate.operators.companion`). The spare is
wanted where the job's ``SupervisionPolicy.spare_driver`` and the deployment's ``STREAMSTATE_SPARE_DRIVERS`` say
so; once it took over (it is the driver then, under the driver's lease) the next check starts a new one. Its
alert is ``spare_down`` (a warning: the job runs, only a failover is slower), under the source ``spare``.
"""

from __future__ import annotations

from streamstate.hooks.spare import SpareDriverHook
from streamstate.operators.companion import SuperviseCompanionOperator

from spark_jobs.registry import JobSpec


class SuperviseSpareOperator(SuperviseCompanionOperator):
    """One check of the job's spare driver: start it if needed (spark-submit on the Spark connection ``conn_id``,
    :class:`~streamstate.hooks.spare.SpareDriverHook`), then its alert."""

    source = "spare"
    title = "spare driver"
    down_condition = "spare_down"
    down_severity = "warning"
    log_title = "the spare's log"
    down_consequence = "the job runs; if its driver dies, supervision restarts it (tens of seconds) instead of the spare taking over (seconds)"

    def __init__(self, *, job: str, conn_id: str = "spark_default", **kwargs) -> None:
        super().__init__(job=job, **kwargs)
        self.conn_id = conn_id

    def hook(self, spec: JobSpec) -> SpareDriverHook:
        return SpareDriverHook(spec, conn_id=self.conn_id)

    def not_wanted(self, spec: JobSpec, hook: SpareDriverHook) -> str | None:
        return hook.not_wanted()

    def launch(self, hook: SpareDriverHook, label: str) -> dict:
        return hook.launch_driver(label)
