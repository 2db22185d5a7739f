"""The keyed-aggregate primitive: per key, aggregates over the key's events, deleted on an event that asks
for it, evicted after the store's TTL; its outputs are the store, projected to a Delta table.

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
- the store's ``ttl_ms`` (``StoreSpec``) deletes a key idle that long in processing time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal, get_args

from pyspark.sql import types as T

from spark_jobs import dead_letter
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.registry import JobSpec, JobSpecError
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

AggregateKind = Literal["count", "sum", "min", "max", "latest"]
#: the stored value's last field: processing time of the key's last change (a restored TTL keeps its deadline)
TOUCHED_AT = "touched_at_ms"
#: the Java processor's input columns (``streamstate.primitives.KeyedAggregate``: the two must stay equal)
DELETE_COLUMN, INPUT_PREFIX = "_delete", "_in_"
_JAVA_CLASS = "streamstate.primitives.KeyedAggregate"
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

        if self.kind == "count":
            return F.lit(True) if self.input is None else F.expr(self.input).isNotNull()
        return F.expr(self.input).try_cast(stored_type)


@dataclasses.dataclass(frozen=True)
class KeyedAggregate:
    """A job whose store keeps, per key, the aggregates ``values`` over the key's events (see the module
    docstring for the semantics). Callable: it is the job's ``build(ctx)``, so a ``JobSpec`` names it as
    its entrypoint (``"my_jobs.counts:COUNTS"``).

    Attributes:
        store: the ``StoreSpec`` it keeps (its ``ttl_ms`` evicts idle keys).
        events: the job's input.
        values: the stored value's fields, in order: name -> :class:`Aggregate`. The outputs (the store,
            projected) are the job's ``key_field`` and these fields.
        where: a Spark SQL condition over the event's fields: the events aggregated (default: all).
        delete_when: a Spark SQL condition over the event's fields: the events that delete their key.

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

    @property
    def state_ddl(self) -> str:
        """The stored value's schema (DDL): the aggregates, then ``touched_at_ms``."""
        fields = [f"{name} {agg.stored_type(self.events.schema, name)}" for name, agg in self.values.items()]
        return ", ".join([*fields, f"{TOUCHED_AT} BIGINT"])

    @property
    def store_changes(self) -> StoreChanges:
        return StoreChanges(self.store, self.state_ddl)

    @property
    def change_ddl(self) -> str:
        """The processor's output rows: ``key``, ``tombstone`` and the stored value."""
        return f"key STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl}"

    def output_columns(self, key_field: str) -> tuple[str, ...]:
        return (key_field, *self.values)

    def check(self, spec: JobSpec) -> None:
        """Refuse a declaration that does not fit ``spec`` or cannot run, naming the job and the field."""
        try:
            self.events.check(spec.name, spec.key_field)
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
            if store.kind != "key_value":
                raise JobSpecError(f"store {self.store!r}: a keyed aggregate keeps a key_value store, not {store.kind}")
            if spec.output_key and tuple(spec.output_key) != (spec.key_field,):
                raise JobSpecError(f"output_key: the outputs are keyed by {spec.key_field!r} alone")
        except JobSpecError as err:
            message = str(err)
            raise JobSpecError(
                message if message.startswith(f"job {spec.name}") else f"job {spec.name}: {message}"
            ) from None

    def __call__(self, ctx):
        return self.build(ctx)

    def build(self, ctx, processor=None):
        """The job's query (the platform's whole pipeline, see :mod:`spark_jobs.primitives`).

        ``processor``: a Python ``StatefulProcessor`` class instead of the Java primitive, constructed with
        the store's ``ttl_ms``; its ``changes`` attribute (:class:`StoreChanges`) is the value it stores,
        and it emits ``key``, ``tombstone`` and that value per changed key. The outputs stay ``values``."""
        spec = ctx.spec
        self.check(spec)
        ttl_ms = store_spec(spec, self.store).ttl_ms
        if ttl_ms:
            # With processing-time timers pending, Spark would run empty micro-batches back to back
            # (and an available-now run would never end); expired keys are evicted by the next batch
            # that has input instead.
            ctx.query_conf["spark.sql.streaming.noDataMicroBatches.enabled"] = "false"
        ctx.ensure_output_table(self.output_schema(spec.key_field))
        classified = self.events.classify(ctx.kafka_source(), spec.key_field)
        events = ctx.with_dead_letters(classified, "offset", key=spec.key_field)
        changes = processor.changes if processor is not None else self.store_changes
        initial = ctx.initial_state(changes)
        if processor is None:
            rows = self.changes(events, spec.key_field, initial, ttl_ms, job=spec.name)
        else:
            rows = processor_changes(events, spec.key_field, initial, processor(ttl_ms), changes, timed=bool(ttl_ms))
        write_outputs, reconcile_outputs = self._output_writers(ctx.output_path, spec.key_field)
        sink = ctx.state_change_sink(changes, write_outputs, reconcile_outputs)
        return rows.writeStream.outputMode("update").foreachBatch(sink)

    def output_schema(self, key_field: str) -> T.StructType:
        from pyspark.sql.types import _parse_datatype_string

        values = [f for f in _parse_datatype_string(self.state_ddl).fields if f.name != TOUCHED_AT]
        return T.StructType([T.StructField(key_field, T.StringType(), nullable=False), *values])

    def changes(self, events, key_field: str, initial, ttl_ms: int | None, job: str = "?"):
        """The store's change rows for ``events`` (a job's processor input, see
        :meth:`JobContext.with_dead_letters`), seeded with ``initial`` after a restore."""
        from pyspark.errors import AnalysisException
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        def resolved(field: str, column):
            try:
                events.select(column)
            except AnalysisException as err:
                reason = str(err).strip().splitlines()[0]
                raise JobSpecError(f"job {job}: {field} does not apply to the event's fields: {reason}") from None
            return column

        delete = F.lit(False)
        if self.delete_when:
            delete = F.coalesce(resolved("delete_when", F.expr(self.delete_when)), F.lit(False))
        aggregated = F.lit(True) if not self.where else F.coalesce(resolved("where", F.expr(self.where)), F.lit(False))
        types = [agg.stored_type(self.events.schema, name) for name, agg in self.values.items()]
        inputs = [
            resolved(f"values.{name}", agg.input_column(stored)).alias(f"{INPUT_PREFIX}{i}")
            for i, ((name, agg), stored) in enumerate(zip(self.values.items(), types, strict=True))
        ]
        kept, letter = delete | aggregated, []
        if dead_letter.LETTER_COLUMN in events.columns:  # rejected records ride along (see JobContext.with_dead_letters)
            kept, letter = kept | F.col(dead_letter.LETTER_COLUMN).isNotNull(), [dead_letter.LETTER_COLUMN]
        needed = events.where(kept).select(key_field, "offset", delete.alias(DELETE_COLUMN), *inputs, *letter)
        spark = events.sparkSession
        jdf = spark._jvm.streamstate.primitives.KeyedAggregate.changes(
            needed._jdf, key_field, None if initial is None else initial._jdf, self.store, self.state_ddl,
            self.change_ddl, ttl_ms or 0, ",".join(agg.kind for agg in self.values.values()),
        )  # fmt: skip
        return DataFrame(jdf, spark)

    def _output_writers(self, output_path: str, key_field: str):
        """The outputs are the store, projected: a MERGE of each batch's changes, and after a restore one
        that makes them equal to the restored store (see ``JobContext.state_change_sink``)."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        columns, values = self.output_columns(key_field), tuple(self.values)
        on = f"t.`{key_field}` = s.`{key_field}`"
        assign = {f"`{c}`": f"s.`{c}`" for c in values}
        insert = {f"`{c}`": f"s.`{c}`" for c in columns}

        def write_outputs(batch, _batch_id: int) -> None:
            source = batch.select(F.col("key").alias(key_field), TOMBSTONE, *values)
            (
                DeltaTable.forPath(batch.sparkSession, output_path).alias("t")
                .merge(source.alias("s"), on)
                .whenMatchedDelete(condition=f"s.{TOMBSTONE}")
                .whenMatchedUpdate(set=assign)
                .whenNotMatchedInsert(condition=f"NOT s.{TOMBSTONE}", values=insert)
                .execute()
            )  # fmt: skip

        def reconcile_outputs(restored) -> None:
            source = restored.select(F.col("key").alias(key_field), *values)
            (
                DeltaTable.forPath(restored.sparkSession, output_path).alias("t")
                .merge(source.alias("s"), on)
                .whenMatchedUpdate(set=assign)
                .whenNotMatchedInsert(values=insert)
                .whenNotMatchedBySourceDelete()
                .execute()
            )  # fmt: skip

        return write_outputs, reconcile_outputs


def processor_changes(events, key_field: str, initial, logic, changes: StoreChanges, timed: bool):
    """A Python ``StatefulProcessor`` (``logic``) over a job's processor input, with the platform's plumbing:
    rejected records pass it by (:func:`dead_letter.passing_letters`), ``initial`` seeds it after a restore,
    processing-time timers when ``timed``. Its rows: ``key``, ``tombstone`` and ``changes.value_ddl``."""
    logic, output_ddl = dead_letter.passing_letters(
        events, logic, f"key STRING, {TOMBSTONE} BOOLEAN, {changes.value_ddl}"
    )
    seeded = initial.withColumnRenamed("key", key_field).groupBy(key_field) if initial is not None else None
    return events.groupBy(key_field).transformWithState(
        logic, output_ddl, "Update", "ProcessingTime" if timed else "None", initialState=seeded
    )
