"""The keyed-aggregate primitive: per key, aggregates over the key's events, deleted on an event that asks
for it, evicted after the store's TTL (processing or event time); its outputs are the store, projected to a
Delta table.

The declaration is pure Python (Airflow imports it; no Spark needed to check it). Its expressions are
Spark SQL over the event's fields, evaluated by Spark before the processor; the processor itself is
``streamstate.primitives.KeyedAggregate`` (Java), so a job's state logic runs at JVM speed without a line
of Java. A job may still bring its own Python ``StatefulProcessor`` with the same plumbing around it
(:meth:`KeyedAggregate.build`'s ``processor``).

Semantics, as a Kafka Streams ``groupByKey().aggregate()`` with a delete:

- a key's events are applied in offset order (one key's events all sit in one source partition);
- an event for which ``delete_when`` holds deletes the key (a tombstone in the changelog and a delete in
  the outputs, even for a key created and deleted in the same micro-batch); a later event starts it afresh;
- an event for which ``where`` holds (default: every valid event that does not delete) updates every
  aggregate; the others are dropped before the shuffle;
- ``count`` counts events (or those whose input is not null), ``sum`` starts at zero, ``min``/``max``/
  ``latest`` start at null; a null input leaves an aggregate as it was;
- the store's ``ttl_ms`` (``StoreSpec``) deletes a key idle that long, counted by ``ttl_clock``:
  ``processing_time`` (default): no change to the key for ``ttl_ms`` of wall-clock time; evicted by the
  next micro-batch that has input (``streamstate.primitives.KeyedAggregate``);
  ``event_time`` (the declaration names the event's ``time``): as a Kafka Streams task with a stream-time
  punctuator would, record by record (``streamstate.primitives.ExpiringAggregate``): **stream time** is
  per source partition, the largest event time read so far from it (of the events the processor reads:
  deleting or ``where`` ones), advanced by each record before it is applied; a key's event time is the
  largest of its aggregated events' since it (re)started; the key expires when stream time reaches its
  event time + ``ttl_ms``. An event for a key the store does not hold that is already that old would
  expire on arrival: it is **late**, a dead letter (reason ``late``), not applied. None of this depends on
  how the input is cut into micro-batches. The changelog then also holds one ``~stream-time@<partition>``
  entry per partition, so a restore continues stream time exactly;
- a store of kind ``lru`` (``StoreSpec(kind="lru", max_entries=N)``; the declaration says ``lru=True``)
  keeps the N most recently used keys **per source partition**, as Kafka Streams' ``Stores.lruMap(name, N)``
  keeps N per task (``streamstate.primitives.LruAggregate``), record by record in offset order: an
  aggregated event makes its key the most recently used; a new key that makes the partition hold more than
  N evicts the least recently used one with a tombstone (in the changelog and in the outputs, which are
  the store; Kafka Streams forwards no eviction downstream, docs/writing-jobs/lru-store.md); a deleting event removes its key and touches no other. The stored
  value carries the key's ``recency`` (a per-partition sequence number) and ``source_partition``, so a
  restore rebuilds the exact order. None of this depends on how the input is cut into micro-batches;
- a store of kind ``in_memory`` keeps the same values by the same rules in Spark's in-memory state store
  (``streamstate.primitives.InMemoryAggregate``, over ``flatMapGroupsWithState``: Spark runs
  ``transformWithState`` on RocksDB only), the query running with that store's provider; no TTL.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import ClassVar, Literal, get_args

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.io.dead_letter import sql_string
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.primitives.pipeline import (
    DELETE_COLUMN,
    StoreDeclaration,
    iso_time,
    late_letters,
    processor_input,
    resolved,
    stream_time_key,
)
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

AggregateKind = Literal["count", "sum", "min", "max", "latest"]
#: the stored value's last field: processing time of the key's last change (a restored TTL keeps its deadline)
TOUCHED_AT = "touched_at_ms"
#: an event-time TTL's stored fields after the aggregates (``streamstate.primitives.ExpiringAggregate``)
EVENT_TIME_FIELDS = "event_time_ms BIGINT, source_partition INT, stream_time_ms BIGINT"
#: an lru store's stored fields after the aggregates (``streamstate.primitives.LruAggregate``)
LRU_FIELDS = "recency BIGINT, source_partition INT"
CHANGE, LATE = "change", "late"
#: the Java processor's input columns (``streamstate.primitives.KeyedAggregate``: the two must stay equal)
INPUT_PREFIX = "_in_"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SUM_TYPE = re.compile(r"^(BIGINT|DOUBLE|DECIMAL\(\s*\d+\s*,\s*\d+\s*\))$", re.IGNORECASE)
_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """One field of the stored value: what it keeps of the key's events.

    ``input`` is an event field or a Spark SQL expression over the event's fields; an expression needs
    ``type``, the stored type (DDL, e.g. ``"DECIMAL(22,2)"``), and a value that does not convert to it
    counts as null. A field's stored type follows Spark's ``sum``: DECIMAL(p,s) -> DECIMAL(p+10,s),
    integers -> BIGINT, floats -> DOUBLE; ``min``/``max``/``latest`` keep the field's type; ``count`` is BIGINT.
    """

    kind: AggregateKind
    input: str | None = None
    type: str | None = None

    @classmethod
    def count(cls, input: str | None = None) -> Aggregate:
        """How many events were aggregated (those whose ``input`` is not null, when given)."""
        return cls("count", input)

    @classmethod
    def sum(cls, input: str, type: str | None = None) -> Aggregate:
        return cls("sum", input, type)

    @classmethod
    def min(cls, input: str, type: str | None = None) -> Aggregate:
        return cls("min", input, type)

    @classmethod
    def max(cls, input: str, type: str | None = None) -> Aggregate:
        return cls("max", input, type)

    @classmethod
    def latest(cls, input: str, type: str | None = None) -> Aggregate:
        """The last non-null value, in the order the key's events happened (offset order)."""
        return cls("latest", input, type)

    def stored_type(self, schema: T.StructType, name: str) -> str:
        """The value field's type (DDL); raises :class:`JobSpecError` naming ``values.<name>``."""
        if self.kind not in get_args(AggregateKind):
            raise JobSpecError(f"values.{name}: unknown aggregate {self.kind!r}; one of {get_args(AggregateKind)}")
        if self.kind == "count":
            return "BIGINT"
        if not self.input:
            raise JobSpecError(f"values.{name}: {self.kind} needs an input (an event field or an expression)")
        if self.type:
            if self.kind == "sum" and not _SUM_TYPE.match(self.type):
                raise JobSpecError(f"values.{name}: a sum is stored as BIGINT, DOUBLE or DECIMAL(p,s), not {self.type}")
            return self.type.upper()
        if self.input not in schema.fieldNames():
            raise JobSpecError(
                f"values.{name}: {self.input!r} is not a field of the event schema; an expression needs type="
            )
        field_type = schema[self.input].dataType
        if self.kind != "sum":
            return field_type.simpleString().upper()
        if isinstance(field_type, T.DecimalType):
            return f"DECIMAL({min(38, field_type.precision + 10)},{field_type.scale})"
        if isinstance(field_type, _INTEGRAL):
            return "BIGINT"
        if isinstance(field_type, (T.FloatType, T.DoubleType)):
            return "DOUBLE"
        raise JobSpecError(f"values.{name}: cannot sum {self.input!r}, a {field_type.simpleString()} field")

    def input_column(self, stored_type: str):
        """The processor's input column for this aggregate (see the Java processor's class comment)."""
        from pyspark.sql import functions as F

        if self.kind == "count":  # how many events it counts: the processor adds them (combined events too)
            counts = F.lit(True) if self.input is None else F.expr(self.input).isNotNull()
            return counts.cast("bigint")
        return F.expr(self.input).try_cast(stored_type)


