"""A fork server for ``airflow dags test``: import Airflow once, fork one child per run.

``import airflow.sdk`` alone takes about 8 s here, and the DAG tests run ``airflow dags test`` some 30
times in sequence. This process imports Airflow (and the heavy libraries the tasks use) once; each
request forks a child that sets its environment, redirects its stdout/stderr to files and runs the
real Airflow CLI (``airflow dags test ...``): the same code path as the command, minus the imports.
Airflow disposes its database connections in forked children itself (its LocalExecutor and task
runner fork the same way).

Protocol: one JSON request per line on stdin, ``{"args", "env", "cwd", "stdout", "stderr", "result",
"timeout_s"}``, answered at once with ``{"started": pid}``; the exit code arrives later in the
``result`` file as ``{"returncode"}``. Started by :class:`tests.dag_runner.DagTestRunner`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback


def _preload() -> None:
    import airflow.sdk  # noqa: F401
    import confluent_kafka  # noqa: F401
    import deltalake  # noqa: F401
    import pyarrow  # noqa: F401
    from airflow.cli import cli_parser

    cli_parser.get_parser()
    import airflow.dag_processing.dagbag  # noqa: F401
    import airflow.providers.apache.spark.operators.spark_submit  # noqa: F401
    import airflow.providers.http.hooks.http  # noqa: F401
    import airflow.sdk.execution_time.supervisor  # noqa: F401
    import airflow.sdk.execution_time.task_runner  # noqa: F401
    from airflow.sdk.execution_time.supervisor import in_process_api_server
    from cadwyn import Cadwyn

    # Every task of a `dags test` talks to an in-process Execution API app; building it and letting
    # Cadwyn generate its versioned routers (lazily, on the first request) takes about 8 s. Build and
    # initialise it once here; every run inherits it (``in_process_api_server`` is a cached
    # singleton). Only the app: its transport starts a thread, which must not exist before a fork;
    # each run makes its own.
    app = in_process_api_server().app

    def initialise(asgi) -> None:
        if isinstance(asgi, Cadwyn) and not asgi._cadwyn_initialized:
            asgi._cadwyn_initialize()
        for route in getattr(asgi, "routes", []):
            if getattr(route, "app", None) is not None and route.app is not asgi:
                initialise(route.app)

    initialise(app)


def _child(request: dict) -> None:
    code = 1
    try:
        os.environ.clear()  # exactly the environment a new `airflow` process would get
        os.environ.update(request["env"])
        for entry in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
            if entry and entry not in sys.path:
                sys.path.insert(0, entry)
        os.chdir(request["cwd"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.setsid()  # a timeout kills the run and whatever it started in the foreground
        from airflow.__main__ import main

        sys.argv = ["airflow", *request["args"]]
        main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the run's stderr, like the CLI would
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _wait(pid: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -signal.SIGKILL
        time.sleep(0.05)


def _run_and_report(request: dict) -> None:
    """In a forked child: fork the run, wait for it, write its exit code to ``request["result"]``."""
    pid = os.fork()
    if pid == 0:
        _child(request)
    code = _wait(pid, float(request.get("timeout_s", 900)))
    partial = request["result"] + ".partial"
    with open(partial, "w") as f:
        json.dump({"returncode": code}, f)
    os.rename(partial, request["result"])  # atomic: the runner never reads half a result
    os._exit(0)


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    # Runs may overlap (the race tests start several at once): each is reported through its result
    # file, so this loop only starts them.
    for line in sys.stdin:
        _reap()
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_and_report(request)
        print(json.dumps({"started": pid}), flush=True)


if __name__ == "__main__":
    main()
