"""The table-table join primitive: two upsert topics read as tables and joined on their key, Kafka Streams'
``KTable#join``, ``leftJoin`` and ``outerJoin`` (the seeds' table-table join, 004 §3.5: always the current
state of both sides, the result updated on every change of either).

Semantics (``streamstate.primitives.TableJoin``, Java):

- both inputs are **upsert topics** (:class:`UpsertTable`, the change-data-capture shape): the Kafka key is
  the JSON object of the key field (``{"customer_id": "c01"}``), the value the row as JSON, a null value (a
  tombstone) deletes the row. The left table is the spec's ``source_topic``, the right one its (one)
  ``join_topics``; both are keyed by the job's ``key_field`` and co-partitioned (refused at start
  otherwise, as Kafka Streams refuses a join of topics with different partition counts). A record whose
  key is not such an object is a dead letter (``missing_key``), one whose value disagrees with its key
  too (``wrong_key``), as for any upsert topic;
- the store keeps, per key, both sides' latest rows (each side's records applied in offset order); the
  result for a key is the joined row of the two sides: ``inner`` when both sides hold the key, ``left``
  when the left one does (the right side's fields null when it does not), ``outer`` when either does;
- the outputs are the results: one row per key, the key then the left side's fields then the right side's
  (``right_prefix`` before each of the right side's names), updated after every micro-batch that changed
  a side of the key, deleted when the key has no result any more (a side deleted: the inner join's row
  goes, the left join's row goes with the left side and loses its right fields with the right side). They
  depend on the sides' latest rows only, so they do not depend on how the input is cut into micro-batches,
  nor on how the two topics' records interleave. With the spec's ``output_topic`` the results also go to
  that upsert topic (the key, the row as JSON, a tombstone for a deleted result), as ``toStream().to(...)``
  of the join does; a key that had no result and still has none publishes nothing, as in Kafka Streams.

One store holds both sides (Kafka Streams materializes each table in its own store): its changelog is
keyed by the key, its value both sides' rows and which are present; a restore rebuilds both sides.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal, get_args

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives.keyed_aggregate import _NAME
from spark_jobs.primitives.pipeline import DELETE_COLUMN, StoreDeclaration
from spark_jobs.primitives.top_n import UpsertTable
from spark_jobs.registry import InputKind, JobSpec, JobSpecError
from spark_jobs.state.store_changes import TOMBSTONE

JoinKind = Literal["inner", "left", "outer"]
#: the stored flags: which sides hold the key
HAS_LEFT, HAS_RIGHT = "has_left", "has_right"
#: the processor's input columns (``streamstate.primitives.TableJoin``)
RIGHT, LEFT_ROW, RIGHT_ROW = "_right", "_left_row", "_right_row"
#: which sides held a key before the batch (the processor's change rows: a result a batch removed is published)
HAD_LEFT, HAD_RIGHT = "had_left", "had_right"
#: which stored keys are a join's results, given which sides hold them
_RESULT = {"inner": "{left} AND {right}", "left": "{left}", "outer": "{left} OR {right}"}


def classify_two_topics(source, right_topic: str, classify_left, classify_right, event):
    """A join's source (both topics' records) decoded and classified in one pass: a left record by
    ``classify_left``, a right one (from ``right_topic``) by ``classify_right`` (each takes a frame and returns it
    with :func:`dead_letter.classify`'s columns). ``event(decoded, right)`` makes the processor's event from a
    side's decoded event column (``right``: the right side's). Returns the source's columns (the value as it was
    read) with the event, the reason and the message of the record's own side."""
    return classify_topics(
        source, (right_topic,), (classify_left, classify_right), lambda decoded, i: event(decoded, i == 1)
    )


def classify_topics(source, join_topics: tuple[str, ...], classifiers: tuple, event):
    """A join's source (all its topics' records) decoded and classified in one pass, as
    :func:`classify_two_topics`: input 0 is the source topic's records (any topic not among ``join_topics``),
    input ``i`` the records of ``join_topics[i - 1]``, each classified by ``classifiers[i]``;
    ``event(decoded, i)`` makes the processor's event from input ``i``'s decoded event column."""
    from pyspark.sql import functions as F

    def of_input(i: int):
        if i > 0:
            return F.col("topic") == F.lit(join_topics[i - 1])
        return ~F.col("topic").isin(*join_topics)

    raw, kept = "_raw_value", [f"`{c}`" for c in source.columns if c != "value"]
    classified = source.withColumn(raw, F.col("value"))
    for i, classify in enumerate(classifiers):
        classified = _side_classified(classified, classify, of_input(i), f"_i{i}", raw)

    def by_input(of, column: str):
        """``of(i, input i's column)`` for the record's own input."""
        chosen = of(0, F.col(f"_i0{column}"))
        for i in range(len(classifiers) - 1, 0, -1):
            chosen = F.when(of_input(i), of(i, F.col(f"_i{i}{column}"))).otherwise(chosen)
        return chosen.alias(column)

    def own(_i, column):
        return column

    decoded = dead_letter.EVENT_COLUMN
    return classified.select(
        *kept,
        F.col(raw).alias("value"),
        by_input(lambda i, column: event(column, i), decoded),
        by_input(own, dead_letter.ERROR_COLUMN),
        by_input(own, dead_letter.MESSAGE_COLUMN),
    )


