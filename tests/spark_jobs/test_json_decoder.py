"""The JVM decoder decodes every record as Spark's own functions do (real Spark): whether it is a JSON
object, each field converted to the schema as ``from_json`` converts it, and each field as written as
``variant_get`` renders it; so every job's classification is the same with either decoder.

Records: the jobs' fuzzed events (tests/fuzz/test_event_decoders.py) and the edge cases each conversion has
(timestamps, decimals, special doubles, integers out of range, JSON written into a string field, duplicate
keys, unpaired surrogates, byte order marks, text after the object).
"""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from tests.fuzz.test_event_decoders import JOBS, KAFKA_SOURCE_SCHEMA, events

pytestmark = pytest.mark.integration

EVERY_TYPE = T.StructType(
    [
        T.StructField("s", T.StringType()),
        T.StructField("b", T.BooleanType()),
        T.StructField("i8", T.ByteType()),
        T.StructField("i16", T.ShortType()),
        T.StructField("i32", T.IntegerType()),
        T.StructField("i64", T.LongType()),
        T.StructField("f", T.FloatType()),
        T.StructField("d", T.DoubleType()),
        T.StructField("dec", T.DecimalType(12, 2)),
        T.StructField("t", T.TimestampType()),
    ]
)

VALUES = [
    # numbers of every shape, as every type
    "0",
    "-0",
    "-0.0",
    "12.50",
    "12.345",
    "2.995",
    "-0.001",
    "1.5e2",
    "1E+2",
    "1e-30",
    "100.0",
    "0.00000000",
    "127",
    "128",
    "-129",
    "32768",
    "2147483648",
    "9223372036854775807",
    "9223372036854775808",
    "123456789012345678901234567890123456789",
    "1.2345678901234567890123456789012345678901",
    "1e400",
    "9999999999.99",
    "99999999999.99",
    "1e10",
    # strings as numbers, times and special values
    '"12.50"',
    '"1,234.5"',
    '"abc"',
    '""',
    '"NaN"',
    '"Infinity"',
    '"+INF"',
    '"-Infinity"',
    '"-INF"',
    '"nan"',
    '"2026-11-01T09:00:00Z"',
    '"2026-11-01 09:00:00"',
    '"2026-11-01T09:00:00.123456+14:00"',
    '"2026-11-01"',
    '"2026-11-01T09:00:00 GMT"',
    '"GMT2026-11-01T09:00:00"',
    '"2026-11-01T09:00:00GMT+01:00"',
    '"0001-01-01T00:00:00Z"',
    '"yesterday"',
    '"2026-13-45T99:00:00Z"',
    '"1700000000"',
    "1700000000",
    # everything else JSON holds
    "true",
    "false",
    "null",
    "[]",
    '[1, 2.50, "x"]',
    '{"b": 1, "a": [true, null]}',
    '"\\u00e9\\ud83d\\ude00"',
]

RECORDS = [
    b"",
    b"   ",
    b"not json",
    b"[1, 2]",
    b"12",
    b'"text"',
    b"\xef\xbb\xbf{}",  # a byte order mark
    b"{\x00\x00\x00}\x00\x00\x00",  # UTF-32 to a decoder that guesses
    b"\xff\xfe{}",
    b' \t\r\n{"s": "x"}',
    b'{"s": "x"} trailing',
    b'{"s": "x"}{"s": "y"}',
    b'{"s": "x", "s": "y"}',  # duplicate keys
    b'{"s": "x", "z": {"k": 1, "k": 2}}',
    b'{"s": "\\ud800"}',  # unpaired surrogates
    b'{"\\udfff": 1}',
    b'{"s": "x", "z": ["\\ude00\\ud83d"]}',
    b'{"s": "\\ud83d\\ude00"}',
    b'{"s": "x", "i64": 1',  # truncated
    b"{'s': 'x'}",
    b'{"d": NaN}',
    b'{"s": "caf\xc3\xa9"}',
    b'{"s": "caf\xe9"}',  # not UTF-8
    b'{"s": "\xed\xa0\x80"}',  # an encoded surrogate
    b'{"s" : "x" , "i32" : 7 }',
    b'{"i32": 007}',
    b"{}",
    None,
] + [f'{{"{field}": {value}}}'.encode() for value in VALUES for field in EVERY_TYPE.fieldNames()]


def _source(spark, values: list[bytes | None]):
    now = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    return spark.createDataFrame([(b"k", v, "in", 0, i, now, 0) for i, v in enumerate(values)], KAFKA_SOURCE_SCHEMA)


