"""Purchase counts per user: the seeds' first scenario, on Spark's built-in (JVM) aggregation.

State: one row per user in the RocksDB state store ``counts`` (count, amount spent, last purchase time).
Each micro-batch, for the users whose state changed (update mode):

1. their full new values go to the changelog ``purchase_counts-v<N>-counts-changelog``, followed by
   the batch marker with the input offsets the batch consumed;
2. the same rows are MERGEd into the Delta output table.

Both steps rewrite full values, so replaying a batch after a crash is idempotent.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from runtime.settings import Settings
from spark_jobs.context import JobContext
from spark_jobs.registry import JobSpec
from spark_jobs.state.checkpoint_offsets import batch_end_offsets

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


STORE = "counts"
STATE_VALUE_COLUMNS = ("purchases", "amount_spent", "last_purchase_at")


def kafka_source(spark: SparkSession, spec: JobSpec, settings: Settings) -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .option("subscribe", spec.source_topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def build(ctx: JobContext):
    from delta.tables import DeltaTable

    path = ctx.output_path
    DeltaTable.createIfNotExists(ctx.spark).location(path).addColumns(OUTPUT_SCHEMA).execute()
    changelog = ctx.changelog_writer(STORE)
    checkpoint = ctx.checkpoint

    events = kafka_source(ctx.spark, ctx.spec, ctx.settings).select(
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

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        # Two writes from one batch: persist so the stateful plan runs once.
        batch.persist()
        try:
            changes = batch.select(
                F.col("user_id").alias("key"), F.to_json(F.struct(*STATE_VALUE_COLUMNS)).alias("value")
            )
            changelog.write_batch(changes, batch_id, batch_end_offsets(checkpoint, batch_id))
            (
                DeltaTable.forPath(batch.sparkSession, path)
                .alias("t")
                .merge(batch.alias("s"), "t.user_id = s.user_id")
                .whenMatchedUpdateAll()
                .whenNotMatchedInsertAll()
                .execute()
            )
        finally:
            batch.unpersist()

    return state.writeStream.outputMode("update").foreachBatch(write_batch)
