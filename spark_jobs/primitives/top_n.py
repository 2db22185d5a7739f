"""The top-N primitive: another job's upsert topic read as a table, grouped by a field of its key, and per
group the N rows ranked highest: the second stage of the seeds' two-stage pattern (004, §3.3: per-key
results computed in parallel, written to a topic, finished in one place), e.g. the day's ten largest price
moves over ``stock_price_changes``' closed days.

Semantics, as Kafka Streams' ``builder.table(topic).groupBy(...).aggregate(adder, subtractor)`` over a
sorted set (``streamstate.primitives.TopN``):

- the source is an **upsert topic** (:class:`UpsertTable`): each record's Kafka key is the JSON object of
  the row's key fields (``{"symbol": "S07", "window_start": "2026-03-02T00:00:00.000Z"}``, as a job's
  ``output_topic`` writes it), its value the row as JSON, a null value (a tombstone) deletes the row. A
  record whose value disagrees with its key is a dead letter (reason ``wrong_key``), one whose key is not
  such an object too (``missing_key``); a row's records are applied in offset order;
- the group (the job's ``key_field``) is one of the key's fields, so a tombstone, which carries only the
  key, finds its group (Kafka Streams looks the old row up in the table's store instead);
- per group the store keeps every row (its latest value); the ranking is ``score`` (a Spark SQL
  expression over the row, a DOUBLE) descending (``descending=False``: ascending); a tie goes to the row
  whose ``ties`` fields are smaller, compared in their declared order as Spark orders them (text by its UTF-8
  bytes, as ``ORDER BY`` does), then to the smaller Kafka key (its canonical JSON, the same way); a row whose
  score is null is kept but not ranked;
- the outputs are the ranking: one row per group and rank (``rank`` 1..n) with the ranked row's
  ``fields``, updated after every micro-batch that changed the ranking, a rank deleted when no row holds it
  any more. They are a function of the rows' latest values only, so they do not depend on how the input
  is cut into micro-batches; its order across partitions does not matter either. With the spec's
  ``output_topic`` the ranking also goes to that upsert topic, in the transaction of the batch's markers:
  the key ``{"<group>": ..., "rank": n}``, the value the output row as JSON, a tombstone for a vacated rank.

The changelog is keyed by the row's Kafka key, its value the group, the score and the fields: a restore
rebuilds every group's rows, and the outputs are recomputed from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar, Literal, get_args

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives.keyed_aggregate import _NAME
from spark_jobs.primitives.pipeline import DELETE_COLUMN, StoreDeclaration, resolved
from spark_jobs.registry import InputKind, JobSpec, JobSpecError
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

#: the processor's grouping column: the group field as a string (``streamstate.primitives.TopN``)
GROUP = "_group"
#: the row's identity: its Kafka key, as canonical JSON
MEMBER = "member"
CHANGE, RANK = "change", "rank"


#: how an upsert topic's Kafka key holds the row's key: the JSON object of the key fields, or (one key field) the
#: field's value as UTF-8 text, as a stream keyed by that field has it (what a join's co-partitioning needs)
KeyFormat = Literal["json", "plain"]


@dataclasses.dataclass(frozen=True)
class UpsertTable:
    """An upsert topic read as a table (see the module docstring): ``schema`` the row's fields (its JSON
    value), ``key`` the fields its Kafka key is made of, ``key_format`` how (:data:`KeyFormat`)."""

    schema: T.StructType
    key: tuple[str, ...]
    key_format: KeyFormat = "json"
    input_kind: ClassVar[InputKind] = "table"

    @property
    def key_schema(self) -> T.StructType:
        return T.StructType([self.schema[name] for name in self.key])

    def check(self, job: str, key_field: str) -> None:
        """Refuse a table that cannot run, naming the job and the field."""
        missing = [name for name in self.key if name not in self.schema.fieldNames()]
        if not self.key or missing:
            raise JobSpecError(f"job {job}: table.key: name the key's fields, all fields of the schema ({missing})")
        if self.key_format not in get_args(KeyFormat):
            raise JobSpecError(f"job {job}: table.key_format {self.key_format!r} is not one of {get_args(KeyFormat)}")
        if self.key_format == "plain" and (
            len(self.key) != 1 or not isinstance(self.schema[self.key[0]].dataType, T.StringType)
        ):
            raise JobSpecError(f"job {job}: table.key_format 'plain' is for a key of one STRING field, not {self.key}")
        if key_field not in self.key:
            raise JobSpecError(
                f"job {job}: key_field {key_field!r} (the group) must be one of the table's key fields {self.key}: "
                "a tombstone carries only the key"
            )

    def classify(self, source):
        """``source`` decoded (:func:`dead_letter.decode_json`) and classified: a tombstone is valid, its event
        the key's fields; a record whose Kafka key is not a JSON object of the key fields is ``missing_key``, a
        row whose value's key fields differ from its Kafka key's is ``wrong_key``. Adds :data:`MEMBER`."""
        from pyspark.sql import functions as F

        if self.key_format == "plain":
            key = F.struct(F.nullif(F.col("key").cast("string"), F.lit("")).alias(self.key[0]))
        else:
            key = F.from_json(F.col("key").cast("string"), self.key_schema)
        decoded = dead_letter.decode_json(source, self.schema).withColumn("_table_key", key)
        tombstone = F.col("value").isNull()
        has_key = F.lit(True)
        for name in self.key:
            has_key = has_key & F.col("_table_key").getField(name).isNotNull()
        disagrees = F.lit(False)
        for name in self.key:
            disagrees = disagrees | ~F.col(dead_letter.EVENT_COLUMN).getField(name).eqNullSafe(
                F.col("_table_key").getField(name)
            )
        key_names = ", ".join(self.key)
        rules = [
            (
                dead_letter.MISSING_KEY,
                ~F.coalesce(has_key, F.lit(False)),
                f"the record's Kafka key is not a JSON object of the table's key fields ({key_names})"
                if self.key_format == "json"
                else f"the record has no Kafka key (the table's key is its {key_names})",
            ),
            (
                dead_letter.WRONG_KEY,
                ~tombstone & disagrees,
                f"the row's key fields ({key_names}) are not its Kafka key's",
            ),
        ]
        fields = [
            (F.col("_table_key").getField(f) if f in self.key else F.col(dead_letter.EVENT_COLUMN).getField(f)).alias(f)
            for f in self.schema.fieldNames()
        ]
        event = F.struct(*fields, F.to_json(F.col("_table_key")).alias(MEMBER), tombstone.alias(DELETE_COLUMN))
        classified = dead_letter.classify(
            decoded.withColumn(dead_letter.OBJECT_COLUMN, F.col(dead_letter.OBJECT_COLUMN) | tombstone), rules
        )
        return classified.withColumn(dead_letter.EVENT_COLUMN, event).drop("_table_key")


@dataclasses.dataclass(frozen=True)
class TopN(StoreDeclaration):
    """A job whose outputs are, per group (the spec's ``key_field``, one of the table's key fields), the
    ``n`` rows of ``table`` ranked highest by ``score`` (see the module docstring). Callable: the job's
    ``build(ctx)``.

    Attributes:
        store: the ``StoreSpec`` (kind ``key_value``) holding every row, keyed by its Kafka key.
        table: the upsert topic's rows (:class:`UpsertTable`).
        score: Spark SQL over the row's fields, converted to DOUBLE: what ranks it.
        n: how many ranks each group keeps.
        descending: the highest score first (False: the lowest).
        fields: the row's fields the outputs show after the group and ``rank`` (default: every field but the group).
        ties: shown fields that break a tie of scores, the smaller first, before the Kafka key does (e.g.
            ``("symbol",)``: the rule a batch step's ``ORDER BY change DESC, symbol`` states).

    Example (``spark_jobs/reference/jobs/top_movers.py``)::

        TOP_MOVERS = TopN(
            store="day-members",
            table=UpsertTable(DAILY_CHANGE_SCHEMA, key=("symbol", "window_start")),
            score="change",
            n=10,
            fields=("symbol", "change", "ticks"),
            ties=("symbol",),
        )
    """

    store: str
    table: UpsertTable
    score: str
    n: int = 10
    descending: bool = True
    fields: tuple[str, ...] = ()
    ties: tuple[str, ...] = ()
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    store_kinds: ClassVar[tuple[str, ...]] = ("key_value",)

    @property
    def events(self) -> UpsertTable:  # the input, as StoreDeclaration names it
        return self.table

    def shown_fields(self, key_field: str) -> tuple[str, ...]:
        return self.fields or tuple(f for f in self.table.schema.fieldNames() if f != key_field)

    def _member_ddl(self, key_field: str) -> str:
        """A stored row: its score, then the fields the outputs show."""
        schema = self.table.schema
        fields = ", ".join(f"`{f}` {schema[f].dataType.simpleString()}" for f in self.shown_fields(key_field))
        return f"score DOUBLE, {fields}"

    def state_ddl_for(self, key_field: str) -> str:
        return f"{GROUP} STRING, {self._member_ddl(key_field)}"

    def output_ddl_for(self, key_field: str) -> str:
        return f"kind STRING, key STRING, {TOMBSTONE} BOOLEAN, {GROUP} STRING, rank INT, {self._member_ddl(key_field)}"

    def store_changes_for(self, key_field: str) -> StoreChanges:
        return StoreChanges(self.store, self.state_ddl_for(key_field), rows=f"kind = '{CHANGE}'")

    def output_key(self, key_field: str) -> tuple[str, ...]:
        return (key_field, "rank")

    def output_schema(self, key_field: str) -> T.StructType:
        """The outputs: the group (typed as in the table), ``rank``, then the shown fields."""
        schema = self.table.schema
        return T.StructType(
            [
                T.StructField(key_field, schema[key_field].dataType, nullable=False),
                T.StructField("rank", T.IntegerType(), nullable=False),
                *(schema[f] for f in self.shown_fields(key_field)),
            ]
        )

    def check_primitive(self, spec: JobSpec) -> None:
        if spec.repartition:
            raise JobSpecError("repartition: a TopN groups its table's rows itself; the table is keyed by its key")
        if self.n < 1:
            raise JobSpecError(f"n: rank at least one row, not {self.n}")
        names = self.table.schema.fieldNames()
        for name in self.shown_fields(spec.key_field):
            if name not in names or name == spec.key_field:
                raise JobSpecError(f"fields.{name}: not a field of the table's schema other than the group")
            if not _NAME.match(name) or name in ("rank", "score", "key", "kind", TOMBSTONE, MEMBER):
                raise JobSpecError(f"fields.{name}: use lower-case letters, digits and _, and not rank or score")
        for name in self.ties:
            if name not in self.shown_fields(spec.key_field):
                raise JobSpecError(
                    f"ties.{name}: a tie is broken by fields the outputs show, {self.shown_fields(spec.key_field)}"
                )

    def classify(self, source, key_field: str):
        from pyspark.sql import functions as F

        classified = self.table.classify(source)
        group = F.col(dead_letter.EVENT_COLUMN).getField(key_field).cast("string")
        return classified.withColumn(dead_letter.EVENT_COLUMN, F.col(dead_letter.EVENT_COLUMN).withField(GROUP, group))

    def changes(self, events, key_field: str, initial, store, job: str = "?", offset_ordered: bool = False):
        """The processor's rows (:meth:`output_ddl_for`) for ``events`` (the classified rows with the source's
        ``partition`` and ``offset``), seeded with ``initial`` (the restored store) after a restore."""
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        score = resolved(events, job, "score", F.expr(self.score)).try_cast("double")
        letter = [dead_letter.LETTER_COLUMN] if dead_letter.LETTER_COLUMN in events.columns else []
        needed = events.select(
            GROUP,
            MEMBER,
            "partition",
            "offset",
            F.coalesce(F.col(DELETE_COLUMN), F.lit(False)).alias(DELETE_COLUMN),
            score.alias("score"),
            *(F.col(f"`{f}`") for f in self.shown_fields(key_field)),
            *letter,
        )
        spark = events.sparkSession
        jdf = spark._jvm.streamstate.primitives.TopN.changes(
            needed._jdf,
            GROUP,
            None if initial is None else initial._jdf,
            self.store,
            self._member_ddl(key_field),
            self.n,
            self.descending,
            ",".join(self.ties),
            self.output_ddl_for(key_field),
        )
        return DataFrame(jdf, spark)

    def build(self, ctx, processor=None):
        """The job's query: :class:`StoreDeclaration`'s pipeline over the table, with the ranking's sink."""
        spec = ctx.spec
        if processor is not None:
            raise JobSpecError(f"job {spec.name}: a TopN runs its Java processor only")
        self.check(spec)
        key_field, store = spec.key_field, store_spec(spec, self.store)
        ctx.outputs.ensure_table(self.output_schema(key_field))
        classified = self.classify(ctx.sources.stream(), key_field)
        events = ctx.sources.with_dead_letters(classified, "partition", "offset", key=GROUP)
        changes = self.store_changes_for(key_field)
        rows = self.changes(events, key_field, ctx.stores.initial_state(changes), store, job=spec.name)
        write_outputs, reconcile_outputs = self._ranking_writers(ctx, key_field)
        output_records = None
        if ctx.outputs.ensure_topic():

            def output_records(batch):
                return self.output_records(batch, key_field)

        sink = ctx.state_change_sink(changes, write_outputs, reconcile_outputs, output_records)
        return rows.writeStream.outputMode("update").foreachBatch(sink)

    def _ranked(self, rows, key_field: str):
        """Rank rows (or a recomputed ranking) as output rows: the group typed as in the table, ``rank``, the
        shown fields, and whether the rank is vacated (``tombstone``)."""
        from pyspark.sql import functions as F

        group = F.col(GROUP).cast(self.table.schema[key_field].dataType).alias(key_field)
        return rows.select(group, "rank", *(F.col(f"`{f}`") for f in self.shown_fields(key_field)), TOMBSTONE)

    def output_records(self, batch, key_field: str):
        """A batch's rank changes as upsert records for the job's output topic: the key the JSON object of the
        group and ``rank`` (``{"window_start": "2026-03-02T00:00:00.000Z", "rank": 1}``), the value the output
        row as JSON, null for a vacated rank. A restore's recomputed ranking needs no records: the topic holds
        the ranking of the last committed batch, which is what the changelog restores."""
        from pyspark.sql import functions as F

        rows = self._ranked(batch.where(f"kind = '{RANK}'"), key_field)
        columns = [F.col(f"`{c}`") for c in rows.columns if c != TOMBSTONE]
        return rows.select(
            F.to_json(F.struct(key_field, "rank")).cast("binary").alias("key"),
            F.when(~F.col(TOMBSTONE), F.to_json(F.struct(*columns))).cast("binary").alias("value"),
        )

    def _ranking_writers(self, ctx, key_field: str):
        """A batch's rank rows upserted into the outputs (a vacated rank deleted); after a restore, the ranking
        recomputed from the restored rows (see ``JobContext.state_change_sink``)."""
        from delta.tables import DeltaTable
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        output_path, outputs = str(ctx.layout.output_table), ctx.outputs.table((key_field, "rank"))
        columns = (key_field, "rank", *self.shown_fields(key_field))
        on = f"t.`{key_field}` = s.`{key_field}` AND t.rank = s.rank"
        assign = {f"`{c}`": f"s.`{c}`" for c in columns}

        def write_outputs(batch, _batch_id: int, commit) -> None:
            outputs.upsert(self._ranked(batch.where(f"kind = '{RANK}'"), key_field), commit, gone=TOMBSTONE)

        def reconcile_outputs(restored) -> None:
            order = F.col("score").desc() if self.descending else F.col("score").asc()
            window = Window.partitionBy(GROUP).orderBy(order, *(F.col(f"`{f}`") for f in self.ties), F.col("key"))
            ranking = (
                restored.where(F.col("score").isNotNull())
                .withColumn("rank", F.row_number().over(window))
                .where(F.col("rank") <= self.n)
                .withColumn(TOMBSTONE, F.lit(False))
            )
            (
                DeltaTable.forPath(restored.sparkSession, output_path)
                .alias("t")
                .merge(self._ranked(ranking, key_field).drop(TOMBSTONE).alias("s"), on)
                .whenMatchedUpdate(set=assign)
                .whenNotMatchedInsert(values=assign)
                .whenNotMatchedBySourceDelete()
                .execute()
            )

        return write_outputs, reconcile_outputs