def _side_classified(frame, classify, mine, tag: str, raw: str):
    """``frame`` with ``classify``'s columns for the records where ``mine`` holds, each named with ``tag`` before
    it. The other side's records are classified as a null value (cheap: nothing to decode), and not this side's
    to judge."""
    from pyspark.sql import functions as F

    masked = frame.withColumn("value", F.when(mine, F.col(raw)))
    decided = classify(masked)
    added = [c for c in decided.columns if c not in masked.columns]
    return decided.select("*", *(F.col(f"`{c}`").alias(tag + c) for c in added)).drop(*added)


@dataclasses.dataclass(frozen=True)
class TableJoin(StoreDeclaration):
    """A job whose outputs are the join of two tables on the job's ``key_field`` (see the module docstring).
    Callable: the job's ``build(ctx)``.

    Attributes:
        store: the ``key_value`` ``StoreSpec`` holding both sides' latest rows per key.
        left: the spec's ``source_topic`` read as a table, keyed by ``(key_field,)``.
        right: the spec's (one) ``join_topics`` read as a table, keyed by ``(key_field,)``.
        join: ``inner`` (``KTable#join``), ``left`` (``leftJoin``) or ``outer`` (``outerJoin``).
        right_prefix: put before each of the right side's field names in the store and the outputs (e.g.
            ``"account_"`` when both tables have an ``updated_at``); a name both sides give is refused.
        summaries: companion outputs recomputed from the outputs after every batch.

    Example (``spark_jobs/reference/jobs/customer_accounts.py``)::

        CUSTOMER_ACCOUNTS = TableJoin(
            store="customer-accounts",
            left=UpsertTable(CUSTOMER_SCHEMA, key=("customer_id",)),
            right=UpsertTable(ACCOUNT_SCHEMA, key=("customer_id",)),
            join="left",
        )
    """

    store: str
    left: UpsertTable
    right: UpsertTable
    join: JoinKind = "inner"
    right_prefix: str = ""
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    store_kinds: ClassVar[tuple[str, ...]] = ("key_value",)

    @property
    def input_kinds(self) -> tuple[InputKind, ...]:
        return (self.left.input_kind, self.right.input_kind)

    @property
    def events(self) -> UpsertTable:  # the input StoreDeclaration checks: the left table (check_primitive: both)
        return self.left

    def _fields(self, table: UpsertTable, prefix: str = "") -> list[T.StructField]:
        """A side's stored fields: every field but the key, named with ``prefix``."""
        return [
            T.StructField(prefix + f.name, f.dataType, nullable=True)
            for f in table.schema.fields
            if f.name not in table.key
        ]

    @property
    def _left_fields(self) -> list[T.StructField]:
        return self._fields(self.left)

    @property
    def _right_fields(self) -> list[T.StructField]:
        return self._fields(self.right, self.right_prefix)

    @property
    def state_ddl(self) -> str:
        """Which sides hold the key, then the left side's fields, then the right side's."""
        fields = [*self._left_fields, *self._right_fields]
        typed = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in fields)
        return f"{HAS_LEFT} BOOLEAN, {HAS_RIGHT} BOOLEAN" + (f", {typed}" if typed else "")

    @property
    def output_values(self) -> tuple[str, ...]:
        return tuple(f.name for f in (*self._left_fields, *self._right_fields))

    def check_primitive(self, spec: JobSpec) -> None:
        if self.join not in get_args(JoinKind):
            raise JobSpecError(f"join: {self.join!r} is not one of {get_args(JoinKind)}")
        if len(spec.join_topics) != 1:
            raise JobSpecError("join_topics: a TableJoin reads its right table from the spec's one join topic")
        if spec.repartition:
            raise JobSpecError(
                "repartition: a table join's sides are tables keyed by their key; re-keying a table by another "
                "field (Kafka Streams' foreign-key join) is not supported"
            )
        for side, table in (("left", self.left), ("right", self.right)):
            table.check(spec.name, spec.key_field)
            if tuple(table.key) != (spec.key_field,):
                raise JobSpecError(
                    f"{side}.key: a table join joins on the tables' key, which must be ({spec.key_field!r},) "
                    f"(the job's key_field), not {tuple(table.key)}"
                )
        if self.right_prefix and not _NAME.match(self.right_prefix + "x"):
            raise JobSpecError(f"right_prefix: {self.right_prefix!r}: use lower-case letters, digits and _")
        seen = {spec.key_field, "key", TOMBSTONE, HAS_LEFT, HAS_RIGHT}
        for name in self.output_values:
            if name in seen:
                raise JobSpecError(
                    f"fields: {name!r} is the key, a reserved name or a field of both tables: give the right "
                    "table's fields a right_prefix"
                )
            seen.add(name)

    def store_rows(self, rows):
        """The stored keys that are the join's results: a batch's change rows with ``tombstone`` also set on a
        key without a result (its output row goes), or the restored keys with one."""
        from pyspark.sql import functions as F

        result = F.coalesce(self._result(HAS_LEFT, HAS_RIGHT), F.lit(False))
        if TOMBSTONE in rows.columns:
            return rows.withColumn(TOMBSTONE, F.col(TOMBSTONE) | ~result)
        return rows.where(result)

    def _result(self, left: str, right: str):
        from pyspark.sql import functions as F

        return F.expr(_RESULT[self.join].format(left=left, right=right))

    @property
    def change_ddl(self) -> str:
        return f"{super().change_ddl}, {HAD_LEFT} BOOLEAN, {HAD_RIGHT} BOOLEAN"

    def output_records(self, batch, key_field: str):
        """The batch's changed results as upsert records (see :meth:`StoreDeclaration.output_records`), but for
        keys that had no result before the batch and have none after it (an inner join's one-sided key
        changing): Kafka Streams publishes nothing for them, and neither does this."""
        from pyspark.sql import functions as F

        had = F.coalesce(self._result(HAD_LEFT, HAD_RIGHT), F.lit(False))
        has = F.coalesce(self._result(HAS_LEFT, HAS_RIGHT), F.lit(False)) & ~F.col(TOMBSTONE)
        return super().output_records(batch.where(had | has), key_field)

    def input_rows(self, ctx):
        """Both topics decoded and classified, each by its own table's rules, in one pass over the source."""
        spec = ctx.spec
        classified = self.classify_sides(ctx.sources.stream(), spec.join_topics[0], spec.key_field)
        return ctx.sources.with_dead_letters(classified, "offset", key=spec.key_field)

    def classify_sides(self, source, right_topic: str, key_field: str):
        """``source`` (both topics' records) classified: a left record by :attr:`left`'s rules, a right one by
        :attr:`right`'s. The event: the key, :data:`RIGHT` (a right table's record), whether it deletes its
        row, and the row's stored fields as a struct of its side (:data:`LEFT_ROW` or :data:`RIGHT_ROW`)."""
        from pyspark.sql import functions as F

        def event(decoded, right: bool):
            rows = {}
            for name, prefix, fields in (
                (LEFT_ROW, "", self._left_fields),
                (RIGHT_ROW, self.right_prefix, self._right_fields),
            ):
                struct = T.StructType(fields)
                if (name == RIGHT_ROW) == right:
                    row = F.struct(*(decoded.getField(f.name[len(prefix) :]).alias(f.name) for f in fields))
                    rows[name] = F.when(~decoded.getField(DELETE_COLUMN), row).cast(struct)
                else:
                    rows[name] = F.lit(None).cast(struct)
            return F.struct(
                decoded.getField(key_field).cast("string").alias(key_field),
                F.lit(right).alias(RIGHT),
                decoded.getField(DELETE_COLUMN).alias(DELETE_COLUMN),
                rows[LEFT_ROW].alias(LEFT_ROW),
                rows[RIGHT_ROW].alias(RIGHT_ROW),
            )

        return classify_two_topics(source, right_topic, self.left.classify, self.right.classify, event)

    def changes(self, events, key_field: str, initial, store, job: str = "?", offset_ordered: bool = False):
        """The store's change rows (``key``, ``tombstone``, :attr:`state_ddl`) for the processor's input,
        seeded with ``initial`` (the restored store) after a restore."""
        from pyspark.sql import DataFrame

        spark = events.sparkSession
        jdf = spark._jvm.streamstate.primitives.TableJoin.changes(
            events._jdf,
            key_field,
            None if initial is None else initial._jdf,
            self.store,
            self.state_ddl,
            len(self._left_fields),
            self.change_ddl,
        )
        return DataFrame(jdf, spark)

    def build(self, ctx, processor=None):
        if processor is not None:
            raise JobSpecError(f"job {ctx.spec.name}: a TableJoin runs its Java processor only")
        return super().build(ctx)
