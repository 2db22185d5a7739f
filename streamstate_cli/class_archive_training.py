"""The class archive's training program (:mod:`runtime.class_archive`): what a Spark driver does in its first
minute, run once by set-up in a JVM that archives the classes it loads. It runs a job's pieces (a session,
a decode, a Delta write and read, a stateful query, a restore-shaped Kafka read), so it lives above
``spark_jobs``; ``runtime.class_archive`` only knows the command that runs it.

    python -m streamstate_cli.class_archive_training <archive path> [--aot-cache]
"""

from __future__ import annotations

import sys
from pathlib import Path

from runtime.class_archive import QUIET_OPTIONS
from runtime.settings import Settings

#: the command set-up runs (``runtime.class_archive.build``), the archive's path appended
COMMAND = (sys.executable, "-m", "streamstate_cli.class_archive_training")


def _record(archive: Path, *, aot_cache: bool = False) -> None:
    """The training program: what a driver does in its first minute, in a JVM that archives its classes
    (``aot_cache``: that writes a JDK 25+ AOT cache instead, classes linked and method profiles; what
    bench/restore_jvms.py compares, not what set-up builds)."""
    import tempfile

    from pyspark.sql import functions as F

    from spark_jobs.driver.session import LOG4J_CONFIG, build_spark_session

    recording = f"-XX:AOTCacheOutput={archive}" if aot_cache else f"-XX:ArchiveClassesAtExit={archive}"
    options = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG} {recording} {' '.join(QUIET_OPTIONS)}"
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
    from spark_jobs.io.kafka_topics import ensure_topic
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
