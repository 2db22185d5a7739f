"""SpareDriverHook: a job version's spare driver (a second driver, warm, that takes over when the driver dies).

The spare is run and watched like the warm standby (same detached launch, same lease semantics), under its own
name ``<application_id>.spare`` (spark_jobs/driver/spare.py): its lease, status and supervision record are its own until
it takes over; from then on it holds the driver's lease and is the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamstate.hooks.streaming_job import StreamingJobHook

from runtime.settings import Settings
from spark_jobs.driver.lifecycle import SpareStatus, read_spare_status
from spark_jobs.layout import spare_name
from spark_jobs.registry import JobSpec

if TYPE_CHECKING:
    from spark_jobs.driver.submit import SubmitSpec


class SpareDriverHook(StreamingJobHook):
    """The spare's lease, status and detached launches (``spark-submit ... run.py <job> --spare``)."""

    def __init__(
        self, spec: JobSpec, settings: Settings | None = None, *, conn_id: str = StreamingJobHook.default_conn_name
    ) -> None:
        super().__init__(spec, settings, conn_id=conn_id)
        self.application_id = spare_name(spec.application_id)

    def submit_spec(self) -> SubmitSpec:
        """The spare's spark-submit (``run.py <job> --spare``), launched on the same connection as the driver."""
        from spark_jobs.driver.submit import submit_spec

        return submit_spec(self.spec, self.settings, spare=True)

    def status(self) -> SpareStatus | None:
        return read_spare_status(self.status_dir, self.spec.application_id)

    def dead_letters(self) -> int | None:
        return None  # the spare reads nothing until it is the driver

    def not_wanted(self) -> str | None:
        """Why this job version should have no spare (None: it should have one)."""
        if not self.settings.spare_drivers:
            return "spare drivers are off on this deployment (STREAMSTATE_SPARE_DRIVERS)"
        if not self.spec.supervision.spare_driver:
            return "the job's supervision policy has spare_driver off"
        return None