@dataclasses.dataclass(frozen=True)
class KeyedAggregate(StoreDeclaration):
    """A job whose store keeps, per key, the aggregates ``values`` over the key's events (see the module
    docstring for the semantics). Callable: it is the job's ``build(ctx)``, so a ``JobSpec`` names it as
    its entrypoint (``"my_jobs.counts:COUNTS"``); the pipeline around it is :mod:`spark_jobs.primitives.pipeline`.

    Attributes:
        store: the ``StoreSpec`` it keeps (its ``ttl_ms`` and ``ttl_clock`` evict idle keys).
        events: the job's input.
        time: the event field that is the event's time (a TIMESTAMP; records without one are dead letters):
            needed by, and only by, a store whose TTL counts event time.
        values: the stored value's fields, in order: name -> :class:`Aggregate`. The outputs (the store,
            projected) are the job's ``key_field`` and these fields.
        where: a Spark SQL condition over the event's fields: the events aggregated (default: all).
        delete_when: a Spark SQL condition over the event's fields: the events that delete their key.
        summaries: companion outputs recomputed from the outputs after every batch (see
            :class:`~spark_jobs.primitives.pipeline.StoreDeclaration`).
        lru: the store is of kind ``lru`` (checked against the spec): the stored value also carries each
            key's recency and source partition, which the declaration must know without the spec.

    Example::

        COUNTS = KeyedAggregate(
            store="counts",
            events=JsonEvents(SCHEMA, types=("purchase", "account_closed")),
            values={"purchases": Aggregate.count(), "amount_spent": Aggregate.sum("amount")},
            where="type = 'purchase'",
            delete_when="type = 'account_closed'",
        )
    """

    store: str
    events: JsonEvents
    values: Mapping[str, Aggregate]
    where: str | None = None
    delete_when: str | None = None
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    time: str | None = None
    lru: bool = False
    store_kinds: ClassVar[tuple[str, ...]] = ("key_value", "lru", "in_memory")

    @property
    def values_ddl(self) -> str:
        return ", ".join(f"{name} {agg.stored_type(self.events.schema, name)}" for name, agg in self.values.items())

    @property
    def state_ddl(self) -> str:
        """The stored value's schema (DDL): the aggregates, then ``touched_at_ms``; with an event-time TTL
        (``time``) the key's event time, its source partition and a partition's stream time instead; in an
        lru store (``lru``) the key's recency and source partition instead."""
        if self.lru:
            return f"{self.values_ddl}, {LRU_FIELDS}"
        return f"{self.values_ddl}, {EVENT_TIME_FIELDS}" if self.time else f"{self.values_ddl}, {TOUCHED_AT} BIGINT"

    @property
    def store_changes(self) -> StoreChanges:
        if not self.time:
            return super().store_changes
        changelog_key = f"coalesce(key, {stream_time_key()})"
        return StoreChanges(self.store, self.state_ddl, key=changelog_key, rows=f"kind = '{CHANGE}'")

    @property
    def source_columns(self) -> tuple[str, ...]:
        if self.time:
            return ("partition", "offset", "timestamp", "value")
        return ("partition", "offset") if self.lru else ("offset",)

    def store_rows(self, rows):
        # an event-time TTL's rows also carry partitions' stream times and late events
        return rows.where("stream_time_ms IS NULL") if self.time else rows

    @property
    def output_values(self) -> tuple[str, ...]:
        return tuple(self.values)

    def check_primitive(self, spec: JobSpec) -> None:
        if not self.values:
            raise JobSpecError("values: declare at least one aggregate")
        for name in self.values:
            if not _NAME.match(name) or name in ("key", TOMBSTONE, TOUCHED_AT, spec.key_field):
                raise JobSpecError(
                    f"values.{name}: use lower-case letters, digits and _, and not key, {TOMBSTONE}, "
                    f"{TOUCHED_AT} or the key field"
                )
        self.state_ddl  # noqa: B018 - raises on an aggregate that cannot be stored
        store = store_spec(spec, self.store)
        if store.kind == "lru" and not self.lru:
            raise JobSpecError(f"lru: store {self.store!r} is of kind lru: declare lru=True")
        if self.lru and store.kind != "lru":
            raise JobSpecError(
                f"lru: store {self.store!r} is of kind {store.kind}; lru=True is for a store of kind lru"
            )
        if self.lru and self.time:
            raise JobSpecError("time: an lru store evicts by recency, not by time")
        event_time_ttl = store.ttl_clock == "event_time"
        if event_time_ttl and not self.time:
            raise JobSpecError(f"time: store {self.store!r} counts its TTL in event time: name the event's time field")
        if self.time and not event_time_ttl:
            raise JobSpecError("time: only a store whose TTL counts event time (ttl_clock='event_time') uses it")
        fields = {f.name: f.dataType.simpleString() for f in self.events.schema.fields}
        if self.time and fields.get(self.time) != "timestamp":
            raise JobSpecError(f"time: {self.time!r} must be a TIMESTAMP field of the event schema")

    def classify(self, source, key_field: str):
        if not self.time:
            return super().classify(source, key_field)
        rules = [(dead_letter.bad_event_time(self.time), f"{self.time} is not a time between 1970 and 2200")]
        return self.events.classify(source, key_field, extra_rules=rules)

    def changes(
        self, events, key_field: str, initial, store: StoreSpec | None, job: str = "?", offset_ordered: bool = False
    ):
        """The store's change rows for ``events`` (a job's processor input, see
        :meth:`JobContext.with_dead_letters`; with an event-time TTL also the source's ``partition``,
        ``timestamp`` and ``value``), seeded with ``initial`` (restored ``key`` + :attr:`state_ddl` rows)
        after a restore; ``store``'s ``ttl_ms`` evicts idle keys.

        ``offset_ordered`` (each input partition's events in offset order, as a Kafka source reads them):
        a key's events are combined per input partition before the shuffle, as Spark's partial aggregation
        would, in offset order (``streamstate.primitives.PartialAggregates``); not with an event-time TTL
        nor in an lru store (both decided record by record) nor a DOUBLE sum (the order of additions
        changes its last bits). An lru store's events also carry the source's ``partition``."""
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        delete, kept, letter = processor_input(events, job, self.where, self.delete_when)
        types = [agg.stored_type(self.events.schema, name) for name, agg in self.values.items()]
        inputs = [
            resolved(events, job, f"values.{name}", agg.input_column(stored)).alias(f"{INPUT_PREFIX}{i}")
            for i, ((name, agg), stored) in enumerate(zip(self.values.items(), types, strict=True))
        ]
        kinds = ",".join(agg.kind for agg in self.values.values())
        ttl_ms = (store.ttl_ms if store else None) or 0
        spark = events.sparkSession
        if self.lru:
            if store is None or store.max_entries is None:
                raise JobSpecError(f"job {job}: lru: the store's max_entries is needed")
            needed = events.where(kept).select(
                key_field, "partition", "offset", delete.alias(DELETE_COLUMN), *inputs, *letter
            )
            seeded = (
                None if initial is None else initial.select("source_partition", "key", *self.values, "recency")._jdf
            )
            jdf = spark._jvm.streamstate.primitives.LruAggregate.changes(
                needed._jdf,
                "partition",
                seeded,
                self.store,
                self.change_ddl,
                self.values_ddl,
                kinds,
                store.max_entries,
                key_field,
            )
            return DataFrame(jdf, spark)
        if self.time:
            needed = events.where(kept).select(
                key_field, self.time, delete.alias(DELETE_COLUMN), *self.source_columns, *inputs, *letter
            )
            seeded = None
            if initial is not None:
                # the restored changelog keys: a key, or a partition's stream time (its own row)
                key = F.when(F.col("stream_time_ms").isNull(), F.col("key"))
                seeded = initial.select(
                    "source_partition", key.alias("key"), *self.values, "event_time_ms", "stream_time_ms"
                )._jdf
            jdf = spark._jvm.streamstate.primitives.ExpiringAggregate.changes(
                needed._jdf,
                "partition",
                seeded,
                self.store,
                self.output_ddl,
                self.values_ddl,
                kinds,
                ttl_ms,
                key_field,
                self.time,
            )
            return DataFrame(jdf, spark)
        needed = events.where(kept).select(key_field, "offset", delete.alias(DELETE_COLUMN), *inputs, *letter)
        primitives = spark._jvm.streamstate.primitives
        in_memory = store is not None and store.kind == "in_memory"
        jdf = (primitives.InMemoryAggregate if in_memory else primitives.KeyedAggregate).changes(
            needed._jdf,
            key_field,
            None if initial is None else initial._jdf,
            self.store,
            self.state_ddl,
            self.change_ddl,
            ttl_ms,
            kinds,
            offset_ordered,
        )
        return DataFrame(jdf, spark)

    @property
    def output_ddl(self) -> str:
        """An event-time TTL's processor rows: ``kind`` (change, or late with the late event's source
        coordinates and raw bytes for its dead letter), ``key``, ``tombstone``, the stored value."""
        return (
            f"kind STRING, key STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl}, source_offset BIGINT, "
            "source_timestamp TIMESTAMP, raw BINARY"
        )

    def late_rows(self, batch, key_field: str, source_topic: str):
        """An event-time TTL's late events among a batch's rows, as dead-letter records."""
        if not self.time:
            return None
        parts = [
            sql_string(f"{self.time} "),
            iso_time("event_time_ms"),
            sql_string(" is older than the store's TTL: stream time of partition "),
            "CAST(source_partition AS STRING)",
            "' was '",
            iso_time("stream_time_ms"),
            "' and the key was not in the store'",
        ]
        message = f"concat({', '.join(parts)})"
        return late_letters(batch.where(f"kind = '{LATE}'"), source_topic, message)
