"""The one Spark session factory: local jars, RocksDB with changelog checkpointing, Delta."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from runtime import jvm
from spark_jobs.driver.session import ROCKSDB_PROVIDER, spark_conf

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


def test_state_reads_do_not_resolve_the_avro_schema_per_record(spark, settings):
    """Spark's Avro state encoder makes a ``GenericDatumReader`` per decoded value; Avro's fast reader would resolve
    the whole schema for each (18% of a stream-stream join's task time): every Spark JVM runs with it off, the
    driver (here also the executor) and a cluster's executors."""
    avro = spark.sparkContext._jvm.org.apache.avro.generic.GenericData.get()
    assert not avro.isFastReaderEnabled()
    assert "-Dorg.apache.avro.fastread=false" in spark_conf(settings)["spark.executor.extraJavaOptions"].split()


def test_delta_round_trip_and_time_travel(spark, settings, unique):
    path = str(settings.lake / f"roundtrip_{unique}")
    spark.range(5).write.format("delta").save(path)
    spark.range(5, 8).write.format("delta").mode("append").save(path)
    assert spark.read.format("delta").load(path).count() == 8
    assert spark.read.format("delta").option("versionAsOf", 0).load(path).count() == 5


def test_kafka_source_reads_the_local_broker(spark, kafka_broker, settings, unique):
    from confluent_kafka import Producer

    from spark_jobs.io.kafka_topics import ensure_topic

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


def _child_cpu_ticks(pid: int) -> int:
    """CPU time (clock ticks) of the processes ``pid`` started and reaped: /proc/<pid>/stat's cutime + cstime."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[13]) + int(fields[14])


def test_local_files_are_written_without_a_process_per_call(spark, tmp_path):
    """Checkpoint files, state store files and Delta's log on a local disk: created with Hadoop's default
    permissions, renamed atomically without overwriting, and not one
    ``chmod`` or ``readlink`` forked for it (Hadoop's own local file system forks three per create-and-rename
    without its native library: 100 of them cost its JVM's children ~2 s of CPU)."""
    jvm = spark.sparkContext._jvm
    hadoop = jvm.org.apache.hadoop
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = hadoop.fs.Path("file:///").getFileSystem(conf)
    fc = hadoop.fs.FileContext.getFileContext(hadoop.fs.Path("file:///").toUri(), conf)
    assert fs.getClass().getName() == "streamstate.hadoop.LocalFileSystem"
    assert fc.getDefaultFileSystem().getClass().getName() == "streamstate.hadoop.LocalFs"
    no_overwrite = spark.sparkContext._gateway.new_array(hadoop.fs.Options.Rename, 0)

    pid = jvm.java.lang.ProcessHandle.current().pid()
    before = _child_cpu_ticks(pid)
    for i in range(50):
        temporary, final = hadoop.fs.Path(f"file://{tmp_path}/.{i}.tmp"), hadoop.fs.Path(f"file://{tmp_path}/{i}")
        out = fs.create(temporary, False)
        out.write(b"offsets")
        out.close()
        fc.rename(temporary, final, no_overwrite)
    assert _child_cpu_ticks(pid) - before < 20  # the fork-per-call file system: ~110

    assert (tmp_path / "7").read_bytes() == b"offsets"
    assert stat.S_IMODE((tmp_path / "7").stat().st_mode) == 0o644  # Hadoop's file default under umask 022
    assert fs.getFileStatus(hadoop.fs.Path(f"file://{tmp_path}/7")).getPermission().toString() == "rw-r--r--"
    assert fs.mkdirs(hadoop.fs.Path(f"file://{tmp_path}/private"), hadoop.fs.permission.FsPermission(0o700))
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o700
    existing = hadoop.fs.Path(f"file://{tmp_path}/8")
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        fc.rename(hadoop.fs.Path(f"file://{tmp_path}/9"), existing, no_overwrite)
    with pytest.raises(Exception, match="FileNotFoundException"):
        fs.setPermission(hadoop.fs.Path(f"file://{tmp_path}/absent"), hadoop.fs.permission.FsPermission(0o644))
