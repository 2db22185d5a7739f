"""Fuzz every job's event decoder (real Spark): whatever bytes arrive, each record is either a valid
event the job can process or a dead-letter record with a reason — never an exception, never dropped.

The records are built from the jobs' own schemas: plausible events with one field broken in every way
JSON allows (wrong types, huge numbers, odd timestamps, empty strings, nesting), plus raw garbage.
"""

from __future__ import annotations

import datetime as dt
import json
import types
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.reference.jobs import patient_heart_rate, purchase_counts, temperature_averages, vote_counts

pytestmark = pytest.mark.integration

KAFKA_SOURCE_SCHEMA = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
    ]
)

# (module, key field, event types): what each job's classify() is given
JOBS = {
    "purchase_counts": (purchase_counts, "user_id", purchase_counts.EVENT_TYPES),
    "vote_counts": (vote_counts, "voter_id", (vote_counts.VOTE,)),
    "patient_heart_rate": (patient_heart_rate, "patient_id", patient_heart_rate.EVENT_TYPES),
    "temperature_averages": (temperature_averages, "sensor_id", temperature_averages.EVENT_TYPES),
}

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
odd_times = st.sampled_from(
    [
        "2026-11-01T09:00:00Z",
        "2026-11-01 09:00:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2026-13-45T99:00:00Z",
        "yesterday",
        "",
        "1700000000",
        "2026-11-01T09:00:00+14:00",
    ]
)
odd_numbers = st.sampled_from(
    [
        0,
        -0.0,
        0.005,
        -1,
        12.345,
        1e10,
        1e11,
        9999999999.99,
        1e300,
        -1e300,
        "12.50",
        "1e3",
        "NaN",
        2.995,
        -0.001,
        1e-30,
        1.5e2,
        0.1,
        10.10,
        "2.999",
        99999999999.99,
    ]
)  # over-precise too


@st.composite
def events(draw, module, key_field: str, event_types) -> bytes | None:
    """A record value: mostly events shaped like the job's, with fields broken at random."""
    kind = draw(st.sampled_from(["event", "event", "event", "garbage", "json"]))
    if kind == "garbage":
        return draw(st.none() | st.binary(max_size=40))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    event = {f.name: None for f in module.EVENT_SCHEMA.fields}
    for field in module.EVENT_SCHEMA.fields:
        if field.name == "type":
            event["type"] = draw(st.sampled_from(event_types) | st.text(max_size=8))
        elif field.name == key_field:
            event[field.name] = draw(st.sampled_from(["u1", "p-7", ""]) | st.text(max_size=6))
        elif isinstance(field.dataType, T.TimestampType):
            event[field.name] = draw(odd_times)
        elif isinstance(field.dataType, (T.DecimalType, T.DoubleType)):
            event[field.name] = draw(odd_numbers | st.integers(min_value=-(10**15), max_value=10**15))
        else:
            event[field.name] = draw(st.text(max_size=10))
        if draw(st.integers(0, 9)) == 0:  # one field in ten: anything JSON can hold, or missing
            if draw(st.booleans()):
                event[field.name] = draw(json_values)
            else:
                del event[field.name]
    if draw(st.integers(0, 4)) == 0:
        event[draw(st.text(max_size=6))] = draw(json_values)  # an unknown extra field
    text = json.dumps(event)
    return text.encode() if draw(st.integers(0, 9)) else text[: draw(st.integers(0, len(text)))].encode()  # truncated


def _kafka_key(value: bytes | None, key_field: str) -> bytes:
    """The key a producer keying by ``key_field`` gives the record (b"k" when it has no string key field:
    such a record that decodes anyway is a wrong_key dead letter)."""
    try:
        key = json.loads(value)[key_field]
    except (TypeError, ValueError, KeyError, IndexError):
        return b"k"
    return key.encode("utf-8", "surrogatepass") if isinstance(key, str) else b"k"


def _classify(spark, module, values: list[bytes | None], key_field: str = ""):
    now = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    rows = [(_kafka_key(v, key_field), v, "in", 0, i, now, 0) for i, v in enumerate(values)]
    source = spark.createDataFrame(rows, KAFKA_SOURCE_SCHEMA)
    return module.classify(types.SimpleNamespace(sources=types.SimpleNamespace(stream=lambda: source)))


