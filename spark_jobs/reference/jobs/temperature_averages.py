"""Average temperature per sensor over the last 5 minutes, every minute: the seeds' hopping-window example
("매 1분마다 최근 5분간의 평균 온도 계산"), declared with the platform's primitives alone.

Each ``reading`` carries a sensor's temperature; a window is 5 minutes long and a new one starts every
minute, so each reading counts in five windows. When a window closes (its end + 30 s grace, by the
partition's stream time) its readings count, average, minimum and maximum are written once to the Delta
table ``temperature_averages``. A reading whose windows had closed is late: it still counts in those of
its windows that are open, and goes to the dead-letter topic (reason ``late``) naming the closed one.
``sensor_removed`` deletes the sensor's windows. Semantics are Kafka Streams'
``TimeWindows.ofSizeAndGrace(5 min, 30 s).advanceBy(1 min)`` with ``withRetention(2 h)`` and
``suppress(untilWindowCloses)`` (see :mod:`spark_jobs.primitives.windows`; the peer in
``bench/kafka_streams`` runs that topology and tests/bench/test_kafka_streams_peer.py holds the two equal).
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives import Aggregate, JsonEvents, WindowedAggregate

READING, SENSOR_REMOVED = "reading", "sensor_removed"
EVENT_TYPES = (READING, SENSOR_REMOVED)

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("sensor_id", T.StringType()),
        T.StructField("temperature", T.DoubleType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)


def _rules():
    reading = dead_letter.event("type") == READING
    temperature = dead_letter.event("temperature")
    return [
        (reading & temperature.isNull(), "a reading needs a temperature"),
        (reading & ~temperature.between(-90.0, 150.0), "temperature is not between -90 and 150 degrees C"),
    ]


#: The job, declared: readings aggregated per sensor in 5-minute windows starting every minute.
AVERAGES = WindowedAggregate(
    store="temperature-windows",
    events=JsonEvents(EVENT_SCHEMA, types=EVENT_TYPES, rules=_rules),
    time="event_time",
    values={
        "readings": Aggregate.count(),
        "temperature_sum": Aggregate.sum("temperature"),
        "min_temperature": Aggregate.min("temperature"),
        "max_temperature": Aggregate.max("temperature"),
    },
    outputs={
        "readings": "readings",
        "avg_temperature": "temperature_sum / readings",
        "min_temperature": "min_temperature",
        "max_temperature": "max_temperature",
    },
    where=f"type = '{READING}'",
    delete_when=f"type = '{SENSOR_REMOVED}'",
)


def classify(ctx):
    """The job's raw Kafka records, decoded and classified (its rules, then a valid event time)."""
    return AVERAGES.classify(ctx.sources.stream(), "sensor_id")
