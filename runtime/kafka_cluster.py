"""Three Kafka brokers on one machine, as they run on three hosts: the production shape's Kafka.

Each node is its own KRaft process (broker and controller roles combined, :class:`~runtime.kafka_broker.LocalKafkaBroker`
with a node id of its own), the three a quorum of controllers; their storage is formatted with one cluster id.
The broker's own topics and the platform's (:attr:`Settings.kafka_replication_factor`) are replicated three times,
``min.insync.replicas=2``: one broker down, every write still commits; two down, a write waits (acks=all) rather
than lose what one broker alone holds.

The platform reaches the cluster through its ordinary settings (:meth:`LocalKafkaCluster.client_settings`: the
three bootstrap servers and replication factor 3), exactly as it reaches brokers on other hosts. The fault
tests stop, kill and pause single nodes (:meth:`LocalKafkaCluster.kill`, :meth:`pause`) and find a partition's
leader or a transactional id's coordinator (:meth:`leader_of`, :meth:`transaction_coordinator`).

Data lives under ``<data_dir>/kafka-cluster/node-<id>``.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time

from runtime.kafka_broker import KraftNode, LocalKafkaBroker, new_cluster_id
from runtime.process import ServiceError, free_port
from runtime.settings import Settings

#: Kafka's ``__transaction_state`` partitions on these brokers (``transaction.state.log.num.partitions``)
TRANSACTION_STATE_PARTITIONS = 5


class LocalKafkaCluster:
    """``size`` KRaft nodes (3 by default) on ``settings.host``; node ``k``'s ports are ``ports[k - 1]``."""

    def __init__(self, settings: Settings, ports: list[tuple[int, int]]) -> None:
        self.settings = settings
        self.home = settings.data_dir / "kafka-cluster"
        quorum = tuple(KraftNode(k, settings.host, port, cport) for k, (port, cport) in enumerate(ports, start=1))
        self.nodes = {
            node.node_id: LocalKafkaBroker(settings, node=node, quorum=quorum, home=self.home / f"node-{node.node_id}")
            for node in quorum
        }

    @classmethod
    def on_free_ports(cls, settings: Settings, size: int = 3) -> LocalKafkaCluster:
        chosen: set[int] = set()
        while len(chosen) < 2 * size:
            chosen.add(free_port(settings.host))
        ports = sorted(chosen)
        return cls(settings, [(ports[2 * k], ports[2 * k + 1]) for k in range(size)])

    # ----- what clients use ----------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(broker.node.bootstrap for broker in self.nodes.values())

    @property
    def replication_factor(self) -> int:
        return min(3, len(self.nodes))

    def client_settings(self, settings: Settings | None = None) -> Settings:
        """``settings`` (the cluster's own by default) pointed at these brokers, the platform's topics replicated."""
        return (settings or self.settings).replace(
            kafka_external_bootstrap=self.bootstrap_servers, kafka_replication_factor=self.replication_factor
        )

    # ----- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        """Start every node that is not running. The nodes start together: a node's broker waits for the quorum,
        which needs a majority of controllers, so the first cannot be ready before the second has started."""
        cluster_id = self.cluster_id()
        for broker in self.nodes.values():
            broker.cluster_id = cluster_id
            broker._write_config()
            broker._format_storage_once()
        for node_id in self.nodes:
            self.restart(node_id, wait=False)
        self.wait_until_ready(timeout_s)

    def cluster_id(self) -> str:
        """The id every node's storage is formatted with: made at the first start, kept in ``cluster.id``."""
        cluster_id_file = self.home / "cluster.id"
        if not cluster_id_file.exists():
            cluster_id_file.parent.mkdir(parents=True, exist_ok=True)
            cluster_id_file.write_text(new_cluster_id())
        return cluster_id_file.read_text().strip()

    def restart(self, node_id: int, *, wait: bool = True, timeout_s: float = 120.0) -> None:
        """(Re)start one node; with ``wait``, until it is back in the cluster's metadata."""
        self.nodes[node_id].start(timeout_s=timeout_s, wait=wait)

    def wait_until_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(broker.is_ready() for broker in self.nodes.values()):
            if time.monotonic() > deadline:
                tails = "\n".join(f"node {k}:\n{b.service.tail(10)}" for k, b in self.nodes.items())
                raise ServiceError(f"the Kafka cluster was not ready after {timeout_s:.0f} s:\n{tails}")
            time.sleep(0.5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every node at once: stopped one by one, the last would wait its whole timeout for a quorum gone."""
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(lambda broker: broker.stop(timeout_s), self.nodes.values()))

    # ----- faults ----------------------------------------------------------------------------------
    def kill(self, node_id: int) -> None:
        """kill -9 of one node (its process group), returning once it is gone."""
        from runtime.process import kill_process_group

        pid = self.nodes[node_id].service.pid()
        if pid is None:
            raise ServiceError(f"Kafka node {node_id} is not running")
        kill_process_group(pid)
        self.nodes[node_id].service.pid()  # reaps a zombie and removes the stale pid file

    def pause(self, node_id: int) -> None:
        """SIGSTOP: the node neither answers nor heartbeats, as a host in a long GC pause or cut off."""
        os.killpg(self._pid(node_id), signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        os.killpg(self._pid(node_id), signal.SIGCONT)

    def _pid(self, node_id: int) -> int:
        if (pid := self.nodes[node_id].service.pid()) is None:
            raise ServiceError(f"Kafka node {node_id} is not running")
        return pid

    # ----- who leads what --------------------------------------------------------------------------
    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})

    def leader_of(self, topic: str, partition: int) -> int:
        """The node leading ``topic``'s ``partition`` now."""
        meta = self._admin().list_topics(topic, timeout=10).topics[topic]
        return meta.partitions[partition].leader

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``'s transactions: the leader of its ``__transaction_state``
        partition, which Kafka chooses as ``abs(transactional_id.hashCode()) % partitions`` (Java's hash)."""
        return self.leader_of("__transaction_state", _java_hash_abs(transactional_id) % TRANSACTION_STATE_PARTITIONS)

    def fully_replicated(self) -> bool:
        """Every partition of every topic has all its replicas in sync (a restarted node has caught up)."""
        metadata = self._admin().list_topics(timeout=10).topics
        return all(
            set(p.isrs) == set(p.replicas) and p.leader >= 0
            for topic in metadata.values()
            for p in topic.partitions.values()
        )

    def describe(self) -> dict[str, object]:
        return {
            "bootstrap": self.bootstrap_servers,
            "nodes": {k: b.describe() for k, b in self.nodes.items()},
            "replication_factor": self.replication_factor,
        }


def _java_hash_abs(text: str) -> int:
    """Kafka's ``Utils.abs(text.hashCode())``: Java's String hash over UTF-16 code units, 32-bit."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return 0 if h == -(1 << 31) else abs(h)
