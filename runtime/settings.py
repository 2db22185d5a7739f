"""Deployment settings: where Kafka, Spark, Delta and Airflow are, in one typed place.

Everything that differs between the embedded default (one machine) and a cluster is here, read
from ``STREAMSTATE_*`` environment variables with defaults for the embedded stack. Code never reads
these variables itself; it takes a :class:`Settings`.

Example:
    >>> s = Settings.from_env({"STREAMSTATE_KAFKA_PORT": "19092"})
    >>> s.kafka_bootstrap_servers
    '127.0.0.1:19092'
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from runtime.kafka_connection import KafkaConnection, KafkaSecurityError
from runtime.object_store import Location, ObjectStoreConnection, ObjectStoreError
from runtime.process import PORT_SLICE_ENV

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: records per micro-batch by default (``Settings.max_offsets_per_trigger``): a few seconds of a job's work here
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 200_000
ENV_PREFIX = "STREAMSTATE_"
#: in the status directory: the Prometheus target file of every process serving ``/metrics`` (Settings.metrics_targets_dir)
METRICS_TARGETS_DIR = "metrics-targets"
#: ``STREAMSTATE_`` variables that are not settings: the fault tests' failpoints (spark_jobs.driver.failpoints), the
#: slice of the free ports a test worker chooses from (runtime.process.free_port)
NOT_SETTINGS = frozenset({"STREAMSTATE_FAILPOINTS", PORT_SLICE_ENV})
# local, local[N], local[*], local[N,F], spark://host:port[,host:port], k8s://https://…, yarn
_SPARK_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://[\w.\-]+:\d+(,[\w.\-]+:\d+)*|k8s://\S+|yarn)$")


class SettingsError(ValueError):
    """A setting has a value that cannot work; the message names the variable."""


MIB = 1024 * 1024
HOUR_MS = 3600 * 1000


@dataclasses.dataclass(frozen=True)
class CompactionPolicy:
    """How far the changelog tuning DAG may go (``STREAMSTATE_COMPACTION_<FIELD>`` variables).

    The bounds keep recommendations inside what the broker accepts and what an operator would sign
    off: tiny segments mean many files and a busy cleaner; a low dirty ratio means the cleaner
    rewrites the log constantly.
    """

    #: records a restore may replay per live key before a topic counts as too dirty
    target_replay_ratio: float = 3.0
    #: on-call hears of a topic above its target after this many consecutive runs
    alert_after_runs: int = 3
    #: a superseded record should become compactable within this (drives segment.ms and max.compaction.lag.ms)
    max_uncompacted_ms: int = 6 * HOUR_MS
    #: Kafka 4 rejects segment.bytes below 1 MiB
    min_segment_bytes: int = MIB
    #: the largest segment.bytes a recommendation sets
    max_segment_bytes: int = 1024 * MIB
    #: rolling more often than this makes many small segment files
    min_segment_ms: int = 10 * 60 * 1000
    #: the lowest min.cleanable.dirty.ratio a recommendation sets
    min_dirty_ratio: float = 0.1
    #: Kafka's default min.cleanable.dirty.ratio
    max_dirty_ratio: float = 0.5
    #: Kafka's default delete.retention.ms: tombstones stay readable at least this long
    min_delete_retention_ms: int = 24 * HOUR_MS
    #: the bounded scan reads at most this many records per topic per run
    scan_max_records: int = 2_000_000
    #: what a scheduled run does: ``apply`` (tune) or ``dry_run`` (only recommend)
    scheduled_mode: str = "apply"

    def validate(self) -> None:
        for name in (
            "target_replay_ratio",
            "alert_after_runs",
            "max_uncompacted_ms",
            "min_segment_bytes",
            "max_segment_bytes",
            "min_segment_ms",
            "min_delete_retention_ms",
            "scan_max_records",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{ENV_PREFIX}COMPACTION_{name.upper()} must be > 0, got {getattr(self, name)}")
        if self.target_replay_ratio <= 1:
            raise SettingsError(f"{ENV_PREFIX}COMPACTION_TARGET_REPLAY_RATIO must be > 1 (1 = only live keys)")
        if self.min_segment_bytes < MIB:
            raise SettingsError(f"{ENV_PREFIX}COMPACTION_MIN_SEGMENT_BYTES: Kafka 4 rejects segments below 1 MiB")
        if self.max_segment_bytes < self.min_segment_bytes:
            raise SettingsError(f"{ENV_PREFIX}COMPACTION_MAX_SEGMENT_BYTES must be >= MIN_SEGMENT_BYTES")
        if not 0 < self.min_dirty_ratio <= self.max_dirty_ratio <= 1:
            raise SettingsError(f"{ENV_PREFIX}COMPACTION_MIN/MAX_DIRTY_RATIO: need 0 < min <= max <= 1")
        if self.scheduled_mode not in ("apply", "dry_run"):
            raise SettingsError(f"{ENV_PREFIX}COMPACTION_SCHEDULED_MODE must be apply or dry_run")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where everything is. Frozen: derive a changed copy with :meth:`replace`."""

    #: All mutable local data (broker logs, checkpoints, Delta tables, Airflow home) lives below this.
    data_dir: Path = PROJECT_ROOT / ".local"
    #: Resolved JVM jars (set-up writes them here from the jvm/ manifests).
    jvm_dir: Path = PROJECT_ROOT / ".jvm"
    #: Host the local services bind to and advertise (the Spark driver too). Loopback only by default.
    host: str = "127.0.0.1"
    #: the local broker's port
    kafka_port: int = 9092
    #: the local broker's KRaft controller port
    kafka_controller_port: int = 9093
    #: When set, clients use these servers instead of the local broker (e.g. a compose cluster).
    kafka_external_bootstrap: str | None = None
    #: Replication factor for topics the platform creates (1 locally, 3 on the compose cluster).
    kafka_replication_factor: int = 1
    #: How clients talk to Kafka (runtime/kafka_connection.py): PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL.
    kafka_security_protocol: str = "PLAINTEXT"
    #: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_* protocols only)
    kafka_sasl_mechanism: str | None = None
    #: the SASL user
    kafka_sasl_username: str | None = None
    #: a file holding the SASL password (a mounted secret): the password itself is never a setting
    kafka_sasl_password_file: Path | None = None
    #: PEM CA file that signed the brokers' certificates (TLS protocols); unset = system trust store
    kafka_ssl_ca_file: Path | None = None
    #: Airflow's API server and UI
    airflow_port: int = 8080
    #: Airflow's other listeners (scheduler health check, worker and triggerer log servers): typed
    #: here so two stacks (yours and the tests') never fight over Airflow's fixed defaults.
    airflow_scheduler_health_port: int = 8974
    #: Airflow's worker log server (see ``airflow_scheduler_health_port``)
    airflow_worker_log_port: int = 8793
    #: Airflow's triggerer log server (see ``airflow_scheduler_health_port``)
    airflow_triggerer_log_port: int = 8794
    #: where Delta tables live (job outputs, state snapshots, the platform's own tables): unset =
    #: ``<data_dir>/lake`` on the local disk; ``s3a://bucket/prefix`` puts them in an S3-API object
    #: store, reached with the ``s3_*`` settings
    lake_uri: str | None = None
    #: where Structured Streaming checkpoints live: unset = ``<data_dir>/checkpoints``; ``s3a://bucket/prefix``
    #: in the object store (status files and leases stay in ``<data_dir>/status``, on a disk the host locks)
    checkpoint_uri: str | None = None
    #: an S3-API server other than AWS (``http(s)://host:port``: MinIO, Ceph, S3Proxy...); unset = AWS
    s3_endpoint: str | None = None
    #: the object store's region
    s3_region: str = "us-east-1"
    #: unset: the AWS SDK's default credentials (environment, instance profile...)
    s3_access_key_id: str | None = None
    #: a file holding the secret access key (a mounted secret): the key itself is never a setting
    s3_secret_access_key_file: Path | None = None
    #: ``local[*]`` on one machine, ``spark://host:7077`` on a standalone cluster.
    spark_master: str = "local[*]"
    #: Spark's ``spark.sql.shuffle.partitions`` in every job's session; a stateful query keeps the number its
    #: checkpoint was created with
    spark_shuffle_partitions: int = 2
    #: on a cluster, at most this many cores per Spark application (Spark's ``spark.cores.max``): a standalone
    #: master otherwise gives the first application every core, and the next (a spare driver, a second job) none;
    #: unset: Spark's default
    spark_cores_max: int | None = None
    #: ``spark.driver.memory`` of every driver
    spark_driver_memory: str = "2g"
    #: more JVM options for every driver (a garbage collector, GC logging..., e.g. ``-XX:+UseParallelGC``), after
    #: the platform's own (its log4j configuration and class archive, which a plain ``spark.driver.extraJavaOptions``
    #: would replace; ``-XX:-DontCompileHugeMethods``: the JIT compiles Spark's large generated methods, which
    #: HotSpot would leave interpreted; ``-Dorg.apache.avro.fastread=false``: Spark's Avro state encoder makes a
    #: reader per value read, and Avro's fast reader would resolve the state's schema for each, executors too)
    spark_driver_java_options: str | None = None
    #: more JVM options for the local Kafka broker (runtime/kafka_broker.py), after its own heap and collector
    #: (``-Xmx768m -XX:+UseG1GC``); the tests give theirs ``-XX:TieredStopAtLevel=1``
    kafka_broker_java_options: str | None = None
    #: the JDK every JVM of the platform runs on (Spark drivers, spark-submit, the local broker...): unset =
    #: ``JAVA_HOME`` when set, else the newest JDK Spark supports in /usr/lib/jvm (runtime/jvm.py: java_home)
    java_home: Path | None = None
    #: at most this many source records per micro-batch, over all the job's input topics (Spark's Kafka
    #: ``maxOffsetsPerTrigger``), so a job catching up on a backlog (a restart after an outage, a burst) works it
    #: off in bounded batches that each commit in seconds (snapshots, changelog flushes, memory within budget)
    #: instead of one batch of everything. The answers do not depend on it (a join's inputs are taken in time
    #: order across batches). 0 (or None): no limit
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER
    #: a micro-batch that changed at most this many output rows is committed to the output table by delta-rs
    #: from the driver (tens of milliseconds); a larger one by a Spark MERGE on the executors (a second or
    #: more, but its rows never enter the driver). 0: always Spark (spark_jobs/io/output_table.py)
    driver_output_max_rows: int = 1_000_000
    #: a store whose restore reads at least this many records (snapshot rows + changelog tail) is
    #: restored by Spark's executors, never entering the driver process; a smaller one is restored in
    #: the driver, which is faster for it (no Spark jobs to plan). 0: always in Spark
    restore_in_spark_min_records: int = 1_000_000
    #: Comma-separated modules with more jobs (each lists ``JobSpec``s in ``JOBS``), e.g. a team's
    #: own job package; it must be importable wherever drivers and Airflow tasks run. Every spark-submit ships it
    #: to the executors.
    job_modules: str | None = None
    #: Comma-separated jars added to every Spark application (a team's own JVM code for its jobs)
    extra_jars: str | None = None
    #: bounds and targets of the changelog tuning DAG
    compaction: CompactionPolicy = CompactionPolicy()
    #: keep a spare driver per supervised job version (spark_jobs/driver/spare.py) where the job's
    #: ``SupervisionPolicy.spare_driver`` asks for one; off: none anywhere on this deployment (it costs a
    #: second driver's memory per job)
    spare_drivers: bool = True
    #: warm standby (spark_jobs/operations/standby): commit the followed changes to the Delta snapshot this often
    standby_commit_interval_s: float = 5.0
    #: the standby's bound: a change reaches the snapshot within this (a lag metric above it alerts)
    standby_max_lag_s: float = 30.0
    #: the state query API run on its own (``python -m streamstate_cli state-api``); in Airflow it is a plugin app
    state_api_port: int = 8791
    #: when set, every state query needs ``Authorization: Bearer <token>`` (never logged or shown)
    state_api_token: str | None = dataclasses.field(default=None, repr=False)
    #: the largest ``page_size`` a state query of a key range may ask for
    state_api_max_page_size: int = 1000
    #: a live answer that takes longer falls back to the standby
    state_api_timeout_s: float = 2.0
    #: ... but the first query of a store waits this long for its live view's first load (the snapshot read,
    #: the changelog caught up: seconds on a loaded machine), not to answer from a stale standby then
    state_api_first_load_s: float = 20.0
    #: every driver and standby serves Prometheus metrics on this port (spark_jobs/driver/metrics.py); 0 takes
    #: a free port (several processes on one host), published in the process's status file
    metrics_port: int = 0

    # ----- derived locations -------------------------------------------------------------------
    @property
    def kafka_bootstrap_servers(self) -> str:
        return self.kafka_external_bootstrap or f"{self.host}:{self.kafka_port}"

    @property
    def kafka(self) -> KafkaConnection:
        """Address and credentials for every Kafka client the platform creates."""
        return KafkaConnection(
            self.kafka_bootstrap_servers,
            self.kafka_security_protocol,
            self.kafka_sasl_mechanism,
            self.kafka_sasl_username,
            self.kafka_sasl_password_file,
            self.kafka_ssl_ca_file,
        )

    @property
    def kafka_dir(self) -> Path:
        return self.data_dir / "kafka"

    @property
    def airflow_home(self) -> Path:
        return self.data_dir / "airflow"

    @property
    def object_store(self) -> ObjectStoreConnection:
        """Address and credentials of the S3-API store ``s3a://`` locations are in."""
        return ObjectStoreConnection(
            self.s3_endpoint, self.s3_region, self.s3_access_key_id, self.s3_secret_access_key_file
        )

    @property
    def lake(self) -> Location:
        """Delta tables: job outputs, state snapshots (``_state``) and the platform's own tables (``_streamstate``)."""
        return Location.of(self.lake_uri or self.data_dir / "lake", self.object_store)

    @property
    def checkpoints(self) -> Location:
        """Structured Streaming checkpoints, one directory per job version."""
        return Location.of(self.checkpoint_uri or self.data_dir / "checkpoints", self.object_store)

    @property
    def status_dir(self) -> Path:
        """Per-job run reports and lifecycle status files."""
        return self.data_dir / "status"

    @property
    def kafka_min_insync_replicas(self) -> int:
        """``min.insync.replicas`` of the topics the platform creates: 2 of 3 copies (a write survives one broker's
        loss), 1 on a single broker."""
        return min(2, self.kafka_replication_factor)

    @property
    def metrics_targets_dir(self) -> Path:
        """Where every process serving ``/metrics`` lists itself for Prometheus' file-based discovery while it serves
        (one ``<name>.json`` each: spark_jobs/driver/metrics.py)."""
        return self.status_dir / METRICS_TARGETS_DIR

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def airflow_url(self) -> str:
        return f"http://{self.host}:{self.airflow_port}"

    def to_env(self) -> dict[str, str]:
        """The ``STREAMSTATE_*`` variables that reproduce these settings in another process."""
        env = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, CompactionPolicy):
                for sub in dataclasses.fields(value):
                    env[f"{ENV_PREFIX}COMPACTION_{sub.name.upper()}"] = str(getattr(value, sub.name))
            elif value is not None:
                env[ENV_PREFIX + field.name.upper()] = str(value)
        return env

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)

    # ----- loading -----------------------------------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``STREAMSTATE_<FIELD>`` variables (upper-case field names) over the defaults.

        Raises:
            SettingsError: a variable cannot be converted, or an unknown ``STREAMSTATE_`` variable is
                set (a typo would otherwise be silently ignored).
        """
        environ = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "compaction"}
        policy_fields = {f.name: f for f in dataclasses.fields(CompactionPolicy)}
        values: dict[str, object] = {}
        policy: dict[str, object] = {}
        for key, raw in environ.items():
            if not key.startswith(ENV_PREFIX) or key in NOT_SETTINGS:
                continue
            name = key[len(ENV_PREFIX) :].lower()
            if name.startswith("compaction_") and name[len("compaction_") :] in policy_fields:
                sub = name[len("compaction_") :]
                policy[sub] = _convert(key, raw, policy_fields[sub].type)
                continue
            if name not in fields:
                known = ", ".join([ENV_PREFIX + n.upper() for n in fields] + [f"{ENV_PREFIX}COMPACTION_<FIELD>"])
                raise SettingsError(f"unknown setting {key}; known settings: {known}")
            values[name] = _convert(key, raw, fields[name].type)
        settings = cls(**values, compaction=CompactionPolicy(**policy))
        settings.validate()
        return settings

    def validate(self) -> None:
        """SettingsError naming the first setting out of its bounds, in this order: the local services' ports,
        Spark, the JDK and Kafka's replication, the job limits, the state API and metrics, the connections, the
        compaction policy."""
        self._validate_local_ports()
        self._validate_spark_java_kafka()
        self._validate_job_limits()
        self._validate_state_api_and_metrics()
        self._validate_connections()
        self.compaction.validate()

    def _validate_local_ports(self) -> None:
        ports = {
            "kafka_port": self.kafka_port,
            "kafka_controller_port": self.kafka_controller_port,
            "airflow_port": self.airflow_port,
            "airflow_scheduler_health_port": self.airflow_scheduler_health_port,
            "airflow_worker_log_port": self.airflow_worker_log_port,
            "airflow_triggerer_log_port": self.airflow_triggerer_log_port,
        }
        for name, port in ports.items():
            if not 1 <= port <= 65535:
                raise SettingsError(f"{ENV_PREFIX}{name.upper()}={port} is not a TCP port")
        if len(set(ports.values())) != len(ports):
            raise SettingsError(f"the local services need distinct ports, got {ports}")

    def _validate_spark_java_kafka(self) -> None:
        if not _SPARK_MASTER.match(self.spark_master):
            raise SettingsError(
                f"{ENV_PREFIX}SPARK_MASTER={self.spark_master!r}: expected local[*], spark://host:port, k8s://… or yarn"
            )
        if self.java_home is not None and not (self.java_home / "bin" / "java").is_file():
            raise SettingsError(f"{ENV_PREFIX}JAVA_HOME={self.java_home}: no bin/java there (expected a JDK's home)")
        if self.kafka_replication_factor < 1:
            raise SettingsError("kafka_replication_factor must be at least 1")
        if self.spark_cores_max is not None and self.spark_cores_max < 1:
            raise SettingsError(
                f"{ENV_PREFIX}SPARK_CORES_MAX must be at least 1 (or unset), got {self.spark_cores_max}"
            )

    def _validate_job_limits(self) -> None:
        if self.restore_in_spark_min_records < 0:
            raise SettingsError(f"{ENV_PREFIX}RESTORE_IN_SPARK_MIN_RECORDS must be >= 0 (0: every store in Spark)")
        if self.driver_output_max_rows < 0:
            raise SettingsError(f"{ENV_PREFIX}DRIVER_OUTPUT_MAX_ROWS must be >= 0 (0: every output write by Spark)")
        if (self.max_offsets_per_trigger or 0) < 0:
            raise SettingsError(f"{ENV_PREFIX}MAX_OFFSETS_PER_TRIGGER must be >= 0 (0: no limit)")
        if not 0 < self.standby_commit_interval_s < self.standby_max_lag_s:
            raise SettingsError(
                f"{ENV_PREFIX}STANDBY_COMMIT_INTERVAL_S must be > 0 and below STANDBY_MAX_LAG_S "
                f"({self.standby_commit_interval_s} vs {self.standby_max_lag_s})"
            )

    def _validate_state_api_and_metrics(self) -> None:
        if (
            not 1 <= self.state_api_port <= 65535
            or self.state_api_max_page_size < 1
            or self.state_api_timeout_s <= 0
            or self.state_api_first_load_s <= 0
        ):
            raise SettingsError(f"{ENV_PREFIX}STATE_API_*: need a TCP port, a page size >= 1 and a timeout > 0")
        if not 0 <= self.metrics_port <= 65535:
            raise SettingsError(f"{ENV_PREFIX}METRICS_PORT={self.metrics_port} is not a TCP port (0: a free one)")

    def _validate_connections(self) -> None:
        try:
            self.kafka  # noqa: B018 - building the connection validates the Kafka security settings
        except KafkaSecurityError as err:
            raise SettingsError(str(err)) from None
        try:  # building the locations validates them and the object store settings
            self.lake  # noqa: B018
            self.checkpoints  # noqa: B018
        except ObjectStoreError as err:
            raise SettingsError(f"{ENV_PREFIX}LAKE_URI / CHECKPOINT_URI / S3_*: {err}") from None


def _boolean(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false (1/0, yes/no, on/off)")


def _convert(key: str, raw: str, type_name: object) -> object:
    type_text = str(type_name)
    if "None" in type_text:
        if not raw:
            return None
        type_text = type_text.replace("| None", "").strip()
    try:
        if type_text == "bool":
            return _boolean(raw)
        if type_text == "int":
            return int(raw)
        if type_text == "float":
            return float(raw)
        if type_text == "Path":
            return Path(raw).expanduser().resolve()
        return raw
    except ValueError as err:
        raise SettingsError(f"{key}={raw!r}: {err}") from err
