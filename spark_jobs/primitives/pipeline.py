"""The query every declared job runs, whatever its primitive: one place, so no job can skip a step.

source at the restored position -> decode and classify once (:class:`JsonEvents`) -> the processor's input,
rejected records riding along (``JobContext.with_dead_letters``) -> the primitive's processor, seeded with
the restored store -> per micro-batch (``JobContext.state_change_sink``): dead letters, the outputs (the
store projected to a Delta table keyed by the job's key, then its summaries), changelog and markers,
snapshots.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from pyspark.sql import types as T

from spark_jobs.driver.session import IN_MEMORY_PROVIDER, PROVIDER_CONF
from spark_jobs.io import dead_letter
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.registry import InputKind, JobSpec, JobSpecError, OutputTopicKind, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.checkpoint_offsets import STATE_ENCODING_CONF
from spark_jobs.state.store_changes import STORE_COLUMN, TOMBSTONE, StoreChanges, several_stores

#: The primitives' Java processors' input column: true when the event deletes its key (``streamstate.primitives.Rows``)
DELETE_COLUMN = "_delete"
#: The changelog key of a source partition's stream time, for primitives that keep one (windows, an
#: event-time TTL); a key's entries have keys of their own.
STREAM_TIME_KEY_PREFIX = "~stream-time@"
#: The query of a job whose store is ``in_memory``: Spark's in-memory state store, whose operator
#: (``flatMapGroupsWithState``) keeps UnsafeRow state only
IN_MEMORY_QUERY_CONF = {PROVIDER_CONF: IN_MEMORY_PROVIDER, STATE_ENCODING_CONF: "unsaferow"}


class StoreDeclaration:
    """What a primitive's declaration (a frozen dataclass with ``store``, ``events`` and ``summaries``)
    shares: the pipeline, the outputs and the checks. A primitive gives :attr:`state_ddl`,
    :attr:`output_values` (the stored fields the outputs show), :meth:`check_primitive` and
    :meth:`changes`."""

    store: str
    events: JsonEvents
    #: companion output tables recomputed from the outputs after every micro-batch: name (one of the
    #: spec's ``companion_outputs``) -> a Spark SQL query reading the outputs as ``{outputs}``
    summaries: Mapping[str, str]
    #: the store kinds this primitive keeps
    store_kinds: ClassVar[tuple[str, ...]] = ("key_value",)
    #: what the job's output topic holds (``JobOutputs.ensure_topic``)
    output_topic_kind: ClassVar[OutputTopicKind] = "upserts"

    @property
    def source_columns(self) -> tuple[str, ...]:
        """The source's columns (``partition``, ``offset``, ``timestamp``, ``value``) the processor reads."""
        return ("offset",)

    @property
    def input_kinds(self) -> tuple[InputKind, ...]:
        """What each of the spec's ``input_topics`` holds, in their order (``JobSpec.input_kinds``)."""
        return (self.events.input_kind,)

    def store_rows(self, rows):
        """The rows of the processor's output (or of the restored store) that are the store's keys."""
        return rows

    def late_rows(self, batch, key_field: str, source_topic: str):
        """The dead-letter records of the events a batch's processor refused as late (None: it refuses none)."""

    @property
    def state_ddl(self) -> str:
        raise NotImplementedError

    @property
    def output_values(self) -> tuple[str, ...]:
        raise NotImplementedError

    def output_key(self, key_field: str) -> tuple[str, ...]:
        """The columns that identify an output row."""
        return (key_field,)

    def check_primitive(self, spec: JobSpec) -> None:
        """The primitive's own checks (raise :class:`JobSpecError`; the job's name is added)."""

    def classify(self, source, key_field: str):
        """The job's input decoded and classified (a primitive may add rules of its own)."""
        return self.events.classify(source, key_field)

    def input_rows(self, ctx):
        """The processor's input: the job's source decoded and classified (:meth:`classify`), every record with
        its fields and :attr:`source_columns`, a rejected one with its dead letter (``JobContext.with_dead_letters``)."""
        key_field = ctx.spec.key_field
        return ctx.sources.with_dead_letters(
            self.classify(ctx.sources.stream(), key_field), *self.source_columns, key=key_field
        )

    def changes(self, events, key_field: str, initial, store: StoreSpec, job: str = "?", offset_ordered: bool = False):
        """The store's change rows (``key``, ``tombstone``, the stored value) for the processor's input.

        ``offset_ordered``: each input partition holds its events in offset order, as a Kafka source's do
        (the pipeline says so); a primitive may then combine a key's events before the shuffle."""
        raise NotImplementedError

    @property
    def store_changes(self) -> StoreChanges:
        return StoreChanges(self.store, self.state_ddl)

    @property
    def change_ddl(self) -> str:
        """The processor's output rows: ``key``, ``tombstone`` and the stored value."""
        return f"key STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl}"

    def output_schema(self, key_field: str) -> T.StructType:
        """The output table: the key, then :attr:`output_values` with their stored types."""
        from pyspark.sql.types import _parse_datatype_string

        stored = {f.name: f for f in _parse_datatype_string(self.state_ddl).fields}
        return T.StructType(
            [T.StructField(key_field, T.StringType(), nullable=False), *(stored[name] for name in self.output_values)]
        )

    def check(self, spec: JobSpec) -> None:
        """Refuse a declaration that does not fit ``spec`` or cannot run, naming the job and the field."""
        try:
            self.events.check(spec.name, spec.key_field)
            store = store_spec(spec, self.store)
            if store.kind not in self.store_kinds:
                *others, last = self.store_kinds
                kinds = f"{', '.join(others)} or {last}" if others else last
                raise JobSpecError(f"store {self.store!r}: this primitive keeps a {kinds} store, not {store.kind}")
            if spec.output_key and tuple(spec.output_key) != self.output_key(spec.key_field):
                raise JobSpecError(f"output_key: the outputs are keyed by {self.output_key(spec.key_field)}")
            if set(self.summaries) != set(spec.companion_outputs):
                raise JobSpecError(
                    f"summaries: {sorted(self.summaries)} must name the spec's companion_outputs "
                    f"{sorted(spec.companion_outputs)}"
                )
            for name, query in self.summaries.items():
                if "{outputs}" not in query:
                    raise JobSpecError(f"summaries.{name}: the query reads the outputs as {{outputs}}")
            self.check_primitive(spec)
        except JobSpecError as err:
            message = str(err)
            raise JobSpecError(
                message if message.startswith(f"job {spec.name}") else f"job {spec.name}: {message}"
            ) from None

    def __call__(self, ctx):
        return self.build(ctx)

    def build(self, ctx, processor=None):
        """The job's query (see the module docstring).

        ``processor``: a Python ``StatefulProcessor`` class instead of the primitive's Java processor,
        constructed with the store's ``ttl_ms``; its ``changes`` attribute (:class:`StoreChanges`) is the
        value it stores, and it emits ``key``, ``tombstone`` and that value per changed key. The outputs
        stay :attr:`output_values`.

        Such a processor may keep further stores, Kafka Streams' processor with several state stores:
        its ``more_stores`` attribute (a tuple of :class:`StoreChanges`, each a store of the spec), one state
        variable each, keyed by the job's key. Its change rows for one of them carry the store's name in
        ``store`` (:data:`STORE_COLUMN`) and that store's value columns (names of their own); a row without
        a ``store`` is the declaration's. Each store gets its changelog, snapshots and restore; after a
        restore ``handleInitialState`` gets one row per restored store and key, its ``store`` saying which.
        Every store's markers of a batch commit in one transaction, so a restore finds them at one input
        position. A store added to a running version (a new state variable, a new changelog) starts empty
        at the batch it was added in, as in Kafka Streams; the others keep their state."""
        spec = ctx.spec
        self.check(spec)
        store = store_spec(spec, self.store)
        changes = processor.changes if processor is not None else self.store_changes
        stores = self.kept_stores(spec, changes, tuple(getattr(processor, "more_stores", ())))
        if processor is not None and store.ttl_clock == "event_time":
            raise JobSpecError(f"job {spec.name}: an event-time TTL runs the primitive's Java processor only")
        if processor is not None and store.kind == "lru":
            raise JobSpecError(f"job {spec.name}: an lru store runs the primitive's Java processor only")
        if store.kind == "in_memory":
            if processor is not None:
                raise JobSpecError(f"job {spec.name}: an in_memory store runs the primitive's Java processor only")
            # the query's state in Spark's in-memory state store (a new checkpoint records it; an existing
            # one keeps its own), whose operator keeps UnsafeRow state only
            ctx.query_conf.update(IN_MEMORY_QUERY_CONF)
        if store.ttl_ms and store.ttl_clock == "processing_time":
            # With processing-time timers pending, Spark would run empty micro-batches back to back
            # (and an available-now run would never end); expired keys are evicted by the next batch
            # that has input instead.
            ctx.query_conf["spark.sql.streaming.noDataMicroBatches.enabled"] = "false"
        ctx.outputs.ensure_table(self.output_schema(spec.key_field))
        events = self.input_rows(ctx)
        initial = ctx.stores.initial_state(changes) if len(stores) == 1 else ctx.stores.initial_states(stores)
        if processor is None:
            rows = self.changes(events, spec.key_field, initial, store, job=spec.name, offset_ordered=True)
        else:
            logic = processor(store.ttl_ms)
            rows = processor_changes(events, spec.key_field, initial, logic, stores, timed=bool(store.ttl_ms))
        write_store, reconcile_outputs = self._output_writers(ctx, spec.key_field)
        source_topic = ctx.sources.input_topic

        def write_outputs(batch, _batch_id: int, commit) -> None:
            if len(stores) > 1:  # the outputs show the declaration's store; the others are the processor's own
                batch = batch.where(stores[0].rows)
            write_store(batch, commit)

        def refused_letters(batch):
            return self.late_rows(batch, spec.key_field, source_topic)

        output_records = None
        if ctx.outputs.ensure_topic():

            def output_records(batch):
                if len(stores) > 1:
                    batch = batch.where(stores[0].rows)
                return self.output_records(batch, spec.key_field)

        sink = ctx.state_change_sink(stores, write_outputs, reconcile_outputs, output_records, refused_letters)
        return rows.writeStream.outputMode("update").foreachBatch(sink)

    def output_records(self, batch, key_field: str):
        """A batch's changed output rows as upsert records for the job's output topic: key, and the row as
        JSON (the key field and :attr:`output_values`, as the output table holds it), or null for a deleted key."""
        rows = self.store_rows(batch).selectExpr(f"key AS `{key_field}`", TOMBSTONE, *_quoted(self.output_values))
        row = f"to_json(struct({', '.join(_quoted((key_field, *self.output_values)))}))"
        return rows.selectExpr(
            f"CAST(`{key_field}` AS BINARY) AS key",
            f"CAST(CASE WHEN NOT {TOMBSTONE} THEN {row} END AS BINARY) AS value",
        )

    def event_records(self, rows, key_field: str):
        """Output rows that are events (a join's results) as records of an event output topic: keyed by the key
        field's text (as the job's inputs are), the whole row as JSON."""
        return rows.selectExpr(f"CAST(`{key_field}` AS BINARY) AS key", "CAST(to_json(struct(*)) AS BINARY) AS value")

    def kept_stores(self, spec: JobSpec, changes: StoreChanges, more: tuple[StoreChanges, ...]):
        """The stores the job's processor keeps: the declaration's (``changes``), then a Python processor's
        ``more_stores`` (see :meth:`build`); refused unless they are exactly the spec's stores."""
        declared = sorted(s.name for s in spec.stores)
        kept = sorted({changes.store, *(m.store for m in more)})
        if declared != kept:
            raise JobSpecError(f"job {spec.name}: stores: the spec declares {declared}, the processor keeps {kept}")
        if not more:
            return (changes,)
        try:
            return several_stores(changes, more)
        except ValueError as err:
            raise JobSpecError(f"job {spec.name}: more_stores: {err}") from None

    def summary_paths(self, ctx) -> Mapping[str, str]:
        """Each summary's table (the spec's companion outputs, in the job's layout)."""
        spec = ctx.spec
        return dict(zip(spec.companion_outputs, (str(t) for t in ctx.layout.output_tables[1:]), strict=True))

    def summary_writer(self, output_path: str, summary_paths: Mapping[str, str]):
        """``write_summaries(spark)``: every summary recomputed from the outputs (a replayed batch rewrites
        the same summary)."""

        def write_summaries(spark) -> None:
            if not self.summaries:
                return
            outputs = spark.read.format("delta").load(output_path)
            for name, query in self.summaries.items():
                spark.sql(query, outputs=outputs).write.format("delta").mode("overwrite").save(summary_paths[name])

        return write_summaries

    def _output_writers(self, ctx, key_field: str):
        """The outputs are the store, projected: each batch's changes upserted (a tombstone deleting the key's
        row), and after a restore a MERGE that makes them equal to the restored store (see
        ``JobContext.state_change_sink``); then each summary is recomputed from them."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        values = self.output_values
        output_path, outputs = str(ctx.layout.output_table), ctx.outputs.table((key_field,))
        on = f"t.`{key_field}` = s.`{key_field}`"
        assign = {f"`{c}`": f"s.`{c}`" for c in values}
        insert = {f"`{c}`": f"s.`{c}`" for c in (key_field, *values)}
        write_summaries = self.summary_writer(output_path, self.summary_paths(ctx))

        def write_outputs(batch, commit) -> None:
            # SQL text: built every micro-batch, and a Column is a call into the JVM or more
            source = self.store_rows(batch).selectExpr(f"key AS `{key_field}`", TOMBSTONE, *_quoted(values))
            outputs.upsert(source, commit, gone=TOMBSTONE)
            write_summaries(batch.sparkSession)

        def reconcile_outputs(restored) -> None:
            source = self.store_rows(restored).select(F.col("key").alias(key_field), *values)
            (
                DeltaTable.forPath(restored.sparkSession, output_path)
                .alias("t")
                .merge(source.alias("s"), on)
                .whenMatchedUpdate(set=assign)
                .whenNotMatchedInsert(values=insert)
                .whenNotMatchedBySourceDelete()
                .execute()
            )
            write_summaries(restored.sparkSession)

        return write_outputs, reconcile_outputs


def processor_changes(events, key_field: str, initial, logic, changes, timed: bool):
    """A Python ``StatefulProcessor`` (``logic``) over a job's processor input, with the platform's plumbing:
    rejected records pass it by (:func:`dead_letter.passing_letters`), ``initial`` seeds it after a restore,
    processing-time timers when ``timed``. Its rows: ``key``, ``tombstone`` and ``changes.value_ddl``; for
    several stores (``changes`` a tuple, see :func:`several_stores`) also ``store`` and every store's value."""
    stores = changes if isinstance(changes, tuple) else (changes,)
    values = ", ".join(s.value_ddl for s in stores)
    which = f"{STORE_COLUMN} STRING, " if len(stores) > 1 else ""
    logic, output_ddl = dead_letter.passing_letters(events, logic, f"key STRING, {TOMBSTONE} BOOLEAN, {which}{values}")
    seeded = initial.withColumnRenamed("key", key_field).groupBy(key_field) if initial is not None else None
    return events.groupBy(key_field).transformWithState(
        logic, output_ddl, "Update", "ProcessingTime" if timed else "None", initialState=seeded
    )


