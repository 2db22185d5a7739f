"""Vote counts where voters change their vote and events arrive out of order: the latest vote by
*event time* wins, not the last one to arrive (the seeds' voter5 case).

The store ``latest-votes`` is versioned, like Kafka Streams' ``VersionedKeyValueStore``: per voter
the vote that counts plus the history of earlier votes within ``retention_ms`` of it, so "whom did
voter5 vote for at 09:05?" has an answer. A vote older than the current one only enters the history;
a newer one replaces the current vote. Ties in event time go to the larger event id, so the answer
never depends on arrival order.

Outputs: the Delta table ``votes`` (one row per voter: the vote that counts) and ``votes_counts`` (votes
per candidate, rewritten from ``votes`` after every micro-batch: candidates are few, voters many).
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from spark_jobs import dead_letter
from spark_jobs.context import JobContext
from spark_jobs.registry import store as store_spec
from spark_jobs.state.store_changes import TOMBSTONE, StoreChanges

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

#: The current vote, and the versions (oldest first, the current one last) kept for "as of" reads.
STATE_DDL = ("candidate STRING, voted_at TIMESTAMP, event_id STRING, "
             "history ARRAY<STRUCT<voted_at: TIMESTAMP, candidate: STRING, event_id: STRING>>")  # fmt: skip
CHANGES = StoreChanges(STORE, STATE_DDL)
CHANGE_DDL = f"key STRING, {TOMBSTONE} BOOLEAN, {STATE_DDL}"

OUTPUT_SCHEMA = T.StructType(
    [
        T.StructField("voter_id", T.StringType(), nullable=False),
        T.StructField("candidate", T.StringType()),
        T.StructField("voted_at", T.TimestampType()),
        T.StructField("event_id", T.StringType()),
    ]
)


def _ms(ts: dt.datetime) -> int:
    return int(ts.timestamp() * 1000)


def _version(v) -> tuple:
    """(voted_at, candidate, event_id) from a history element: a tuple or Row from state, a dict
    from the initial state's nested struct."""
    if isinstance(v, dict):
        return v["voted_at"], v["candidate"], v["event_id"]
    return v[0], v[1], v[2]


class LatestVote(StatefulProcessor):
    """Per voter: the vote with the latest event time, and the versions within retention."""

    def __init__(self, retention_ms: int) -> None:
        self.retention_ms = retention_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.vote = handle.getValueState(STORE, STATE_DDL)

    def handleInputRows(self, key, rows, timerValues):  # noqa: N802 - Spark's processor API
        current = self.vote.get()
        versions = {v[2]: v for v in map(_version, current[3] if current else [])}
        for r in rows:
            versions[r.event_id] = (r.event_time, r.candidate, r.event_id)
        history = self.prune(sorted(versions.values(), key=lambda v: (_ms(v[0]), v[2])))
        voted_at, candidate, event_id = history[-1]
        if current is not None and [v[2] for v in current[3]] == [v[2] for v in history]:
            return  # only versions older than the retained history arrived: nothing changed
        self.vote.update((candidate, voted_at, event_id, history))
        yield Row(key=key[0], tombstone=False, candidate=candidate, voted_at=voted_at, event_id=event_id,
                  history=[Row(voted_at=v[0], candidate=v[1], event_id=v[2]) for v in history])  # fmt: skip

    def prune(self, history: list[tuple]) -> list[tuple]:
        """Keep the versions valid at some time within ``retention_ms`` before the latest one."""
        cutoff = _ms(history[-1][0]) - self.retention_ms
        first = 0
        for i, version in enumerate(history):
            if _ms(version[0]) <= cutoff:
                first = i  # the version valid at the cutoff is still needed to answer for it
        return history[first:]

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: N802
        row = initialState
        history = [_version(v) for v in row.history]
        self.vote.update((row.candidate, row.voted_at, row.event_id, history))

    def close(self) -> None:
        pass


def classify(ctx: JobContext) -> DataFrame:
    return dead_letter.classify_events(
        ctx.kafka_source(), EVENT_SCHEMA, "voter_id", (VOTE,),
        invalid=dead_letter.bad_event_time() | dead_letter.event("event_id").isNull()
        | F.coalesce(F.length(dead_letter.event("candidate")) == 0, F.lit(True)),
    )  # fmt: skip


def counts_path(ctx: JobContext) -> str:
    return f"{ctx.output_path}_counts"


def build(ctx: JobContext):
    from delta.tables import DeltaTable

    retention_ms = store_spec(ctx.spec, STORE).retention_ms
    ctx.ensure_output_table(OUTPUT_SCHEMA)
    events = ctx.with_dead_letters(classify(ctx), key="voter_id")
    initial = ctx.initial_state(CHANGES)
    logic, output_ddl = dead_letter.passing_letters(events, LatestVote(retention_ms), CHANGE_DDL)
    changes = events.groupBy("voter_id").transformWithState(
        logic, output_ddl, "Update", "None",
        initialState=initial.withColumnRenamed("key", "voter_id").groupBy("voter_id") if initial is not None else None,
    )  # fmt: skip
    output_path, tally_path = ctx.output_path, counts_path(ctx)

    def write_outputs(batch: DataFrame, _batch_id: int) -> None:
        source = batch.select(F.col("key").alias("voter_id"), "candidate", "voted_at", "event_id")
        (DeltaTable.forPath(batch.sparkSession, output_path).alias("t")
         .merge(source.alias("s"), "t.voter_id = s.voter_id")
         .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())  # fmt: skip
        # Recounting from the table (not adding deltas) keeps a replayed batch idempotent.
        tally = batch.sparkSession.read.format("delta").load(output_path).groupBy("candidate").agg(
            F.count(F.lit(1)).alias("votes"))  # fmt: skip
        tally.write.format("delta").mode("overwrite").save(tally_path)

    return changes.writeStream.outputMode("update").foreachBatch(ctx.state_change_sink(CHANGES, write_outputs))
