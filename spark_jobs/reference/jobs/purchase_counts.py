"""Purchase counts per user: the seeds' first scenario, with delete-on-event and an optional TTL.

Events on the source topic, keyed by ``user_id``: ``purchase`` adds to the user's count and amount;
``account_closed`` deletes the user's state (the seeds' tombstone: the changelog gets ``(user, null)``
and the user's row leaves the output table). A store declared with ``ttl_ms`` also evicts users
idle that long (processing time), with the same tombstones: the seeds' bounded store.

The job is a declaration (:data:`COUNTS`, a :class:`spark_jobs.primitives.KeyedAggregate`): per user a
count, a sum and a max over purchases, deleted on ``account_closed``. The platform builds the query from it
and keeps the store with its generic Java processor (``streamstate.primitives.KeyedAggregate``): each
micro-batch emits one row per changed user, which :meth:`JobContext.state_change_sink` writes to the
changelog and MERGEs into the Delta table; after a restore the rebuilt store seeds the processor.

The same rules exist once more in Python, :class:`PurchaseCounter`: the processor a new version
subclasses when it changes the logic beyond what the primitive declares (the reprocessing tests' versions
do). It pays a round trip to the JVM's state server for every state read and write (0.19 ms per key at
100,000 keys, 8.7x the Java processor; see BENCHMARKS.md). Both write the same change rows, so changelogs,
snapshots and restores do not know which one ran (tests/spark_jobs/test_purchase_counts_parity.py).
"""

from __future__ import annotations

import time
from decimal import Decimal

from pyspark.sql import DataFrame, Row
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from spark_jobs.driver.context import JobContext
from spark_jobs.io import dead_letter
from spark_jobs.primitives import Aggregate, JsonEvents, KeyedAggregate
from spark_jobs.primitives.pipeline import processor_changes
from spark_jobs.registry import StoreSpec

STORE = "counts"
PURCHASE, ACCOUNT_CLOSED = "purchase", "account_closed"
EVENT_TYPES = (PURCHASE, ACCOUNT_CLOSED)

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


def _rules():
    """The validation rules (see :class:`JsonEvents`). An amount that ``DECIMAL(12,2)`` cannot hold exactly
    is refused with a message, never rounded."""
    amount, is_purchase = dead_letter.event("amount"), dead_letter.event("type") == PURCHASE
    precision, scale = EVENT_SCHEMA["amount"].dataType.precision, EVENT_SCHEMA["amount"].dataType.scale
    return [
        # account_closed needs no time, but not a wild one
        (dead_letter.bad_event_time(required=False), "event_time is not a time between 1970 and 2200"),
        (is_purchase & dead_letter.bad_event_time(), "a purchase needs an event_time between 1970 and 2200"),
        (
            is_purchase & dead_letter.inexact_decimal("amount", precision, scale),
            dead_letter.decimal_message("amount", precision, scale),
        ),
        (is_purchase & amount.isNull(), "a purchase needs an amount"),
        (is_purchase & (amount < 0), "amount is negative"),
    ]


#: The job, declared: the platform builds its query and runs the keyed-aggregate primitive in the JVM.
COUNTS = KeyedAggregate(
    store=STORE,
    events=JsonEvents(EVENT_SCHEMA, types=EVENT_TYPES, rules=_rules),
    values={
        "purchases": Aggregate.count(),
        "amount_spent": Aggregate.sum("amount"),
        "last_purchase_at": Aggregate.max("event_time"),
    },
    where=f"type = '{PURCHASE}'",
    delete_when=f"type = '{ACCOUNT_CLOSED}'",
)
#: The store's value. ``touched_at_ms`` (processing time of the last change) lets a restored TTL
#: timer keep its deadline instead of starting over.
STATE_DDL = COUNTS.state_ddl
CHANGES = COUNTS.store_changes
CHANGE_DDL = COUNTS.change_ddl


