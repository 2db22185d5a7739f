"""Orders enriched with their customer and their customer's credit line, each as it was when they ordered: one
stream joined with two tables keyed as it is (Kafka Streams' ``orders.leftJoin(customers).leftJoin(credit)``,
each table versioned, in one task).

``orders`` is keyed by ``customer_id``; ``customer-profiles`` and ``credit-lines`` are two change streams keyed by
the same id (co-partitioned with the orders), each record a row as JSON or a tombstone whose Kafka timestamp is
the time the row changed. Each order joins both rows **valid at the order's event time**, at once (no grace: a
grace period is for a join of one table); an order of a customer without a row (or a line) keeps that table's
fields null (a left join). Reference: :func:`spark_jobs.reference.generators.credit.expected_credit_enrichment`.
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.primitives import JoinedTable, JsonEvents, StreamTableJoin, UpsertTable
from spark_jobs.reference.jobs.order_enrichment import CUSTOMER_SCHEMA, ORDER_SCHEMA, _rules

CREDIT_LINE_SCHEMA = T.StructType(
    [
        T.StructField("customer_id", T.StringType()),
        T.StructField("credit_limit", T.LongType()),
        T.StructField("standing", T.StringType()),
    ]
)

#: The job, declared: each order with its customer's name and tier and its credit line at the order's time.
ORDER_CREDIT_ENRICHMENT = StreamTableJoin(
    store="customer-credit",
    stream=JsonEvents(ORDER_SCHEMA, rules=_rules),
    table=UpsertTable(CUSTOMER_SCHEMA, key=("customer_id",), key_format="plain"),
    more_tables=(JoinedTable(UpsertTable(CREDIT_LINE_SCHEMA, key=("customer_id",), key_format="plain")),),
    time="event_time",
    join="left",
)
