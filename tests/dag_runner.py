"""Runs ``airflow dags test`` for the tests through :mod:`tests.dag_test_server` (Airflow imported
once, one forked child per run) instead of a new ``airflow`` process per run; same arguments, same
environment, same result shape as :meth:`runtime.airflow_standalone.LocalAirflow.dags_test`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runtime.airflow_standalone import LocalAirflow
from runtime.settings import PROJECT_ROOT


class DagTestRunner:
    def __init__(self, local: LocalAirflow) -> None:
        self.local = local
        self._lock = threading.Lock()
        self._outputs = Path(tempfile.mkdtemp(prefix="dag-test-runs-"))
        self._runs = 0
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.dag_test_server"],
            cwd=PROJECT_ROOT,
            env={**local.environment(), "PYTHONPATH": str(PROJECT_ROOT)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ready = self._server.stdout.readline()
        if not ready.strip().startswith('{"ready"'):
            raise RuntimeError(f"the dags-test server did not start: {ready!r}")

    def dags_test(
        self,
        dag_id: str,
        conf: dict | None = None,
        env: dict[str, str] | None = None,
        dag_file: Path | None = None,
        timeout_s: float = 900,
        logical_date: str | None = None,
    ) -> subprocess.CompletedProcess:
        args = [
            "dags",
            "test",
            dag_id,
            *([logical_date] if logical_date else []),
            *(["-c", json.dumps(conf)] if conf else []),
            *(["--dagfile-path", str(dag_file)] if dag_file else []),
        ]
        with self._lock:
            self._runs += 1
            out, err, result = (self._outputs / f"{self._runs}.{ext}" for ext in ("out", "err", "result"))
            request = {
                "args": args,
                "env": {**self.local.environment(), **(env or {})},
                "cwd": str(self.local.home),
                "stdout": str(out),
                "stderr": str(err),
                "result": str(result),
                "timeout_s": timeout_s,
            }
            self._server.stdin.write(json.dumps(request) + "\n")
            self._server.stdin.flush()
            if not self._server.stdout.readline():
                raise RuntimeError(f"the dags-test server died (exit {self._server.poll()})")
        deadline = time.monotonic() + timeout_s + 60
        while not result.exists():  # runs may overlap: each waits for its own result
            if time.monotonic() > deadline:
                raise TimeoutError(f"`airflow {' '.join(args)}` reported nothing in {timeout_s + 60}s; see {out}")
            time.sleep(0.2)
        return subprocess.CompletedProcess(
            ["airflow", *args],
            json.loads(result.read_text())["returncode"],
            out.read_text(errors="replace"),
            err.read_text(errors="replace"),
        )

    def close(self) -> None:
        self._server.stdin.close()
        try:
            self._server.wait(30)
        except subprocess.TimeoutExpired:
            self._server.kill()
        shutil.rmtree(self._outputs, ignore_errors=True)  # each run's output files: read by the test already
