"""KafkaConnection (pure): settings -> librdkafka and Spark/Java client configuration, and the secret's path."""

from __future__ import annotations

import pytest

from runtime.kafka_connection import KafkaConnection, KafkaSecurityError, as_connection
from runtime.settings import Settings, SettingsError


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "pw"
    path.write_text('s3cr"et\\x\n')  # a quote and a backslash: the JAAS line must escape them
    return path


def test_plaintext_is_just_the_bootstrap_servers():
    kafka = as_connection("b:9092")
    assert kafka.client_config({"group.id": "g"}) == {"bootstrap.servers": "b:9092", "group.id": "g"}
    assert kafka.spark_options() == {"kafka.bootstrap.servers": "b:9092"}
    assert str(kafka) == "b:9092" and as_connection(kafka) is kafka


def test_sasl_ssl_scram_for_librdkafka_and_spark(password_file, tmp_path):
    ca = tmp_path / "ca.pem"
    kafka = KafkaConnection("b:9093", "SASL_SSL", "SCRAM-SHA-512", "svc", password_file, ca)
    assert kafka.client_config() == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": 's3cr"et\\x',
        "ssl.ca.location": str(ca),
    }
    options = kafka.spark_options()
    assert options["kafka.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="svc" password="s3cr\\"et\\\\x";'
    )
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512" and options["kafka.security.protocol"] == "SASL_SSL"
    assert (options["kafka.ssl.truststore.type"], options["kafka.ssl.truststore.location"]) == ("PEM", str(ca))


def test_plain_uses_the_plain_login_module(password_file):
    jaas = KafkaConnection("b:1", "SASL_PLAINTEXT", "PLAIN", "u", password_file).java_properties()["sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.plain.PlainLoginModule required")


def test_the_password_is_read_when_a_client_is_built_and_never_shown(password_file):
    kafka = KafkaConnection("b:1", "SASL_SSL", "PLAIN", "u", password_file)
    password_file.write_text("rotated\n")
    assert kafka.client_config()["sasl.password"] == "rotated"
    assert "rotated" not in repr(kafka) + str(kafka.describe()) + str(kafka)
    assert kafka.describe()["sasl_password_file"] == str(password_file)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"security_protocol": "TLS"}, "SECURITY_PROTOCOL='TLS'"),
        ({"security_protocol": "SASL_SSL"}, "SASL_MECHANISM=None"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "GSSAPI"}, "SASL_MECHANISM='GSSAPI'"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN", "sasl_username": "u"}, "SASL_PASSWORD_FILE"),
        ({"sasl_username": "u"}, "does not use SASL"),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "PLAIN",
                "sasl_username": "u",
                "sasl_password_file": "/x",
                "ssl_ca_file": "/ca.pem",
            },
            "has no TLS",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_variable(fields, message):
    with pytest.raises(KafkaSecurityError, match=message.replace("(", r"\(")):
        KafkaConnection("b:1", **fields)


def test_a_missing_or_empty_password_file_is_a_clear_error(tmp_path):
    missing = KafkaConnection("b:1", "SASL_SSL", "PLAIN", "u", tmp_path / "nope")
    with pytest.raises(KafkaSecurityError, match="cannot read it"):
        missing.client_config()
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(KafkaSecurityError, match="is empty"):
        KafkaConnection("b:1", "SASL_SSL", "PLAIN", "u", tmp_path / "empty").client_config()


def test_settings_read_the_security_variables_and_refuse_bad_ones(password_file):
    env = {
        "STREAMSTATE_KAFKA_EXTERNAL_BOOTSTRAP": "k1:9093,k2:9093",
        "STREAMSTATE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "STREAMSTATE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "STREAMSTATE_KAFKA_SASL_USERNAME": "svc",
        "STREAMSTATE_KAFKA_SASL_PASSWORD_FILE": str(password_file),
    }
    settings = Settings.from_env(env)
    assert settings.kafka == KafkaConnection("k1:9093,k2:9093", "SASL_SSL", "SCRAM-SHA-256", "svc", password_file)
    assert Settings.from_env(settings.to_env()).kafka == settings.kafka  # what a spark-submit'd driver gets
    assert 's3cr"et' not in str(settings.to_env())
    with pytest.raises(SettingsError, match="SASL_MECHANISM"):
        Settings.from_env({**env, "STREAMSTATE_KAFKA_SASL_MECHANISM": "OAUTHBEARER"})