def _decoded(source, schema, decoder):
    # times as microseconds: Python holds no year 0 (see dead_letter.EVENT_TIME_RANGE)
    event = F.struct(
        *(
            F.unix_micros(dead_letter.event(f.name)).alias(f.name)
            if isinstance(f.dataType, T.TimestampType)
            else dead_letter.event(f.name)
            for f in schema.fields
        )
    )
    columns = ["offset", dead_letter.OBJECT_COLUMN, event.alias(dead_letter.EVENT_COLUMN), dead_letter.WRITTEN_COLUMN]
    rows = dead_letter.decode_json(source, schema, decoder).select(*columns).collect()
    return {
        r["offset"]: (r[dead_letter.OBJECT_COLUMN], r[dead_letter.EVENT_COLUMN], r[dead_letter.WRITTEN_COLUMN])
        for r in rows
    }


def _differences(values: list[bytes | None], schema) -> list[str]:
    """Where the two decoders disagree, one line per record and part. An undecodable record's event and
    written fields are not compared (no rule reads them), nor written nested values (the variant sorts an
    object's keys; only a dead letter's message shows them)."""
    from pyspark.sql import SparkSession

    source = _source(SparkSession.getActiveSession(), values)
    by_jvm, by_spark = _decoded(source, schema, "jvm"), _decoded(source, schema, "spark")
    found = []
    for offset, value in enumerate(values):
        (jvm_object, jvm_event, jvm_written), (spark_object, spark_event, spark_written) = (
            by_jvm[offset],
            by_spark[offset],
        )
        if jvm_object != spark_object:
            found.append(f"{value!r}: object {jvm_object} (jvm) vs {spark_object} (spark)")
            continue
        if not jvm_object:
            continue
        if repr(jvm_event) != repr(spark_event):  # repr: NaN equals NaN
            found.append(f"{value!r}: event {jvm_event!r} (jvm) vs {spark_event!r} (spark)")
        for field in schema.fieldNames():
            jvm_text, spark_text = jvm_written[field], spark_written[field]
            nested = spark_text is not None and spark_text[:1] in "[{"
            if jvm_text != spark_text and not nested:
                found.append(f"{value!r}: written {field} {jvm_text!r} (jvm) vs {spark_text!r} (spark)")
    return found


def test_every_type_and_edge_case_decodes_as_spark_does(spark):
    assert dead_letter.decode_json(_source(spark, [b"{}"]), EVERY_TYPE).count() == 1
    assert spark._jvm.streamstate.primitives.JsonDecoder.reads(EVERY_TYPE.json())
    assert _differences(RECORDS, EVERY_TYPE) == []


@pytest.mark.parametrize("zone", ["UTC", "America/Los_Angeles"])
def test_times_without_a_zone_are_read_in_the_session_zone(spark, zone):
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        assert _differences([b'{"t": "2026-11-01 09:00:00"}', b'{"t": "2026-11-01T09:00:00Z"}'], EVERY_TYPE) == []
        [row] = dead_letter.decode_json(_source(spark, [b'{"t": "2026-11-01 09:00:00"}']), EVERY_TYPE, "jvm").collect()
        expected = spark.sql("SELECT TIMESTAMP '2026-11-01 09:00:00' AS t").first()["t"]
        assert row[dead_letter.EVENT_COLUMN]["t"] == expected
    finally:
        spark.conf.unset("spark.sql.session.timeZone")


def test_a_schema_the_jvm_decoder_does_not_read_is_decoded_by_spark(spark):
    nested = T.StructType([T.StructField("id", T.StringType()), T.StructField("tags", T.ArrayType(T.StringType()))])
    assert not spark._jvm.streamstate.primitives.JsonDecoder.reads(nested.json())
    [row] = dead_letter.decode_json(_source(spark, [b'{"id": "a", "tags": ["x", "y"]}']), nested).collect()
    assert row[dead_letter.OBJECT_COLUMN] and row[dead_letter.EVENT_COLUMN]["tags"] == ["x", "y"]


@pytest.mark.parametrize("job", list(JOBS))
def test_every_jobs_fuzzed_events_decode_alike_with_either_decoder(spark, job):
    """A job's rules read only the decoded columns, so equal columns classify alike (the rules' messages
    may show a nested value as each decoder writes it, see :func:`_differences`)."""
    module, key_field, event_types = JOBS[job]

    @settings(max_examples=max(3, settings().max_examples // 10), deadline=None, derandomize=True)
    @given(st.lists(events(module, key_field, event_types), min_size=40, max_size=80))
    def check(values):
        assert _differences(values, module.EVENT_SCHEMA) == []

    check()