def resolved(events, job: str, field: str, column):
    """``column`` when it applies to ``events``; else :class:`JobSpecError` naming the job and the field."""
    from pyspark.errors import AnalysisException

    try:
        events.select(column)
    except AnalysisException as err:
        reason = str(err).strip().splitlines()[0]
        raise JobSpecError(f"job {job}: {field} does not apply to the event's fields: {reason}") from None
    return column


def processor_input(events, job: str, where: str | None, delete_when: str | None):
    """What a primitive's processor reads of a job's input: ``(delete, kept, letter)``: the column telling a
    deleting event, the condition keeping the rows the processor needs (deleting or ``where`` events, and
    rejected records riding along, see ``JobContext.with_dead_letters``), and the dead-letter column's
    name when the input has it (else nothing)."""
    from pyspark.sql import functions as F

    delete = F.lit(False)
    if delete_when:
        delete = F.coalesce(resolved(events, job, "delete_when", F.expr(delete_when)), F.lit(False))
    wanted = F.lit(True) if not where else F.coalesce(resolved(events, job, "where", F.expr(where)), F.lit(False))
    kept, letter = delete | wanted, []
    if dead_letter.LETTER_COLUMN in events.columns:
        kept, letter = kept | F.col(dead_letter.LETTER_COLUMN).isNotNull(), [dead_letter.LETTER_COLUMN]
    return delete, kept, letter


