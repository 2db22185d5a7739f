"""A local background service: one process group, a pid file, a log file, a readiness check.

The pid file is the source of truth for "is this service ours and running". Services are started in
their own session so they outlive the CLI that started them and can be stopped as a group (Airflow
standalone has children; the broker's JVM has none, but the same code stops both).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal


class ServiceError(RuntimeError):
    """A local service could not be started, became unhealthy or could not be stopped."""


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def listener(port: int) -> str:
    """`` (<what ss says listens on port>)``, or an empty string when ss is not installed or says nothing."""
    try:
        out = subprocess.run(
            ["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return f" ({' '.join(out.split())})" if out else ""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (for tests and ephemeral stacks), chosen below the kernel's
    ephemeral range: a port chosen early stays free until its service starts late (an Airflow stack started
    forty minutes into a test session), since nothing that binds port 0 (a Spark driver, a metrics server,
    a client connection) is ever given one of these. Within ``STREAMSTATE_PORT_SLICE`` (``"i/n"``), when set."""
    high = _ephemeral_range_start()
    start, stop = _port_slice(max(1024, high - 12_000), high)
    for _ in range(500):
        port = _PORTS.randrange(start, stop)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded range: any free port
        sock.bind((host, 0))
        return sock.getsockname()[1]


#: not the ``random`` module's state, which tests seed
_PORTS = random.SystemRandom()

#: ``"i/n"``: this process chooses ports in the i-th of n equal slices of the range only. Test runs on several
#: workers set it per worker (tests/conftest.py): a port one worker chose for a service it starts later
#: (its Airflow) is then never chosen by another
PORT_SLICE_ENV = "STREAMSTATE_PORT_SLICE"


def _port_slice(low: int, high: int) -> tuple[int, int]:
    index, _, count = os.environ.get(PORT_SLICE_ENV, "0/1").partition("/")
    width = (high - low) // int(count)
    return low + int(index) * width, low + (int(index) + 1) * width


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_service_ports(host: str = "127.0.0.1") -> dict[str, int]:
    """Distinct free ports for every local service a :class:`~runtime.settings.Settings` names, so an
    ephemeral stack (tests, soak) never fights over the defaults with another stack."""
    names = (
        "kafka_port",
        "kafka_controller_port",
        "airflow_port",
        "airflow_scheduler_health_port",
        "airflow_worker_log_port",
        "airflow_triggerer_log_port",
    )
    ports: set[int] = set()
    while len(ports) < len(names):
        ports.add(free_port(host))
    return dict(zip(names, sorted(ports), strict=True))


class LocalService:
    def __init__(self, name: str, run_dir: Path, log_file: Path) -> None:
        self.name = name
        self.pid_file = run_dir / f"{name}.pid"
        self.log_file = log_file

    # ----- state ---------------------------------------------------------------------------------
    def pid(self) -> int | None:
        """The pid from the pid file if that process is still alive, else None (stale files removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            self.pid_file.unlink(missing_ok=True)
            return None
        except PermissionError:
            pass
        if _is_zombie(pid):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            self.pid_file.unlink(missing_ok=True)
            return None
        return pid

    def is_running(self) -> bool:
        return self.pid() is not None

    # ----- start / stop --------------------------------------------------------------------------
    def start(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str],
        ports: Mapping[str, tuple[str, int]],
        ready: Callable[[], bool],
        timeout_s: float,
        cwd: Path | None = None,
    ) -> int:
        """Start the service unless it already runs; wait until ``ready()``; return its pid.

        Refuses (ServiceError) when one of ``ports`` is taken by something that is not this service.
        """
        if (pid := self.pid()) is not None:
            return pid
        for what, (host, port) in ports.items():
            if port_in_use(host, port):
                raise ServiceError(
                    f"cannot start {self.name}: {what} port {host}:{port} is already in use by another "
                    f"process{listener(port)}. Stop it, or choose another port (see docs/configuration.md)."
                )
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                list(cmd),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )
        self.pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.pid_file.unlink(missing_ok=True)
                raise ServiceError(
                    f"{self.name} exited with code {proc.returncode} while starting; last log lines:\n" + self.tail()
                )
            if ready():
                return proc.pid
            time.sleep(0.5)
        self.stop()
        raise ServiceError(f"{self.name} was not ready after {timeout_s:.0f}s; last log lines:\n{self.tail()}")

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the whole process group: SIGTERM, then SIGKILL after ``timeout_s``. True if it ran."""
        pid = self.pid()
        if pid is None:
            return False
        _signal_group(pid, signal.SIGTERM)
        if not self._gone_within(timeout_s):
            _signal_group(pid, signal.SIGKILL)
            # a killed JVM holds its ports until the kernel has torn it down: a restart on the same ports waits
            self._gone_within(30.0)
        # Children that ignored SIGTERM (e.g. gunicorn workers) go with the group.
        _signal_group(pid, signal.SIGKILL)
        self.pid_file.unlink(missing_ok=True)
        return True

    def _gone_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.pid() is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return f"(no log at {self.log_file})"


def stop_process_group(proc: subprocess.Popen, timeout_s: float = 120.0) -> int | None:
    """Stop a child started with ``start_new_session=True`` (a spark-submit driver and its Python
    workers) as an operator would: SIGTERM to its group, which lets a driver stop its query cleanly,
    then SIGKILL after ``timeout_s``. Returns its exit code (None if it never exits)."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(30)
    return proc.returncode


def kill_process_group(pgid: int, timeout_s: float = 30.0) -> None:
    """kill -9 of process group ``pgid`` (a child started with ``start_new_session=True``), returning once none
    of its processes runs: a killed process lets go of its locks (a job's lease) and ports only as it exits, and a
    driver's Python process is the spark-submit JVM's child, so waiting for the direct child is not enough (a
    restart on a loaded machine found the killed driver's lease still held). The caller still reaps its child."""
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while (alive := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    if alive:
        raise ServiceError(f"process group {pgid} still runs {timeout_s:.0f} s after kill -9: {alive}")


def group_members(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that run (zombies left out: they hold nothing but their exit code)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)  # None: gone while listed
        if fields and int(fields[2]) == pgid and _process_state(int(stat.parent.name)) == "running":
            members.append(int(stat.parent.name))
    return members


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stat_fields(stat: Path) -> list[str] | None:
    """A process's ``/proc/<pid>/stat`` fields after its command name (state, parent, group, ...); None when it
    is gone. The name is cut at the last ``)``: it may hold spaces and parentheses itself."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def _process_state(pid: int) -> Literal["running", "exited", "gone"]:
    """``exited``: a zombie, its exit code all that is left. A process whose main thread has ended shows as a
    zombie while its other threads still run (a JVM in its shutdown hooks, its ports still bound): it runs until
    every thread has ended."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    if fields is None:
        return "gone"
    if fields[0] not in ("Z", "X"):
        return "running"
    for task in Path(f"/proc/{pid}/task").glob("*/stat"):
        if (thread := _stat_fields(task)) is not None and thread[0] not in ("Z", "X"):
            return "running"
    return "exited"


def _is_zombie(pid: int) -> bool:
    return _process_state(pid) == "exited"


def process_alive(pid: int | None) -> bool:
    """Whether ``pid`` runs (a zombie does not count: its exit code is all that is left)."""
    return bool(pid) and _process_state(pid) == "running"