@pytest.mark.parametrize("job", list(JOBS))
def test_every_record_is_either_valid_or_a_dead_letter(spark, job):
    module, key_field, event_types = JOBS[job]
    reasons = {
        dead_letter.UNDECODABLE,
        dead_letter.MISSING_KEY,
        dead_letter.WRONG_KEY,
        dead_letter.UNKNOWN_TYPE,
        dead_letter.INVALID,
    }
    earliest, latest = (
        dt.datetime.fromisoformat(t).replace(tzinfo=dt.timezone.utc) for t in dead_letter.EVENT_TIME_RANGE
    )

    # Few examples of many records: nearly all of an example's time is Spark's two collects, and
    # classification is row by row, so records per job (~240) count, not examples.
    @settings(max_examples=max(4, settings().max_examples // 5))
    @given(st.lists(events(module, key_field, event_types), min_size=20, max_size=60))
    def check(values):
        classified = _classify(spark, module, values, key_field)
        # Collecting the valid events converts them to Python objects, as the job's state processor does.
        good = dead_letter.valid(classified, "offset").collect()
        bad = classified.where(F.col(dead_letter.ERROR_COLUMN).isNotNull())
        letters = [
            (r["value"], {h["key"]: h["value"].decode() for h in r["headers"]})
            for r in dead_letter.dead_letter_records(bad, "fuzz").collect()
        ]
        offsets = [e["offset"] for e in good] + [
            int(h[dead_letter.HEADER_PREFIX + "source.offset"]) for _, h in letters
        ]
        assert sorted(offsets) == list(range(len(values)))  # every record once: nothing dropped, nothing doubled
        for event in good:  # what the job's state logic relies on
            assert event[key_field] and event["type"] in event_types, event
            time = event["event_time"]
            assert (
                time is None and job == "purchase_counts" and event["type"] != purchase_counts.PURCHASE
            ) or earliest <= time.astimezone(dt.timezone.utc) < latest, event
            if job == "purchase_counts" and event["type"] == purchase_counts.PURCHASE:
                assert event["amount"] is not None and event["amount"] >= 0, event
                written = json.loads(values[event["offset"]], parse_float=Decimal)["amount"]
                assert Decimal(str(written)) == event["amount"], (written, event)  # never rounded
            if job == "temperature_averages" and event["type"] == temperature_averages.READING:
                assert event["temperature"] is not None and -90 <= event["temperature"] <= 150, event
        for value, headers in letters:  # the raw bytes kept, with a known reason
            assert value == values[int(headers[dead_letter.HEADER_PREFIX + "source.offset"])]
            assert headers[dead_letter.HEADER_PREFIX + "reason"] in reasons, headers
            assert headers[dead_letter.HEADER_PREFIX + "message"].startswith("record rejected by fuzz: "), headers

    check()


@pytest.mark.parametrize(
    ("amount", "valid"),
    [
        ("12.50", True),
        ("10.000", True),
        ("1.5e2", True),
        ("9999999999.99", True),
        ('"12.50"', True),
        ("2.995", False),
        ("-0.001", False),
        ("1e-30", False),
        ("12345678901.5", False),
        ("true", False),
        ('"abc"', False),
    ],
)
def test_an_amount_is_taken_exactly_or_refused_naming_the_field(spark, amount, valid):
    text = f'{{"type": "purchase", "user_id": "u1", "amount": {amount}, "event_time": "2026-11-01T09:00:00Z"}}'
    classified = _classify(spark, purchase_counts, [text.encode()], "user_id")
    good = dead_letter.valid(classified, "offset").collect()
    if valid:
        assert [e["amount"] for e in good] == [Decimal(json.loads(amount, parse_float=Decimal))]
        return
    assert not good
    [letter] = dead_letter.dead_letter_records(classified, "fuzz").collect()
    headers = {h["key"]: h["value"].decode() for h in letter["headers"]}
    assert headers[dead_letter.HEADER_PREFIX + "reason"] == dead_letter.INVALID
    assert headers[dead_letter.HEADER_PREFIX + "message"].startswith("record rejected by fuzz: amount: "), headers
