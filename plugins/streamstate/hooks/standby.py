"""StandbyHook: a job version's warm standby (its snapshot follower process) on this deployment.

The follower is run and watched like a driver (same detached launch, same lease semantics), under its
own name ``<application_id>.standby``: its lease, status file and supervision record are its own.
"""

from __future__ import annotations

import os
import sys

from streamstate.hooks.streaming_job import StreamingJobHook

from runtime.settings import Settings
from spark_jobs.driver.lifecycle import StandbyStatus, read_standby_status
from spark_jobs.operations.standby.follower import standby_id
from spark_jobs.registry import JobSpec


class StandbyHook(StreamingJobHook):
    """The follower's lease, status and detached launches (``python -m spark_jobs.operations.standby``)."""

    def __init__(self, spec: JobSpec, settings: Settings | None = None) -> None:
        super().__init__(spec, settings)
        self.application_id = standby_id(spec.application_id)

    def status(self) -> StandbyStatus | None:
        return read_standby_status(self.status_dir, self.spec.application_id)

    def dead_letters(self) -> int | None:
        return None  # a follower reads changelogs; it has no input of its own to dead-letter

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "spark_jobs.operations.standby",
            self.spec.name,
            "--version",
            str(self.spec.version),
        ]

    def launch_follower(self, run_label: str) -> dict:
        env = {**os.environ, **self.settings.to_env()}
        return self.launch(self.command(), env, run_label)

    def launch_driver(self, run_label: str) -> dict:
        raise TypeError(f"{self.application_id} is a snapshot follower, not a Spark driver: use launch_follower")
