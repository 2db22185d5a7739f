"""Daily price change per stock: stage 1 of the seeds' two-stage pattern (004, §3.3: results computed per key
in parallel, then finished in one place). Its second stage is the batch step ``daily_top_movers``
(:mod:`spark_jobs.batch`), the day's ten largest moves over this job's Delta outputs.

Each ``tick`` says how much a symbol's price moved since its previous tick; a day's change is the sum of its
ticks' changes, in a 1-day tumbling window (10 min grace, 3 days retention), written once when the day
closes (its end + grace, by the partition's stream time), as Kafka Streams'
``TimeWindows.ofSizeAndGrace(1 day, 10 min)`` with ``suppress(untilWindowCloses)``. A tick whose day had
closed is a dead letter (reason ``late``). Generator and reference: :mod:`spark_jobs.reference.generators.ticks`.
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.primitives import Aggregate, JsonEvents, WindowedAggregate

STORE = "daily-changes"

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("tick_id", T.StringType()),
        T.StructField("symbol", T.StringType()),
        T.StructField("change", T.DoubleType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)


def _rules():
    return [(dead_letter.event("change").isNull(), "a tick needs a change")]


#: The job, declared: ticks' changes summed per symbol and day.
DAILY_CHANGES = WindowedAggregate(
    store=STORE,
    events=JsonEvents(EVENT_SCHEMA, rules=_rules),
    time="event_time",
    values={"change": Aggregate.sum("change"), "ticks": Aggregate.count()},
)
