"""The embedded Airflow 3: ``airflow standalone`` on SQLite with this repository's dags/ and plugins/.

Source of truth for the Airflow side of the local stack: its environment (:meth:`environment`), its
home under ``<data_dir>/airflow`` and its pid file. ``prepare()`` migrates the metadata database
and imports the ``spark_default`` connection (``local[*]`` or the configured master); both steps
are idempotent. The UI needs no login locally (simple auth manager, all admins) because it binds
to loopback only; the compose deployment uses real users.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from runtime.process import LocalService, ServiceError
from runtime.settings import PROJECT_ROOT, Settings

VENV_BIN = Path(sys.executable).parent


def spark_default_connection(settings: Settings) -> dict[str, object]:
    """The ``spark_default`` connection as Airflow's connection JSON (host = the Spark master)."""
    return {
        "conn_type": "spark",
        "host": settings.spark_master,
        "extra": json.dumps({"deploy-mode": "client", "spark-binary": "spark-submit"}),
    }


def alert_webhook_connection(airflow_url: str) -> dict[str, object]:
    """The default ``streamstate_webhook``: the alert inbox of the "Streaming jobs" page on the Airflow
    API server itself, so alerts are visible with no outside service. Point it at your own endpoint
    (an Airflow connection of the same id) to receive them elsewhere."""
    return {"conn_type": "http", "host": f"{airflow_url.rstrip('/')}/streamstate/api/alerts"}


#: Airflow's processes as a deployment runs them, each on its own (``airflow <name>``)
AIRFLOW_PROCESSES = ("api-server", "scheduler", "dag-processor", "triggerer")


SQLITE_LOCK_TIMEOUT_S = 60


def sqlite_url(path: Path) -> str:
    """The standalone's SQLite database. A writer waits up to a minute for the file's lock (SQLite's default is
    5 s): the scheduler, the DAG processor and the API server all write to it, and on a busy machine one of them
    holds the lock for longer; the scheduler's loop dies on a ``database is locked`` and ``airflow standalone``
    does not start it again, leaving every run queued."""
    return f"sqlite:///{path}?timeout={SQLITE_LOCK_TIMEOUT_S}"


