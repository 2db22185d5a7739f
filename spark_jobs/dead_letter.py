"""Bad input never stops a job: it goes to the job's dead-letter topic, with why and where from.

A job decodes its raw Kafka records and names, per record, the first rule it breaks
(:func:`classify`). Each record's text is parsed twice, in one projection: ``from_json`` to the job's
schema (the struct the rules and the job read) and ``try_parse_json`` to a variant (what the text
wrote, for the rules that must tell "absent" from "did not parse" or check a number's digits). The
rules read those two columns; none parses the text again. Valid records feed the job; the others are
written by a second, stateless streaming query of the same job to ``<application_id>-dead-letter``: the
original key and value bytes untouched, and headers (Kafka Connect's DLQ convention) with the reason, a
message, and the source topic, partition and offset. That query keeps its own checkpoint inside the
job's, so it restarts with the job; like any Kafka sink it is at-least-once (source coordinates identify
repeats).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from runtime.kafka_connection import KafkaTarget, as_connection
from spark_jobs.layout import dead_letter_topic_name

ERROR_COLUMN = "_dead_letter_reason"
#: the record's text, its variant (``try_parse_json``: null when it is not JSON) and its decoded struct
TEXT_COLUMN, JSON_COLUMN, EVENT_COLUMN = "_text", "_json", "_event"
MESSAGE_COLUMN = "_dead_letter_message"
UNDECODABLE = "undecodable"
MISSING_KEY = "missing_key"
UNKNOWN_TYPE = "unknown_event_type"
INVALID = "failed_validation"
#: an event for a window that had already closed (found by the job, not by classify)
LATE = "late"

HEADER_PREFIX = "streamstate.dlq."


def dead_letter_topic(application_id: str) -> str:
    return dead_letter_topic_name(application_id)


def is_json_object(text_column: str = TEXT_COLUMN, json_column: str = JSON_COLUMN) -> Column:
    """True when the text column is valid UTF-8 holding a JSON object (not a scalar, array or garbage),
    by its variant column. Spark's from_json alone cannot tell: it yields an all-null struct for garbage."""
    # parsed, and JSON text whose first non-blank character opens an object (cheaper than asking the
    # variant its schema, which describes every field)
    check = f"is_valid_utf8({text_column}) AND {json_column} IS NOT NULL AND {text_column} RLIKE '^[ \\t\\n\\r]*[{{]'"
    return F.coalesce(F.expr(check), F.lit(False))


def written(field: str) -> Column:
    """The record's ``field`` as its JSON text wrote it (a string; null when absent or JSON null), from the
    variant :func:`classify` parsed once."""
    return F.expr(f"variant_get({JSON_COLUMN}, '$.{field}', 'string')")


#: Why a rule rejects a record, in words for the person reading the dead letter: a text, or a column
#: (e.g. naming the offending value).
Message = str | Column
#: (reason, condition that means the record breaks it) or (reason, condition, message).
Rule = tuple[str, Column] | tuple[str, Column, Message]


def classify(raw: DataFrame, decoded: Column, rules: Sequence[Rule]) -> DataFrame:
    """Add the decoded struct's fields, :data:`ERROR_COLUMN` (the first broken rule, or null) and
    :data:`MESSAGE_COLUMN` (that rule's message).

    ``raw`` is the Kafka source DataFrame (key, value, topic, partition, offset, ...). ``rules`` are
    checked in order after "undecodable".
    """
    # One projection parses each record (the optimizer keeps an expensive expression that is read several
    # times in its own projection instead of inlining it into every rule that reads it).
    with_event = raw.select(
        "*",
        F.col("value").cast("string").alias(TEXT_COLUMN),
        F.expr("try_parse_json(CAST(value AS STRING))").alias(JSON_COLUMN),
        decoded.alias(EVENT_COLUMN),
    )
    undecodable = ~is_json_object()
    reason = F.when(undecodable, F.lit(UNDECODABLE))
    message = F.when(undecodable, F.lit("the value is not a JSON object in UTF-8"))
    for name, broken, *why in rules:
        reason = reason.when(broken, F.lit(name))
        text_or_column = why[0] if why else name
        message = message.when(broken, F.lit(text_or_column) if isinstance(text_or_column, str) else text_or_column)
    return with_event.withColumn(ERROR_COLUMN, reason).withColumn(MESSAGE_COLUMN, message)


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
    return F.concat(F.lit(f"{field}: "), written(field),
                    F.lit(f" does not fit DECIMAL({precision},{scale}) exactly (never rounded)"))  # fmt: skip


