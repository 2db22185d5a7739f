"""Vote counts where voters change their vote and events arrive out of order: the latest vote by
*event time* wins, not the last one to arrive (the seeds' voter5 case).

The store ``latest-votes`` is versioned, like Kafka Streams' ``VersionedKeyValueStore``: per voter
the vote that counts plus the history of earlier votes within ``retention_ms`` of it, so "whom did
voter5 vote for at 09:05?" has an answer. A vote older than the current one only enters the history;
a newer one replaces the current vote. Ties in event time go to the larger event id, so the answer
never depends on arrival order.

Outputs: the Delta table ``votes`` (one row per voter: the vote that counts) and ``votes_counts`` (votes
per candidate, rewritten from ``votes`` after every micro-batch: candidates are few, voters many).

The job is a declaration (:data:`VOTES`, a :class:`spark_jobs.primitives.VersionedLatest`): the store is kept
by the platform's generic Java processor ``streamstate.primitives.VersionedLatest``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.driver.context import JobContext
from spark_jobs.io import dead_letter
from spark_jobs.primitives import JsonEvents, VersionedLatest

STORE = "latest-votes"
VOTE = "vote"

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("type", T.StringType()),
        T.StructField("voter_id", T.StringType()),
        T.StructField("candidate", T.StringType()),
        T.StructField("event_time", T.TimestampType()),
    ]
)


def _rules():
    # the primitive adds its own after these: an event_time between 1970 and 2200, an event_id
    return [(F.coalesce(F.length(dead_letter.event("candidate")) == 0, F.lit(True)), "a vote needs a candidate")]


#: The job, declared. The stored value: the current vote, and the versions (oldest first, the current one
#: last) kept for "as of" reads.
VOTES = VersionedLatest(
    store=STORE,
    events=JsonEvents(EVENT_SCHEMA, types=(VOTE,), rules=_rules),
    values={"candidate": "candidate", "voted_at": "event_time", "event_id": "event_id"},
    time="voted_at",
    version_id="event_id",
    summaries={"counts": "SELECT candidate, COUNT(1) AS votes FROM {outputs} GROUP BY candidate"},
)
STATE_DDL = VOTES.state_ddl


def classify(ctx: JobContext) -> DataFrame:
    """The job's raw Kafka records, decoded and classified (its rules and the primitive's)."""
    return VOTES.classify(ctx.sources.stream(), "voter_id")


def build(ctx: JobContext):
    return VOTES.build(ctx)
