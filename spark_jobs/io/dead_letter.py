"""Bad input never stops a job: it goes to the job's dead-letter topic, with why and where from.

A job decodes its raw Kafka records and names, per record, the first rule it breaks
(:func:`classify`). Each record is decoded once (:func:`decode_json`) into three columns the rules read:
whether it is a JSON object, the event (its fields converted to the job's schema, as Spark's
``from_json`` converts them) and each field as the record wrote it (for the rules that must tell
"absent" from "did not convert", or check a number's digits). A schema of flat fields is decoded by the
platform's JVM decoder in one pass over the bytes (``streamstate.primitives.JsonDecoder``); any other
schema by Spark's ``from_json`` and ``try_parse_json``, which parse the text twice. Both decode alike
(tests/spark_jobs/test_json_decoder.py); none of the rules parses the text again.

One query per job reads and classifies the input once (:func:`with_dead_letters`): every record goes on to
the job's processor, a rejected one carrying its dead-letter record in :data:`LETTER_COLUMN` and no event
fields. The processor never sees rejected records: a wrapper (:class:`PassingLetters` for a Python
processor, ``streamstate.jobs.DeadLetters`` for a Java one) sets them aside and emits each as an output row
of its own, and the job's sink writes them to ``<application_id>-dead-letter`` in the same micro-batch,
before the batch's outputs and changelog (``JobContext.state_change_sink``): the original key and value
bytes untouched, and headers (Kafka Connect's DLQ convention) with the reason, a message, and the source
topic, partition and offset. Like any Kafka sink it is at-least-once: a replayed batch writes its dead
letters again (the source coordinates identify repeats).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Literal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from runtime.kafka_connection import KafkaTarget, as_connection
from spark_jobs.layout import dead_letter_topic_name

ERROR_COLUMN = "_dead_letter_reason"
#: what :func:`decode_json` adds: whether the record is a JSON object, the event's struct, and each field as
#: the record wrote it (a struct of strings)
OBJECT_COLUMN, EVENT_COLUMN, WRITTEN_COLUMN = "_object", "_event", "_written"
#: how a record is decoded (see :func:`decode_json`)
Decoder = Literal["jvm", "spark"]
MESSAGE_COLUMN = "_dead_letter_message"
#: a rejected record's dead letter (its Kafka key, value and headers) on its row; null on a valid one. The
#: Java wrapper's name for it is ``streamstate.jobs.DeadLetters.COLUMN`` (tests/spark_jobs/test_shared_names.py).
LETTER_COLUMN = "_dead_letter"
UNDECODABLE = "undecodable"
MISSING_KEY = "missing_key"
#: a record whose Kafka key is not its key field: applied, it would be counted in another partition's task
WRONG_KEY = "wrong_key"
UNKNOWN_TYPE = "unknown_event_type"
INVALID = "failed_validation"
#: an event for a window that had already closed (found by the job, not by classify)
LATE = "late"

HEADER_PREFIX = "streamstate.dlq."


def dead_letter_topic(application_id: str) -> str:
    return dead_letter_topic_name(application_id)


def decode_json(raw: DataFrame, schema: T.StructType, decoder: Decoder | None = None) -> DataFrame:
    """``raw`` (the Kafka source DataFrame) with :data:`OBJECT_COLUMN` (the value is UTF-8 holding a JSON
    object: not a scalar, array or garbage), :data:`EVENT_COLUMN` (its fields converted to ``schema`` as
    ``from_json`` converts them: a value that does not convert is null) and :data:`WRITTEN_COLUMN` (each
    field as the record wrote it, see :func:`written`).

    ``decoder``: ``"jvm"`` parses each record once (schemas of flat fields: string, boolean, integers, float,
    double, decimal, timestamp); ``"spark"`` uses ``from_json`` and ``try_parse_json`` (any schema, two
    parses). Default: ``"jvm"`` when it reads the schema."""
    jvm_decoder = raw.sparkSession._jvm.streamstate.primitives.JsonDecoder
    if decoder is None:
        decoder = "jvm" if jvm_decoder.reads(schema.json()) else "spark"
    if decoder == "spark":
        return _decoded_by_spark(raw, schema)
    from pyspark.sql.classic.column import Column as JvmColumn

    zone = raw.sparkSession.conf.get("spark.sql.session.timeZone")
    decoded = JvmColumn(jvm_decoder.decode(F.col("value")._jc, schema.json(), zone))
    # One projection decodes each record (the optimizer keeps an expensive expression that is read several
    # times in its own projection instead of inlining it into every column that reads it).
    parts = raw.select("*", decoded.alias("_decoded"))
    decoded_parts = (F.col("_decoded").getField(part).alias(column) for part, column in _DECODED_PARTS)
    return parts.select(*(F.col(f"`{c}`") for c in raw.columns), *decoded_parts)


_DECODED_PARTS = (("object", OBJECT_COLUMN), ("event", EVENT_COLUMN), ("written", WRITTEN_COLUMN))


def _decoded_by_spark(raw: DataFrame, schema: T.StructType) -> DataFrame:
    """:func:`decode_json` with Spark's functions: ``from_json`` to the schema, ``try_parse_json`` to a variant
    for the object check and the written fields."""
    text, json = "_text", "_json"
    parsed = raw.select(
        "*",
        F.col("value").cast("string").alias(text),
        F.expr("try_parse_json(CAST(value AS STRING))").alias(json),
        F.from_json(F.col("value").cast("string"), schema).alias(EVENT_COLUMN),
    )
    # parsed, and JSON text whose first non-blank character opens an object (cheaper than asking the
    # variant its schema, which describes every field)
    is_object = F.coalesce(
        F.expr(f"is_valid_utf8({text}) AND {json} IS NOT NULL AND {text} RLIKE '^[ \\t\\n\\r]*[{{]'"), F.lit(False)
    )
    written_fields = [F.expr(f"variant_get({json}, '$.{f}', 'string')").alias(f) for f in schema.fieldNames()]
    written_struct = F.struct(*written_fields).alias(WRITTEN_COLUMN)
    return parsed.select(
        *(F.col(f"`{c}`") for c in raw.columns), is_object.alias(OBJECT_COLUMN), EVENT_COLUMN, written_struct
    )


def written(field: str) -> Column:
    """The record's ``field`` (of the event schema) as its JSON text wrote it: a string; null when absent or
    JSON null. A number as a variant holds it (``12.50`` is ``12.5``, ``1.5e2`` is ``150.0``)."""
    return F.col(WRITTEN_COLUMN).getField(field)


#: Why a rule rejects a record, in words for the person reading the dead letter: a text, or a column
#: (e.g. naming the offending value).
Message = str | Column
#: (reason, condition that means the record breaks it) or (reason, condition, message).
Rule = tuple[str, Column] | tuple[str, Column, Message]


def classify(decoded: DataFrame, rules: Sequence[Rule]) -> DataFrame:
    """Add :data:`ERROR_COLUMN` (the first broken rule, or null) and :data:`MESSAGE_COLUMN` (that rule's
    message) to ``decoded`` (see :func:`decode_json`). ``rules`` are checked in order after "undecodable"."""
    checked = [(UNDECODABLE, ~F.col(OBJECT_COLUMN), "the value is not a JSON object in UTF-8"), *rules]
    # Each condition is evaluated once per record, in its own projection: the reason and the message are
    # then read from the first broken rule's number, by index. Not by comparing it with each rule's number:
    # Spark inlines the number into every filter over the classified rows (the processor's input is one)
    # and rewrites `number = n` into a copy of the whole rule chain per rule, a generated method too large
    # for the JIT (8,000 bytes of bytecode), interpreted ten times slower. Indexing keeps one copy, which
    # Spark's subexpression elimination evaluates once. (The guard is needed: element_at of a literal
    # array is declared non-null even for a null index, and Spark would drop a null check on it.)
    first_broken = F.when(checked[0][1], F.lit(0))
    for n, (_, broken, *_) in enumerate(checked[1:], start=1):
        first_broken = first_broken.when(broken, F.lit(n))
    numbered = decoded.withColumn(_FIRST_BROKEN, first_broken)
    number = F.col(_FIRST_BROKEN)

    def by_number(values: list[Column]) -> Column:
        return F.when(number.isNotNull(), F.element_at(F.array(*values), number + 1))

    messages = []
    for name, _, *why in checked:
        text_or_column = why[0] if why else name
        messages.append(F.lit(text_or_column) if isinstance(text_or_column, str) else text_or_column)
    reason, message = by_number([F.lit(name) for name, *_ in checked]), by_number(messages)
    return numbered.withColumn(ERROR_COLUMN, reason).withColumn(MESSAGE_COLUMN, message).drop(_FIRST_BROKEN)


_FIRST_BROKEN = "_first_broken_rule"


def event(field: str) -> Column:
    """A field of the decoded event inside a rule (the struct :func:`classify` adds)."""
    return F.col(f"{EVENT_COLUMN}.{field}")


#: The event times a job accepts. Spark parses timestamps Python cannot hold (year 1 in a zone west of
#: UTC is year 0 to Python's datetime), and the jobs' state processors are Python: one such event
#: would fail every retry of its batch. A time outside this range is a producer's bug in any case.
EVENT_TIME_RANGE = ("1970-01-01 00:00:00", "2200-01-01 00:00:00")


def bad_event_time(field: str = "event_time", required: bool = True) -> Column:
    """Outside :data:`EVENT_TIME_RANGE`, or (when ``required``) missing or unparseable: a rule for
    :func:`classify_events`."""
    earliest, latest = (F.expr(f"TIMESTAMP '{t} UTC'") for t in EVENT_TIME_RANGE)
    return F.coalesce((event(field) < earliest) | (event(field) >= latest), F.lit(required)) | unparsed(field)


def inexact_decimal(field: str, precision: int, scale: int) -> Column:
    """The record's ``field`` is present but not a number that ``DECIMAL(precision, scale)`` holds
    exactly: more decimal places than ``scale`` (from_json would round 2.995 to 3.00 and -0.001 to
    0.00), more integer digits than fit, or not a number. A rule for :func:`classify_events`; a value
    is never rounded to fit."""
    integer_digits = precision - scale
    # The value as the JSON text wrote it (a decimal keeps its digits in a variant; an exponent form
    # is a double and is accepted only when it prints as a plain decimal, e.g. 1.5e2 -> 150.0).
    fits = f"^[-+]?0*[0-9]{{1,{integer_digits}}}([.][0-9]{{0,{scale}}}0*)?$"
    return written(field).isNotNull() & ~written(field).rlike(fits)


def decimal_message(field: str, precision: int, scale: int) -> Column:
    """The dead-letter message of :func:`inexact_decimal`, naming the field and the value."""
    return F.concat(
        F.lit(f"{field}: "),
        written(field),
        F.lit(f" does not fit DECIMAL({precision},{scale}) exactly (never rounded)"),
    )


def unparsed(field: str) -> Column:
    """The record has ``field`` but it did not parse to the schema's type (from_json silently makes it
    null: a wrong-typed value would otherwise pass as "absent")."""
    return written(field).isNotNull() & event(field).isNull()


def classify_events(
    raw: DataFrame,
    schema,
    key_field: str,
    event_types: Sequence[str] | None,
    invalid: Column | Sequence[tuple[Column, Message]] | None = None,
    decoder: Decoder | None = None,
    check_key: bool = True,
) -> DataFrame:
    """:func:`classify` for JSON events with a key field and a ``type``: missing key, wrong key (the record's
    Kafka key is not its key field; only when ``raw`` has Kafka's ``key`` column), unknown type (not
    checked when ``event_types`` is None), then ``invalid``, in that order. ``invalid`` is a condition over
    :func:`event` fields, or (condition, message) pairs: the first broken one names the :data:`INVALID`
    record's message. ``decoder``: see :func:`decode_json`. ``check_key``: False for a source the job
    re-keys (``JobSpec.repartition``)."""
    rules: list[Rule] = [
        (MISSING_KEY, F.coalesce(F.length(event(key_field)) == 0, F.lit(True)), f"{key_field} is missing or empty")
    ]
    if check_key and "key" in raw.columns:
        rules.append(wrong_key_rule(key_field))
    if event_types is not None:
        unknown = F.concat(
            F.lit("type "),
            F.coalesce(event("type"), F.lit("(missing)")),
            F.lit(f" is not one of {', '.join(event_types)}"),
        )
        rules.append((UNKNOWN_TYPE, ~F.coalesce(event("type").isin(*event_types), F.lit(False)), unknown))
    if isinstance(invalid, Column):
        rules.append((INVALID, invalid))
    elif invalid is not None:
        rules.extend((INVALID, broken, message) for broken, message in invalid)
    return classify(decode_json(raw, schema, decoder), rules)


def wrong_key_rule(key_field: str) -> Rule:
    """The record's Kafka key is not its ``key_field`` (as UTF-8), or it has none. A job's state lives in the
    task of the key's partition: a key whose records are spread over partitions (producers without a key,
    or keyed by another field) would be counted apart in several tasks, so such a record is refused, never
    applied; a job whose source is keyed otherwise declares ``repartition=True`` (Kafka Streams' rule: a
    stateful step reads records keyed by its key, re-keyed through a repartition topic when they are not)."""
    kafka_key = F.col("key")
    wrong = F.coalesce(kafka_key != F.encode(event(key_field), "UTF-8"), F.lit(True))
    shown = F.coalesce(F.concat(F.lit("'"), kafka_key.cast("string"), F.lit("'")), F.lit("none"))
    message = F.concat(
        F.lit("the record's Kafka key is "),
        shown,
        F.lit(f", not its {key_field} '"),
        event(key_field),
        F.lit(f"': the source must be keyed by {key_field} (or the job declare repartition=True)"),
    )
    return (WRONG_KEY, wrong, message)


def valid(classified: DataFrame, *source_columns: str) -> DataFrame:
    """The decoded fields of the records that broke no rule, plus the named Kafka source columns
    (e.g. ``"offset"`` to process a key's records in log order)."""
    return classified.where(F.col(ERROR_COLUMN).isNull()).select(f"{EVENT_COLUMN}.*", *source_columns)


#: a re-keyed record's place in the source, beside the repartition topic's own columns (JobSources.stream):
#: a dead letter names it, so that both stages' letters name their record's place in the job's source topic
ORIGIN_COLUMNS = ("_origin_topic", "_origin_partition", "_origin_offset")


def letter_columns(application_id: str) -> list[Column]:
    """key, value and headers of the dead-letter record of a rejected row of a classified source (see
    :func:`classify`)."""
    return _letter_columns(True, application_id)


def _letter_columns(has_message: bool, application_id: str, origin: bool = False) -> list[Column]:
    """key, value and headers of the dead-letter record of a rejected row (see :func:`dead_letter_records`)."""
    return [F.expr(column) for column in _letter_sql(has_message, application_id, origin)]


def _letter_sql(has_message: bool, application_id: str, origin: bool = False) -> list[str]:
    """:func:`_letter_columns` as SQL text: a frame built every micro-batch (a processor's late events) takes it in
    one call into the JVM, where a Column per header field is a call each. ``origin``: the frame has
    :data:`ORIGIN_COLUMNS`, which name the record's place where they are set (a re-keyed record's)."""

    def header(name: str, value: str) -> str:
        return (
            f"named_struct('key', {sql_string(HEADER_PREFIX + name)}, 'value', CAST(CAST({value} AS STRING) AS BINARY))"
        )

    why = f"`{ERROR_COLUMN}`"
    if has_message:
        why = f"coalesce(`{MESSAGE_COLUMN}`, {why})"
    headers = [
        header("reason", f"`{ERROR_COLUMN}`"),
        header("message", f"concat({sql_string(f'record rejected by {application_id}: ')}, {why})"),
        *(
            header(f"source.{name}", f"coalesce(`{column}`, `{name}`)" if origin else f"`{name}`")
            for name, column in zip(("topic", "partition", "offset"), ORIGIN_COLUMNS, strict=True)
        ),
        header("source.timestamp", "`timestamp`"),
    ]
    return ["`key`", "`value`", f"array({', '.join(headers)}) AS headers"]


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def dead_letter_records(rejected: DataFrame, application_id: str) -> DataFrame:
    """Kafka records (key, value, headers) for rejected input: raw key and value bytes untouched, the
    reason and the source coordinates in headers. ``rejected`` has the Kafka source columns (key,
    value, topic, partition, offset, timestamp), :data:`ERROR_COLUMN` and, optionally,
    :data:`MESSAGE_COLUMN`."""
    return rejected.selectExpr(*_letter_sql(MESSAGE_COLUMN in rejected.columns, application_id))


def with_dead_letters(
    classified: DataFrame, application_id: str, key_field: str | None, *source_columns: str
) -> DataFrame:
    """Every record of ``classified`` for the job's processor: the decoded fields and the named Kafka
    source columns, and :data:`LETTER_COLUMN`, the dead-letter record of a rejected one (null on a valid
    one). A rejected record's decoded fields are null (the processor never reads them, and a Python worker
    could not even hold some of them, see :data:`EVENT_TIME_RANGE`) but for ``key_field``, kept ("" when
    missing) so that rejected records spread over the processor's groups like the valid ones."""
    rejected = F.col(ERROR_COLUMN).isNotNull()
    decoded = [
        F.coalesce(event(f), F.lit("")).alias(f) if f == key_field else F.when(~rejected, event(f)).alias(f)
        for f in classified.schema[EVENT_COLUMN].dataType.fieldNames()
    ]
    origin = ORIGIN_COLUMNS[0] in classified.columns
    letter = F.when(rejected, F.struct(*_letter_columns(True, application_id, origin))).alias(LETTER_COLUMN)
    return classified.select(*decoded, *source_columns, letter)


def write_letters(letters: DataFrame, application_id: str, kafka: KafkaTarget) -> None:
    """Batch-write dead-letter records (key, value, headers) to the job's dead-letter topic."""
    (
        letters.write.format("kafka")
        .options(**as_connection(kafka).spark_options())
        .option("kafka.acks", "all")
        .option("topic", dead_letter_topic(application_id))
        .save()
    )


def count_by_reason(letters: DataFrame) -> dict[str, int]:
    """Dead-letter records (key, value, headers) counted by their reason header: one Spark job, empty when
    there are none (what a caller asks before writing them)."""
    rows = letters.selectExpr(f"{_reason('headers')} AS reason").groupBy("reason").count().collect()
    return {row["reason"]: int(row["count"]) for row in rows}


@dataclasses.dataclass(frozen=True)
class BatchCount:
    """A processor's output rows of one micro-batch, counted by the Spark job that materialises them."""

    #: the rows by the reason of the dead letter they carry (:data:`LETTER_COLUMN`), None counting the rows that
    #: carry none (the processor's own); a reason no row has is absent
    by_reason: dict[str | None, int]
    #: per name given to :func:`count_batch`, how many of the processor's own rows meet its condition
    matching: dict[str, int] = dataclasses.field(default_factory=dict)


def count_batch(batch: DataFrame, conditions: Mapping[str, str] | None = None) -> BatchCount:
    """A processor's output rows counted by dead-letter reason, and, among its own rows (no letter), those meeting
    each of ``conditions`` (name -> SQL condition, e.g. the change rows of a store).

    One Spark job runs the batch's plan and counts its rows as they pass (:func:`observed_counts`: no shuffle of
    its own, where a grouped count adds a stage); the dead letters are counted by reason in a second one only
    when the batch holds any (from its cached rows, when the caller persisted it)."""
    names = list(conditions or {})
    letter = f"`{LETTER_COLUMN}`"
    lettered = LETTER_COLUMN in batch.columns
    own = f"{letter} IS NULL" if lettered else "true"
    aggregates = {"rows": f"count_if({own})", **({"letters": f"count({letter})"} if lettered else {})}
    aggregates.update({f"matching_{i}": f"count_if({own} AND ({conditions[name]}))" for i, name in enumerate(names)})
    counts = observed_counts(batch, **aggregates)
    by_reason: dict[str | None, int] = {None: counts["rows"]} if counts["rows"] else {}
    if counts.get("letters"):
        by_reason.update(count_by_reason(batch.where(f"{letter} IS NOT NULL").select(f"{letter}.*")))
    matching = {name: counts[f"matching_{i}"] for i, name in enumerate(names)}
    return BatchCount(by_reason, matching)


def letter_reasons(batch: DataFrame) -> DataFrame:
    """One row per row of a processor's output: whether it carries a dead letter (:data:`LETTER_COLUMN`) and
    the letter's reason; read into the driver with the batch's other rows, :func:`counted_reasons` counts them
    as :func:`count_batch` would, without a Spark job of their own."""
    if LETTER_COLUMN not in batch.columns:
        return batch.selectExpr("false AS lettered", "CAST(NULL AS STRING) AS reason")
    letter = f"`{LETTER_COLUMN}`"
    return batch.selectExpr(f"{letter} IS NOT NULL AS lettered", f"{_reason(f'{letter}.headers')} AS reason")


def counted_reasons(reasons) -> dict[str | None, int]:
    """:func:`letter_reasons`'s rows (a ``pyarrow.Table``) counted by reason, None counting the processor's rows
    (:attr:`BatchCount.by_reason`)."""
    import pyarrow.compute as pc

    lettered = reasons.column("lettered")
    rows = reasons.num_rows - (pc.sum(lettered).as_py() or 0)
    counts: dict[str | None, int] = {None: rows} if rows else {}
    for reason in reasons.filter(lettered).column("reason").to_pylist():
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def without_letters(batch: DataFrame, some: bool = True) -> DataFrame:
    """A processor's output rows that carry no dead letter, without :data:`LETTER_COLUMN`; ``some=False`` when
    none is known to carry one (the column goes, without a filter to plan)."""
    if LETTER_COLUMN not in batch.columns:
        return batch
    if not some:
        return batch.drop(LETTER_COLUMN)
    return batch.where(f"`{LETTER_COLUMN}` IS NULL").drop(LETTER_COLUMN)


def observed_counts(frame: DataFrame, **aggregates: str) -> dict[str, int]:
    """The values of SQL aggregates (name -> expression) over ``frame``'s rows, observed while one Spark job
    runs its plan into Spark's ``noop`` sink: the rows are not shuffled to one place to be aggregated, and a
    persisted frame is materialised by it (its cache filled)."""
    from pyspark.sql import Observation

    observation = Observation("streamstate_counts")
    columns = [F.expr(sql).alias(name) for name, sql in aggregates.items()]
    frame.observe(observation, *columns).write.format("noop").mode("overwrite").save()
    return {name: int(observation.get[name]) for name in aggregates}


def _reason(headers: str) -> str:
    """The reason header of a dead letter's ``headers`` (SQL of that column), as SQL."""
    return (
        f"CAST(element_at(filter({headers}, h -> h.key = {sql_string(HEADER_PREFIX + 'reason')}), 1).value AS STRING)"
    )


def write_dead_letters(rejected: DataFrame, application_id: str, kafka: KafkaTarget) -> None:
    """Batch-write rejected records found inside a job's micro-batch (e.g. late events)."""
    write_letters(dead_letter_records(rejected, application_id), application_id, kafka)


class PassingLetters(StatefulProcessor):
    """A Python processor over input that carries :data:`LETTER_COLUMN`: rejected rows are set aside (the
    processor never sees them) and each leaves as an output row of its own, the processor's columns null;
    the processor's rows leave with the column null. The processor is only called with input. Built by
    :func:`passing_letters`; the twin of ``streamstate.jobs.DeadLetters`` for Java processors."""

    def __init__(self, inner: StatefulProcessor, fields: list[str]) -> None:
        self.inner, self.fields = inner, fields

    def init(self, handle) -> None:
        self.inner.init(handle)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - Spark's processor API
        from pyspark.sql import Row

        valid = []
        for row in rows:
            letter = row[LETTER_COLUMN]
            if letter is None:
                valid.append(row)
            else:
                yield Row(**dict.fromkeys(self.fields), **{LETTER_COLUMN: letter})
        if valid:
            yield from self._widened(self.inner.handleInputRows(key, iter(valid), timerValues))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):  # noqa: N802
        yield from self._widened(self.inner.handleExpiredTimer(key, timerValues, expiredTimerInfo))

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: N802
        self.inner.handleInitialState(key, initialState, timerValues)

    def close(self) -> None:
        self.inner.close()

    def _widened(self, rows):
        from pyspark.sql import Row

        for row in rows or ():
            # by name: a processor keeping several stores emits each store's columns only
            values = row.asDict() if hasattr(row, "__fields__") else dict(zip(self.fields, row, strict=False))
            yield Row(**{**dict.fromkeys(self.fields), **values, LETTER_COLUMN: None})


def passing_letters(events: DataFrame, processor: StatefulProcessor, output_ddl: str):
    """``(processor, output DDL)`` for ``transformWithState`` over ``events``: wrapped in
    :class:`PassingLetters`, with the dead-letter column added to the output, when ``events`` carry
    :data:`LETTER_COLUMN`; as given otherwise."""
    from pyspark.sql import types as T

    if LETTER_COLUMN not in events.columns:
        return processor, output_ddl
    fields = T._parse_datatype_string(output_ddl).fieldNames()
    letter = events.schema[LETTER_COLUMN].dataType.simpleString()
    return PassingLetters(processor, fields), f"{output_ddl}, {LETTER_COLUMN} {letter}"
