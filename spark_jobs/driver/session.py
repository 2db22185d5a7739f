"""The one Spark session factory: every job and every test gets its SparkSession here.

What it guarantees, whatever the master:

* the Kafka connector and Delta jars come from the local, set-up-resolved ``spark.jars`` (never
  ``spark.jars.packages``/Ivy at start);
* keyed state lives in the RocksDB state store provider with changelog checkpointing on (needed by
  ``transformWithState`` and by the state data source's change feed); a job with an ``in_memory`` store
  runs its query with :data:`IN_MEMORY_PROVIDER` instead;
* Delta's SQL extension and catalog are installed;
* the master is ``Settings.spark_master`` (``local[*]`` embedded, ``spark://…`` on a cluster).

:func:`spark_conf` returns the same settings as plain ``key=value`` pairs so that ``spark-submit``
(the Airflow path and the standalone-cluster path) configures sessions identically.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

from runtime import class_archive, jvm
from runtime.settings import Settings

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
#: Spark's in-memory state store (a JVM map per partition; ``streamstate.primitives.InMemoryAggregate``):
#: the queries of jobs with an ``in_memory`` store run with it
IN_MEMORY_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
LOG4J_CONFIG = Path(__file__).parent.parent / "conf" / "log4j2.properties"
#: Every Spark JVM's JIT compiles methods of any size. HotSpot leaves a method of more than 8,000 bytecode bytes
#: interpreted, and Spark's generated code for a processor's wide, nested rows exceeds it: the stream-table
#: join's output serializer ran interpreted, 28% of its tasks' time (BENCHMARKS "Stream-table join: the JIT").
JIT_OPTIONS = ("-XX:-DontCompileHugeMethods",)
#: Avro's "fast reader" off in every Spark JVM. Spark's Avro state encoder (``transformWithState``'s stores) makes a
#: new ``GenericDatumReader`` for every value it decodes, and with the fast reader on (Avro 1.12's default) each one
#: resolves the whole schema again before reading one record: 18% of the stream-stream join's task time, most of
#: it in a store scan (BENCHMARKS "Stream-stream join: Avro's schema resolution per state read"). Off, a reader
#: takes its resolving decoder from Avro's per-thread cache, keyed by the schema object the encoder keeps.
AVRO_OPTIONS = ("-Dorg.apache.avro.fastread=false",)
#: The cache of a micro-batch's processor rows (built once for the batch's several writes, dropped after it) is
#: not compressed: choosing and applying a compression per column cost 9% of the stream-table join's task time,
#: for memory held one batch long. Only that cache: a session-wide setting doubled the plain Spark peer's peak
#: memory (its cached profiles table) and would do the same to a user's long-lived caches.
BATCH_CACHE_CONF = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}
#: The ``file:`` scheme (checkpoints, state store files, Delta's log and tables on a local or mounted disk) through
#: ``streamstate.hadoop`` (jvm/local-fs): Hadoop's local file system, which without Hadoop's native library (pyspark
#: ships none) forks ``chmod`` for every file it creates and ``readlink`` twice for every rename: ~40 processes
#: per micro-batch of a small job, a create-and-rename of a checkpoint file 43 ms instead of 4 (BENCHMARKS "A
#: steady micro-batch's cost: no process per file").
LOCAL_FILE_SYSTEM_CONF = {
    "spark.hadoop.fs.file.impl": "streamstate.hadoop.LocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "streamstate.hadoop.LocalFs",
}


def spark_conf(settings: Settings) -> dict[str, str]:
    """The Spark configuration every session of this platform runs with."""
    jars = ",".join(str(p) for p in jvm.spark_jars(settings))
    local_fs = str(jvm.local_fs_jar(settings))  # at the same path on every node, as the repository is
    # the S3A connector's address and credentials, when tables or checkpoints live in an object store
    on_local_disk = settings.lake.is_local and settings.checkpoints.is_local
    object_store = {} if on_local_disk else settings.object_store.spark_conf()
    return {
        **object_store,
        "spark.jars": jars,
        **LOCAL_FILE_SYSTEM_CONF,
        "spark.driver.extraClassPath": local_fs,
        "spark.executor.extraClassPath": local_fs,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        PROVIDER_CONF: ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": str(settings.data_dir / "warehouse"),
        "spark.driver.memory": settings.spark_driver_memory,
        # The repository sits at the same path on every node (compose mounts it), so one file serves all.
        # The driver starts from set-up's class archive when there is one (runtime/class_archive.py).
        "spark.driver.extraJavaOptions": " ".join(
            [
                f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
                *JIT_OPTIONS,
                *AVRO_OPTIONS,
                *class_archive.driver_java_options(settings),
                *shlex.split(settings.spark_driver_java_options or ""),
            ]
        ),
        "spark.executor.extraJavaOptions": " ".join(
            [f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}", *JIT_OPTIONS, *AVRO_OPTIONS]
        ),
        # Bind the driver to the configured host rather than whatever the hostname resolves to.
        "spark.driver.host": settings.host,
        "spark.driver.bindAddress": settings.host,
        # Small local state: keep the UI and the event log quiet but available.
        "spark.ui.showConsoleProgress": "false",
        # a running job's snapshots take their Spark jobs in a pool of their own (SnapshotWorker): their
        # tasks share the cores with the micro-batches' rather than queueing ahead of them
        "spark.scheduler.mode": "FAIR",
        "spark.sql.adaptive.enabled": "false",
        # A secured Kafka source/sink carries the SASL password in its JAAS option
        # (runtime/kafka_connection.py); redact it from plans, the UI and logs like other secrets.
        "spark.redaction.regex": "(?i)secret|password|token|access[.]?key|jaas",
        "spark.sql.redaction.options.regex": "(?i)url|jaas|password",
        "spark.redaction.string.regex": r'(?i)password\s*=\s*"[^"]*"',
        # PySpark records the Python call site of every DataFrame and Column call in the JVM (for error messages'
        # "DataFrame context"): ~6 py4j round trips each, a third of the ~800 a micro-batch's driver makes
        # building its sinks' DataFrames. The platform's errors name the job and field themselves.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # Delta replays its log with 50 tasks by default, each paying codegen for a wide schema;
        # on a few cores that costs seconds per table read. Scale it with the shuffle partitions.
        "spark.databricks.delta.snapshotPartitions": str(max(1, settings.spark_shuffle_partitions)),
        **({"spark.cores.max": str(settings.spark_cores_max)} if settings.spark_cores_max else {}),
    }


def launch_env(settings: Settings) -> dict[str, str]:
    """The environment of whatever starts a Spark JVM: workers run the same interpreter (pandas < 3, pyarrow,
    protobuf) as the driver, and every JVM runs on the platform's JDK (:func:`runtime.jvm.java_home`)."""
    return {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, **jvm.java_env(settings)}


