"""Purchase counts per user: the seeds' first scenario, on Spark's built-in (JVM) aggregation.

State: one row per user in the RocksDB state store (count, amount spent, last purchase time).
Output: every micro-batch MERGEs the users whose state changed into a Delta table, so replaying a
batch after a crash rewrites the same full values (idempotent).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from runtime.settings import Settings
from spark_jobs.registry import JobSpec

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("item", T.StringType()),
        T.StructField("amount", T.DecimalType(12, 2)),
        T.StructField("event_time", T.TimestampType()),
    ]
)

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("user_id", T.StringType(), nullable=False),
        T.StructField("purchases", T.LongType()),
        T.StructField("amount_spent", T.DecimalType(22, 2)),
        T.StructField("last_purchase_at", T.TimestampType()),
    ]
)


def output_path(spec: JobSpec, settings: Settings) -> str:
    return str(settings.lake_dir / spec.output_table)


def kafka_source(spark: SparkSession, spec: JobSpec, settings: Settings) -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .option("subscribe", spec.source_topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def build(spark: SparkSession, spec: JobSpec, settings: Settings):
    from delta.tables import DeltaTable

    path = output_path(spec, settings)
    DeltaTable.createIfNotExists(spark).location(path).addColumns(OUTPUT_SCHEMA).execute()

    events = kafka_source(spark, spec, settings).select(
        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")
    ).select("e.*")
    # Undecodable and unkeyed records are dropped here for now; the dead-letter topic (issue 3)
    # will take them with their source coordinates instead.
    purchases = events.where((F.col("type") == "purchase") & F.col("user_id").isNotNull())
    state = purchases.groupBy("user_id").agg(
        F.count(F.lit(1)).alias("purchases"),
        F.sum("amount").alias("amount_spent"),
        F.max("event_time").alias("last_purchase_at"),
    )

    def merge_into_delta(batch: DataFrame, batch_id: int) -> None:
        (
            DeltaTable.forPath(batch.sparkSession, path)
            .alias("t")
            .merge(batch.alias("s"), "t.user_id = s.user_id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .execute()
        )

    return state.writeStream.outputMode("update").foreachBatch(merge_into_delta)
