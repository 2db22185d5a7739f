"""The embedded Apache Kafka broker: one KRaft process (broker + controller) run from Maven jars.

Data lives under ``<data_dir>/kafka``: ``server.properties`` and ``log4j2.properties`` written from
:class:`Settings`, the formatted storage in ``data/``, the broker's log in ``logs/``. Storage is
formatted once (``kafka.tools.StorageTool format``); later starts reuse it, so topics and offsets
survive ``down``/``up``.

The same class runs one node of a cluster (:mod:`runtime.kafka_cluster`): its node id, the quorum's voters and
the cluster id its storage is formatted with are then the cluster's, and the broker's own topics are replicated
as the platform's are (replication factor up to 3, ``min.insync.replicas`` up to 2).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import shlex
import shutil
import subprocess
import uuid
from pathlib import Path

from runtime import jvm
from runtime.kafka_connection import KafkaConnection, jaas_quote
from runtime.process import LocalService, ServiceError
from runtime.settings import Settings

BROKER_HEAP = "-Xmx768m"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclasses.dataclass(frozen=True)
class BrokerSecurity:
    """A secured local broker: its client listener is SASL_SSL (TLS with the given PEM key and
    certificate, SASL/PLAIN and SASL/SCRAM-SHA-256/512), ACLs are enforced (StandardAuthorizer, nothing
    allowed without an ACL) and only ``admin_username`` is a super user. The controller listener
    authenticates with SASL/PLAIN as the admin too, so no anonymous principal is trusted anywhere.

    SCRAM users and ACLs are created at run time with the AdminClient (as the admin); PLAIN users live
    in the broker's own configuration (``plain_users``: name -> password file), as Kafka's built-in
    PLAIN store requires.
    """

    #: PEM: the broker's private key (unencrypted PKCS#8) followed by its certificate chain
    keystore_pem: Path
    #: PEM: the CA that signed it (the broker checks its own inter-broker connection against it)
    ca_pem: Path
    admin_username: str
    admin_password_file: Path
    plain_users: tuple[tuple[str, Path], ...] = ()

    def admin_connection(self, bootstrap_servers: str) -> KafkaConnection:
        return KafkaConnection(
            bootstrap_servers, "SASL_SSL", "PLAIN", self.admin_username, self.admin_password_file, self.ca_pem
        )

    def server_properties(self, settings: Settings) -> dict[str, str]:
        s, admin = settings, self.admin_username
        admin_pw = jaas_quote(self.admin_password_file.read_text().strip())
        users = {admin: admin_pw, **{u: jaas_quote(f.read_text().strip()) for u, f in self.plain_users}}
        plain_users = " ".join(f'user_{u}="{pw}"' for u, pw in users.items())
        plain_jaas = f'{PLAIN_LOGIN} required username="{admin}" password="{admin_pw}" {plain_users};'
        return {
            "listeners": f"SASL_SSL://{s.host}:{s.kafka_port},CONTROLLER://{s.host}:{s.kafka_controller_port}",
            "advertised.listeners": f"SASL_SSL://{s.host}:{s.kafka_port}",
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "PLAIN",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": plain_jaas,
            "listener.name.sasl_ssl.plain.sasl.jaas.config": plain_jaas,
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": f"{SCRAM_LOGIN} required;",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": f"{SCRAM_LOGIN} required;",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_pem),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{admin}",
        }


@dataclasses.dataclass(frozen=True)
class KraftNode:
    """One KRaft process of a quorum (broker and controller roles combined): its id and its two listeners."""

    node_id: int
    host: str
    port: int
    controller_port: int

    @property
    def voter(self) -> str:
        """This node in ``controller.quorum.voters``."""
        return f"{self.node_id}@{self.host}:{self.controller_port}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


class LocalKafkaBroker:
    """Starts, checks and stops the local broker. Source of truth: its pid file and storage dir.

    Alone (the default) it is node 1 of a quorum of itself, on ``settings``' ports, in ``settings.kafka_dir``.
    As one node of a cluster it takes ``node`` (its id and ports), ``quorum`` (every node) and ``cluster_id``
    (the id every node's storage is formatted with) and lives in ``home``.
    """

    def __init__(
        self,
        settings: Settings,
        security: BrokerSecurity | None = None,
        *,
        node: KraftNode | None = None,
        quorum: tuple[KraftNode, ...] = (),
        cluster_id: str | None = None,
        home: Path | None = None,
    ) -> None:
        self.settings = settings
        self.security = security
        self.node = node or KraftNode(1, settings.host, settings.kafka_port, settings.kafka_controller_port)
        self.quorum = quorum or (self.node,)
        self.cluster_id = cluster_id
        self.home = home or settings.kafka_dir
        self.storage_dir = self.home / "data"
        self.config_file = self.home / "server.properties"
        self.log4j_file = self.home / "log4j2.properties"
        self.service = LocalService("kafka", self.home, self.home / "logs" / "server.log")

    # ----- configuration -----------------------------------------------------------------------
    def server_properties(self) -> dict[str, str]:
        s, node = self.settings, self.node
        # the broker's own topics (consumer offsets, transactions) replicated as the platform replicates its own
        replicas, in_sync = str(min(3, len(self.quorum))), str(min(2, len(self.quorum)))
        return {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": ",".join(n.voter for n in self.quorum),
            "listeners": f"PLAINTEXT://{node.bootstrap},CONTROLLER://{node.host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{node.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.storage_dir),
            # The platform creates every topic it uses with explicit configs.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": replicas,
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            # every driver's first claim (a transactional producer) waits for this topic: 50 partitions
            # (the default) take seconds to create on one broker
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "group.initial.rebalance.delay.ms": "0",
            # The log cleaner compacts changelog topics; keep it on with a modest buffer.
            "log.cleaner.enable": "true",
            "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
            # an idle cleaner looks for dirty logs every second, not every 15 s (the default): a tuned
            # changelog compacts soon after its segment rolls (checking costs a scan of a few logs)
            "log.cleaner.backoff.ms": "1000",
            **(self.security.server_properties(s) if self.security else {}),
        }

    @property
    def admin_connection(self) -> KafkaConnection:
        """How the runtime itself talks to the broker (readiness): the admin on a secured broker."""
        bootstrap = self.node.bootstrap
        return self.security.admin_connection(bootstrap) if self.security else KafkaConnection(bootstrap)

    def _write_config(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        lines = [f"{k}={v}" for k, v in self.server_properties().items()]
        # A secured broker's configuration holds its PLAIN passwords: readable by its owner only.
        self.config_file.touch(mode=0o600, exist_ok=True)
        self.config_file.chmod(0o600)
        self.config_file.write_text(
            "# Written by runtime/kafka_broker.py from Settings; edits are overwritten.\n" + "\n".join(lines) + "\n"
        )
        self.log4j_file.write_text(_LOG4J2_PROPERTIES.format(log_file=self.service.log_file))

    def _java_cmd(self, main_class: str, *args: str) -> list[str]:
        java = jvm.java_binary(self.settings)
        return [
            java,
            BROKER_HEAP,
            "-XX:+UseG1GC",
            *shlex.split(self.settings.kafka_broker_java_options or ""),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.log4j_file}",
            f"-Dkafka.logs.dir={self.service.log_file.parent}",
            "-cp",
            jvm.broker_classpath(self.settings),
            main_class,
            *args,
        ]

    def _format_storage_once(self) -> None:
        if (self.storage_dir / "meta.properties").exists():
            return
        cluster_id = self.cluster_id or new_cluster_id()
        cmd = self._java_cmd("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.config_file))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ServiceError(f"formatting Kafka storage in {self.storage_dir} failed:\n{proc.stdout}{proc.stderr}")

    # ----- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout_s: float = 90.0, *, wait: bool = True) -> int:
        """Start the broker unless it runs; with ``wait``, until it is ready (a cluster starts its nodes
        without: one node of a quorum cannot be ready before a majority of them runs)."""
        if (pid := self.service.pid()) is not None:
            return pid
        self._write_config()
        self._format_storage_once()
        node = self.node
        return self.service.start(
            self._java_cmd("kafka.Kafka", str(self.config_file)),
            env=os.environ,
            ports={"Kafka": (node.host, node.port), "Kafka controller": (node.host, node.controller_port)},
            ready=self.is_ready if wait else lambda: True,
            timeout_s=timeout_s,
        )

    def is_ready(self) -> bool:
        """The broker answers a metadata request and lists itself (a cluster's node: the brokers it knows)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(self.admin_connection.client_config({"log_level": 0}))
        try:
            metadata = admin.list_topics(timeout=2)
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False
        return self.node.node_id in metadata.brokers

    def stop(self, timeout_s: float = 30.0) -> bool:
        return self.service.stop(timeout_s)

    def wipe(self) -> None:
        """Delete all broker data (topics, offsets). The broker must be stopped."""
        if self.service.is_running():
            raise ServiceError("refusing to wipe Kafka data while the broker runs; stop it first")
        shutil.rmtree(self.home, ignore_errors=True)

    def describe(self) -> dict[str, object]:
        return {
            "running": self.service.is_running(),
            "pid": self.service.pid(),
            **self.settings.kafka.describe(),
            "data": str(self.storage_dir),
            "log": str(self.service.log_file),
        }


def new_cluster_id() -> str:
    """A KRaft cluster id, as Kafka's ``Uuid.randomUuid`` makes one (a leading "-" would read as an option)."""
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster_id


_LOG4J2_PROPERTIES = """\
# Written by runtime/kafka_broker.py
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
logger.controller.name = org.apache.kafka.controller
logger.controller.level = WARN
"""
