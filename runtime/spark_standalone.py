"""A local Spark standalone cluster (one master, one or more workers) from pyspark's own ``spark-class``.

This is the deployment users move to when one machine's ``local[*]`` is not enough: the same jobs,
submitted with ``--master spark://host:port``. Locally it proves that path; docker-compose runs the
multi-node version of it.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

from runtime import jvm
from runtime.process import LocalService, port_in_use
from runtime.settings import Settings


class LocalSparkStandalone:
    def __init__(
        self,
        settings: Settings,
        master_port: int,
        master_ui_port: int,
        worker_ui_port: int,
        worker_cores: int = 2,
        worker_memory: str = "2g",
        workers: int = 1,
    ) -> None:
        """``workers``: worker ``k`` (1-based) serves its UI on ``worker_ui_port + k - 1``."""
        import pyspark

        self.settings = settings
        self.spark_home = Path(pyspark.__file__).parent
        self.master_port, self.master_ui_port, self.worker_ui_port = master_port, master_ui_port, worker_ui_port
        self.worker_cores, self.worker_memory = worker_cores, worker_memory
        run_dir = settings.data_dir / "spark-standalone"
        self.work_dir = run_dir / "work"
        self.master = LocalService("spark-master", run_dir, settings.logs_dir / "spark-master.log")
        names = ["spark-worker", *(f"spark-worker-{k}" for k in range(2, workers + 1))]
        self.workers = [LocalService(name, run_dir, settings.logs_dir / f"{name}.log") for name in names]

    @property
    def master_url(self) -> str:
        return f"spark://{self.settings.host}:{self.master_port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "SPARK_LOCAL_IP": self.settings.host,
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_NO_DAEMONIZE": "1",
            **jvm.java_env(self.settings),  # executors on the drivers' JDK
        }

    def _spark_class(self, *args: str) -> list[str]:
        return [str(self.spark_home / "bin" / "spark-class"), *args]

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.settings.host}:{self.master_ui_port}/json/", timeout=3) as r:
                return int(json.loads(r.read()).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def start(self, timeout_s: float = 120) -> str:
        host = self.settings.host
        self.master.start(
            self._spark_class(
                "org.apache.spark.deploy.master.Master",
                "--host",
                host,
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.master_ui_port),
            ),
            env=self._env(),
            ports={"Spark master": (host, self.master_port), "Spark master UI": (host, self.master_ui_port)},
            ready=lambda: port_in_use(host, self.master_port) and port_in_use(host, self.master_ui_port),
            timeout_s=timeout_s,
        )
        for k, worker in enumerate(self.workers, start=1):
            self.start_worker(worker, self.worker_ui_port + k - 1, k, timeout_s)
        return self.master_url

    def start_worker(self, worker: LocalService, ui_port: int, alive: int, timeout_s: float = 120) -> int:
        """Start one worker; ready when the master counts ``alive`` workers."""
        host = self.settings.host
        work_dir = self.work_dir / worker.name
        work_dir.mkdir(parents=True, exist_ok=True)
        return worker.start(
            self._spark_class(
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                host,
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--webui-port",
                str(ui_port),
                "--work-dir",
                str(work_dir),
            ),
            env=self._env(),
            ports={"Spark worker UI": (host, ui_port)},
            ready=lambda: self.alive_workers() >= alive,
            timeout_s=timeout_s,
        )

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()