class LocalAirflow:
    """Airflow (API server, scheduler, DAG processor, triggerer) for ``settings``: ``airflow standalone`` on SQLite
    (:meth:`start`, the embedded default), or, given ``database_url`` (PostgreSQL: :mod:`runtime.postgres`), each
    process on its own with the LocalExecutor, as Airflow is deployed (:meth:`start_processes`), so one can be
    killed and restarted alone. ``extra_env``: Airflow configuration on top of this module's
    (``AIRFLOW__SECTION__KEY`` variables)."""

    def __init__(
        self, settings: Settings, extra_env: Mapping[str, str] | None = None, database_url: str | None = None
    ) -> None:
        self.settings = settings
        self.extra_env = dict(extra_env or {})
        self.database_url = database_url
        self.home = settings.airflow_home
        self.service = LocalService("airflow", self.home, settings.logs_dir / "airflow-standalone.log")
        self.processes = {
            name: LocalService(f"airflow-{name}", self.home, settings.logs_dir / f"airflow-{name}.log")
            for name in AIRFLOW_PROCESSES
        }

    def environment(self) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(
            {
                "AIRFLOW_HOME": str(self.home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT_ROOT / "dags"),
                "AIRFLOW__CORE__PLUGINS_FOLDER": str(PROJECT_ROOT / "plugins"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{s.airflow_url}/execution/",
                "AIRFLOW__API__HOST": s.host,
                "AIRFLOW__API__PORT": str(s.airflow_port),
                "AIRFLOW__API__BASE_URL": s.airflow_url,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url or sqlite_url(self.home / "airflow.db"),
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
                "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "True",
                "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT": str(s.airflow_scheduler_health_port),
                "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(s.airflow_worker_log_port),
                "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(s.airflow_triggerer_log_port),
                # spark-submit and the Python Spark workers must come from this environment.
                "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
            }
        )
        if self.database_url:
            env["AIRFLOW__CORE__EXECUTOR"] = "LocalExecutor"
        # DAGs and tasks see the same deployment settings as the CLI that started Airflow.
        env.update(s.to_env())
        env.update(self.extra_env)
        return env

    def _airflow(self, *args: str, timeout_s: float = 600) -> str:
        proc = subprocess.run(
            [str(VENV_BIN / "airflow"), *args],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise ServiceError(f"`airflow {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc.stdout

    def reserialize_dags(self) -> None:
        """Parse the DAG folder into the metadata database now (what the DAG processor does on its rounds)."""
        self._airflow("dags", "reserialize")

    def dags_test(
        self,
        dag_id: str,
        conf: dict | None = None,
        env: dict[str, str] | None = None,
        dag_file: Path | None = None,
        timeout_s: float = 900,
        logical_date: str | None = None,
    ) -> subprocess.CompletedProcess:
        """One run of ``dag_id`` via ``airflow dags test`` (``dag.test()``: tasks and triggers run in that
        process, no scheduler needed). ``dag_file`` spares parsing the whole folder; ``logical_date`` (ISO 8601)
        picks the run's data interval as the schedule would. ``returncode`` is 0
        when the run succeeded."""
        args = [
            str(VENV_BIN / "airflow"),
            "dags",
            "test",
            dag_id,
            *([logical_date] if logical_date else []),
            *(["-c", json.dumps(conf)] if conf else []),
            *(["--dagfile-path", str(dag_file)] if dag_file else []),
        ]
        return subprocess.run(
            args,
            env={**self.environment(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=self.home,
        )

    def prepare(self) -> None:
        """Migrate the metadata DB and (re)import the spark_default and alert webhook connections. Idempotent.

        A stamp (Airflow version + the connection) skips both CLI calls (about 20 s) when nothing changed.
        """
        from airflow import __version__ as airflow_version

        self.home.mkdir(parents=True, exist_ok=True)
        connections = {
            "spark_default": spark_default_connection(self.settings),
            "streamstate_webhook": alert_webhook_connection(self.settings.airflow_url),
        }
        stamp = self.home / ".prepared"
        migrated = self.database_url is not None or (self.home / "airflow.db").exists()
        wanted = json.dumps(
            {"airflow": airflow_version, "connections": connections, "db": self.database_url}, sort_keys=True
        )
        if stamp.exists() and stamp.read_text() == wanted and migrated:
            return
        self._airflow("db", "migrate")
        connections_file = self.home / "connections.json"
        connections_file.write_text(json.dumps(connections, indent=2))
        self._airflow("connections", "import", "--overwrite", str(connections_file))
        stamp.write_text(wanted)

    def start(self, timeout_s: float = 300.0) -> int:
        if (pid := self.service.pid()) is not None:
            return pid
        self.prepare()
        s = self.settings
        return self.service.start(
            [str(VENV_BIN / "airflow"), "standalone"],
            env=self.environment(),
            ports={"Airflow API server": (s.host, s.airflow_port)},
            ready=self.is_ready,
            timeout_s=timeout_s,
            cwd=self.home,
        )

    def start_processes(self, timeout_s: float = 300.0) -> None:
        """Airflow as deployed: every process of :data:`AIRFLOW_PROCESSES` on its own (needs ``database_url``: the
        LocalExecutor runs tasks beside the scheduler, which SQLite cannot serve), ready when the API server
        reports the metadata database and the scheduler healthy. Idempotent: a process already running stays."""
        if not self.database_url:
            raise ServiceError("Airflow's processes on their own need a database server (database_url)")
        self.prepare()  # also writes airflow.cfg once, whose generated secrets every process then shares
        for name in AIRFLOW_PROCESSES:
            self.start_process(name, wait=False)
        deadline = time.monotonic() + timeout_s
        while not self.is_ready():
            if time.monotonic() > deadline:
                tails = "\n".join(f"{n}:\n{p.tail(10)}" for n, p in self.processes.items())
                raise ServiceError(f"Airflow was not ready after {timeout_s:.0f} s:\n{tails}")
            time.sleep(1)

    def start_process(self, name: str, *, wait: bool = True, timeout_s: float = 120.0) -> int:
        """(Re)start one of Airflow's processes; with ``wait``, until Airflow is healthy again."""
        s = self.settings
        ports = {"Airflow API server": (s.host, s.airflow_port)} if name == "api-server" else {}
        return self.processes[name].start(
            [str(VENV_BIN / "airflow"), name],
            env=self.environment(),
            ports=ports,
            ready=self.is_ready if wait else lambda: True,
            timeout_s=timeout_s,
            cwd=self.home,
        )

    def health(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"{self.settings.airflow_url}/api/v2/monitor/health", timeout=3) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def is_ready(self) -> bool:
        health = self.health()
        if not health:
            return False
        return all(health.get(part, {}).get("status") == "healthy" for part in ("metadatabase", "scheduler"))

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the standalone, or every process of a deployed Airflow. True if anything ran."""
        stopped = [process.stop(timeout_s) for process in self.processes.values()]
        return self.service.stop(timeout_s) or any(stopped)

    def describe(self) -> dict[str, object]:
        health = self.health() or {}
        return {
            "running": self.service.is_running(),
            "pid": self.service.pid(),
            "url": self.settings.airflow_url,
            "health": {k: v.get("status") for k, v in health.items() if isinstance(v, dict)},
            "home": str(self.home),
            "log": str(self.service.log_file),
        }


#: tries of an idempotent API request the standalone's SQLite database was too busy for
DATABASE_BUSY_ATTEMPTS = 5


class AirflowApi:
    """A small client of the Airflow 3 REST API (``/api/v2``) of the local stack.

    Locally the simple auth manager makes everyone admin, so ``/auth/token`` hands out a token
    without credentials.
    """

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._token: str | None = None

    def _token_for_requests(self) -> str:
        """The API token, fetched once. Fetching it is idempotent: a fresh api-server that is still starting
        its workers on a busy machine can take longer than a timeout to answer, and is asked again."""
        attempt = 0
        while self._token is None:
            attempt += 1
            try:
                with urllib.request.urlopen(f"{self.base_url}/auth/token", timeout=30) as resp:
                    self._token = json.loads(resp.read())["access_token"]
            except (TimeoutError, urllib.error.URLError) as err:
                if attempt == DATABASE_BUSY_ATTEMPTS:
                    raise ServiceError(f"Airflow API token from {self.base_url}: {err}") from err
                time.sleep(attempt)
        return self._token

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        token = self._token_for_requests()
        request = urllib.request.Request(
            f"{self.base_url}/api/v2{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        for attempt in range(1, DATABASE_BUSY_ATTEMPTS + 1):
            try:
                with urllib.request.urlopen(request, timeout=30) as resp:
                    return json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as err:
                detail = err.read()[:500]
                # SQLite (the standalone's database) has one writer: a request that waited out its busy
                # timeout while the scheduler or DAG processor wrote fails whole (rolled back), and is safe
                # to repeat; a fresh stack's scheduled housekeeping runs write right when `make run` triggers
                retry = err.code == 500 and b"Database error" in detail
                if not retry or attempt == DATABASE_BUSY_ATTEMPTS:
                    raise ServiceError(f"Airflow API {method} {path}: HTTP {err.code} {detail!r}") from err
                time.sleep(attempt)
        raise AssertionError("unreachable")

    def dag_ids(self) -> list[str]:
        return [d["dag_id"] for d in self._request("GET", "/dags?limit=1000")["dags"]]

    def import_errors(self) -> list[dict]:
        return self._request("GET", "/importErrors")["import_errors"]

    def connection(self, conn_id: str) -> dict:
        return self._request("GET", f"/connections/{conn_id}")

    def trigger(self, dag_id: str, conf: dict | None = None) -> str:
        self._request("PATCH", f"/dags/{dag_id}", {"is_paused": False})
        run = self._request("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return run["dag_run_id"]

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self._request("PATCH", f"/dags/{dag_id}", {"is_paused": paused})

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self._request("GET", f"/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")["state"]

    def fail_unfinished_runs(self, dag_id: str) -> list[str]:
        """Mark the DAG's queued and running runs failed (what on-call does with a run whose process
        died); the run ids. Under ``max_active_runs=1`` a run left running blocks every new one."""
        found = self._request("GET", f"/dags/{dag_id}/dagRuns?state=queued&state=running&limit=100")
        failed = []
        for run in found["dag_runs"]:
            quoted = urllib.parse.quote(run["dag_run_id"], safe="")
            self._request("PATCH", f"/dags/{dag_id}/dagRuns/{quoted}", {"state": "failed"})
            failed.append(run["dag_run_id"])
        return failed

    def task_states(self, dag_id: str, task_id: str) -> dict[str, str | None]:
        """run id -> the state of the task in that run, over the DAG's runs (newest 100)."""
        found = self._request("GET", f"/dags/{dag_id}/dagRuns/~/taskInstances?task_id={task_id}&limit=100&order_by=-id")
        return {ti["dag_run_id"]: ti["state"] for ti in found["task_instances"]}

    def task_logs(self, dag_id: str, run_id: str, lines: int = 40) -> str:
        """The tail of each task's last try in the run, as its log page shows the events: what a failed run's
        assertion prints (the stack and its task logs are gone when CI reports the failure)."""
        run = urllib.parse.quote(run_id, safe="")
        found = self._request("GET", f"/dags/{dag_id}/dagRuns/{run}/taskInstances?limit=100")["task_instances"]
        parts = []
        for ti in found:
            head = f"--- {ti['task_id']}: {ti['state']} (try {ti['try_number']})"
            if not ti["try_number"]:
                parts.append(head)
                continue
            log = self._request(
                "GET", f"/dags/{dag_id}/dagRuns/{run}/taskInstances/{ti['task_id']}/logs/{ti['try_number']}"
            )
            events = [
                " ".join(str(e.get(k, "")) for k in ("timestamp", "level", "event")).strip()
                for e in log.get("content", [])
                if isinstance(e, dict)
            ]
            parts.append("\n".join([head, *events[-lines:]]))
        return "\n".join(parts)

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = 600) -> str:
        """Poll until the run is success or failed; returns the final state."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(1)
        raise ServiceError(f"DAG run {dag_id}/{run_id} did not finish in {timeout_s:.0f}s")
