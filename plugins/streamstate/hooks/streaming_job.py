"""StreamingJobHook: one registered job's runtime on this deployment (its lease, status, supervision
record, driver logs and dead-letter topic), and detached launches of its driver.

The deployment (where the status files and Kafka are) is the typed :class:`~runtime.settings.Settings`
every process of the platform shares (``STREAMSTATE_*`` variables), not an Airflow connection: the
driver, the CLI and Airflow must agree on it. The Spark side (master, deploy mode, binary) is the
``spark_default`` connection, owned by the provider's ``SparkSubmitHook``.

Why detached: in client mode spark-submit *is* the driver, and a streaming driver runs for weeks. The
launch starts it in its own session (so the task's process group, the worker and a cleared task
can end without taking it along) and returns; the worker slot is free while the job runs.
"""

from __future__ import annotations

import datetime as dt
import os
import shlex
import signal
import socket
import subprocess
from pathlib import Path

from runtime.process import process_alive  # noqa: F401 - its home is runtime; callers import it from here
from runtime.settings import Settings
from spark_jobs.dead_letter import dead_letter_topic
from spark_jobs.layout import launch_files
from spark_jobs.lease import JobLease, LeaseHolder
from spark_jobs.lifecycle import PublishedStatus, read_status
from spark_jobs.registry import JobSpec


class StreamingJobHook:
    """Runtime files and driver processes of one job version."""

    def __init__(self, spec: JobSpec, settings: Settings | None = None) -> None:
        self.spec = spec
        self.settings = settings or Settings.from_env()
        self.application_id = spec.application_id
        self.status_dir = self.settings.status_dir

    # ----- what is running -------------------------------------------------------------------
    def running_instance(self) -> LeaseHolder | None:
        """The lease holder (pid, host, epoch) of the live driver, or None. The lease is the truth:
        the kernel drops it when the driver dies, however it dies."""
        return JobLease(self.status_dir, self.application_id).holder()

    def status(self) -> PublishedStatus | None:
        return read_status(self.status_dir, self.application_id)

    def dead_letters(self) -> int | None:
        """Records in the job's dead-letter topic, or None when it does not exist or Kafka is down."""
        from spark_jobs.kafka_topics import partition_offsets

        try:
            return sum(
                high - low
                for low, high in partition_offsets(
                    self.settings.kafka, dead_letter_topic(self.application_id), 5
                ).values()
            )
        except Exception:
            return None

    # ----- starting and stopping ---------------------------------------------------------------
    def launch(self, command: list[str], env: dict[str, str], run_label: str) -> dict:
        """Start ``command`` (a spark-submit) detached; returns where its output and exit code go.

        A small shell wrapper records the exit code, so a trigger in another process can tell a
        driver that failed from one that is still starting.
        """
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
        log_file, exit_file = launch_files(self.settings.logs_dir, self.application_id, stamp)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        wrapper = f"{shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}"
        with open(log_file, "ab") as out:
            out.write(f"# {run_label}: {shlex.join(command)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                ["/bin/sh", "-c", wrapper],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        return {"launcher_pid": proc.pid, "log": str(log_file), "exit_file": str(exit_file)}

    def stop(self, *, force: bool = False) -> LeaseHolder | None:
        """Ask the live driver to stop: SIGTERM (it stops its queries cleanly), or SIGKILL with
        ``force``. Returns the holder signalled, None when nothing was running.

        Raises:
            RuntimeError: the driver runs on another host (signal it there).
        """
        holder = self.running_instance()
        if holder is None:
            return None
        if holder.host not in (None, socket.gethostname()):
            raise RuntimeError(f"{self.application_id} runs on {holder.host}, not here; stop it on that host")
        try:
            os.kill(holder.pid, signal.SIGKILL if force else signal.SIGTERM)
        except ProcessLookupError:
            pass
        return holder

    def stop_launch(self, launcher_pid: int) -> None:
        """Kill a launch that never reached RUNNING (its whole process group)."""
        try:
            os.killpg(launcher_pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def exit_code(exit_file: str | None) -> int | None:
    try:
        return int(Path(exit_file).read_text().strip()) if exit_file else None
    except (FileNotFoundError, ValueError):
        return None


def log_tail(log_file: str | None, lines: int = 25) -> str:
    if not log_file:
        return ""
    try:
        return "\n".join(Path(log_file).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
