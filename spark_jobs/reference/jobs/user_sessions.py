"""Visits per user: clicks and page views grouped into sessions by a 30 minute inactivity gap, declared
with the platform's primitives alone (:data:`VISITS`, a :class:`spark_jobs.primitives.SessionAggregate`).

A user's events less than 30 minutes apart are one visit, ``[session_start, session_end]`` their first and
last event times. When a visit closes (its end + 30 min gap + 5 min grace, by the partition's stream time)
its events, page views and last page are written to the Delta table ``user_sessions``. An event arriving
late but within grace may extend a visit, or bridge two visits into one; an event whose visit had closed is
late: it goes to the dead-letter topic (reason ``late``). ``forget_me`` deletes the user's visits. Semantics
are Kafka Streams' ``SessionWindows.ofInactivityGapAndGrace(30 min, 5 min)`` with ``withRetention(2 h)`` and
``suppress(untilWindowCloses)`` (see :mod:`spark_jobs.primitives.sessions`; the peer in
``bench/kafka_streams`` runs that topology and tests/bench/test_kafka_streams_peer.py holds the two equal).
"""

from __future__ import annotations

from pyspark.sql import types as T

from spark_jobs.primitives import Aggregate, JsonEvents, SessionAggregate

CLICK, PAGE_VIEW, FORGET_ME = "click", "page_view", "forget_me"
EVENT_TYPES = (CLICK, PAGE_VIEW, FORGET_ME)

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("page", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)

#: The job, declared: a user's clicks and page views aggregated per visit, deleted on forget_me.
VISITS = SessionAggregate(
    store="user-sessions",  # StoreSpec(kind="session", gap_ms=30 * 60_000, grace_ms=5 * 60_000,
    #           retention_ms=2 * 3600 * 1000)
    events=JsonEvents(EVENT_SCHEMA, types=(CLICK, PAGE_VIEW, FORGET_ME)),
    time="event_time",
    values={
        "events": Aggregate.count(),
        "page_views": Aggregate.count(f"IF(type = '{PAGE_VIEW}', 1, NULL)"),
        "last_page": Aggregate.latest("page"),
    },
    where=f"type IN ('{CLICK}', '{PAGE_VIEW}')",
    delete_when=f"type = '{FORGET_ME}'",
)
