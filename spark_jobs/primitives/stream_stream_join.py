"""The windowed stream-stream join primitive: records of two streams with the same key at most ``window_ms`` apart,
joined, Kafka Streams' ``KStream#join``, ``leftJoin`` and ``outerJoin(KStream, joiner,
JoinWindows.ofTimeDifferenceAndGrace(window, grace))`` (the seeds' stream-stream join, 004 §3.6: payments matched
to orders within 10 minutes).

Semantics (``streamstate.primitives.StreamStreamJoin``, Java): Kafka Streams 4.3.1's, rule by rule, as
:mod:`spark_jobs.reference.generators.payments` states them with the Kafka Streams class each comes from, per task (a
partition of both topics, which are co-partitioned):

- records are taken in timestamp order (each topic's in offset order; on a tie, the topic not taken last), across
  micro-batches (a topic's records wait in the store while the other has records written but not yet read:
  ``streamstate.primitives.InputMerge``); a
  record's time is its ``time`` field;
- **inner results**: a record joins every record of the other topic with its key whose time is within
  ``window_ms`` of its own (both bounds included) and that the other side's window still holds (each side keeps
  its records for 2 x window + grace of that side's time); the pair is emitted once, by the later of the two to
  arrive;
- **left and outer results**: a record of an outer side (``left``: the left topic; ``outer``: both) that found no
  match waits until its window closes (its time + window + grace is before the task's stream time, the largest
  time of either topic), then is emitted alone, unless a record of the other side joins it first; one already
  more than ``window_ms`` behind stream time is emitted alone at once. No early (spurious) left or outer results,
  as Kafka Streams 3.1+. Kafka Streams scans its waiting records only when a record at stream time arrives and
  stream time has passed the previous scan's last time + window + grace; records whose window closed may wait
  longer than that, and a late match can still join them: kept as it is, since it is what Kafka Streams emits;
- nothing is dropped: a late record still joins what the other side holds (Kafka Streams drops none either).
  Records still waiting when the input ends are emitted by the record that closes their window, as in Kafka
  Streams (there is no wall-clock timer).

The outputs are the results, appended: the key, the declared ``fields`` (by default every field of both sides),
and the results' place: ``source_partition``, ``left_offset`` and ``right_offset`` (-1 for an absent side),
which identify an output row (a batch inserts only the rows not written yet: a replay repeats none). The store's changelog
holds each key's records of each side, the waiting records and the task's times: a restore continues all.
With the spec's ``output_topic`` each result also goes to an event topic (``JobOutputs.ensure_topic``:
keyed by the join key, the row as JSON), once, in the transaction of its batch's markers.

A left stream not keyed by the join key is re-keyed first (``JobSpec(repartition=True)``, Kafka Streams'
``selectKey`` before the join; :mod:`spark_jobs.io.repartition`): the join reads the repartition topic and the right
topic, and a left record carries its place in the source (from the repartition topic's headers) through the
windows and the changelog, so a result with a left record names it: ``source_partition`` and ``left_offset`` are
the record's source partition and offset, ``right_offset`` the right record's offset in its task's partition. A
repartition topic's offsets differ from one run to the next.
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
from spark_jobs.primitives.stream_join import JOINED, ORIGIN_FIELDS, StreamJoin, struct_ddl
from spark_jobs.primitives.table_join import RIGHT, classify_two_topics
from spark_jobs.registry import InputKind, JobSpec, JobSpecError, StoreSpec
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE

StreamsJoinKind = Literal["inner", "left", "outer"]
TIME_MS, LEFT_ROW, RIGHT_ROW = "_time_ms", "_left_row", "_right_row"
#: the columns that identify an output row: the result's place in both topics
RESULT_COORDINATES = ("source_partition", "left_offset", "right_offset")
_SIDES = ("left", "right")


@dataclasses.dataclass(frozen=True)
class StreamStreamJoin(StreamJoin):
    """A job whose outputs are the records of ``left`` (the spec's ``source_topic``) and ``right`` (its
    one ``join_topics``) joined within ``window_ms`` of each other (see the module docstring). Callable: the job's
    ``build(ctx)``.

    Attributes:
        store: the ``key_value`` ``StoreSpec`` of the join's windows, waiting records and times.
        left, right: the two streams' events, both keyed by the job's ``key_field``.
        left_time, right_time: each side's event-time field (a TIMESTAMP; an event without one is a dead letter).
        window_ms: the largest time difference of a joined pair (``JoinWindows.ofTimeDifferenceAndGrace``).
        grace_ms: how long after its window a record still accepts a match (and an unmatched one waits).
        join: ``inner``, ``left`` (every left record, alone when unmatched) or ``outer`` (every record).
        fields: the outputs' columns after the key: name -> ``"left.<field>"`` or ``"right.<field>"``. Default:
            every field of both sides but the key, as named (a name both sides have is refused: declare fields).
        summaries: companion outputs recomputed from the outputs after every batch that wrote some.
    """

    store: str
    left: JsonEvents
    right: JsonEvents
    left_time: str
    right_time: str
    window_ms: int
    grace_ms: int
    join: StreamsJoinKind = "inner"
    fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    store_kinds: ClassVar[tuple[str, ...]] = ("key_value",)
    processor: ClassVar[str] = "StreamStreamJoin"
    same_name_hint: ClassVar[str] = "a field of both streams: declare the outputs' fields"

    @property
    def input_kinds(self) -> tuple[InputKind, ...]:
        return (self.left.input_kind, self.right.input_kind)

    @property
    def events(self) -> JsonEvents:
        return self.left

    def _side(self, side: str) -> JsonEvents:
        return self.left if side == "left" else self.right

    def _row_fields(self, side: str, key_field: str) -> list[T.StructField]:
        """A side's fields: every field of its events but the key."""
        return [T.StructField(f.name, f.dataType) for f in self._side(side).schema.fields if f.name != key_field]

    def _held_fields(self, side: str, key_field: str, rekeyed: bool) -> list[T.StructField]:
        """A side's record as the processor holds and emits it: a re-keyed left record's carries its place in the
        source (its place in the repartition topic orders it, and is not the same from one run to the next)."""
        return self._row_fields(side, key_field) + (list(ORIGIN_FIELDS) if rekeyed and side == "left" else [])

    def _row_ddl(self, side: str, key_field: str, rekeyed: bool) -> str:
        return struct_ddl(self._held_fields(side, key_field, rekeyed))

    def output_fields(self, key_field: str) -> list[tuple[str, str, str]]:
        """The outputs' columns after the key, in order: (name, side, field)."""
        if self.fields:
            return [(name, *source.split(".", 1)) for name, source in self.fields.items()]
        return [(f.name, side, f.name) for side in _SIDES for f in self._row_fields(side, key_field)]

    def state_ddl_for(self, key_field: str, rekeyed: bool = False) -> str:
        """A store entry: a side's records of a key (or a waiting entry's), or a partition's times."""
        record = (
            f"STRUCT<time_ms: BIGINT, offset: BIGINT, left_row: {self._row_ddl('left', key_field, rekeyed)}, "
            f"right_row: {self._row_ddl('right', key_field, rekeyed)}>"
        )
        return (
            f"source_partition INT, side STRING, records ARRAY<{record}>, stream_time_ms BIGINT, min_time_ms BIGINT, "
            "left_time_ms BIGINT, right_time_ms BIGINT, last_side STRING"
        )

    def output_ddl_for(self, key_field: str, rekeyed: bool = False) -> str:
        """The processor's rows: store changes (kind = change) and results (kind = joined)."""
        return (
            f"kind STRING, key STRING, {TOMBSTONE} BOOLEAN, {self.state_ddl_for(key_field, rekeyed)}, "
            f"left_offset BIGINT, right_offset BIGINT, left_row {self._row_ddl('left', key_field, rekeyed)}, "
            f"right_row {self._row_ddl('right', key_field, rekeyed)}, result_time_ms BIGINT"
        )

    def output_key(self, key_field: str) -> tuple[str, ...]:
        return RESULT_COORDINATES

    def output_schema(self, key_field: str) -> T.StructType:
        """The outputs: the key, the declared fields, then the result's place."""
        types = {side: {f.name: f.dataType for f in self._side(side).schema.fields} for side in _SIDES}
        return T.StructType(
            [
                T.StructField(key_field, T.StringType(), nullable=False),
                *(T.StructField(name, types[side][field]) for name, side, field in self.output_fields(key_field)),
                T.StructField("source_partition", T.IntegerType(), nullable=False),
                T.StructField("left_offset", T.LongType(), nullable=False),
                T.StructField("right_offset", T.LongType(), nullable=False),
            ]
        )

    def check_primitive(self, spec: JobSpec) -> None:
        if self.join not in get_args(StreamsJoinKind):
            raise JobSpecError(f"join: {self.join!r} is not one of {get_args(StreamsJoinKind)}")
        if len(spec.join_topics) != 1:
            raise JobSpecError("join_topics: a StreamStreamJoin reads its right stream from the spec's one join topic")
        if self.window_ms <= 0 or self.grace_ms < 0:
            raise JobSpecError(f"window_ms must be > 0 and grace_ms >= 0, got {self.window_ms} and {self.grace_ms}")
        self.right.check(spec.name, spec.key_field)
        for side, time in (("left", self.left_time), ("right", self.right_time)):
            schema = self._side(side).schema
            if time not in schema.fieldNames() or not isinstance(schema[time].dataType, T.TimestampType):
                raise JobSpecError(f"{side}_time: {time!r} must be a TIMESTAMP field of the {side} stream's events")
        for name, source in self.fields.items():
            side, _, field = source.partition(".")
            if side not in _SIDES or field not in self._side(side).schema.fieldNames() or field == spec.key_field:
                raise JobSpecError(f"fields.{name}: {source!r} is not 'left.<field>' or 'right.<field>' (not the key)")
            if not _NAME.match(name):
                raise JobSpecError(f"fields.{name}: use lower-case letters, digits and _")
        store_spec(spec, self.store)
        self.check_output_names(spec)

    def input_rows(self, ctx):
        """Both topics decoded and classified, each by its own rules, in one pass over the source."""
        from pyspark.sql import functions as F

        spec, key_field = ctx.spec, ctx.spec.key_field
        structs = {side: T.StructType(self._held_fields(side, key_field, spec.repartition)) for side in _SIDES}
        times = {"left": self.left_time, "right": self.right_time}
        # a re-keyed left record's place in the source, from the repartition topic's headers
        origin = (
            [c.alias(f.name) for c, f in zip(origin_columns(), ORIGIN_FIELDS, strict=True)] if spec.repartition else []
        )

        def rules(side: str):
            message = f"{times[side]} is not a time between 1970 and 2200"
            return lambda frame: self._side(side).classify(
                frame, key_field, extra_rules=[(dead_letter.bad_event_time(times[side]), message)]
            )

        def event(decoded, right: bool):
            side = "right" if right else "left"
            rows = {name: F.lit(None).cast(structs[name]) for name in _SIDES}
            fields = self._row_fields(side, key_field)
            held = origin if side == "left" else []
            rows[side] = F.struct(*(decoded.getField(f.name).alias(f.name) for f in fields), *held)
            return F.struct(
                decoded.getField(key_field).cast("string").alias(key_field),
                F.lit(right).alias(RIGHT),
                F.unix_millis(decoded.getField(times[side])).alias(TIME_MS),
                rows["left"].cast(structs["left"]).alias(LEFT_ROW),
                rows["right"].cast(structs["right"]).alias(RIGHT_ROW),
            )

        classified = classify_two_topics(
            ctx.sources.stream(), spec.join_topics[0], rules("left"), rules("right"), event
        )
        return ctx.sources.with_dead_letters(classified, "partition", "offset", key=key_field)

    def processor_args(self, store: StoreSpec) -> tuple:
        return (self.window_ms, self.grace_ms, self.join)

    def joined_rows(self, batch, key_field: str, rekeyed: bool = False):
        """A batch's results as output rows (:meth:`output_schema`): with a re-keyed left record, the result's place
        is the record's in the source (partition and offset) and the right record's offset in its partition."""
        # SQL text: built every micro-batch, and a Column per field is a call into the JVM or more
        columns = [f"`{side}_row`.`{field}` AS `{name}`" for name, side, field in self.output_fields(key_field)]
        place = [f"`{c}`" for c in RESULT_COORDINATES]
        if rekeyed:
            partition, offset = (f.name for f in ORIGIN_FIELDS)
            place[0] = f"CASE WHEN left_row IS NOT NULL THEN left_row.`{partition}` ELSE source_partition END"
            place[1] = f"CASE WHEN left_row IS NOT NULL THEN left_row.`{offset}` ELSE left_offset END"
        return batch.where(f"kind = '{JOINED}'").selectExpr(
            f"key AS `{key_field}`",
            *columns,
            *(f"{column} AS `{name}`" for column, name in zip(place, RESULT_COORDINATES, strict=True)),
        )

    def writes(self, outputs, ctx, batch_id: int):
        # always insert-if-absent: a batch of the right topic alone emits results too, and the output marks that let
        # a batch append (spark_jobs/state/output_marks.py) follow the left topic only
        return outputs.insert_absent
