"""A secured local Kafka for the security tests: a throwaway CA and broker certificate, secrets in
0600 files, a SASL_SSL broker with ACLs (runtime.kafka_broker.BrokerSecurity), SCRAM users and ACLs
created with the AdminClient as the broker's admin — what a real company's cluster looks like to
the platform."""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from pathlib import Path

from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from runtime.kafka_broker import BrokerSecurity
from runtime.kafka_connection import KafkaConnection

PLATFORM_USER, OUTSIDER_USER, PLAIN_USER, ADMIN_USER = "streamstate", "outsider", "plainclient", "admin"


def write_secret(path: Path, value: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(value + "\n")
    return path


def new_password() -> str:
    # Distinctive and long, so a search of every output for it cannot match by accident.
    return "pw-" + secrets.token_hex(16)


def make_certificates(directory: Path, host: str) -> tuple[Path, Path]:
    """(ca.pem, broker.pem): a CA and a broker certificate for ``host`` (an IP SAN and localhost)
    signed by it; broker.pem holds the broker's unencrypted PKCS#8 key followed by its certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def cert(subject: str, key, issuer: str, issuer_key, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(host))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_cert = cert("streamstate-test-ca", ca_key, "streamstate-test-ca", ca_key, ca=True)
    broker_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    broker_cert = cert(host, broker_key, "streamstate-test-ca", ca_key, ca=False)
    ca_pem = directory / "ca.pem"
    ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    broker_pem = directory / "broker.pem"
    broker_pem.touch(mode=0o600)
    broker_pem.write_bytes(
        broker_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        + broker_cert.public_bytes(serialization.Encoding.PEM)
        + ca_cert.public_bytes(serialization.Encoding.PEM)
    )
    return ca_pem, broker_pem


class SecuredCluster:
    """Secrets, certificates and the broker's security for one test module (under ``directory``)."""

    def __init__(self, directory: Path, host: str) -> None:
        self.dir = directory
        self.ca_pem, broker_pem = make_certificates(directory / "tls", host)
        self.passwords = {user: new_password() for user in (ADMIN_USER, PLATFORM_USER, OUTSIDER_USER, PLAIN_USER)}
        self.password_files = {
            user: write_secret(directory / "secrets" / user, pw) for user, pw in self.passwords.items()
        }
        self.security = BrokerSecurity(
            broker_pem,
            self.ca_pem,
            ADMIN_USER,
            self.password_files[ADMIN_USER],
            plain_users=((PLAIN_USER, self.password_files[PLAIN_USER]),),
        )

    def connection(
        self, bootstrap: str, user: str, mechanism: str = "SCRAM-SHA-512", password_file: Path | None = None
    ) -> KafkaConnection:
        return KafkaConnection(
            bootstrap, "SASL_SSL", mechanism, user, password_file or self.password_files[user], self.ca_pem
        )

    def provision(self, bootstrap: str) -> None:
        """As the admin: SCRAM credentials for the platform and an outsider; ACLs for the platform (its
        topics and consumer groups, the cluster reads the tuning and audit DAGs make) and for the PLAIN
        client. The outsider gets no ACL at all."""
        admin = AdminClient(self.security.admin_connection(bootstrap).client_config({"log_level": 3}))
        upserts = [
            UserScramCredentialUpsertion(
                user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), self.passwords[user].encode()
            )
            for user in (PLATFORM_USER, OUTSIDER_USER)
        ]
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(timeout=30)
        acls = []
        for user in (PLATFORM_USER, PLAIN_USER):
            principal = f"User:{user}"
            acls += [
                AclBinding(
                    ResourceType.TOPIC,
                    "*",
                    ResourcePatternType.LITERAL,
                    principal,
                    "*",
                    AclOperation.ALL,
                    AclPermissionType.ALLOW,
                ),
                AclBinding(
                    ResourceType.GROUP,
                    "*",
                    ResourcePatternType.LITERAL,
                    principal,
                    "*",
                    AclOperation.ALL,
                    AclPermissionType.ALLOW,
                ),
                # a driver's claim of its job version: a transactional producer (spark_jobs/state/fencing.py)
                AclBinding(
                    ResourceType.TRANSACTIONAL_ID,
                    "*",
                    ResourcePatternType.LITERAL,
                    principal,
                    "*",
                    AclOperation.ALL,
                    AclPermissionType.ALLOW,
                ),
            ]
            acls += [
                AclBinding(
                    ResourceType.BROKER,
                    "kafka-cluster",
                    ResourcePatternType.LITERAL,
                    principal,
                    "*",
                    op,
                    AclPermissionType.ALLOW,
                )
                for op in (AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.IDEMPOTENT_WRITE)
            ]
        for future in admin.create_acls(acls).values():
            future.result(timeout=30)
