"""The reference for a keyed aggregate in an ``lru`` store (``recent_buyers``), in plain Python, no Spark.

The input is purchases' (:func:`spark_jobs.reference.generators.purchases.generate`: many users, a few heavy buyers,
some closes). The rules, per source partition (Kafka's murmur2 of the key), record by record in offset
order, as Kafka Streams' ``Stores.lruMap(name, max_entries)`` behind ``groupByKey().aggregate()``:

- a purchase makes its user the partition's most recently used, counted from what the store holds (from
  zero for a user it does not hold);
- a new user that makes the partition hold more than ``max_entries`` evicts the least recently used user;
- ``account_closed`` removes the user and touches no other.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from decimal import Decimal

from spark_jobs.reference.generators.producer import kafka_partition
from spark_jobs.reference.generators.purchases import is_valid


@dataclasses.dataclass(frozen=True)
class Outcome:
    """The store after the events.

    Attributes:
        state: user -> (purchases, amount spent).
        order: source partition -> its users, least recently used first.
        evicted: how many evictions happened on the way.
    """

    state: dict[str, tuple[int, Decimal]]
    order: dict[int, list[str]]
    evicted: int


def expected(events: Iterable[dict], max_entries: int, partitions: int, start: Outcome | None = None) -> Outcome:
    """The store an LRU of ``max_entries`` per partition holds after ``events`` (invalid ones are dead
    letters and touch nothing), starting from ``start``'s users in its order (default: empty)."""
    lrus: dict[int, OrderedDict[str, tuple[int, Decimal]]] = defaultdict(OrderedDict)
    for partition, users in (start.order if start else {}).items():
        lrus[partition].update((user, start.state[user]) for user in users)
    evicted = 0
    for event in events:
        if not is_valid(event):
            continue
        user = event["user_id"]
        lru = lrus[kafka_partition(user, partitions)]
        if event["type"] == "account_closed":
            lru.pop(user, None)
            continue
        purchases, spent = lru.pop(user, (0, Decimal("0")))
        lru[user] = (purchases + 1, spent + Decimal(str(event["amount"])))
        if len(lru) > max_entries:
            lru.popitem(last=False)
            evicted += 1
    state = {user: value for lru in lrus.values() for user, value in lru.items()}
    return Outcome(state, {p: list(lru) for p, lru in lrus.items()}, evicted)