def unparsed(field: str) -> Column:
    """The record has ``field`` but it did not parse to the schema's type (from_json silently makes it
    null: a wrong-typed value would otherwise pass as "absent")."""
    return written(field).isNotNull() & event(field).isNull()


def classify_events(
    raw: DataFrame,
    schema,
    key_field: str,
    event_types: Sequence[str],
    invalid: Column | Sequence[tuple[Column, Message]] | None = None,
) -> DataFrame:
    """:func:`classify` for JSON events with a key field and a ``type``: missing key, unknown type,
    then ``invalid``, in that order. ``invalid`` is a condition over :func:`event` fields, or
    (condition, message) pairs: the first broken one names the :data:`INVALID` record's message."""
    rules: list[Rule] = [
        (MISSING_KEY, F.coalesce(F.length(event(key_field)) == 0, F.lit(True)), f"{key_field} is missing or empty"),
        (UNKNOWN_TYPE, ~F.coalesce(event("type").isin(*event_types), F.lit(False)),
         F.concat(F.lit("type "), F.coalesce(event("type"), F.lit("(missing)")),
                  F.lit(f" is not one of {', '.join(event_types)}"))),
    ]  # fmt: skip
    if isinstance(invalid, Column):
        rules.append((INVALID, invalid))
    elif invalid is not None:
        rules.extend((INVALID, broken, message) for broken, message in invalid)
    return classify(raw, F.from_json(F.col("value").cast("string"), schema), rules)


def valid(classified: DataFrame, *source_columns: str) -> DataFrame:
    """The decoded fields of the records that broke no rule, plus the named Kafka source columns
    (e.g. ``"offset"`` to process a key's records in log order)."""
    return classified.where(F.col(ERROR_COLUMN).isNull()).select(f"{EVENT_COLUMN}.*", *source_columns)


def dead_letter_records(rejected: DataFrame, application_id: str) -> DataFrame:
    """Kafka records (key, value, headers) for rejected input: raw key and value bytes untouched, the
    reason and the source coordinates in headers. ``rejected`` has the Kafka source columns (key,
    value, topic, partition, offset, timestamp), :data:`ERROR_COLUMN` and, optionally,
    :data:`MESSAGE_COLUMN`."""

    def header(name: str, value: Column) -> Column:
        return F.struct(F.lit(HEADER_PREFIX + name).alias("key"), value.cast("string").cast("binary").alias("value"))

    why = F.col(ERROR_COLUMN)
    if MESSAGE_COLUMN in rejected.columns:
        why = F.coalesce(F.col(MESSAGE_COLUMN), why)
    return rejected.select(
        F.col("key"),
        F.col("value"),
        F.array(
            header("reason", F.col(ERROR_COLUMN)),
            header("message", F.concat(F.lit(f"record rejected by {application_id}: "), why)),
            header("source.topic", F.col("topic")),
            header("source.partition", F.col("partition")),
            header("source.offset", F.col("offset")),
            header("source.timestamp", F.col("timestamp")),
        ).alias("headers"),
    )


def write_dead_letters(rejected: DataFrame, application_id: str, kafka: KafkaTarget) -> None:
    """Batch-write rejected records found inside a job's micro-batch (e.g. late events)."""
    (dead_letter_records(rejected, application_id).write.format("kafka")
     .options(**as_connection(kafka).spark_options()).option("kafka.acks", "all")
     .option("topic", dead_letter_topic(application_id)).save())  # fmt: skip


def dead_letter_writer(classified: DataFrame, application_id: str, kafka: KafkaTarget, checkpoint: str):
    """The streaming writer that sends every classified-bad record to the dead-letter topic."""
    bad = dead_letter_records(classified.where(F.col(ERROR_COLUMN).isNotNull()), application_id)
    return (
        bad.writeStream.format("kafka")
        .options(**as_connection(kafka).spark_options())
        .option("topic", dead_letter_topic(application_id))
        .option("checkpointLocation", checkpoint)
        .queryName(f"{application_id}-dead-letter")
    )
