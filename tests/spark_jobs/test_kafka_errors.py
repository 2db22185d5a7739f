"""Which Kafka client errors the platform's followers wait out (pure)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from spark_jobs.io.kafka_topics import is_transient


def test_broker_restarts_and_timeouts_are_transient():
    for code in (
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._DESTROY_BROKER,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    ):
        assert is_transient(KafkaError(code)), code


def test_authorization_and_bad_requests_are_not():
    for code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.INVALID_CONFIG,
        KafkaError._INVALID_ARG,
    ):
        assert not is_transient(KafkaError(code)), code
