"""Customers and their accounts, joined: a table-table join of two change-data-capture topics (the seeds'
table-table join, 004 §3.5), Kafka Streams' ``customers.leftJoin(accounts, joiner)``.

``customers`` and ``accounts`` are upsert topics keyed by ``{"customer_id": ...}`` (a CDC connector's key), a
row as JSON or a tombstone for a deleted row; both have the same partitions. The outputs hold one row per
customer, their account's fields beside theirs (null while the customer has no account), always the
current rows of both tables: an account's change updates its customer's row, a deleted customer's row goes.
Reference: :func:`spark_jobs.reference.generators.customer_accounts.expected_join`.
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.primitives import TableJoin, UpsertTable

CUSTOMER_SCHEMA = T.StructType(
    [
        T.StructField("customer_id", T.StringType()),
        T.StructField("name", T.StringType()),
        T.StructField("tier", T.StringType()),
    ]
)
ACCOUNT_SCHEMA = T.StructType(
    [
        T.StructField("customer_id", T.StringType()),
        T.StructField("account_id", T.StringType()),
        T.StructField("status", T.StringType()),
        T.StructField("balance", T.DecimalType(12, 2)),
    ]
)

#: The job, declared: every customer, with their account's fields when they have one.
CUSTOMER_ACCOUNTS = TableJoin(
    store="customer-accounts",
    left=UpsertTable(CUSTOMER_SCHEMA, key=("customer_id",)),
    right=UpsertTable(ACCOUNT_SCHEMA, key=("customer_id",)),
    join="left",
)