def late_letters(rows, source_topic: str, message: str, key: str = "key"):
    """A processor's late-event rows (with ``source_partition``, ``source_offset``, ``source_timestamp``
    and ``raw``) as dead-letter records (reason ``late``, ``message`` SQL saying why). SQL text: built every
    micro-batch, and a Column per field is a call into the JVM or more."""
    return rows.selectExpr(
        f"CAST(`{key}` AS BINARY) AS key",
        "raw AS value",
        f"{dead_letter.sql_string(source_topic)} AS topic",
        "source_partition AS `partition`",
        "source_offset AS `offset`",
        "source_timestamp AS `timestamp`",
        f"{dead_letter.sql_string(dead_letter.LATE)} AS `{dead_letter.ERROR_COLUMN}`",
        f"{message} AS `{dead_letter.MESSAGE_COLUMN}`",
    )


def _quoted(names) -> list[str]:
    """Column names as SQL identifiers."""
    return [f"`{name}`" for name in names]


def stream_time_key() -> str:
    """The changelog key (SQL) of a row carrying a partition's stream time (``source_partition``)."""
    return f"concat('{STREAM_TIME_KEY_PREFIX}', CAST(source_partition AS STRING))"


def iso_time(millis: str) -> str:
    """An epoch-millisecond column (SQL) as an ISO-8601 UTC string (SQL), for messages."""
    return f"date_format(timestamp_millis({millis}), \"yyyy-MM-dd'T'HH:mm:ss.SSS'Z'\")"
