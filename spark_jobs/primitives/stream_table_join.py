"""The stream-table join primitive: each event of a stream enriched with a table's row for its key, Kafka
Streams' ``KStream#join`` and ``leftJoin(KTable)`` (the seeds' stream-table join, 004 §3.4: clicks joined with
user profiles kept locally from a database's change stream); or with several tables' rows, each keyed as the
stream is (``more_tables``: Kafka Streams' ``stream.leftJoin(first).leftJoin(second)`` in one task).

Semantics (``streamstate.primitives.StreamTableJoin``, Java), per task (a partition of every input topic, which
are co-partitioned):

- the stream is the spec's ``source_topic`` (:class:`JsonEvents`, keyed by ``key_field`` as every job's source
  is, with an event-time field ``time``); the table is its first ``join_topics`` entry, a further table
  (``more_tables``) each next one, every table an upsert topic (:class:`UpsertTable`, the change-data-capture
  shape: a JSON-object key, the row or a tombstone), whose records' times are their Kafka timestamps (a CDC
  connector's commit time);
- the topics' records are taken in timestamp order (each topic's in offset order; on a tie, the topic taken
  least recently: with one table, the topic not taken last), as a Kafka Streams task takes its partitions'
  records, across micro-batches: while one topic has records written but not yet read, the others' later
  records wait in the store for them; a topic with nothing more written holds nothing back
  (``max.task.idle.ms = 0``). So the answer does not depend on how a rate limit cuts the input
  (``streamstate.primitives.InputMerge``). With more than two topics, Kafka Streams' order of records of equal
  times is its priority queue's, not a rule (a known difference: docs/writing-jobs/stream-table-join.md);
- a ``versioned`` store (the default to choose: Kafka Streams' versioned table, KIP-914) keeps each key's
  versions for the store's ``retention_ms`` of table time, and a stream event joins the row valid **at the
  event's time**; a ``key_value`` store keeps the latest row, and an event joins the row current when it is
  processed (a plain ``KTable``);
- with ``grace_ms`` (versioned only; Kafka Streams' ``Joined.withGracePeriod``, KIP-923) an event waits until
  the task's stream time (its largest event time) passes its time + grace, then joins as of its time: a table
  update up to ``grace_ms`` late still counts, whatever the micro-batch held. An event later than that joins
  at once (Kafka Streams joins it too, it drops none);
- with several tables, each keeps its own versions and table time (its own versioned store in Kafka Streams),
  all of the one store's kind and retention; a grace period is for a join of one table (chained joins with
  grace hold an event once per join in Kafka Streams, each buffer on its own stream time);
- ``inner`` emits an event only when its key has a row (at its time) in every table; ``left`` emits every
  event, a table's fields null without a row. The outputs are the joined events, appended: the key, the
  event's fields, each table's (``right_prefix``, or the further table's ``prefix``, before each), and the
  event's ``source_partition`` and ``source_offset``, which
  identify an output row (a replayed batch inserts only the rows not written yet);
- with ``repartition`` the stream is re-keyed by the join key first (Kafka Streams' ``selectKey(...).join``):
  the stateful stage reads the version's repartition topic (``repartition_partitions``, the tables' count) and
  the tables; a task takes the repartition partition's events in its offset order, and an output row's
  coordinates are still the event's place in ``source_topic`` (carried through the processor: the repartition
  topic's offsets differ from one run, or version, to the next).

The store's changelog holds the table's versions per key (a further table's as ``~table@<t>@<key>``, its
time as ``~table-time@<partition>@<t>``), the events waiting out their grace
(``~buffer@<partition>@<offset>``), the records of any topic waiting for another
(``~waiting@<partition>@<side>@<offset>``, the side ``stream``, ``table``, then ``table1`` and on for further tables) and each partition's stream and table times and the topic it
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
from spark_jobs.primitives.table_join import classify_topics
from spark_jobs.primitives.top_n import UpsertTable
from spark_jobs.registry import InputKind, JobSpec, JobSpecError, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE

StreamJoinKind = Literal["inner", "left"]
#: the processor's input columns (``streamstate.primitives.StreamTableJoin``): which input (0 the stream, then
#: each table), the record's time, a stream record's fields, a table record's (in the struct of every table's)
INPUT, TIME_MS, STREAM_ROW, TABLE_ROW = "_input", "_time_ms", "_stream_row", "_table_row"
#: the columns that identify an output row: the joined event's place in the stream (a re-keyed event's carried
#: through the processor, :data:`ORIGIN_FIELDS`)
EVENT_COORDINATES = tuple(f.name for f in ORIGIN_FIELDS)


@dataclasses.dataclass(frozen=True)
class JoinedTable:
    """A further table a :class:`StreamTableJoin` enriches each event from (its ``more_tables``), looked up by
    the job's key as the first one is.

    Attributes:
        table: the table's spec's ``join_topics`` entry read as a table, keyed by ``(key_field,)``.
        prefix: put before each of its field names in the outputs.
    """

    table: UpsertTable
    prefix: str = ""


@dataclasses.dataclass(frozen=True)
class StreamTableJoin(StreamJoin):
    """A job whose outputs are the events of ``stream`` joined with ``table``'s row for their key (see the
    module docstring). Callable: the job's ``build(ctx)``.

    Attributes:
        store: the table's ``StoreSpec``: ``versioned`` (rows as of the event's time; ``retention_ms`` of
            history) or ``key_value`` (the latest row).
        stream: the spec's ``source_topic`` events.
        table: the spec's first ``join_topics`` entry read as a table, keyed by ``(key_field,)``.
        time: the stream event's time field (a TIMESTAMP; an event without one is a dead letter).
        join: ``inner`` (``KStream#join``) or ``left`` (``leftJoin``).
        grace_ms: how long an event waits for late table updates (versioned stores only; at most the store's
            ``retention_ms``, as Kafka Streams demands). 0: joined on arrival.
        right_prefix: put before each of the table's field names in the outputs.
        summaries: companion outputs recomputed from the outputs after every batch that wrote some.
        more_tables: further tables, each the next ``join_topics`` entry, each event joined with each of them
            too (Kafka Streams' ``leftJoin(table).leftJoin(more)``); not with a ``grace_ms``.
    """

    store: str
    stream: JsonEvents
    table: UpsertTable
    time: str
    join: StreamJoinKind = "inner"
    grace_ms: int = 0
    right_prefix: str = ""
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    more_tables: tuple[JoinedTable, ...] = ()
    store_kinds: ClassVar[tuple[str, ...]] = ("versioned", "key_value")
    processor: ClassVar[str] = "StreamTableJoin"
    same_name_hint: ClassVar[str] = (
        "a field of both the stream and a table, or of two tables: give the table's fields a right_prefix (a "
        "further table's, its JoinedTable prefix)"
    )

    @property
    def input_kinds(self) -> tuple[InputKind, ...]:
        return (self.stream.input_kind, *(table.input_kind for table, _prefix in self._tables()))

    @property
    def events(self) -> JsonEvents:
        return self.stream

    def _stream_fields(self, key_field: str) -> list[T.StructField]:
        return [T.StructField(f.name, f.dataType) for f in self.stream.schema.fields if f.name != key_field]

    def _held_fields(self, key_field: str, rekeyed: bool) -> list[T.StructField]:
        """An event's fields as the processor holds and emits them: a re-keyed event's carry its place in the
        source (its place in the repartition topic orders it, and is not the same from one run to the next)."""
        return self._stream_fields(key_field) + (list(ORIGIN_FIELDS) if rekeyed else [])

    def _tables(self) -> list[tuple[UpsertTable, str]]:
        """Each table with the prefix of its output fields, in ``join_topics`` order."""
        return [(self.table, self.right_prefix), *((more.table, more.prefix) for more in self.more_tables)]

    def _fields_of(self, table: UpsertTable, prefix: str) -> list[T.StructField]:
        """One table's fields as stored and output (its key aside)."""
        return [T.StructField(prefix + f.name, f.dataType) for f in table.schema.fields if f.name not in table.key]

    def _table_fields(self) -> list[T.StructField]:
        """Every table's fields, in order: a stored version's row (a table's version fills its own)."""
        return [field for table, prefix in self._tables() for field in self._fields_of(table, prefix)]

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
            f"table_rows ARRAY<{struct_ddl(self._table_fields())}>"
        )

    def output_key(self, key_field: str) -> tuple[str, ...]:
        return EVENT_COORDINATES

    def output_schema(self, key_field: str) -> T.StructType:
        """The outputs: the key, the event's fields, the tables', then the event's coordinates."""
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
        tables = self._tables()
        if len(spec.join_topics) != len(tables):
            raise JobSpecError(
                f"join_topics: a StreamTableJoin reads each of its {len(tables)} table(s) from the spec's "
                f"join_topics, in order; it has {len(spec.join_topics)}"
            )
        for i, (table, prefix) in enumerate(tables):
            name = "table" if i == 0 else f"more_tables[{i - 1}]"
            table.check(spec.name, spec.key_field)
            if tuple(table.key) != (spec.key_field,):
                raise JobSpecError(
                    f"{name}.key: a stream-table join looks a table up by the job's key, so its key must be "
                    f"({spec.key_field!r},), not {tuple(table.key)}"
                )
            if prefix and not _NAME.match(prefix + "x"):
                where = "right_prefix" if i == 0 else f"{name}.prefix"
                raise JobSpecError(f"{where}: {prefix!r}: use lower-case letters, digits and _")
        if self.grace_ms and self.more_tables:
            raise JobSpecError(
                "grace_ms: a grace period is for a join of one table (Kafka Streams holds an event once per "
                "chained join, each on its own stream time); join more tables without one"
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
        self.check_output_names(spec)

    def input_rows(self, ctx):
        """Every topic decoded and classified, each by its own rules, in one pass over the source."""
        from pyspark.sql import functions as F

        spec, key_field = ctx.spec, ctx.spec.key_field
        time_rule = [(dead_letter.bad_event_time(self.time), f"{self.time} is not a time between 1970 and 2200")]
        stream_struct = T.StructType(self._held_fields(key_field, spec.repartition))
        origin = (
            [c.alias(f.name) for c, f in zip(origin_columns(), ORIGIN_FIELDS, strict=True)] if spec.repartition else []
        )
        tables = self._tables()
        table_struct = T.StructType(self._table_fields())

        def stream_rules(frame):
            return self.stream.classify(frame, key_field, extra_rules=time_rule)

        def event(decoded, input_index: int):
            if input_index > 0:  # a table's record: its fields in the struct of every table's, the others' null
                table, prefix = tables[input_index - 1]
                own = {f.name for f in self._fields_of(table, prefix)}
                delete = decoded.getField(DELETE_COLUMN)
                row = F.struct(
                    *(
                        (decoded.getField(f.name[len(prefix) :]) if f.name in own else F.lit(None))
                        .cast(f.dataType)
                        .alias(f.name)
                        for f in table_struct.fields
                    )
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
                F.lit(input_index).alias(INPUT),
                time.alias(TIME_MS),
                deletes.alias(DELETE_COLUMN),
                rows[0].alias(STREAM_ROW),
                rows[1].alias(TABLE_ROW),
            )

        classifiers = (stream_rules, *(table.classify for table, _prefix in tables))
        classified = classify_topics(ctx.sources.stream(), spec.join_topics, classifiers, event)
        return ctx.sources.with_dead_letters(classified, "partition", "offset", key=key_field)

    def processor_args(self, store: StoreSpec) -> tuple:
        versioned = store.kind == "versioned"
        return (versioned, store.retention_ms or 0, self.grace_ms, self.join == "left", len(self._tables()))

    def joined_rows(self, batch, key_field: str, rekeyed: bool = False):
        """A batch's joined events as output rows (:meth:`output_schema`): a re-keyed event's coordinates are its
        place in the source (:meth:`_held_fields`)."""
        # SQL text: built every micro-batch, and a Column per field is a call into the JVM or more
        stream = [f"stream_row.`{f.name}` AS `{f.name}`" for f in self._stream_fields(key_field)]
        table = [
            f"table_rows[{t}].`{f.name}` AS `{f.name}`"
            for t, (joined, prefix) in enumerate(self._tables())
            for f in self._fields_of(joined, prefix)
        ]
        place = [f"stream_row.`{c}` AS `{c}`" if rekeyed else f"`{c}`" for c in EVENT_COORDINATES]
        return batch.where(f"kind = '{JOINED}'").selectExpr(f"key AS `{key_field}`", *stream, *table, *place)

    def writes(self, outputs, ctx, batch_id: int):
        # a replay may repeat rows written already; else appending writes the batch alone (no MERGE)
        return outputs.insert_absent if ctx.outputs_may_repeat(batch_id) else outputs.append