def build_spark_session(settings: Settings, app_name: str, extra_conf: dict[str, str] | None = None):
    """Get or create the SparkSession configured by :func:`spark_conf`.

    Example:
        >>> spark = build_spark_session(Settings.from_env(), "adhoc")  # doctest: +SKIP
        >>> spark.range(3).count()  # doctest: +SKIP
        3
    """
    from pyspark.sql import SparkSession

    # pyspark starts its gateway JVM with this process's environment
    os.environ.update(launch_env(settings))
    builder = SparkSession.builder.appName(app_name).master(settings.spark_master)
    for key, value in {**spark_conf(settings), **(extra_conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextlib.contextmanager
def session_conf(spark, conf: dict[str, str]):
    """Set SQL ``conf`` on ``spark`` for the block, then put back what was there (a streaming query copies
    the session's conf when it starts; a Delta MERGE reads its commit's metadata from it)."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


def release_state_stores(spark) -> None:
    """Close this JVM's state store providers, unless a query of ``spark`` still runs.

    Spark keeps a stopped query's providers loaded until its maintenance thread (every
    ``spark.sql.streaming.stateStore.maintenanceInterval``) finds them inactive, and that last maintenance may
    still upload a RocksDB snapshot into the query's checkpoint. In a session that outlives the query (a test's,
    a spare's rehearsal, a benchmark's) a checkpoint deleted after the run (lost, or a scratch directory) would
    get ``state/`` files back, and the next query over it is refused with
    ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``. ``StateStore.stop`` unloads every provider and waits out a
    maintenance under way; the providers are the JVM's, shared by all its queries, hence only with none active.
    (Executors of a cluster keep theirs until they end with the application.)"""
    if not spark.streams.active:
        spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()


def stop_built_session() -> None:
    """Stop the session :func:`build_spark_session` made in this thread, if any: a driver lets go of its
    application (its executors on a cluster, its UI port, its JVM's memory) before it lets go of its lease, so
    that whoever sees the lease free (a stop request, a supervisor, the spare) sees the driver gone."""
    from pyspark.sql import SparkSession

    if (spark := SparkSession.getActiveSession()) is not None:
        spark.stop()
