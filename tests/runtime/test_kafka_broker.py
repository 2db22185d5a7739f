"""The embedded broker is a real Apache Kafka process: the admin client sees it, records round-trip."""

from __future__ import annotations

import socket

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from runtime.kafka_broker import LocalKafkaBroker
from runtime.process import ServiceError
from spark_jobs.io.kafka_topics import ensure_topic

pytestmark = pytest.mark.integration


def test_admin_client_sees_a_kraft_broker(kafka_broker, settings):
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap_servers})
    metadata = admin.list_topics(timeout=10)
    assert [b.id for b in metadata.brokers.values()] == [1]
    cluster = admin.describe_cluster(request_timeout=10).result()
    assert cluster.controller is not None and cluster.cluster_id
    # A KRaft broker from the Maven jars, with a java process behind the pid file.
    cmdline = open(f"/proc/{kafka_broker.service.pid()}/cmdline").read()
    assert "kafka.Kafka" in cmdline and "kafka_2.13-" in cmdline


def test_a_produced_record_is_consumed(kafka_broker, settings, unique):
    topic = f"roundtrip-{unique}"
    assert ensure_topic(settings.kafka_bootstrap_servers, topic, partitions=3) is True
    assert ensure_topic(settings.kafka_bootstrap_servers, topic, partitions=3) is False  # idempotent
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    producer.produce(topic, key=b"user-1", value=b"hello")
    assert producer.flush(30) == 0
    consumer = Consumer(
        {"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": unique, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    try:
        for _ in range(60):
            msg = consumer.poll(1)
            if msg is not None and not msg.error():
                break
        assert msg is not None and (msg.key(), msg.value()) == (b"user-1", b"hello")
    finally:
        consumer.close()


def test_partition_mismatch_is_refused(kafka_broker, settings, unique):
    topic = f"mismatch-{unique}"
    ensure_topic(settings.kafka_bootstrap_servers, topic, partitions=2)
    with pytest.raises(ValueError, match="exists with 2 partitions"):
        ensure_topic(settings.kafka_bootstrap_servers, topic, partitions=4)


def test_auto_topic_creation_is_off(kafka_broker):
    assert kafka_broker.server_properties()["auto.create.topics.enable"] == "false"


def test_second_start_is_a_no_op(kafka_broker):
    pid = kafka_broker.service.pid()
    assert kafka_broker.start() == pid


def test_refuses_clearly_when_the_port_is_taken(settings, tmp_path):
    with socket.socket() as blocker:
        blocker.bind((settings.host, 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        other = settings.replace(data_dir=tmp_path, kafka_port=taken, kafka_controller_port=taken + 1)
        with pytest.raises(ServiceError, match=rf"Kafka port {settings.host}:{taken} is already in use"):
            LocalKafkaBroker(other).start()


def test_broker_logs_through_log4j(kafka_broker):
    log = kafka_broker.service.log_file.read_text()
    assert "Kafka Server started" in log or "Kafka version" in log, log[-2000:]
    assert "Defaulting to no-operation (NOP) logger" not in log
