"""StreamingJobHook: one registered job's runtime on this deployment (its lease, status, supervision
record, driver logs and dead-letter topic), and detached launches of its driver on the Spark connection.

The hook is an Airflow hook of the Spark connection (``spark_default`` unless told otherwise): it resolves the
connection once, when a launch needs it (:meth:`StreamingJobHook.get_conn`), and builds the driver's
spark-submit from it, so operators only name the connection. The connection is read through the Spark
provider's public API: ``SparkSubmitHook(conn_id=...)`` checks it as ``SparkSubmitOperator`` would (the allowed
``spark-binary`` values, no ``spark-home``, Kubernetes dependencies for a ``k8s://`` master) and gives the
binary; the master, ``deploy-mode``, ``queue`` and ``namespace`` come from the connection's fields by the
provider's rule (:func:`spark_master`), which the provider does not expose publicly;
``tests/plugins/test_streaming_job_hook.py`` pins the command against the one the provider's hook runs.

The deployment (where the status files and Kafka are) is the typed :class:`~runtime.settings.Settings`
every process of the platform shares (``STREAMSTATE_*`` variables), not an Airflow connection: the
driver, the CLI and Airflow must agree on it.

Why detached: in client mode spark-submit *is* the driver, and a streaming driver runs for weeks. The
launch starts it in its own session (so the task's process group, the worker and a cleared task
can end without taking it along) and returns; the worker slot is free while the job runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shlex
import signal
import socket
import subprocess
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from airflow.sdk import BaseHook

from runtime.process import process_alive  # noqa: F401 - its home is runtime; callers import it from here
from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease, LeaseHolder
from spark_jobs.driver.lifecycle import PublishedStatus, read_status
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.layout import launch_files
from spark_jobs.registry import JobSpec

if TYPE_CHECKING:
    from spark_jobs.driver.submit import SubmitSpec

#: the provider's default ``spark-binary``: here, this environment's spark-submit (its Spark is the pinned one)
DEFAULT_SPARK_BINARY = "spark-submit"
#: extras a driver of this platform cannot honour, and why
REFUSED_EXTRAS = {
    "principal": "Kerberos login is not supported by the detached driver launch",
    "keytab": "Kerberos login is not supported by the detached driver launch",
}


class UnsupportedSparkConnection(ValueError):
    """The Spark connection asks for something a streamstate driver cannot do (the message names the
    connection and the extra)."""


@dataclasses.dataclass(frozen=True)
class SparkConnection:
    """The Spark connection as spark-submit uses it (the fields the provider's ``SparkSubmitHook`` resolves)."""

    conn_id: str
    master: str
    #: ``client`` or None (unset: spark-submit's default); ``cluster`` is refused
    deploy_mode: str | None
    #: the YARN queue (``--queue``)
    queue: str | None
    #: ``spark-submit``, ``spark2-submit`` or ``spark3-submit`` (the provider's allowed binaries)
    spark_binary: str
    #: the Kubernetes namespace (``spark.kubernetes.namespace``, for a ``k8s://`` master)
    namespace: str | None


def spark_master(conn) -> str:
    """The master URL of an Airflow connection by the Spark provider's rule: a ``spark`` connection whose host is a
    whole master URL (``spark://m:7077``, ``k8s://https://...``) or has no port (``local[*]``, ``yarn``) is its host,
    any other is ``<conn_type>://<host>`` (a URI connection ``spark://m:7077`` has host ``m``); then ``:<port>``
    when it has one."""
    if conn.conn_type == "spark" and conn.host and ("://" in conn.host or not conn.port):
        master = conn.host
    else:
        master = f"{conn.conn_type}://{conn.host or ''}"
    return f"{master}:{conn.port}" if conn.port else master


def resolve_spark_connection(conn_id: str) -> SparkConnection:
    """``conn_id`` as a streamstate driver's spark-submit uses it.

    Raises:
        AirflowNotFoundException: no such connection (the provider would fall back to ``yarn``; a driver must
            not start somewhere nobody configured).
        UnsupportedSparkConnection: an extra this platform cannot honour (``deploy-mode`` other than client,
            ``principal``, ``keytab``).
        ValueError: the provider's own refusals (a ``spark-binary`` it does not allow, ``spark-home``).
    """
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    for key, why in REFUSED_EXTRAS.items():
        if extra.get(key):  # checked first: the provider's hook writes a keytab out as it reads the connection
            raise UnsupportedSparkConnection(f"Spark connection {conn_id!r}: extra {key!r} is set; {why}")
    deploy_mode = extra.get("deploy-mode") or None
    if deploy_mode not in (None, "client"):
        raise UnsupportedSparkConnection(
            f"Spark connection {conn_id!r}: extra 'deploy-mode' is {deploy_mode!r}; a streamstate driver runs in "
            "client mode only (it must run on this host, where it holds the job's lease and supervision watches "
            "its process); set deploy-mode to 'client' or remove it"
        )
    provider = SparkSubmitHook(conn_id=conn_id)  # the provider's checks, and its choice of binary
    return SparkConnection(
        conn_id=conn_id,
        master=spark_master(conn),
        deploy_mode=deploy_mode,
        queue=extra.get("queue") or None,
        spark_binary=provider.spark_binary or DEFAULT_SPARK_BINARY,
        namespace=extra.get("namespace") or None,
    )


class StreamingJobHook(BaseHook):
    """Runtime files and driver processes of one job version, launched on a Spark connection.

    :param spec: the job version.
    :param settings: the deployment (default: ``Settings.from_env()``).
    :param conn_id: the Spark connection its driver is launched on; read when a launch first needs it, so
        watching, checking and stopping a job need no connection.
    """

    conn_name_attr = "conn_id"
    default_conn_name = "spark_default"
    conn_type = "spark"
    hook_name = "Streamstate streaming job"

    def __init__(self, spec: JobSpec, settings: Settings | None = None, *, conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.conn_id = conn_id
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
        from spark_jobs.io.kafka_topics import partition_offsets

        try:
            return sum(
                high - low
                for low, high in partition_offsets(
                    self.settings.kafka, dead_letter_topic(self.application_id), 5
                ).values()
            )
        except Exception:
            return None

    # ----- the Spark connection -----------------------------------------------------------------
    def get_conn(self) -> SparkConnection:
        """The Spark connection, resolved (:func:`resolve_spark_connection`) on first use."""
        return self.spark

    @cached_property
    def spark(self) -> SparkConnection:
        """The resolved Spark connection (:meth:`get_conn`)."""
        return resolve_spark_connection(self.conn_id)

    def submit_spec(self) -> SubmitSpec:
        """The platform's spark-submit description of this job version's driver."""
        from spark_jobs.driver.submit import submit_spec

        return submit_spec(self.spec, self.settings)

    def submit_command(self, submit: SubmitSpec) -> list[str]:
        """spark-submit of ``submit`` on the connection: its master, queue, Kubernetes namespace and binary
        (``spark-submit``: this environment's, :func:`~spark_jobs.driver.submit.spark_submit_binary`), in client mode
        always (a ``spark.submit.deployMode`` in Spark's defaults cannot move the driver elsewhere)."""
        spark = self.spark
        conf = dict(submit.conf)
        if spark.namespace and "k8s" in spark.master:
            conf.setdefault("spark.kubernetes.namespace", spark.namespace)
        binary = None if spark.spark_binary == DEFAULT_SPARK_BINARY else spark.spark_binary
        return dataclasses.replace(submit, master=spark.master, conf=conf).command(binary, queue=spark.queue)

    def launch_driver(self, run_label: str) -> dict:
        """Start this job version's driver detached on the Spark connection (:meth:`launch`)."""
        submit = self.submit_spec()
        command = self.submit_command(submit)
        self.log.info("launching %s on %s (master %s)", self.application_id, self.conn_id, self.spark.master)
        return self.launch(command, {**os.environ, **submit.env}, run_label)

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
