"""PostgreSQL for Airflow's metadata database, as Airflow is deployed: Debian's server, a data directory of the
stack's own (``<data_dir>/postgres``), started and stopped like the stack's other services.

The cluster is made once (``initdb``) with one role, ``streamstate``, trusted on the address the server listens
on (the stack's host: loopback by default), and a database ``airflow``; later starts reuse it, so Airflow's runs
and connections survive ``down``/``up``. PostgreSQL refuses to run as root: under root (a container, a CI
machine) the server and ``initdb`` run as the ``postgres`` system user Debian's package creates, and the data
directory is theirs.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

from runtime.process import LocalService, ServiceError
from runtime.settings import Settings

ROLE = "streamstate"
DATABASE = "airflow"
#: the OS user that runs the server when the stack runs as root
SERVER_USER = "postgres"


def _bin_dir() -> Path:
    """Debian's server binaries (postgresql-NN): the newest installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise ServiceError("PostgreSQL is not installed: `make setup` installs Debian's postgresql package")
    return Path(found[-1]).parent


class LocalPostgres:
    """The stack's PostgreSQL on ``settings.host``:``port``."""

    def __init__(self, settings: Settings, port: int, home: Path | None = None) -> None:
        """``home``: instead of ``<data_dir>/postgres`` (under root, a directory the ``postgres`` user can reach)."""
        self.settings, self.port = settings, port
        self.home = home or settings.data_dir / "postgres"
        self.data_dir = self.home / "data"
        self.socket_dir = self.home / "run"
        self.service = LocalService("postgres", self.home, self.home / "postgres.log")

    @property
    def url(self) -> str:
        """Airflow's ``sql_alchemy_conn`` for the stack's database."""
        return f"postgresql+psycopg2://{ROLE}@{self.settings.host}:{self.port}/{DATABASE}"

    def _as_server_user(self) -> list[str]:
        """The prefix that runs a command as the server's user (nothing unless the stack runs as root)."""
        if os.geteuid() != 0:
            return []
        return ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups", "--"]

    def _own(self, *paths: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            for path in paths:
                os.chown(path, user.pw_uid, user.pw_gid)

    def _init_once(self) -> None:
        if (self.data_dir / "PG_VERSION").exists():
            return
        for path in (self.home, self.data_dir, self.socket_dir):
            path.mkdir(parents=True, exist_ok=True)
        self._own(self.home, self.data_dir, self.socket_dir)
        cmd = [
            *self._as_server_user(),
            str(_bin_dir() / "initdb"),
            f"--pgdata={self.data_dir}",
            f"--username={ROLE}",
            "--auth=trust",  # the server listens on the stack's host only (loopback by default)
            "--encoding=UTF8",
            "--no-instructions",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ServiceError(f"initdb in {self.data_dir} failed:\n{proc.stdout}{proc.stderr}")

    def start(self, timeout_s: float = 60.0) -> int:
        self._init_once()
        pid = self.service.start(
            [
                *self._as_server_user(),
                str(_bin_dir() / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-h",
                self.settings.host,
                "-k",
                str(self.socket_dir),
            ],
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"},
            ports={"PostgreSQL": (self.settings.host, self.port)},
            ready=self._accepts,
            timeout_s=timeout_s,
        )
        self._create_database_once()
        return pid

    def _connect(self, dbname: str):
        import psycopg2

        return psycopg2.connect(host=self.settings.host, port=self.port, user=ROLE, dbname=dbname, connect_timeout=3)

    def _accepts(self) -> bool:
        try:
            self._connect("postgres").close()
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False
        return True

    def _create_database_once(self) -> None:
        connection = self._connect("postgres")
        connection.autocommit = True  # CREATE DATABASE runs outside a transaction
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cursor.fetchone() is None:
                    cursor.execute(f"CREATE DATABASE {DATABASE}")
        finally:
            connection.close()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """PostgreSQL's "fast" shutdown (SIGINT: open sessions are ended, nothing is lost), then the service's own
        escalation (SIGTERM waits for every client to leave, which Airflow's pooled connections never do)."""
        pid = self.service.pid()
        if pid is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        while self.service.pid() is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        self.service.stop(5)
        return True

    def wipe(self) -> None:
        if self.service.is_running():
            raise ServiceError("refusing to wipe PostgreSQL's data while it runs; stop it first")
        shutil.rmtree(self.home, ignore_errors=True)

    def describe(self) -> dict[str, object]:
        return {
            "running": self.service.is_running(),
            "pid": self.service.pid(),
            "url": self.url,
            "data": str(self.data_dir),
            "log": str(self.service.log_file),
        }
