"""Where Delta tables live: a local directory, or a prefix in an S3-API object store (``s3a://``).

Two types, one per concern:

* :class:`ObjectStoreConnection`: an object store's endpoint, region and credentials, built from
  :class:`~runtime.settings.Settings` (``STREAMSTATE_S3_*``). It is the one place that turns them into
  each client's configuration: Hadoop's S3A connector for Spark (:meth:`~ObjectStoreConnection.spark_conf`),
  delta-rs's object store (:meth:`~ObjectStoreConnection.storage_options`) and pyarrow's filesystem for
  everything else this process reads or deletes (:meth:`~ObjectStoreConnection.filesystem`). As with
  Kafka, the secret key is read from a file when a client is built: never in a setting, a repr or a
  status file (Spark redacts it in its UI).
* :class:`Location`: a table's (or a directory's) address, a local path or an ``s3a://bucket/key`` URI,
  with what the platform does to it: join names (``/``), read and write small files, list, measure and
  delete. ``pathlib`` would collapse ``s3a://`` into ``s3a:/``, so every lake path is a Location.

Example:
    >>> lake = Location.of("s3a://lake/prod")
    >>> str(lake / "_state" / "job-v1" / "counts")
    's3a://lake/prod/_state/job-v1/counts'
    >>> (lake / "_state").name, str((lake / "_state").parent)
    ('_state', 's3a://lake/prod')
    >>> Location.of("/data/lake").is_local
    True
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path, PurePosixPath

S3_SCHEMES = ("s3a", "s3")


class ObjectStoreError(ValueError):
    """The object store settings cannot work, or a location needs a store that is not configured."""


@dataclasses.dataclass(frozen=True)
class ObjectStoreConnection:
    """An S3-API object store (AWS S3, or any server speaking its API, e.g. MinIO or S3Proxy)."""

    #: ``http(s)://host:port`` of a server other than AWS; unset = AWS's regional endpoint
    endpoint: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    #: a file holding the secret access key (a mounted secret), read when a client is built
    secret_access_key_file: Path | None = None

    def __post_init__(self) -> None:
        if (self.access_key_id is None) != (self.secret_access_key_file is None):
            raise ObjectStoreError("STREAMSTATE_S3_ACCESS_KEY_ID and STREAMSTATE_S3_SECRET_ACCESS_KEY_FILE go together")
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ObjectStoreError(f"STREAMSTATE_S3_ENDPOINT={self.endpoint!r}: expected http(s)://host:port")

    def __str__(self) -> str:  # messages name the store, never the credentials
        return self.endpoint or f"AWS S3 ({self.region})"

    @property
    def uses_tls(self) -> bool:
        return self.endpoint is None or self.endpoint.startswith("https://")

    def secret_access_key(self) -> str:
        try:
            secret = self.secret_access_key_file.read_text().strip()
        except OSError as err:
            raise ObjectStoreError(
                f"STREAMSTATE_S3_SECRET_ACCESS_KEY_FILE={self.secret_access_key_file}: {err.strerror}"
            ) from None
        if not secret:
            raise ObjectStoreError(f"STREAMSTATE_S3_SECRET_ACCESS_KEY_FILE={self.secret_access_key_file} is empty")
        return secret

    def spark_conf(self) -> dict[str, str]:
        """:meth:`hadoop_conf` as Spark configuration (``spark.hadoop.fs.s3a.*``), for a session's start."""
        return {f"spark.hadoop.{key}": value for key, value in self.hadoop_conf().items()}

    def hadoop_conf(self) -> dict[str, str]:
        """Hadoop's S3A connector settings (``fs.s3a.*``) for every ``s3a://`` path Spark reads or writes.
        Set on a running session's SQL conf they reach the Hadoop configuration of every later read and write."""
        conf = {
            "fs.s3a.endpoint.region": self.region,
            "fs.s3a.connection.ssl.enabled": str(self.uses_tls).lower(),
            # retries fail a job in seconds, not minutes, when the store is down
            "fs.s3a.attempts.maximum": "3",
            "fs.s3a.retry.limit": "3",
        }
        if self.endpoint is not None:
            # a server of its own is addressed by path (bucket in the path, not in the host name)
            conf |= {"fs.s3a.endpoint": self.endpoint, "fs.s3a.path.style.access": "true"}
        if self.access_key_id is not None:
            conf |= {
                "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
                "fs.s3a.access.key": self.access_key_id,
                "fs.s3a.secret.key": self.secret_access_key(),
            }
        return conf

    def storage_options(self) -> dict[str, str]:
        """delta-rs's object store options for ``s3://`` / ``s3a://`` table URIs."""
        options = {"AWS_REGION": self.region}
        if self.endpoint is not None:
            options |= {"AWS_ENDPOINT_URL": self.endpoint, "AWS_FORCE_PATH_STYLE": "true"}
            if not self.uses_tls:
                options["AWS_ALLOW_HTTP"] = "true"
        if self.access_key_id is not None:
            options |= {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key()}
        return options

    def filesystem(self):
        """A pyarrow S3 filesystem (listing, sizes, small files, deletes)."""
        from pyarrow import fs

        options = {"region": self.region, "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=3)}
        if self.endpoint is not None:
            scheme, _, host = self.endpoint.partition("://")
            options |= {"endpoint_override": host, "scheme": scheme, "force_virtual_addressing": False}
        if self.access_key_id is not None:
            options |= {"access_key": self.access_key_id, "secret_key": self.secret_access_key()}
        return fs.S3FileSystem(**options)

    def describe(self) -> dict[str, object]:
        shown: dict[str, object] = {"endpoint": str(self), "region": self.region}
        if self.access_key_id is not None:
            shown |= {"access_key_id": self.access_key_id, "secret_access_key_file": str(self.secret_access_key_file)}
        return shown


@dataclasses.dataclass(frozen=True)
class Location:
    """A directory or a table on the local disk (``uri`` is an absolute path) or in an object store
    (``s3a://bucket/key``, reached through ``store``). Build it with :meth:`of`; join with ``/``."""

    uri: str
    store: ObjectStoreConnection | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, where: str | Path | Location, store: ObjectStoreConnection | None = None) -> Location:
        """A Location from a path or URI (a Location is returned as it is)."""
        if isinstance(where, Location):
            return where
        text = str(where)
        scheme, sep, rest = text.partition("://")
        if not sep:
            return cls(os.path.abspath(os.path.expanduser(text)))
        if scheme not in S3_SCHEMES:
            raise ObjectStoreError(f"{text}: only local paths and s3a:// locations are supported")
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ObjectStoreError(f"{text}: an s3a:// location needs a bucket (s3a://bucket/prefix)")
        # one spelling: Spark's connector is s3a; delta-rs and pyarrow accept the same bucket/key
        return cls(f"s3a://{bucket}/{key.strip('/')}".rstrip("/"), store)

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:  # a local location works where a path does; an object store's refuses
        return str(self.path)

    def __truediv__(self, name: str) -> Location:
        name = str(name).strip("/")
        if not name:
            return self
        return dataclasses.replace(self, uri=f"{self.uri.rstrip('/')}/{name}")

    @property
    def is_local(self) -> bool:
        return "://" not in self.uri

    @property
    def path(self) -> Path:
        """The local path (a local location only)."""
        if not self.is_local:
            raise ObjectStoreError(f"{self.uri} is in an object store, not on the local disk")
        return Path(self.uri)

    @property
    def name(self) -> str:
        return PurePosixPath(self._fs_path).name

    @property
    def parent(self) -> Location:
        if self.is_local:
            return dataclasses.replace(self, uri=str(self.path.parent))
        bucket, _, key = self._fs_path.partition("/")
        return dataclasses.replace(self, uri=f"s3a://{bucket}/{key.rpartition('/')[0]}".rstrip("/"))

    # ----- clients ---------------------------------------------------------------------------------
    @property
    def _fs_path(self) -> str:
        """The path pyarrow's filesystem takes: the local path, or ``bucket/key``."""
        return self.uri if self.is_local else self.uri.partition("://")[2]

    def _object_store(self) -> ObjectStoreConnection:
        if self.store is None:
            raise ObjectStoreError(
                f"{self.uri}: no object store is configured (set STREAMSTATE_S3_ENDPOINT and its credentials)"
            )
        return self.store

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's options for this location (None: the local disk needs none)."""
        return None if self.is_local else self._object_store().storage_options()

    def filesystem(self):
        from pyarrow import fs

        return fs.LocalFileSystem() if self.is_local else self._object_store().filesystem()

    # ----- what the platform does to a location ----------------------------------------------------
    def exists(self) -> bool:
        """Whether a file or a directory (on object storage: any object under the prefix) is here."""
        from pyarrow import fs

        filesystem = self.filesystem()
        if filesystem.get_file_info(self._fs_path).type != fs.FileType.NotFound:
            return True
        return not self.is_local and bool(self._list(recursive=False, limit_one=True))

    def _list(self, *, recursive: bool, limit_one: bool = False) -> list:
        from pyarrow import fs

        selector = fs.FileSelector(self._fs_path, allow_not_found=True, recursive=recursive)
        try:
            found = self.filesystem().get_file_info(selector)
        except (NotADirectoryError, FileNotFoundError):
            return []
        return found[:1] if limit_one else found

    def size_bytes(self) -> int:
        """Bytes of every file at or under this location (0 when there is none)."""
        from pyarrow import fs

        info = self.filesystem().get_file_info(self._fs_path)
        if info.type == fs.FileType.File:
            return info.size
        return sum(f.size for f in self._list(recursive=True) if f.type == fs.FileType.File)

    def children(self) -> list[Location]:
        """What is directly under this location (files and directories; on object storage, prefixes)."""
        return sorted((self / PurePosixPath(f.path).name for f in self._list(recursive=False)), key=str)

    def files(self) -> list[tuple[str, int]]:
        """(path relative to this location, bytes) of every file under it."""
        from pyarrow import fs

        base = self._fs_path.rstrip("/") + "/"
        return [(f.path[len(base) :], f.size) for f in self._list(recursive=True) if f.type == fs.FileType.File]

    def read_text(self) -> str:
        with self.filesystem().open_input_stream(self._fs_path) as stream:
            return stream.read().decode()

    def write_text(self, text: str) -> None:
        """Write a small file whole (on the local disk: parents created, replaced atomically)."""
        if self.is_local:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(self.path)
            return
        with self.filesystem().open_output_stream(self._fs_path) as stream:  # a PUT is atomic
            stream.write(text.encode())

    def move_to(self, target: Location) -> None:
        """Move what is here to ``target`` (same store). On the local disk a rename; in an object store,
        which has no directories to rename, each object is copied and then the originals deleted."""
        if self.is_local:
            target.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.rename(target.path)
            return
        filesystem = self.filesystem()
        for relative, _size in self.files():
            filesystem.copy_file(f"{self._fs_path}/{relative}", f"{target._fs_path}/{relative}")
        self._delete_tree()

    def _delete_tree(self) -> None:
        """Delete every object under this prefix, directory markers included, deepest first. A prefix can
        list "directories" with nothing deletable at their own name (a marker-less prefix, or an S3
        server's empty directory left by earlier deletes), which a single ``delete_dir`` refuses with
        NotFound: each entry is deleted in turn, and one already gone is no error."""
        from pyarrow import fs

        filesystem = self.filesystem()
        entries = sorted(self._list(recursive=True), key=lambda f: f.path.count("/"), reverse=True)
        for entry in [*entries, filesystem.get_file_info(self._fs_path)]:
            try:
                if entry.type == fs.FileType.File:
                    filesystem.delete_file(entry.path)
                elif entry.type == fs.FileType.Directory:
                    filesystem.delete_dir(entry.path)
            except FileNotFoundError:
                pass

    def remove(self) -> bool:
        """Delete what is here (a file, or a directory and everything under it). True if there was something."""
        from pyarrow import fs

        if not self.exists():
            return False
        filesystem = self.filesystem()
        if filesystem.get_file_info(self._fs_path).type == fs.FileType.File:
            filesystem.delete_file(self._fs_path)
        elif self.is_local:
            filesystem.delete_dir(self._fs_path)
        else:
            self._delete_tree()
        return True
