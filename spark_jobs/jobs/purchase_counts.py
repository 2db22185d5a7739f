"""Purchase counts per user: the seeds' first scenario, with delete-on-event and an optional TTL.

Events on the source topic, keyed by ``user_id``: ``purchase`` adds to the user's count and amount;
``account_closed`` deletes the user's state (the seeds' tombstone: the changelog gets ``(user, null)``
and the user's row leaves the output table). A store declared with ``ttl_ms`` also evicts users
idle that long (processing time), with the same tombstones: the seeds' bounded store.

A built-in ``groupBy().agg()`` cannot delete a key, so the state lives in a ``transformWithState``
processor (value state ``counts`` in RocksDB). Each micro-batch it emits one row per changed user,
which :meth:`JobContext.state_change_sink` writes to the changelog and MERGEs into the Delta table.
After a restore the rebuilt store is handed to the processor as ``initialState``.

The processor exists twice, with one set of rules: :class:`PurchaseCounter` here (Python: the one to
subclass when a new version changes the logic) and ``streamstate.jobs.PurchaseCounts`` in
``jvm/state-processors`` (Java), which the job runs by default. A Python processor pays a round trip
to the JVM's state server for every state read and write (0.19 ms per key at 100,000 keys, 8.7x the
Java processor; see BENCHMARKS.md); the Java one reads RocksDB in-process. Both write the same change rows, so
changelogs, snapshots and restores do not know which one ran (tests/spark_jobs/test_purchase_counts_parity.py).
"""

from __future__ import annotations

import time
from decimal import Decimal

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from spark_jobs import dead_letter
from spark_jobs.context import JobContext
from spark_jobs.registry import store as store_spec
from spark_jobs.state.jvm_processor import jvm_changes
from spark_jobs.state.store_changes import StoreChanges

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

#: The store's value. ``touched_at_ms`` (processing time of the last change) lets a restored TTL
#: timer keep its deadline instead of starting over.
STATE_DDL = "purchases BIGINT, amount_spent DECIMAL(22,2), last_purchase_at TIMESTAMP, touched_at_ms BIGINT"
CHANGES = StoreChanges(STORE, STATE_DDL)
CHANGE_DDL = f"key STRING, tombstone BOOLEAN, {STATE_DDL}"
OUTPUT_COLUMNS = ("user_id", "purchases", "amount_spent", "last_purchase_at")

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("user_id", T.StringType(), nullable=False),
        T.StructField("purchases", T.LongType()),
        T.StructField("amount_spent", T.DecimalType(22, 2)),
        T.StructField("last_purchase_at", T.TimestampType()),
    ]
)


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
    """The job's validation rules over its raw Kafka records (see :func:`dead_letter.classify_events`).
    An amount that ``DECIMAL(12,2)`` cannot hold exactly is refused with a message, never rounded."""
    amount, is_purchase = dead_letter.event("amount"), dead_letter.event("type") == PURCHASE
    amount_type = EVENT_SCHEMA["amount"].dataType
    return dead_letter.classify_events(ctx.kafka_source(), EVENT_SCHEMA, "user_id", EVENT_TYPES, invalid=[
        # account_closed needs no time, but not a wild one
        (dead_letter.bad_event_time(required=False), "event_time is not a time between 1970 and 2200"),
        (is_purchase & dead_letter.bad_event_time(), "a purchase needs an event_time between 1970 and 2200"),
        (is_purchase & dead_letter.inexact_decimal("amount", amount_type.precision, amount_type.scale),
         dead_letter.decimal_message("amount", amount_type.precision, amount_type.scale)),
        (is_purchase & amount.isNull(), "a purchase needs an amount"),
        (is_purchase & (amount < 0), "amount is negative"),
    ])  # fmt: skip


def build(ctx: JobContext, processor: type[PurchaseCounter] | None = None):
    """The job's query. ``processor``: a Python state logic (a :class:`PurchaseCounter` subclass changes
    it for a new version, and its ``changes`` the store's value); None runs the Java processor with the
    same rules."""
    from delta.tables import DeltaTable

    ttl_ms = store_spec(ctx.spec, STORE).ttl_ms
    if ttl_ms:
        # With processing-time timers pending, Spark would run empty micro-batches back to back
        # (and an available-now run would never end); expired users are evicted by the next batch
        # that has input instead.
        ctx.query_conf["spark.sql.streaming.noDataMicroBatches.enabled"] = "false"
    ctx.ensure_output_table(OUTPUT_SCHEMA)
    events = ctx.with_dead_letters(classify(ctx), "offset", key="user_id")
    store_changes = processor.changes if processor is not None else CHANGES
    changes = state_changes(events, ctx.initial_state(store_changes), ttl_ms, processor)
    output_path = ctx.output_path

    def write_outputs(batch: DataFrame, _batch_id: int) -> None:
        source = batch.select(F.col("key").alias("user_id"), "tombstone", *OUTPUT_COLUMNS[1:])
        (
            DeltaTable.forPath(batch.sparkSession, output_path).alias("t")
            .merge(source.alias("s"), "t.user_id = s.user_id")
            .whenMatchedDelete(condition="s.tombstone")
            .whenMatchedUpdate(set={c: f"s.{c}" for c in OUTPUT_COLUMNS[1:]})
            .whenNotMatchedInsert(condition="NOT s.tombstone", values={c: f"s.{c}" for c in OUTPUT_COLUMNS})
            .execute()
        )  # fmt: skip

    def reconcile_outputs(restored: DataFrame) -> None:
        # The outputs are the store, projected: after a restore they hold exactly the restored users.
        source = restored.select(F.col("key").alias("user_id"), *OUTPUT_COLUMNS[1:])
        (
            DeltaTable.forPath(restored.sparkSession, output_path).alias("t")
            .merge(source.alias("s"), "t.user_id = s.user_id")
            .whenMatchedUpdate(set={c: f"s.{c}" for c in OUTPUT_COLUMNS[1:]})
            .whenNotMatchedInsert(values={c: f"s.{c}" for c in OUTPUT_COLUMNS})
            .whenNotMatchedBySourceDelete()
            .execute()
        )  # fmt: skip

    sink = ctx.state_change_sink(store_changes, write_outputs, reconcile_outputs)
    return changes.writeStream.outputMode("update").foreachBatch(sink)


def state_changes(
    events: DataFrame, initial: DataFrame | None, ttl_ms: int | None, processor: type[PurchaseCounter] | None = None
) -> DataFrame:
    """The store's change rows (key, tombstone and the value's columns) for valid ``events``, seeded with
    ``initial`` (key + value rows) after a restore: through ``processor`` (Python) or, when None, the Java
    processor (``CHANGE_DDL``). Rejected records among ``events`` pass through (spark_jobs.dead_letter)."""
    if processor is None:
        return jvm_changes("PurchaseCounts", events, "user_id", initial, STORE, STATE_DDL, CHANGE_DDL, ttl_ms or 0)
    logic, output_ddl = dead_letter.passing_letters(
        events, processor(ttl_ms), f"key STRING, tombstone BOOLEAN, {processor.changes.value_ddl}"
    )
    return events.groupBy("user_id").transformWithState(
        logic, output_ddl, "Update", "ProcessingTime" if ttl_ms else "None", initialState=_grouped(initial)
    )


def _grouped(initial: DataFrame | None):
    return initial.withColumnRenamed("key", "user_id").groupBy("user_id") if initial is not None else None
