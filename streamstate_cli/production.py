"""The production shape on one machine: ``make production`` starts it and runs the main job on it as ``make run``
does on the embedded stack; ``make down`` stops it too.

Every part runs as it is deployed, each process on its own, from the same code and the same settings:

- Kafka: three KRaft brokers, a quorum of three controllers (runtime/kafka_cluster.py); every topic the platform
  creates has three copies and ``min.insync.replicas=2``;
- Spark: a standalone master and two workers (runtime/spark_standalone.py); drivers in client mode here, their
  executors on the workers;
- Airflow: the API server, scheduler, DAG processor and triggerer, each a process, on PostgreSQL
  (runtime/postgres.py) with the LocalExecutor;
- tables, snapshots and checkpoints in an S3-API object store (S3Proxy, runtime/s3_server.py: a bucket ``lake``);
- Prometheus scraping every driver, spare and standby it finds in their target files, with the platform's alert
  rules (runtime/prometheus.py).

Its data lives beside the embedded stack's, in ``<data_dir>-production`` (``.local-production`` by default), and its
ports (:class:`ProductionPorts`) differ from the embedded stack's, so both can run. The status files and leases stay
on its local disk: in production, a disk every Airflow host mounts.
"""

from __future__ import annotations

import dataclasses

from runtime.airflow_standalone import LocalAirflow
from runtime.kafka_cluster import LocalKafkaCluster
from runtime.postgres import LocalPostgres
from runtime.prometheus import LocalPrometheus, render_alert_rules
from runtime.s3_server import LocalS3Server
from runtime.settings import Settings
from runtime.spark_standalone import LocalSparkStandalone
from streamstate_cli.demo import console, run_supervised_demo
from streamstate_cli.job_processes import stop_job_processes

#: the object store's bucket of the job's tables (``tables/``) and checkpoints (``checkpoints/``)
LAKE_BUCKET = "lake"


@dataclasses.dataclass(frozen=True)
class ProductionPorts:
    """Where the production shape's processes listen (none of the embedded stack's defaults)."""

    kafka: tuple[tuple[int, int], ...] = ((19092, 19093), (19192, 19193), (19292, 19293))
    postgres: int = 15432
    airflow: int = 18080
    airflow_scheduler_health: int = 18974
    airflow_worker_log: int = 18793
    airflow_triggerer_log: int = 18794
    spark_master: int = 17077
    spark_master_ui: int = 18081
    #: the first worker's UI; the second's is the next port
    spark_worker_ui: int = 18082
    prometheus: int = 19090
    s3: int = 19000


class ProductionStack:
    """The production shape's processes for ``settings`` (its data directory, its host)."""

    def __init__(self, base: Settings, ports: ProductionPorts = ProductionPorts()) -> None:
        own = base.replace(
            airflow_port=ports.airflow,
            airflow_scheduler_health_port=ports.airflow_scheduler_health,
            airflow_worker_log_port=ports.airflow_worker_log,
            airflow_triggerer_log_port=ports.airflow_triggerer_log,
            spark_master=f"spark://{base.host}:{ports.spark_master}",
            # two workers of 2 cores: the driver's application and its spare's get 2 each (without a cap the
            # first application takes all 4 and the other waits for cores that never come)
            spark_cores_max=base.spark_cores_max or 2,
        )
        self.s3 = LocalS3Server(own.data_dir / "s3", ports.s3, settings=own)
        own = own.replace(
            lake_uri=f"s3a://{LAKE_BUCKET}/tables",
            checkpoint_uri=f"s3a://{LAKE_BUCKET}/checkpoints",
            **self.s3.settings_fields(),
        )
        self.kafka = LocalKafkaCluster(own, list(ports.kafka))
        self.settings = self.kafka.client_settings(own)
        self.postgres = LocalPostgres(self.settings, ports.postgres)
        self.airflow = LocalAirflow(self.settings, database_url=self.postgres.url)
        self.spark = LocalSparkStandalone(
            self.settings, ports.spark_master, ports.spark_master_ui, ports.spark_worker_ui, workers=2
        )
        self.prometheus = LocalPrometheus(self.settings, ports.prometheus, render_alert_rules(self.settings))
        self.ports = ports

    @classmethod
    def from_env(cls) -> ProductionStack:
        """For the deployment's settings, its data in ``<data_dir>-production``."""
        settings = Settings.from_env()
        return cls(settings.replace(data_dir=settings.data_dir.with_name(f"{settings.data_dir.name}-production")))

    def start(self) -> None:
        """Start every part not running yet, each ready before the next (Airflow's tasks need the others)."""
        self._start("an S3-API object store", self._start_object_store, f"{self.s3.endpoint} (bucket {LAKE_BUCKET})")
        self._start("three Kafka brokers", self.kafka.start, self.kafka.bootstrap_servers)
        self._start("a Spark master and two workers", self.spark.start, self.spark.master_url)
        self._start("PostgreSQL", self.postgres.start, self.postgres.url)
        self._start("Airflow's four processes", self.airflow.start_processes, self.settings.airflow_url)
        self._start("Prometheus", self.prometheus.start, self.prometheus.url)

    def _start_object_store(self) -> None:
        self.s3.start()
        self.s3.create_bucket(LAKE_BUCKET)

    @staticmethod
    def _start(what: str, start, where: str) -> None:
        with console.status(f"starting {what}…"):
            start()
        console.print(f"[green]✓[/green] {what} at {where}")

    def uis(self) -> list[tuple[str, str]]:
        host = self.settings.host
        return [
            ("Kafka brokers", self.kafka.bootstrap_servers),
            ("Spark master UI", f"http://{host}:{self.ports.spark_master_ui}"),
            ("Prometheus", f"{self.prometheus.url}/alerts"),
            ("S3-API object store", self.s3.endpoint),
        ]

    def stop(self) -> list[str]:
        """Stop every process, the job's drivers first; the names of what was stopped."""
        stopped = stop_job_processes(self.settings)
        for name, stop in (
            ("airflow", self.airflow.stop),
            ("prometheus", self.prometheus.stop),
            ("postgres", self.postgres.stop),
        ):
            if stop():
                stopped.append(name)
        self.spark.stop()
        self.kafka.stop()
        self.s3.stop()
        return [*stopped, "spark", "kafka", "s3"]


def run(events: int, users: int, seconds: float) -> int:
    """``make production``: the stack, then the main job on it through Airflow, as ``make run``."""
    stack = ProductionStack.from_env()
    return run_supervised_demo(stack.settings, events=events, users=users, seconds=seconds, stack=stack)
