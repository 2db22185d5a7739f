"""The three-broker cluster's configuration and its coordinator arithmetic, without starting it (its faults run in
tests/production/test_kafka_cluster_faults.py)."""

from __future__ import annotations

from runtime.kafka_cluster import LocalKafkaCluster, _java_hash_abs
from runtime.settings import Settings


def test_three_nodes_form_one_quorum_and_replicate_every_internal_topic(tmp_path):
    cluster = LocalKafkaCluster(Settings(data_dir=tmp_path), [(19092, 19093), (19192, 19193), (19292, 19293)])
    configs = [broker.server_properties() for broker in cluster.nodes.values()]
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    voters = "1@127.0.0.1:19093,2@127.0.0.1:19193,3@127.0.0.1:19293"
    assert {c["controller.quorum.voters"] for c in configs} == {voters}
    for c in configs:
        assert c["default.replication.factor"] == c["offsets.topic.replication.factor"] == "3"
        assert c["transaction.state.log.replication.factor"] == "3"
        assert c["min.insync.replicas"] == c["transaction.state.log.min.isr"] == "2"
    assert cluster.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19192,127.0.0.1:19292"
    client = cluster.client_settings()
    assert client.kafka_bootstrap_servers == cluster.bootstrap_servers and client.kafka_replication_factor == 3
    # one cluster id for every node's storage, made at the first start and kept across restarts of the stack
    assert not cluster.home.exists(), "nothing is written before a start"
    again = LocalKafkaCluster(Settings(data_dir=tmp_path), [(1, 2), (3, 4), (5, 6)])
    assert cluster.cluster_id() == again.cluster_id() and len(cluster.cluster_id()) == 22


def test_one_broker_alone_keeps_its_single_copies(tmp_path):
    from runtime.kafka_broker import LocalKafkaBroker

    config = LocalKafkaBroker(
        Settings(data_dir=tmp_path, kafka_port=19092, kafka_controller_port=19093)
    ).server_properties()
    assert config["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert config["offsets.topic.replication.factor"] == config["min.insync.replicas"] == "1"


def test_the_coordinator_partition_is_javas_string_hash():
    # String.hashCode() of these, as Java computes it; "polygenelubricants" hashes to Integer.MIN_VALUE,
    # which Kafka's Utils.abs maps to 0
    assert _java_hash_abs("abc") == 96354
    assert _java_hash_abs("hello") == 99162322
    assert _java_hash_abs("purchase_counts-v3-driver") == abs(_java_hash_signed("purchase_counts-v3-driver"))
    assert _java_hash_abs("polygenelubricants") == 0
    assert _java_hash_abs("é€") == ord("é") * 31 + ord("€")


def _java_hash_signed(text: str) -> int:
    h = 0
    for ch in text:  # every character here is one UTF-16 unit
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h
