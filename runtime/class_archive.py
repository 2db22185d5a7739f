"""Class-data sharing for Spark drivers: a JVM that starts from an archive of the classes Spark loads
instead of parsing and verifying them again (measured here: a local SparkSession 5.0-5.2 s -> 3.0-3.2 s,
its first query 2.9-3.4 s -> 1.8 s).

Set-up (``python -m runtime setup-jvm``) runs a short Spark program once in a JVM started with
``-XX:ArchiveClassesAtExit`` (a dynamic archive, JDK 13+): a session, a JSON decode, an aggregation, a
Delta write and read, a stateful streaming query on RocksDB and a restore-shaped Kafka batch read (on a
broker of its own), so the classes of a driver's start, of its restore and of its first micro-batch land
in ``<jvm_dir>/class-archive/``. Every driver the platform starts (pyspark
sessions and spark-submit in client mode alike, through ``spark.driver.extraJavaOptions``) then maps that
archive with ``-Xshare:auto``: a JVM whose build, or a driver whose class path, differs from the archive's
quietly loads its classes the usual way, so the archive can make a start faster but never break one.

The file name carries a hash of the Java binary and the pyspark version, so a new JDK or Spark gets a
new archive at the next set-up, and a stale one is never used.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from runtime import jvm
from runtime.settings import Settings

DIRECTORY = "class-archive"
# -Xshare:auto falls back to no sharing on a mismatch; the cds log tags would print that fallback's
# warnings on every start.
_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


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
    return settings.jvm_dir / DIRECTORY / f"spark-driver-{hashlib.sha256(key.encode()).hexdigest()[:12]}.jsa"


def driver_java_options(settings: Settings) -> list[str]:
    """The JVM options that map the archive, or none when set-up has not built one for this Java and Spark."""
    path = archive_path(settings)
    if path is None or not path.is_file():
        return []
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *_QUIET]


def build(settings: Settings, *, force: bool = False, log=print) -> Path | None:
    """Build the archive unless it exists (idempotent). A failure is logged, not raised: drivers then
    start without sharing, as they would without this module."""
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
        [sys.executable, "-m", "runtime.class_archive", str(partial)],
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


def _record(archive: Path, *, aot_cache: bool = False) -> None:
    """The training program: what a driver does in its first minute, in a JVM that archives its classes
    (``aot_cache``: that writes a JDK 25+ AOT cache instead, classes linked and method profiles; what
    bench/restore_jvms.py compares, not what set-up builds)."""
    import tempfile

    from pyspark.sql import functions as F

    from spark_jobs.session import LOG4J_CONFIG, build_spark_session

    recording = f"-XX:AOTCacheOutput={archive}" if aot_cache else f"-XX:ArchiveClassesAtExit={archive}"
    options = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG} {recording} {' '.join(_QUIET)}"
    with tempfile.TemporaryDirectory(prefix="class-archive-") as scratch:
        settings = Settings.from_env().replace(data_dir=Path(scratch), spark_master="local[2]")
        spark = build_spark_session(settings, "class-archive", {"spark.driver.extraJavaOptions": options})
        events = spark.createDataFrame(
            [(f'{{"user": "u{i % 7}", "amount": {i}.5, "at": "2026-01-01T00:00:{i % 60:02d}Z"}}',) for i in range(200)],
            "value STRING",
        ).select(F.from_json("value", "user STRING, amount DOUBLE, at TIMESTAMP").alias("e"))
        table = f"{scratch}/table"
        events.select("e.*").groupBy("user").agg(F.count("*").alias("n"), F.sum("amount").alias("total")).write.format(
            "delta"
        ).save(table)
        spark.read.format("delta").load(table).collect()
        query = (
            spark.readStream.format("delta")
            .load(table)
            .groupBy("user")
            .agg(F.max("n").alias("n"))
            .writeStream.format("memory")
            .queryName("class_archive")
            .outputMode("update")
            .option("checkpointLocation", f"{scratch}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        _restore_shaped_read(spark, settings, table)
        spark.stop()


def _restore_shaped_read(spark, settings: Settings, table: str) -> None:
    """A restore's first job, in miniature: a Kafka batch read with headers (on a broker of its own, stopped
    after), the latest value per key, and a broadcast anti-join against a plain Parquet scan of ``table``'s
    files. Without it a driver's restore loads the Kafka client's and source's classes from their jars. A
    broker that does not start leaves the archive without them (logged, not raised)."""
    from confluent_kafka import Producer
    from pyspark.sql import functions as F

    from runtime.kafka_broker import LocalKafkaBroker
    from runtime.process import free_port
    from spark_jobs.kafka_topics import ensure_topic
    from spark_jobs.state.snapshots import overlay

    ports = sorted({free_port() for _ in range(3)})
    settings = settings.replace(kafka_port=ports[0], kafka_controller_port=ports[1], airflow_port=ports[2])
    broker = LocalKafkaBroker(settings)
    try:
        broker.start()
        ensure_topic(settings.kafka, "class-archive", 2)
        producer = Producer(settings.kafka.client_config())
        for i in range(200):
            producer.produce("class-archive", key=f"u{i % 7}", value=str(i), partition=i % 2, headers={"b": b"1"})
        producer.flush(30)
        records = (
            spark.read.format("kafka")
            .options(**settings.kafka.spark_options())
            .option("subscribe", "class-archive")
            .option("startingOffsets", "earliest")
            .option("includeHeaders", "true")
            .option("kafka.isolation.level", "read_committed")
            .load()
        )
        header = F.filter("headers", lambda h: h["key"] == F.lit("b"))
        latest = (
            records.withColumn("batch", F.try_element_at(header, F.lit(1))["value"].cast("string").cast("bigint"))
            .groupBy(F.col("key").cast("string").alias("key"))
            .agg(F.max(F.struct("partition", "offset", F.col("value").cast("string").alias("value"))).alias("last"))
            .select("key", "last.value")
        )
        files = [str(f) for f in Path(table).glob("*.parquet")]
        base = (
            spark.read.schema("user STRING, n BIGINT")
            .parquet(*files)
            .selectExpr("user AS key", "CAST(n AS STRING) AS value")
        )
        overlay(base, latest, broadcast=True).count()
    except Exception as error:  # noqa: BLE001 - the archive is an optimisation; it is built without this part
        print(f"class archive: the restore-shaped read was left out ({error})")
    finally:
        broker.stop()


if __name__ == "__main__":
    _record(Path(sys.argv[1]), aot_cache="--aot-cache" in sys.argv[2:])
