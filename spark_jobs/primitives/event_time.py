"""What the event-time aggregates share: per key, aggregates of the events of each of its time spans (a
window, :class:`~spark_jobs.primitives.WindowedAggregate`; a session,
:class:`~spark_jobs.primitives.SessionAggregate`), decided by a Java processor keyed by source partition.

Their declarations are the same (store, events, the event-time field, values, outputs, emit mode, where,
delete_when, summaries); so are their checks, their outputs' schema (the key, the span's start and end,
then the outputs), the classification (a record without a valid event time is a dead letter) and the
processor's input, the call of the processor and the job's query (:meth:`EventTimeAggregate.build`). Each
primitive names its span's columns and its processor, and keeps its own store rows and how a batch's spans
reach the outputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal, get_args

from spark_jobs.io import dead_letter
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.primitives.keyed_aggregate import _NAME, INPUT_PREFIX, Aggregate
from spark_jobs.primitives.pipeline import (
    DELETE_COLUMN,
    StoreDeclaration,
    late_letters,
    processor_input,
    resolved,
    stream_time_key,
)
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import StoreChanges

#: the processor's row kinds: a store change, a late event
CHANGE, LATE = "change", "late"

EmitMode = Literal["close", "update"]


@dataclasses.dataclass(frozen=True)
class EventTimeAggregate(StoreDeclaration):
    """The declaration of an event-time aggregate (attributes as :class:`WindowedAggregate` documents them)."""

    store: str
    events: JsonEvents
    time: str
    values: Mapping[str, Aggregate] = dataclasses.field(default_factory=lambda: {"count": Aggregate.count()})
    outputs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    emit: EmitMode = "close"
    where: str | None = None
    delete_when: str | None = None
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: what one span is called ("window", "session") and its output columns
    span: ClassVar[str] = ""
    span_columns: ClassVar[tuple[str, str]] = ("", "")
    #: columns of the processor's rows and of the outputs that a value or an output may not be named
    taken_columns: ClassVar[tuple[str, ...]] = ()
    #: the Java processor's class in ``streamstate.primitives``
    processor: ClassVar[str] = ""

    # -- what each primitive gives ----------------------------------------------------------------

    def state_ddl_for(self, key_field: str) -> str:
        """A store entry: a span of a key, or a partition's stream time (key and start null)."""
        raise NotImplementedError

    def output_ddl_for(self, key_field: str) -> str:
        """The processor's rows: store changes (kind = change), late events (kind = late) and the primitive's own."""
        raise NotImplementedError

    def processor_args(self, store: StoreSpec) -> tuple:
        """The processor's own parameters, between the aggregates' kinds and the key column."""
        raise NotImplementedError

    def span_aggregates(self) -> list:
        """A key's restored spans as the processor's initial state holds them: aggregate columns over the key's
        stored rows (``<Processor>.initialDdl``)."""
        raise NotImplementedError

    def span_writer(self, outputs, key_field: str, store: StoreSpec, may_repeat):
        """``write(batch, batch_id, commit) -> bool``: what a batch's rows do to the outputs (an
        :class:`spark_jobs.io.output_table.OutputTable`), and whether it wrote. ``may_repeat(batch_id)``: the
        batch may repeat outputs written already (a replay, see ``spark_jobs/state/output_marks.py``)."""
        raise NotImplementedError

    def span_records(self, batch, key_field: str, store: StoreSpec):
        """A batch's changes of the outputs as upsert records for the job's output topic."""
        raise NotImplementedError

    @staticmethod
    def late_message() -> str:
        """Why a late event was refused, for its dead letter (SQL over the processor's late rows)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------------

    @property
    def values_ddl(self) -> str:
        return ", ".join(f"{name} {agg.stored_type(self.events.schema, name)}" for name, agg in self.values.items())

    @property
    def output_expressions(self) -> Mapping[str, str]:
        """Output column -> Spark SQL over the values (the values themselves when ``outputs`` is empty)."""
        return self.outputs or {name: f"`{name}`" for name in self.values}

    def output_schema(self, key_field: str):
        """The outputs: the key, the span's start and end, then :attr:`output_expressions` with the types
        Spark gives them over the values (an active Spark session is needed)."""
        from pyspark.sql import SparkSession
        from pyspark.sql import types as T

        spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        values = spark.createDataFrame([], self.values_ddl)
        computed = values.select(*self._output_columns(values))
        start, end = self.span_columns
        return T.StructType(
            [
                T.StructField(key_field, T.StringType(), nullable=False),
                T.StructField(start, T.TimestampType(), nullable=False),
                T.StructField(end, T.TimestampType()),
                *computed.schema.fields,
            ]
        )

    def _output_columns(self, values, job: str = "?"):
        from pyspark.sql import functions as F

        return [
            resolved(values, job, f"outputs.{name}", F.expr(expression)).alias(name)
            for name, expression in self.output_expressions.items()
        ]

    def _output_sql(self) -> list[str]:
        """:attr:`output_expressions` as SQL select items, for a frame built every micro-batch (one call into the
        JVM; :meth:`output_schema` checked them against the values when the job was built)."""
        return [f"{expression} AS `{name}`" for name, expression in self.output_expressions.items()]

    def output_key(self, key_field: str) -> tuple[str, ...]:
        return (key_field, self.span_columns[0])

    def check_primitive(self, spec: JobSpec) -> None:
        if self.time not in self.events.schema.fieldNames():
            raise JobSpecError(f"time: {self.time!r} is not a field of the event schema")
        if self.events.schema[self.time].dataType.simpleString() != "timestamp":
            raise JobSpecError(f"time: {self.time!r} must be a TIMESTAMP field")
        if not self.values:
            raise JobSpecError("values: declare at least one aggregate")
        for role, names in (("values", self.values), ("outputs", self.output_expressions)):
            for name in names:
                if not _NAME.match(name) or name in (*self.taken_columns, spec.key_field):
                    raise JobSpecError(
                        f"{role}.{name}: use lower-case letters, digits and _, and not the key "
                        f"or a {self.span} column ({', '.join(self.taken_columns)})"
                    )
        self.values_ddl  # noqa: B018 - raises on an aggregate that cannot be stored
        if self.emit not in get_args(EmitMode):
            raise JobSpecError(f"emit: {self.emit!r} is not one of {get_args(EmitMode)}")

    def classify(self, source, key_field: str):
        rules = [(dead_letter.bad_event_time(self.time), f"{self.time} is not a time between 1970 and 2200")]
        return self.events.classify(source, key_field, extra_rules=rules)

    def store_changes_for(self, key_field: str) -> StoreChanges:
        """The changelog: a span's entry keyed ``<key>@<span start ms>``, a partition's stream time
        ``~stream-time@<partition>``."""
        start_ms = f"{self.span_columns[0]}_ms"
        span_key = f"concat_ws('@', `{key_field}`, CAST(`{start_ms}` AS STRING))"
        changelog_key = f"CASE WHEN `{key_field}` IS NULL THEN {stream_time_key()} ELSE {span_key} END"
        return StoreChanges(self.store, self.state_ddl_for(key_field), key=changelog_key, rows=f"kind = '{CHANGE}'")

    def processed(self, ctx, processor=None):
        """The first steps of the job's query (:class:`StoreDeclaration`'s pipeline): the checks, the output
        table, the input classified with its dead letters riding along, the processor's rows seeded with
        the restored store. Returns (the store's spec, its changes, the processor's rows)."""
        if processor is not None:
            raise JobSpecError(f"job {ctx.spec.name}: {self.span}s run their Java processor only")
        spec = ctx.spec
        self.check(spec)
        key_field, store = spec.key_field, store_spec(spec, self.store)
        ctx.outputs.ensure_table(self.output_schema(key_field))
        events = ctx.sources.with_dead_letters(
            self.classify(ctx.sources.stream(), key_field), "partition", "offset", "timestamp", "value", key=key_field
        )
        changes = self.store_changes_for(key_field)
        return store, changes, self.changes(events, key_field, ctx.stores.initial_state(changes), store, job=spec.name)

    def changes(self, events, key_field: str, initial, store: StoreSpec, job: str = "?", offset_ordered: bool = False):
        """The processor's rows (:meth:`output_ddl_for`) for ``events`` (the processor's input, with the
        source's ``partition``, ``offset``, ``timestamp`` and ``value``), seeded with ``initial`` (restored
        ``key`` + state rows) after a restore."""
        from pyspark.sql import DataFrame

        needed = self.processor_events(events, key_field, job)
        spark = events.sparkSession
        seeded = None if initial is None else self.initial_rows(initial, key_field)._jdf
        jdf = getattr(spark._jvm.streamstate.primitives, self.processor).changes(
            needed._jdf,
            "partition",
            seeded,
            self.store,
            self.output_ddl_for(key_field),
            self.values_ddl,
            ",".join(agg.kind for agg in self.values.values()),
            *self.processor_args(store),
            key_field,
            self.time,
        )
        return DataFrame(jdf, spark)

    def initial_rows(self, restored, key_field: str):
        """The restored store (``key`` + state rows) in the processor's initial-state shape: one row per key (its
        spans, :meth:`span_aggregates`) and one per partition's stream time (key null)."""
        from pyspark.sql import functions as F

        spans = (
            restored.where(F.col(key_field).isNotNull())
            .groupBy("source_partition", F.col(key_field).alias("key"))
            .agg(*self.span_aggregates())
        )
        times = restored.where(F.col(key_field).isNull()).select(
            "source_partition", F.lit(None).cast("string").alias("key"), "stream_time_ms"
        )
        return spans.unionByName(times, allowMissingColumns=True)

    def build(self, ctx, processor=None):
        """The job's query: :class:`StoreDeclaration`'s pipeline with the spans' sink (:meth:`span_writer`, then
        the summaries; late events to dead letters); no Python processor."""
        store, changes, rows = self.processed(ctx, processor)
        key_field = ctx.spec.key_field
        outputs = ctx.outputs.table(self.output_key(key_field))
        write_spans = self.span_writer(outputs, key_field, store, ctx.outputs_may_repeat)
        write_summaries = self.summary_writer(str(ctx.layout.output_table), self.summary_paths(ctx))
        source_topic = ctx.sources.input_topic

        def write_outputs(batch, batch_id: int, commit) -> None:
            if write_spans(batch, batch_id, commit):
                write_summaries(batch.sparkSession)

        def refused_letters(batch):
            return late_letters(batch.where(f"kind = '{LATE}'"), source_topic, self.late_message(), key=key_field)

        output_records = None
        if ctx.outputs.ensure_topic():

            def output_records(batch):
                return self.span_records(batch, key_field, store)

        sink = ctx.state_change_sink(
            changes, write_outputs, output_records=output_records, refused_letters=refused_letters
        )
        return rows.writeStream.outputMode("append").foreachBatch(sink)

    def processor_events(self, events, key_field: str, job: str):
        """The processor's input: the events it reads (``where`` or ``delete_when``), with their key, event
        time, whether they delete, their source coordinates and raw value, and each aggregate's input."""
        delete, kept, letter = processor_input(events, job, self.where, self.delete_when)
        inputs = [
            resolved(events, job, f"values.{name}", agg.input_column(agg.stored_type(self.events.schema, name))).alias(
                f"{INPUT_PREFIX}{i}"
            )
            for i, (name, agg) in enumerate(self.values.items())
        ]
        return events.where(kept).select(
            key_field,
            self.time,
            delete.alias(DELETE_COLUMN),
            "partition",
            "offset",
            "timestamp",
            "value",
            *inputs,
            *letter,
        )
