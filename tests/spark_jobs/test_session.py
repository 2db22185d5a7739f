"""The one Spark session factory: local jars, RocksDB with changelog checkpointing, Delta."""

from __future__ import annotations

import pytest

from runtime import jvm
from spark_jobs.session import ROCKSDB_PROVIDER, spark_conf

pytestmark = pytest.mark.integration


def test_conf_uses_local_jars_and_never_ivy(settings):
    conf = spark_conf(settings)
    jars = conf["spark.jars"].split(",")
    assert jars and all(j.startswith(str(settings.jvm_dir)) for j in jars)
    names = {jvm.artifact_name(j.rsplit("/", 1)[1]) for j in jars}
    assert {"spark-sql-kafka-0-10_2.13", "delta-spark_4.2_2.13", "delta-storage", "kafka-clients"} <= names
    assert not any(k.startswith("spark.jars.packages") or k.startswith("spark.jars.ivy") for k in conf)


def test_no_jar_duplicates_an_artifact_pyspark_ships(settings):
    shipped = {jvm.artifact_name(p.name) for p in jvm.pyspark_jars_dir().glob("*.jar")}
    ours = {jvm.artifact_name(p.name) for p in jvm.spark_jars(settings)}
    assert not ours & shipped


def test_session_runs_rocksdb_with_changelog_checkpointing(spark, settings):
    get = spark.conf.get
    assert get("spark.sql.streaming.stateStore.providerClass") == ROCKSDB_PROVIDER
    assert get("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled") == "true"
    assert spark.sparkContext.master == settings.spark_master


def test_delta_round_trip_and_time_travel(spark, settings, unique):
    path = str(settings.lake / f"roundtrip_{unique}")
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)
    assert spark.read.format("delta").load(path).count() == 8
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).count() == 5


def test_kafka_source_reads_the_local_broker(spark, kafka_broker, settings, unique):
    from confluent_kafka import Producer

    from spark_jobs.kafka_topics import ensure_topic

    topic = f"spark-read-{unique}"
    ensure_topic(settings.kafka_bootstrap_servers, topic, partitions=2)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers})
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    producer.flush(30)
    df = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .option("subscribe", topic)
        .load()
    )
    assert sorted(r.value.decode() for r in df.select("value").collect()) == sorted(f"v{i}" for i in range(10))
