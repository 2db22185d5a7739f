"""Orders enriched with their customer as the customer was when they ordered: a stream-table join of an
orders topic with a customers change stream (the seeds' stream-table join, 004 §3.4), Kafka Streams'
``orders.leftJoin(customers, joiner, Joined.withGracePeriod(1 min))`` over a versioned table.

``orders`` is keyed by ``customer_id``; ``customer-profiles`` is the customers table's change stream keyed by the
same id (the Kafka key is the id's text, so a customer's orders and rows share a partition number), a row as
JSON or a tombstone, each record's Kafka timestamp the time the row changed. Each order joins the customer's row
**valid at the order's event time**; an order waits up to a minute of stream time for a late change of its
customer; an order of an unknown (or deleted) customer keeps null customer fields (a left join).
Reference: :func:`spark_jobs.reference.generators.orders.expected_enrichment`.
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives import JsonEvents, StreamTableJoin, UpsertTable

ORDER_SCHEMA = T.StructType(
    [
        T.StructField("order_id", T.StringType()),
        T.StructField("customer_id", T.StringType()),
        T.StructField("amount", T.DecimalType(12, 2)),
        T.StructField("event_time", T.TimestampType()),
    ]
)
CUSTOMER_SCHEMA = T.StructType(
    [
        T.StructField("customer_id", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("tier", T.StringType()),
    ]
)


def _rules():
    """An order needs an id and an amount ``DECIMAL(12,2)`` holds exactly (never rounded)."""
    return [
        (dead_letter.event("order_id").isNull(), "an order needs an order_id"),
        (dead_letter.inexact_decimal("amount", 12, 2), dead_letter.decimal_message("amount", 12, 2)),
    ]


#: The job, declared: each order with its customer's name and tier at the order's time.
ORDER_ENRICHMENT = StreamTableJoin(
    store="customer-profiles",
    stream=JsonEvents(ORDER_SCHEMA, rules=_rules),
    table=UpsertTable(CUSTOMER_SCHEMA, key=("customer_id",), key_format="plain"),
    time="event_time",
    join="left",
    grace_ms=60_000,
)
