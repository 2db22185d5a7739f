"""A local Spark standalone cluster (one master, one or more workers) from pyspark's own ``spark-class``.

This is the deployment users move to when one machine's ``local[*]`` is not enough: the same jobs,
submitted with ``--master spark://host:port``. Locally it proves that path; docker-compose runs the
multi-node version of it.

The master keeps what it knows (workers, running applications) in a recovery directory
(``spark.deploy.recoveryMode=FILESYSTEM``, Spark's single-master recovery): a master restarted while jobs run
takes their applications and the workers back instead of forgetting them. The production tests kill workers
(:meth:`LocalSparkStandalone.kill_worker`, the host lost with its executors), restart the master
(:meth:`restart_master`) and add a worker to a running cluster (:meth:`add_worker`).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

from runtime import jvm
from runtime.process import LocalService, free_port, kill_process_group, port_in_use
from runtime.settings import Settings


def master_recovery_options(recovery_dir: Path | str) -> str:
    """The master's ``SPARK_MASTER_OPTS``: what it knows kept in ``recovery_dir`` (single-master recovery), so a
    restarted master takes back the running applications and the workers (docker-compose.yml sets the same)."""
    return f"-Dspark.deploy.recoveryMode=FILESYSTEM -Dspark.deploy.recoveryDirectory={recovery_dir}"


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
        self.run_dir = settings.data_dir / "spark-standalone"
        self.work_dir = self.run_dir / "work"
        self.recovery_dir = self.run_dir / "master-recovery"
        self.master = LocalService("spark-master", self.run_dir, settings.logs_dir / "spark-master.log")
        self.workers = [self._worker_service(k) for k in range(1, workers + 1)]
        self._added_ui_ports: dict[int, int] = {}

    def _worker_service(self, k: int) -> LocalService:
        name = "spark-worker" if k == 1 else f"spark-worker-{k}"
        return LocalService(name, self.run_dir, self.settings.logs_dir / f"{name}.log")

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
            # read by spark-class for the master only
            "SPARK_MASTER_OPTS": master_recovery_options(self.recovery_dir),
            **jvm.java_env(self.settings),  # executors on the drivers' JDK
        }

    def master_status(self) -> dict:
        """The master's status JSON (state, workers, activeapps), or {} while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.settings.host}:{self.master_ui_port}/json/", timeout=3) as r:
                return json.loads(r.read())
        except (OSError, ValueError):
            return {}

    def _spark_class(self, *args: str) -> list[str]:
        return [str(self.spark_home / "bin" / "spark-class"), *args]

    def alive_workers(self) -> int:
        return int(self.master_status().get("aliveworkers", 0))

    def _worker_alive(self, ui_port: int) -> bool:
        return any(
            w.get("state") == "ALIVE" and w.get("webuiaddress", "").endswith(f":{ui_port}")
            for w in self.master_status().get("workers", [])
        )

    def running_applications(self) -> list[dict]:
        """The master's running applications (its JSON: id, name, cores, state)."""
        return list(self.master_status().get("activeapps", []))

    def start(self, timeout_s: float = 120) -> str:
        self.start_master(timeout_s)
        for k, worker in enumerate(self.workers, start=1):
            self.start_worker(worker, self.worker_ui_port + k - 1, timeout_s)
        return self.master_url

    def start_master(self, timeout_s: float = 120) -> int:
        """Start the master (ready when it serves its status as ALIVE: a restarted one first recovers what its
        recovery directory holds, then answers)."""
        host = self.settings.host
        self.recovery_dir.mkdir(parents=True, exist_ok=True)
        return self.master.start(
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
            ready=lambda: port_in_use(host, self.master_port) and self.master_status().get("status") == "ALIVE",
            timeout_s=timeout_s,
        )

    def start_worker(self, worker: LocalService, ui_port: int, timeout_s: float = 120) -> int:
        """Start one worker; ready when the master lists it (by its UI's address) as ALIVE."""
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
            ready=lambda: self._worker_alive(ui_port),
            timeout_s=timeout_s,
        )

    def kill_worker(self, k: int) -> None:
        """kill -9 of worker ``k`` (1-based) and every executor it launched: a host lost."""
        if (pid := self.workers[k - 1].pid()) is not None:
            kill_process_group(pid)

    def restart_worker(self, k: int, timeout_s: float = 120) -> int:
        """Start worker ``k`` again; ready when the master counts it among the live workers."""
        port = self._added_ui_ports.get(k, self.worker_ui_port + k - 1)
        return self.start_worker(self.workers[k - 1], port, timeout_s)

    def add_worker(self, ui_port: int | None = None, timeout_s: float = 120) -> int:
        """A new worker joins the running cluster (running applications that want more cores than they have get
        executors on it); its number. Its UI on ``ui_port`` (a free port by default)."""
        k = len(self.workers) + 1
        self.workers.append(self._worker_service(k))
        port = ui_port or free_port(self.settings.host)
        self.start_worker(self.workers[-1], port, timeout_s)
        self._added_ui_ports[k] = port
        return k

    def restart_master(self, timeout_s: float = 180) -> int:
        """Stop the master (SIGTERM) and start it again on the same ports and recovery directory."""
        self.master.stop()
        return self.start_master(timeout_s)

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.master.stop()
