"""A local S3-API server: S3Proxy (``org.gaul:s3proxy``, from Maven Central) over a local directory.

The test suite and the benchmarks run the platform against object storage with it, the way they run
it against the embedded Kafka broker: a real server process speaking the S3 API (SigV4 signatures,
multipart uploads, ranged reads, conditional ``If-None-Match`` writes that delta-rs commits with), no
cloud account. A bucket is a directory under ``<home>/blobs``. It is not part of ``make run``: the
embedded default keeps tables on the local disk.

Example (what a test does):
    >>> server = LocalS3Server(tmp / "s3", port=free_port())  # doctest: +SKIP
    >>> server.start(); server.create_bucket("lake")  # doctest: +SKIP
    >>> settings = settings.replace(lake_uri="s3a://lake/prod", **server.settings_fields())  # doctest: +SKIP
"""

from __future__ import annotations

import os
import secrets
import urllib.error
import urllib.request
from pathlib import Path

from runtime import jvm
from runtime.object_store import ObjectStoreConnection
from runtime.process import LocalService
from runtime.settings import Settings

S3_SERVER_HEAP = "-Xmx256m"
ACCESS_KEY_ID = "streamstate-local"


def s3proxy_properties(endpoint: str, basedir: Path | str, credential: str) -> dict[str, str]:
    """S3Proxy's configuration for a server at ``endpoint`` keeping its buckets as directories under ``basedir``,
    signed requests only (the identity :data:`ACCESS_KEY_ID`, the secret ``credential``). The local server writes
    them to its properties file; docker-compose.yml passes them as ``-D`` options (S3Proxy reads both)."""
    return {
        "s3proxy.endpoint": endpoint,
        "s3proxy.authorization": "aws-v2-or-v4",
        "s3proxy.identity": ACCESS_KEY_ID,
        "s3proxy.credential": credential,
        "jclouds.provider": "filesystem",
        "jclouds.filesystem.basedir": str(basedir),
    }


class LocalS3Server:
    """Starts, checks and stops one S3Proxy process. Source of truth: its pid file and its directory."""

    def __init__(self, home: Path, port: int, *, settings: Settings | None = None, host: str = "127.0.0.1") -> None:
        self.home, self.port, self.host = Path(home), port, host
        self.settings = settings or Settings()
        self.blobs = self.home / "blobs"
        self.config_file = self.home / "s3proxy.conf"
        self.secret_file = self.home / "secret-access-key"
        self.service = LocalService("s3proxy", self.home, self.home / "s3proxy.log")

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def connection(self) -> ObjectStoreConnection:
        return ObjectStoreConnection(self.endpoint, "us-east-1", ACCESS_KEY_ID, self.secret_file)

    def settings_fields(self) -> dict[str, object]:
        """The ``Settings`` fields that point the platform at this server (``settings.replace(**...)``)."""
        return {
            "s3_endpoint": self.endpoint,
            "s3_access_key_id": ACCESS_KEY_ID,
            "s3_secret_access_key_file": self.secret_file,
        }

    def _write_config(self) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        if not self.secret_file.exists():
            self.secret_file.touch(mode=0o600)
            self.secret_file.write_text(secrets.token_hex(20))
        self.config_file.touch(mode=0o600, exist_ok=True)
        properties = s3proxy_properties(self.endpoint, self.blobs, self.secret_file.read_text().strip())
        self.config_file.write_text(
            "# Written by runtime/s3_server.py; edits are overwritten.\n"
            + "".join(f"{key}={value}\n" for key, value in properties.items())
        )

    def start(self, timeout_s: float = 60.0) -> int:
        if (pid := self.service.pid()) is not None:
            return pid
        self._write_config()
        (server_jar,) = jvm.jars(self.settings, "s3-server")
        java = jvm.java_binary(self.settings)
        cmd = [java, S3_SERVER_HEAP, "-jar", str(server_jar), "--properties", str(self.config_file)]
        return self.service.start(
            cmd,
            env={**os.environ, "LOG_LEVEL": "warn", "JETTY_LOG_LEVEL": "warn"},
            ports={"S3 API": (self.host, self.port)},
            ready=self.is_ready,
            timeout_s=timeout_s,
        )

    def is_ready(self) -> bool:
        """The server answers HTTP (an unsigned request is refused with 403: it is up)."""
        try:
            urllib.request.urlopen(self.endpoint, timeout=2)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def create_bucket(self, name: str) -> None:
        """A bucket is a directory of the filesystem backend."""
        (self.blobs / name).mkdir(parents=True, exist_ok=True)

    def stop(self, timeout_s: float = 30.0) -> bool:
        return self.service.stop(timeout_s)
