"""How the platform connects to Kafka: the one place that turns settings into client configuration.

Every Kafka client the platform creates — confluent-kafka admin clients, producers and consumers
(librdkafka) and Spark's Kafka source and sink (the Java client) — gets its address *and* its security
settings from a :class:`KafkaConnection`, built from :class:`~runtime.settings.Settings` (never from
code). Supported: ``PLAINTEXT`` (the embedded default), ``SSL`` (TLS, the broker's certificate checked
against a PEM CA file), ``SASL_PLAINTEXT`` and ``SASL_SSL`` with ``PLAIN``, ``SCRAM-SHA-256`` or
``SCRAM-SHA-512``.

The SASL password is read from a file (a mounted secret) at the moment a client is built, so it is
never in an environment variable, a command line, the Spark configuration or a repr: the object's
repr and :meth:`KafkaConnection.describe` show the file's path, not its content.

Example:
    >>> KafkaConnection("broker:9092").client_config({"group.id": "g"})
    {'bootstrap.servers': 'broker:9092', 'group.id': 'g'}
    >>> KafkaConnection("broker:9092").spark_options()
    {'kafka.bootstrap.servers': 'broker:9092'}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class KafkaSecurityError(ValueError):
    """The Kafka security settings cannot work; the message names the setting (never a secret)."""


@dataclasses.dataclass(frozen=True)
class KafkaConnection:
    """A Kafka cluster's address and the credentials to use it. Build it with ``Settings.kafka``."""

    bootstrap_servers: str
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    #: a file holding the password (surrounding whitespace is ignored); read when a client is built
    sasl_password_file: Path | None = None
    #: PEM file of the CA(s) that signed the brokers' certificates; unset = the system's trust store
    ssl_ca_file: Path | None = None

    def __post_init__(self) -> None:
        self.validate()

    def __str__(self) -> str:  # messages name the cluster, never the credentials
        return self.bootstrap_servers

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def validate(self) -> None:
        p = "STREAMSTATE_KAFKA_"
        if self.security_protocol not in SECURITY_PROTOCOLS:
            raise KafkaSecurityError(
                f"{p}SECURITY_PROTOCOL={self.security_protocol!r}: expected one of {SECURITY_PROTOCOLS}"
            )
        sasl_fields = (self.sasl_mechanism, self.sasl_username, self.sasl_password_file)
        if self.uses_sasl:
            if self.sasl_mechanism not in SASL_MECHANISMS:
                raise KafkaSecurityError(
                    f"{p}SASL_MECHANISM={self.sasl_mechanism!r}: {self.security_protocol} "
                    f"needs one of {SASL_MECHANISMS}"
                )
            if not self.sasl_username or self.sasl_password_file is None:
                raise KafkaSecurityError(f"{self.security_protocol} needs {p}SASL_USERNAME and {p}SASL_PASSWORD_FILE")
        elif any(v is not None for v in sasl_fields):
            raise KafkaSecurityError(
                f"{p}SASL_* settings are set but {p}SECURITY_PROTOCOL={self.security_protocol} "
                "does not use SASL (use SASL_SSL or SASL_PLAINTEXT)"
            )
        if self.ssl_ca_file is not None and not self.uses_tls:
            raise KafkaSecurityError(
                f"{p}SSL_CA_FILE is set but {p}SECURITY_PROTOCOL={self.security_protocol} has no TLS"
            )

    def password(self) -> str:
        """The SASL password, read now from its file (so a rotated secret is picked up by new clients)."""
        if self.sasl_password_file is None:
            raise KafkaSecurityError("no STREAMSTATE_KAFKA_SASL_PASSWORD_FILE is configured")
        try:
            secret = self.sasl_password_file.read_text().strip()
        except OSError as err:
            raise KafkaSecurityError(
                f"STREAMSTATE_KAFKA_SASL_PASSWORD_FILE={self.sasl_password_file}: cannot read it ({err.strerror})"
            ) from None
        if not secret:
            raise KafkaSecurityError(f"STREAMSTATE_KAFKA_SASL_PASSWORD_FILE={self.sasl_password_file} is empty")
        return secret

    # ----- client configuration --------------------------------------------------------------------
    def client_config(self, extra: Mapping[str, object] | None = None) -> dict[str, object]:
        """librdkafka configuration (confluent-kafka ``Producer``/``Consumer``/``AdminClient``)."""
        config: dict[str, object] = {"bootstrap.servers": self.bootstrap_servers}
        if self.security_protocol != "PLAINTEXT":
            config["security.protocol"] = self.security_protocol
        if self.uses_sasl:
            config.update(
                {
                    "sasl.mechanisms": self.sasl_mechanism,
                    "sasl.username": self.sasl_username,
                    "sasl.password": self.password(),
                }
            )
        if self.ssl_ca_file is not None:
            config["ssl.ca.location"] = str(self.ssl_ca_file)
        config.update(extra or {})
        return config

    def java_properties(self) -> dict[str, str]:
        """The same settings for a Java Kafka client (``Properties`` keys)."""
        props = {"bootstrap.servers": self.bootstrap_servers}
        if self.security_protocol != "PLAINTEXT":
            props["security.protocol"] = self.security_protocol
        if self.uses_sasl:
            user, secret = jaas_quote(self.sasl_username or ""), jaas_quote(self.password())
            props["sasl.mechanism"] = self.sasl_mechanism or ""
            props["sasl.jaas.config"] = (
                f'{_LOGIN_MODULES[self.sasl_mechanism or ""]} required username="{user}" password="{secret}";'
            )
        if self.ssl_ca_file is not None:
            props.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ssl_ca_file)})
        return props

    def spark_options(self) -> dict[str, str]:
        """Options for Spark's Kafka source and sink (``kafka.``-prefixed Java client properties).

        Set them with ``.options(**...)`` on the reader/writer in the driver, never as ``--conf``: the
        JAAS line holds the password, and Spark's plan output redacts it (``spark_conf`` sets
        ``spark.sql.redaction.options.regex`` to cover it).
        """
        return {f"kafka.{k}": v for k, v in self.java_properties().items()}

    def describe(self) -> dict[str, object]:
        """What to show people (CLI, status, UI): no secret, only where it comes from."""
        shown: dict[str, object] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.uses_sasl:
            shown.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_username=self.sasl_username,
                sasl_password_file=str(self.sasl_password_file),
            )
        if self.ssl_ca_file is not None:
            shown["ssl_ca_file"] = str(self.ssl_ca_file)
        return shown


#: What a Kafka helper accepts: the platform's connection, or a bare ``host:port`` list (PLAINTEXT) —
#: the latter only for tests and benchmarks against the embedded broker.
KafkaTarget = KafkaConnection | str


def as_connection(target: KafkaTarget) -> KafkaConnection:
    return target if isinstance(target, KafkaConnection) else KafkaConnection(target)


def client_config(target: KafkaTarget, extra: Mapping[str, object] | None = None) -> dict[str, object]:
    """librdkafka configuration for ``target`` plus ``extra`` (``group.id``, ``log_level``, …)."""
    return as_connection(target).client_config(extra)


def jaas_quote(value: str) -> str:
    # A JAAS option value is a double-quoted string; a quote or backslash inside must be escaped.
    return value.replace("\\", "\\\\").replace('"', '\\"')
