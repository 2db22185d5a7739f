"""Orders matched with their payments within 10 minutes: a windowed stream-stream join (the seeds' stream-stream
join, 004 §3.6), Kafka Streams' ``orders.outerJoin(payments, joiner,
JoinWindows.ofTimeDifferenceAndGrace(10 min, 1 min))``.

``placed-orders`` and ``payments`` are both keyed by ``order_id`` (a payment's key is the order it pays), with an
``event_time`` each. Every order and payment at most 10 minutes apart is one output row; an order nobody paid
within its window, and a payment for no order in its window, are reported alone once the window (plus a minute
of grace) has closed: the unmatched orders are what someone chases.
Reference: :func:`spark_jobs.reference.generators.payments.expected_join`.
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives import JsonEvents, StreamStreamJoin

ORDER_SCHEMA = T.StructType(
    [
        T.StructField("order_id", T.StringType()),
        T.StructField("customer_id", T.StringType()),
        T.StructField("amount", T.DecimalType(12, 2)),
        T.StructField("event_time", T.TimestampType()),
    ]
)
PAYMENT_SCHEMA = T.StructType(
    [
        T.StructField("payment_id", T.StringType()),
        T.StructField("order_id", T.StringType()),
        T.StructField("paid", T.DecimalType(12, 2)),
        T.StructField("event_time", T.TimestampType()),
    ]
)


def _exact(field: str):
    def rules():
        """An amount ``DECIMAL(12,2)`` holds exactly (never rounded)."""
        return [(dead_letter.inexact_decimal(field, 12, 2), dead_letter.decimal_message(field, 12, 2))]

    return rules


#: The job, declared: every order and payment at most 10 minutes apart, and the ones that found none.
ORDER_PAYMENTS = StreamStreamJoin(
    store="order-payments",
    left=JsonEvents(ORDER_SCHEMA, rules=_exact("amount")),
    right=JsonEvents(PAYMENT_SCHEMA, rules=_exact("paid")),
    left_time="event_time",
    right_time="event_time",
    window_ms=10 * 60_000,
    grace_ms=60_000,
    join="outer",
    fields={
        "customer_id": "left.customer_id",
        "amount": "left.amount",
        "order_time": "left.event_time",
        "payment_id": "right.payment_id",
        "paid": "right.paid",
        "payment_time": "right.event_time",
    },
)
