"""Purchase counts per user: the seeds' first scenario, on Spark's built-in (JVM) aggregation.

State: one row per user in the RocksDB state store ``counts`` (count, amount spent, last purchase time).
Each micro-batch, for the users whose state changed (update mode):

1. their full new values go to the changelog ``purchase_counts-v<N>-counts-changelog``, followed by
   the batch marker with the input offsets the batch consumed;
2. the same rows are MERGEd into the Delta output table.

Both steps rewrite full values, so replaying a batch after a crash is idempotent.

Restore (the query starts without a checkpoint): Spark's built-in aggregations take no initial state,
so the restored state becomes a Delta *base* table inside the new checkpoint and the new query
aggregates only the input after the restored offsets. Counts, sums and max merge, so each batch writes
``base + delta`` as the full value. The hot path stays in the JVM.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs import dead_letter
from spark_jobs.context import JobContext
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
EVENT_TYPES = ("purchase",)
STATE_VALUE_COLUMNS = ("purchases", "amount_spent", "last_purchase_at")


STATE_VALUE_DDL = "purchases BIGINT, amount_spent DECIMAL(22,2), last_purchase_at TIMESTAMP"


def kafka_source(ctx: JobContext) -> DataFrame:
    return (
        ctx.spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", ctx.settings.kafka_bootstrap_servers)
        .option("subscribe", ctx.spec.source_topic)
        .option("startingOffsets", ctx.starting_offsets)
        .load()
    )


def write_base_table(spark: SparkSession, path: str, state: dict[bytes, bytes]) -> None:
    """Materialise restored state (changelog JSON values) as the base table of a new checkpoint."""
    rows = [(k.decode(), v.decode()) for k, v in state.items()]
    raw = spark.createDataFrame(rows, "user_id STRING, value STRING")
    base = raw.select("user_id", F.from_json("value", STATE_VALUE_DDL).alias("v")).select("user_id", "v.*")
    base.write.format("delta").mode("overwrite").save(path)


def add_base(batch: DataFrame, base: DataFrame) -> DataFrame:
    """Full values = restored base + what this query aggregated since the restore."""
    d, b = batch.alias("d"), base.alias("b")
    return d.join(b, F.col("d.user_id") == F.col("b.user_id"), "left").select(
        F.col("d.user_id").alias("user_id"),
        (F.col("d.purchases") + F.coalesce(F.col("b.purchases"), F.lit(0))).alias("purchases"),
        (F.col("d.amount_spent") + F.coalesce(F.col("b.amount_spent"), F.lit(0))).cast("decimal(22,2)").alias("amount_spent"),
        F.greatest(F.col("d.last_purchase_at"), F.col("b.last_purchase_at")).alias("last_purchase_at"),
    )


def build(ctx: JobContext):
    from delta.tables import DeltaTable

    path = ctx.output_path
    DeltaTable.createIfNotExists(ctx.spark).location(path).addColumns(OUTPUT_SCHEMA).execute()
    changelog = ctx.changelog_writer(STORE)
    checkpoint = ctx.checkpoint
    base_path = ctx.base_table(STORE)
    if STORE in ctx.restored:
        write_base_table(ctx.spark, base_path, ctx.restored[STORE].state)
    has_base = DeltaTable.isDeltaTable(ctx.spark, base_path)

    classified = dead_letter.classify(
        kafka_source(ctx),
        F.from_json(F.col("value").cast("string"), EVENT_SCHEMA),
        rules=[
            (dead_letter.MISSING_KEY, F.coalesce(F.length("_event.user_id") == 0, F.lit(True))),
            (dead_letter.UNKNOWN_TYPE, ~F.coalesce(F.col("_event.type").isin(*EVENT_TYPES), F.lit(False))),
            (dead_letter.INVALID, F.col("_event.amount").isNull() | (F.col("_event.amount") < 0)
             | F.col("_event.event_time").isNull()),
        ],
    )  # fmt: skip
    purchases = ctx.split_dead_letters(classified)
    state = purchases.groupBy("user_id").agg(
        F.count(F.lit(1)).alias("purchases"),
        F.sum("amount").alias("amount_spent"),
        F.max("event_time").alias("last_purchase_at"),
    )

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        if has_base:
            batch = add_base(batch, batch.sparkSession.read.format("delta").load(base_path))
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
        ctx.snapshot_if_due(STORE, changelog.batch_base + batch_id)

    return state.writeStream.outputMode("update").foreachBatch(write_batch)
