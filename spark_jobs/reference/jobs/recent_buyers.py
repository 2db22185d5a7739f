"""Recent buyers: purchase counts of the 10,000 most recently active users of each source partition.

The same events as ``purchase_counts`` (keyed by ``user_id``; ``purchase`` counts and adds its amount,
``account_closed`` deletes the user), kept in a store of kind ``lru``: Kafka Streams'
``Stores.lruMap("recent-buyers", 10_000)`` behind a ``groupByKey().aggregate()``. A user's purchase makes
them the partition's most recently used; a new user beyond 10,000 in a partition evicts the least recently
used one, whose row leaves the outputs (a tombstone in the changelog and a delete in the Delta table). So
the table is bounded whatever the number of users, and holds exact counts since each user's (re)entry.

The declaration is :data:`RECENT`; its processor is ``streamstate.primitives.LruAggregate`` (Java, keyed by
source partition). The plain-Python reference is :func:`spark_jobs.reference.generators.recent_buyers.expected`.
"""

from __future__ import annotations

from spark_jobs.primitives import Aggregate, KeyedAggregate
from spark_jobs.reference.jobs.purchase_counts import ACCOUNT_CLOSED, COUNTS, PURCHASE

STORE = "recent-buyers"
#: the users kept per source partition (the store's ``max_entries``, in the registry)
MAX_ENTRIES = 10_000

#: The job, declared: purchase_counts' aggregates in an LRU store.
RECENT = KeyedAggregate(
    store=STORE,
    events=COUNTS.events,  # purchase_counts' input: schema, event types, validation rules
    values={
        "purchases": Aggregate.count(),
        "amount_spent": Aggregate.sum("amount"),
        "last_purchase_at": Aggregate.max("event_time"),
    },
    where=f"type = '{PURCHASE}'",
    delete_when=f"type = '{ACCOUNT_CLOSED}'",
    lru=True,
)
