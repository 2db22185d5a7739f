"""Heart rate per patient: the seeds' windowed ``pulse-counts`` store, in Spark.

Each ``pulse`` event is one heartbeat; the heart rate of a 60 s tumbling window is its beat count.
The job is a declaration (:data:`HEART_RATE`, a :class:`spark_jobs.primitives.WindowedAggregate`).
Semantics are Kafka Streams' ``TimeWindows.ofSizeAndGrace(60 s, 5 s)`` with ``withRetention(6 h)`` and
``suppress(untilWindowCloses)``, decided **record by record**, as a Kafka Streams task decides them:

* **stream time** is per source partition (a Kafka Streams task): the largest event time of the valid
  events read so far from that partition, advanced by each record before it is applied;
* a window **closes** when stream time reaches its end + grace: it is emitted once, to the Delta
  table ``patient_heart_rate``, and never changes again;
* a pulse whose window has closed is **late**: it goes to the dead-letter topic (reason ``late``)
  instead of being dropped silently;
* a window is **evicted** from the store when stream time reaches its start + retention (tombstone);
* ``checked_out`` deletes all of the patient's windows (tombstones; open windows are not emitted,
  windows that closed before the check-out were).

None of this depends on how the input is cut into micro-batches (tests/spark_jobs/test_patient_heart_rate_semantics.py
holds the processor to the plain-Python reference :func:`spark_jobs.reference.generators.pulse.expected` under
several cuts). The store is kept by the platform's windows primitive (``streamstate.primitives.WindowedAggregate``,
Java), keyed by source partition. Its changelog ``…-pulse-counts-changelog`` is keyed
``<patient>@<window start ms>``, plus one ``~stream-time@<partition>`` entry per partition so a restore
continues stream time exactly; it is ``compact,delete`` with ``retention.ms`` = the store's retention plus
Kafka Streams' extra day for windowed changelogs.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_jobs.driver.context import JobContext
from spark_jobs.primitives import Aggregate, JsonEvents, WindowedAggregate
from spark_jobs.primitives.event_time import LATE  # noqa: F401 - the job's vocabulary
from spark_jobs.primitives.pipeline import STREAM_TIME_KEY_PREFIX  # noqa: F401 - the job's vocabulary
from spark_jobs.registry import StoreSpec

STORE = "pulse-counts"
PULSE, CHECKED_OUT = "pulse", "checked_out"
EVENT_TYPES = (PULSE, CHECKED_OUT)

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("patient_id", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)

#: The job, declared: pulses counted per patient and window, deleted on check-out.
HEART_RATE = WindowedAggregate(
    store=STORE,
    events=JsonEvents(EVENT_SCHEMA, types=EVENT_TYPES),
    time="event_time",
    values={"beats": Aggregate.count()},
    outputs={"heart_rate": "beats"},
    where=f"type = '{PULSE}'",
    delete_when=f"type = '{CHECKED_OUT}'",
)


def window_changes(events: DataFrame, initial: DataFrame | None, store: StoreSpec) -> DataFrame:
    """The processor's rows (changes, stream times, late pulses) for ``events`` (the processor's input, with
    the source's ``partition``, ``offset``, ``timestamp`` and ``value``), seeded with ``initial`` (restored
    ``key`` + state rows) after a restore."""
    return HEART_RATE.changes(events, "patient_id", initial, store, job="patient_heart_rate")


def classify(ctx: JobContext) -> DataFrame:
    """The job's raw Kafka records, decoded and classified (a pulse or a check-out needs an event time)."""
    return HEART_RATE.classify(ctx.sources.stream(), "patient_id")


def build(ctx: JobContext):
    return HEART_RATE.build(ctx)