class PurchaseCounter(StatefulProcessor):
    """Per user: count, amount spent, last purchase time; deleted on ``account_closed`` or TTL.

    A new version whose value gains fields sets ``changes`` and extends :meth:`value`."""

    #: the store and its value's schema
    changes = CHANGES

    def __init__(self, ttl_ms: int | None = None) -> None:
        self.ttl_ms = ttl_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.counts = handle.getValueState(STORE, self.changes.value_ddl)
        # the value's fields, in order (a Python worker has no JVM to parse the DDL with)
        self.fields = list(self.value(0, Decimal("0"), None, 0))

    def value(self, purchases: int, spent: Decimal, last, touched_at_ms: int) -> dict:
        """The stored value after a change: ``changes.value_ddl``'s fields, in its order."""
        return {"purchases": purchases, "amount_spent": spent, "last_purchase_at": last, "touched_at_ms": touched_at_ms}

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - Spark's processor API
        user = key[0]
        current = self.counts.get()
        alive = current is not None
        purchases, spent, last = (current[0], current[1], current[2]) if alive else (0, Decimal("0"), None)
        # One user's events all sit in one source partition: offset order is the order they happened.
        for event in sorted(rows, key=lambda r: r.offset):
            if event.type == ACCOUNT_CLOSED:
                alive, purchases, spent, last = False, 0, Decimal("0"), None
            else:
                alive = True
                purchases += 1
                spent += event.amount
                last = event.event_time if last is None else max(_aware(last), _aware(event.event_time))
        if alive:
            now = _now_ms(timerValues)
            value = self.value(purchases, spent, last, now)
            self.counts.update(tuple(value[f] for f in self.fields))
            self._restart_ttl(now)
            yield Row(key=user, tombstone=False, **value)
        else:
            # A tombstone even for a user created and closed inside this batch (never in the store):
            # the outputs may hold a row the store never recorded, and the delete must reach them.
            yield self._delete(user)

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: N802
        if self.counts.exists():
            yield self._delete(key[0])

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: N802
        row = initialState
        self.counts.update(tuple(row[f] for f in self.fields))
        if self.ttl_ms:
            self.handle.registerTimer(row.touched_at_ms + self.ttl_ms)

    def close(self) -> None:
        pass

    def _restart_ttl(self, now: int) -> None:
        if not self.ttl_ms:
            return
        for deadline in list(self.handle.listTimers()):
            self.handle.deleteTimer(deadline)
        self.handle.registerTimer(now + self.ttl_ms)

    def _delete(self, user: str) -> Row:
        self.counts.clear()
        if self.ttl_ms:
            for deadline in list(self.handle.listTimers()):
                self.handle.deleteTimer(deadline)
        return Row(key=user, tombstone=True, **dict.fromkeys(self.fields))


def _aware(ts):
    """Spark hands input timestamps over as naive local time but state values as aware ones."""
    return ts if ts.tzinfo else ts.astimezone()


def _now_ms(timer_values) -> int:
    now = timer_values.getCurrentProcessingTimeInMs()
    return now if now > 0 else int(time.time() * 1000)


def classify(ctx: JobContext) -> DataFrame:
    """The job's raw Kafka records, decoded and classified by its validation rules."""
    return COUNTS.events.classify(ctx.sources.stream(), "user_id")


def build(ctx: JobContext, processor: type[PurchaseCounter] | None = None):
    """The job's query. ``processor``: a Python state logic (a :class:`PurchaseCounter` subclass changes
    it for a new version, and its ``changes`` the store's value); None runs the declaration's Java primitive."""
    return COUNTS.build(ctx, processor)


def state_changes(
    events: DataFrame, initial: DataFrame | None, ttl_ms: int | None, processor: type[PurchaseCounter] | None = None
) -> DataFrame:
    """The store's change rows (key, tombstone and the value's columns) for ``events`` (the processor's input,
    see ``JobContext.with_dead_letters``), seeded with ``initial`` (key + value rows) after a restore: through
    ``processor`` (Python) or, when None, the Java primitive (``CHANGE_DDL``)."""
    if processor is None:
        return COUNTS.changes(events, "user_id", initial, StoreSpec(STORE, ttl_ms=ttl_ms), job="purchase_counts")
    return processor_changes(events, "user_id", initial, processor(ttl_ms), processor.changes, timed=bool(ttl_ms))
