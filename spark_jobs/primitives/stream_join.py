"""What a stream's two joins share: :class:`~spark_jobs.primitives.stream_table_join.StreamTableJoin` and
:class:`~spark_jobs.primitives.stream_stream_join.StreamStreamJoin`, Kafka Streams' ``KStream#join`` family,
whose results are events.

Rules both keep (each join's module states its own semantics):

- the inputs are the spec's ``source_topic`` (the left side, a stream) and its ``join_topics`` (the right side),
  co-partitioned, decoded and classified in one pass, each by its own rules
  (:func:`~spark_jobs.primitives.table_join.classify_topics`);
- the join's Java processor (``streamstate.primitives.<processor>``) emits ``change`` rows (the store's changes,
  to its changelog) and ``joined`` rows (the results);
- the outputs are the results, appended, each identified by its place in the inputs (:meth:`output_key`), so a
  batch replayed after a crash inserts only the rows not written yet; with the spec's ``output_topic`` each result
  also goes to an event topic, once, in the transaction of its batch's markers (what a Kafka Streams
  ``join(...).to(topic)`` writes under exactly-once);
- a left record re-keyed first (``JobSpec(repartition=True)``) carries its place in the source through the
  processor (:data:`ORIGIN_FIELDS`): its place in the repartition topic differs from one run to the next.
"""

from __future__ import annotations

from typing import ClassVar

from pyspark.sql import types as T

from spark_jobs.primitives.pipeline import StoreDeclaration
from spark_jobs.registry import JobSpec, JobSpecError, OutputTopicKind, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

#: the processor's row kinds: a store change, a result
CHANGE, JOINED = "change", "joined"
#: a re-keyed left record's place in the source, carried through the processor
ORIGIN_FIELDS = (
    T.StructField("source_partition", T.IntegerType()),
    T.StructField("source_offset", T.LongType()),
)


def struct_ddl(fields: list[T.StructField]) -> str:
    """``fields`` as a STRUCT type in DDL."""
    return "STRUCT<" + ", ".join(f"`{f.name}`: {f.dataType.simpleString()}" for f in fields) + ">"


class StreamJoin(StoreDeclaration):
    """The shared part of a stream's join declaration (see the module docstring). A join gives its processor's
    name and parameters (:attr:`processor`, :meth:`processor_args`), its stored and emitted rows
    (:meth:`state_ddl_for`, :meth:`output_ddl_for`), its results as output rows (:meth:`joined_rows`) and how a
    batch writes them (:meth:`writes`)."""

    output_topic_kind: ClassVar[OutputTopicKind] = "events"
    #: the Java processor's class in ``streamstate.primitives``
    processor: ClassVar[str]
    #: how to tell apart two output fields of one name (the error's hint)
    same_name_hint: ClassVar[str]

    def state_ddl_for(self, key_field: str, rekeyed: bool = False) -> str:
        """A store entry's columns (after ``key`` and ``tombstone``)."""
        raise NotImplementedError

    def output_ddl_for(self, key_field: str, rekeyed: bool = False) -> str:
        """The processor's rows: store changes (kind = change) and results (kind = joined)."""
        raise NotImplementedError

    def processor_args(self, store: StoreSpec) -> tuple:
        """The processor's own parameters, between its output DDL and the key column."""
        raise NotImplementedError

    def joined_rows(self, batch, key_field: str, rekeyed: bool = False):
        """A batch's results as output rows (:meth:`output_schema`)."""
        raise NotImplementedError

    def writes(self, outputs, ctx, batch_id: int):
        """How batch ``batch_id`` writes its results to ``outputs`` (an ``OutputTable``): its ``insert_absent``
        or its ``append``."""
        raise NotImplementedError

    def store_changes_for(self, key_field: str, rekeyed: bool = False) -> StoreChanges:
        return StoreChanges(self.store, self.state_ddl_for(key_field, rekeyed), rows=f"kind = '{CHANGE}'")

    def check_output_names(self, spec: JobSpec) -> None:
        """Refuse outputs with a reserved column name or two columns of one name."""
        seen = {"key", "kind", TOMBSTONE}
        for field in self.output_schema(spec.key_field).fields:
            if field.name in seen:
                raise JobSpecError(f"fields: {field.name!r} is a reserved name or {self.same_name_hint}")
            seen.add(field.name)

    def changes(
        self,
        events,
        key_field: str,
        initial,
        store: StoreSpec,
        job: str = "?",
        offset_ordered: bool = False,
        rekeyed: bool = False,
    ):
        """The processor's rows (:meth:`output_ddl_for`), seeded with ``initial`` (the restored store)."""
        from pyspark.sql import DataFrame

        spark = events.sparkSession
        jdf = getattr(spark._jvm.streamstate.primitives, self.processor).changes(
            events._jdf,
            "partition",
            None if initial is None else initial._jdf,
            self.store,
            self.output_ddl_for(key_field, rekeyed),
            *self.processor_args(store),
            key_field,
        )
        return DataFrame(jdf, spark)

    def build(self, ctx, processor=None):
        """The job's query: both topics classified, the Java processor, the results written (:meth:`writes`),
        store changes to the changelog."""
        spec = ctx.spec
        if processor is not None:
            raise JobSpecError(f"job {spec.name}: a {type(self).__name__} runs its Java processor only")
        self.check(spec)
        key_field, store, rekeyed = spec.key_field, store_spec(spec, self.store), spec.repartition
        ctx.outputs.ensure_table(self.output_schema(key_field))
        changes = self.store_changes_for(key_field, rekeyed)
        initial = ctx.stores.initial_state(changes)
        rows = self.changes(self.input_rows(ctx), key_field, initial, store, job=spec.name, rekeyed=rekeyed)
        outputs = ctx.outputs.table(self.output_key(key_field))
        write_summaries = self.summary_writer(str(ctx.layout.output_table), self.summary_paths(ctx))

        def write_outputs(batch, batch_id: int, commit) -> None:
            if self.writes(outputs, ctx, batch_id)(self.joined_rows(batch, key_field, rekeyed), commit):
                write_summaries(batch.sparkSession)

        output_records = None
        if ctx.outputs.ensure_topic():

            def output_records(batch):
                return self.event_records(self.joined_rows(batch, key_field, rekeyed), key_field)

        sink = ctx.state_change_sink(changes, write_outputs, output_records=output_records)
        return rows.writeStream.outputMode("append").foreachBatch(sink)
