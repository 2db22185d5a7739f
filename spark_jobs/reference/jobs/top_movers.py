"""The day's ten largest price moves, streaming: stage 2 of the seeds' two-stage pattern (004, §3.3).

Stage 1, ``stock_price_changes``, sums each symbol's ticks per day in parallel (2 partitions) and writes every
closed day to its upsert topic ``stock-daily-changes-v<version>`` (one partition: the finish happens in one
place); this job reads that topic as a table and keeps, per day, the ten symbols whose change is largest (a tie
to the smaller symbol: ``ties``), as Kafka Streams' ``builder.table(topic).groupBy(day).aggregate(adder, subtractor)``
does. Its outputs, one row per day and rank, equal the batch step ``daily_top_movers`` for every closed day.
Reference: :func:`spark_jobs.reference.generators.ticks.top_movers`.
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.primitives import TopN, UpsertTable

#: stage 1's output row (``stock_price_changes``: the key, the window, its outputs)
DAILY_CHANGE_SCHEMA = T.StructType(
    [
        T.StructField("symbol", T.StringType()),
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("change", T.DoubleType()),
        T.StructField("ticks", T.LongType()),
    ]
)

#: The job, declared: per day, the ten largest changes.
TOP_MOVERS = TopN(
    store="day-members",
    table=UpsertTable(DAILY_CHANGE_SCHEMA, key=("symbol", "window_start")),
    score="change",
    n=10,
    fields=("symbol", "change", "ticks"),
    ties=("symbol",),  # as daily_top_movers' ORDER BY change DESC, symbol
)
