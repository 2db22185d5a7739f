"""The stream-table join primitive: each event of a stream enriched with a table's row for its key, Kafka
Streams' ``KStream#join`` and ``leftJoin(KTable)`` (the seeds' stream-table join, 004 §3.4: clicks joined with
user profiles kept locally from a database's change stream).

Semantics (``streamstate.primitives.StreamTableJoin``, Java), per task (a partition of both topics, which are
co-partitioned):

- the stream is the spec's ``source_topic`` (:class:`JsonEvents`, keyed by ``key_field`` as every job's source
  is, with an event-time field ``time``); the table is its ``join_topic``, an upsert topic
  (:class:`UpsertTable`, the change-data-capture shape: a JSON-object key, the row or a tombstone), whose
  records' times are their Kafka timestamps (a CDC connector's commit time);
- both topics' records are taken in timestamp order (each topic's in offset order; on a tie, the topic not taken
  last), as a Kafka Streams task takes its partitions' records, across micro-batches: while one topic has records
  written but not yet read, the other's later records wait in the store for them; a topic with nothing more
  written holds nothing back (``max.task.idle.ms = 0``). So the answer does not depend on how a rate limit cuts
  the input (``streamstate.primitives.InputMerge``);
- a ``versioned`` store (the default to choose: Kafka Streams' versioned table, KIP-914) keeps each key's
  versions for the store's ``retention_ms`` of table time, and a stream event joins the row valid **at the
  event's time**; a ``key_value`` store keeps the latest row, and an event joins the row current when it is
  processed (a plain ``KTable``);
- with ``grace_ms`` (versioned only; Kafka Streams' ``Joined.withGracePeriod``, KIP-923) an event waits until
  the task's stream time (its largest event time) passes its time + grace, then joins as of its time: a table
  update up to ``grace_ms`` late still counts, whatever the micro-batch held. An event later than that joins
  at once (Kafka Streams joins it too, it drops none);
- ``inner`` emits an event only when its key has a row (at its time); ``left`` emits every event, the table's
  fields null without a row. The outputs are the joined events, appended: the key, the event's fields, the
  table's (``right_prefix`` before each), and the event's ``source_partition`` and ``source_offset``, which
  identify an output row (a replayed batch inserts only the rows not written yet);
- with ``repartition`` the stream is re-keyed by the join key first (Kafka Streams' ``selectKey(...).join``):
  the stateful stage reads the version's repartition topic (``repartition_partitions``, the table's count) and
  the table; a task takes the repartition partition's events in its offset order, and an output row's
  coordinates are still the event's place in ``source_topic`` (carried through the processor: the repartition
  topic's offsets differ from one run, or version, to the next).

The store's changelog holds the table's versions per key, the events waiting out their grace
(``~buffer@<partition>@<offset>``), the records of either topic waiting for the other
(``~waiting@<partition>@<stream|table>@<offset>``) and each partition's stream and table times and the topic it
took last (``~stream-time@<partition>``): a restore continues all of them exactly. With the spec's ``output_topic`` each joined event also goes to an event
topic (``JobOutputs.ensure_topic``: keyed by the join key, the row as JSON), once, in the transaction of
its batch's markers: what a Kafka Streams ``join(...).to(topic)`` writes under exactly-once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal, get_args

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.io.repartition import origin_columns
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.primitives.keyed_aggregate import _NAME
from spark_jobs.primitives.pipeline import DELETE_COLUMN
from spark_jobs.primitives.stream_join import JOINED, ORIGIN_FIELDS, StreamJoin, struct_ddl
from spark_jobs.primitives.table_join import RIGHT, classify_two_topics
from spark_jobs.primitives.top_n import UpsertTable
from spark_jobs.registry import InputKind, JobSpec, JobSpecError, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE

StreamJoinKind = Literal["inner", "left"]
#: the processor's input columns (``streamstate.primitives.StreamTableJoin``)
TIME_MS, STREAM_ROW, TABLE_ROW = "_time_ms", "_stream_row", "_table_row"
#: the columns that identify an output row: the joined event's place in the stream (a re-keyed event's carried
#: through the processor, :data:`ORIGIN_FIELDS`)
EVENT_COORDINATES = tuple(f.name for f in ORIGIN_FIELDS)


@dataclasses.dataclass(frozen=True)
class StreamTableJoin(StreamJoin):
    """A job whose outputs are the events of ``stream`` joined with ``table``'s row for their key (see the
    module docstring). Callable: the job's ``build(ctx)``.

    Attributes:
        store: the table's ``StoreSpec``: ``versioned`` (rows as of the event's time; ``retention_ms`` of
            history) or ``key_value`` (the latest row).
        stream: the spec's ``source_topic`` events.
        table: the spec's ``join_topic`` read as a table, keyed by ``(key_field,)``.
        time: the stream event's time field (a TIMESTAMP; an event without one is a dead letter).
        join: ``inner`` (``KStream#join``) or ``left`` (``leftJoin``).
        grace_ms: how long an event waits for late table updates (versioned stores only; at most the store's
            ``retention_ms``, as Kafka Streams demands). 0: joined on arrival.
        right_prefix: put before each of the table's field names in the outputs.
        summaries: companion outputs recomputed from the outputs after every batch that wrote some.
    """

    store: str
    stream: JsonEvents
    table: UpsertTable
    time: str
    join: StreamJoinKind = "inner"
    grace_ms: int = 0
    right_prefix: str = ""
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    store_kinds: ClassVar[tuple[str, ...]] = ("versioned", "key_value")
    processor: ClassVar[str] = "StreamTableJoin"
    same_name_hint: ClassVar[str] = "a field of both the stream and the table: give the table's fields a right_prefix"

    @property
    def input_kinds(self) -> tuple[InputKind, ...]:
        return (self.stream.input_kind, self.table.input_kind)

    @property
    def events(self) -> JsonEvents:
        return self.stream

    def _stream_fields(self, key_field: str) -> list[T.StructField]:
        return [T.StructField(f.name, f.dataType) for f in self.stream.schema.fields if f.name != key_field]

    def _held_fields(self, key_field: str, rekeyed: bool) -> list[T.StructField]:
        """An event's fields as the processor holds and emits them: a re-keyed event's carry its place in the
        source (its place in the repartition topic orders it, and is not the same from one run to the next)."""
        return self._stream_fields(key_field) + (list(ORIGIN_FIELDS) if rekeyed else [])

    def _table_fields(self) -> list[T.StructField]:
        return [
            T.StructField(self.right_prefix + f.name, f.dataType)
            for f in self.table.schema.fields
            if f.name not in self.table.key
        ]

    def state_ddl_for(self, key_field: str, rekeyed: bool = False) -> str:
        """A store entry: a table key's versions, a held event, a record waiting for the other topic, or a
        partition's times and the side it took last (see the module docstring)."""
        version = f"STRUCT<valid_from: BIGINT, present: BOOLEAN, row: {struct_ddl(self._table_fields())}>"
        held_row = struct_ddl(self._held_fields(key_field, rekeyed))
        held = f"STRUCT<time_ms: BIGINT, offset: BIGINT, key: STRING, row: {held_row}>"
        return (
            f"source_partition INT, versions ARRAY<{version}>, buffered {held}, stream_time_ms BIGINT, "
            "table_time_ms BIGINT, last_side STRING"
        )

    def output_ddl_for(self, key_field: str, rekeyed: bool = False) -> str:
        """The processor's rows: store changes (kind = change) and joined events (kind = joined)."""
        return (
            f"kind STRING, key STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl_for(key_field, rekeyed)}, "
            f"source_offset BIGINT, event_time_ms BIGINT, "
            f"stream_row {struct_ddl(self._held_fields(key_field, rekeyed))}, "
            f"table_row {struct_ddl(self._table_fields())}"
        )

    def output_key(self, key_field: str) -> tuple[str, ...]:
        return EVENT_COORDINATES

    def output_schema(self, key_field: str) -> T.StructType:
        """The outputs: the key, the event's fields, the table's, then the event's coordinates."""
        return T.StructType(
            [
                T.StructField(key_field, T.StringType(), nullable=False),
                *self._stream_fields(key_field),
                *self._table_fields(),
                T.StructField("source_partition", T.IntegerType(), nullable=False),
                T.StructField("source_offset", T.LongType(), nullable=False),
            ]
        )

    def check_primitive(self, spec: JobSpec) -> None:
        if self.join not in get_args(StreamJoinKind):
            raise JobSpecError(f"join: {self.join!r} is not one of {get_args(StreamJoinKind)}")
        if not spec.join_topic:
            raise JobSpecError("join_topic: a StreamTableJoin reads its table from the spec's join_topic")
        self.table.check(spec.name, spec.key_field)
        if tuple(self.table.key) != (spec.key_field,):
            raise JobSpecError(
                f"table.key: a stream-table join looks the table up by the job's key, so the table's key must be "
                f"({spec.key_field!r},), not {tuple(self.table.key)}"
            )
        if self.time not in self.stream.schema.fieldNames() or not isinstance(
            self.stream.schema[self.time].dataType, T.TimestampType
        ):
            raise JobSpecError(f"time: {self.time!r} must be a TIMESTAMP field of the stream's events")
        store = store_spec(spec, self.store)
        if self.grace_ms < 0:
            raise JobSpecError(f"grace_ms must be >= 0, got {self.grace_ms}")
        if self.grace_ms and store.kind != "versioned":
            raise JobSpecError(
                f"grace_ms: a grace period needs a versioned store (the event joins the row valid at its time), "
                f"not {store.kind} (Kafka Streams refuses it too)"
            )
        if self.grace_ms and self.grace_ms > store.retention_ms:
            raise JobSpecError(
                f"grace_ms {self.grace_ms} is longer than the store's retention_ms {store.retention_ms}: an event "
                "would wait for versions the store no longer keeps"
            )
        if self.right_prefix and not _NAME.match(self.right_prefix + "x"):
            raise JobSpecError(f"right_prefix: {self.right_prefix!r}: use lower-case letters, digits and _")
        self.check_output_names(spec)

    def input_rows(self, ctx):
        """Both topics decoded and classified, each by its own rules, in one pass over the source."""
        from pyspark.sql import functions as F

        spec, key_field = ctx.spec, ctx.spec.key_field
        time_rule = [(dead_letter.bad_event_time(self.time), f"{self.time} is not a time between 1970 and 2200")]
        stream_struct = T.StructType(self._held_fields(key_field, spec.repartition))
        origin = (
            [c.alias(f.name) for c, f in zip(origin_columns(), ORIGIN_FIELDS, strict=True)] if spec.repartition else []
        )
        table_struct = T.StructType(self._table_fields())

        def stream_rules(frame):
            return self.stream.classify(frame, key_field, extra_rules=time_rule)

        def event(decoded, table: bool):
            if table:
                delete = decoded.getField(DELETE_COLUMN)
                names = [f.name[len(self.right_prefix) :] for f in table_struct.fields]
                row = F.struct(
                    *(decoded.getField(n).alias(f.name) for n, f in zip(names, table_struct.fields, strict=True))
                )
                rows = (F.lit(None).cast(stream_struct), F.when(~delete, row).cast(table_struct))
                time, deletes = F.unix_millis(F.col("timestamp")), delete
            else:
                fields = self._stream_fields(key_field)
                row = F.struct(*(decoded.getField(f.name).alias(f.name) for f in fields), *origin)
                rows = (row.cast(stream_struct), F.lit(None).cast(table_struct))
                time, deletes = F.unix_millis(decoded.getField(self.time)), F.lit(False)
            return F.struct(
                decoded.getField(key_field).cast("string").alias(key_field),
                F.lit(table).alias(RIGHT),
                time.alias(TIME_MS),
                deletes.alias(DELETE_COLUMN),
                rows[0].alias(STREAM_ROW),
                rows[1].alias(TABLE_ROW),
            )

        classified = classify_two_topics(
            ctx.sources.stream(), spec.join_topic, stream_rules, self.table.classify, event
        )
        return ctx.sources.with_dead_letters(classified, "partition", "offset", key=key_field)

    def processor_args(self, store: StoreSpec) -> tuple:
        return (store.kind == "versioned", store.retention_ms or 0, self.grace_ms, self.join == "left")

    def joined_rows(self, batch, key_field: str, rekeyed: bool = False):
        """A batch's joined events as output rows (:meth:`output_schema`): a re-keyed event's coordinates are its
        place in the source (:meth:`_held_fields`)."""
        # SQL text: built every micro-batch, and a Column per field is a call into the JVM or more
        stream = [f"stream_row.`{f.name}` AS `{f.name}`" for f in self._stream_fields(key_field)]
        table = [f"table_row.`{f.name}` AS `{f.name}`" for f in self._table_fields()]
        place = [f"stream_row.`{c}` AS `{c}`" if rekeyed else f"`{c}`" for c in EVENT_COORDINATES]
        return batch.where(f"kind = '{JOINED}'").selectExpr(f"key AS `{key_field}`", *stream, *table, *place)

    def writes(self, outputs, ctx, batch_id: int):
        # a replay may repeat rows written already; else appending writes the batch alone (no MERGE)
        return outputs.insert_absent if ctx.outputs_may_repeat(batch_id) else outputs.append
