"""Class-data sharing for Spark drivers: a JVM that starts from an archive of the classes Spark loads
instead of parsing and verifying them again (measured here: a local SparkSession 5.0-5.2 s -> 3.0-3.2 s,
its first query 2.9-3.4 s -> 1.8 s).

Set-up (``python -m streamstate_cli setup-jvm``) runs a short Spark program
(``streamstate_cli/class_archive_training.py``) once in a JVM started with
``-XX:ArchiveClassesAtExit`` (a dynamic archive, JDK 13+): a session, a JSON decode, an aggregation, a
Delta write and read, a stateful streaming query on RocksDB and a restore-shaped Kafka batch read (on a
broker of its own), so the classes of a driver's start, of its restore and of its first micro-batch land
in ``<jvm_dir>/class-archive/``. Every driver the platform starts (pyspark
sessions and spark-submit in client mode alike, through ``spark.driver.extraJavaOptions``) then maps that
archive with ``-Xshare:auto``: a JVM whose build, or a driver whose class path, differs from the archive's
quietly loads its classes the usual way, so the archive can make a start faster but never break one.

The file name carries a hash of the Java binary, the pyspark version and the time stamp of the jar on the
drivers' class path (``runtime.jvm.LOCAL_FS``), so a new JDK, Spark or jar gets a new archive at the next
set-up, and a stale one is never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from runtime import jvm
from runtime.settings import Settings

DIRECTORY = "class-archive"
# -Xshare:auto falls back to no sharing on a mismatch; the cds log tags would print that fallback's
# warnings on every start.
QUIET_OPTIONS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _java_binary(settings: Settings) -> Path | None:
    found = shutil.which(jvm.java_binary(settings))  # the JVM drivers run on (runtime/jvm.py: java_home)
    return Path(found).resolve() if found else None


def archive_path(settings: Settings) -> Path | None:
    """The archive for this Java and this Spark (None without a Java on the path)."""
    import pyspark

    java = _java_binary(settings)
    if java is None:
        return None
    key = f"{java} {java.stat().st_mtime_ns} pyspark {pyspark.__version__}"
    local_fs = settings.jvm_dir / jvm.LOCAL_FS / jvm.BUILT_JARS[jvm.LOCAL_FS]
    if local_fs.is_file():  # on the drivers' class path, which the archive records (a rebuilt jar: a new archive)
        key += f" {local_fs.stat().st_mtime_ns}"
    return settings.jvm_dir / DIRECTORY / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


def driver_java_options(settings: Settings) -> list[str]:
    """The JVM options that map the archive, or none when set-up has not built one for this Java and Spark."""
    path = archive_path(settings)
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *QUIET_OPTIONS]


def build(settings: Settings, training: Sequence[str], *, force: bool = False, log=print) -> Path | None:
    """Build the archive unless it exists (idempotent), running the ``training`` command (the program,
    ``streamstate_cli.class_archive_training``, with the archive's path appended). A failure is logged,
    not raised: drivers then start without sharing, as they would without this module."""
    path = archive_path(settings)
    if path is None or (path.is_file() and not force):
        return path
    log(f"recording the classes a Spark driver loads, for faster driver starts ({path.parent})")
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob("*.jsa*"):  # another Java's or Spark's archive, or a failed attempt
        stale.unlink()
    partial = path.with_suffix(".jsa.partial")
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.run(
        [*training, str(partial)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not partial.is_file():
        log(f"no class archive (drivers start without it): {(proc.stdout + proc.stderr).strip()[-1500:]}")
        partial.unlink(missing_ok=True)
        return None
    partial.replace(path)
    for line in proc.stdout.splitlines():
        if line.startswith("class archive:"):  # a part of the training program that was left out
            log(line)
    return path
