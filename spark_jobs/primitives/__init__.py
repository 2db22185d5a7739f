"""Platform primitives: a job declared in Python, its state kept by processors that ship with the platform.

A declaration names the job's input (:class:`JsonEvents`: schema, event types, validation rules) and its
store's semantics (:class:`KeyedAggregate`: aggregates per key, delete-on-event, the store's TTL;
:class:`VersionedLatest`: the latest version by event time, with history; :class:`WindowedAggregate`:
aggregates per key in tumbling or hopping event-time windows, emitted on close or on every update;
:class:`SessionAggregate`: aggregates per key per session of activity, Kafka Streams' session windows;
:class:`TopN`: another job's upsert topic read as a table (:class:`UpsertTable`), its top rows per group;
:class:`TableJoin`: two upsert topics read as tables, joined on their key; :class:`StreamTableJoin`: each event
of a stream joined with a table's row, as of its time, or with several tables' (:class:`JoinedTable`);
:class:`StreamStreamJoin`: two streams' records joined
within a time window). It is the
job's ``build``: the platform builds the whole query from it (source at the restored position, decode and
classify once, dead letters from the same micro-batch, the processor seeded with the restored state,
outputs, changelog and markers, snapshots), so a job cannot skip a step. The processor is generic Java
(``jvm/state-processors``), parameterised by the declaration: no Java and no Python state logic to write.
"""

from spark_jobs.primitives.events import JsonEvents
from spark_jobs.primitives.keyed_aggregate import Aggregate, KeyedAggregate
from spark_jobs.primitives.sessions import SessionAggregate
from spark_jobs.primitives.stream_stream_join import StreamStreamJoin
from spark_jobs.primitives.stream_table_join import JoinedTable, StreamTableJoin
from spark_jobs.primitives.table_join import TableJoin
from spark_jobs.primitives.top_n import TopN, UpsertTable
from spark_jobs.primitives.versioned import VersionedLatest
from spark_jobs.primitives.windows import WindowedAggregate

__all__ = [
    "Aggregate",
    "JoinedTable",
    "JsonEvents",
    "KeyedAggregate",
    "SessionAggregate",
    "StreamStreamJoin",
    "StreamTableJoin",
    "TableJoin",
    "TopN",
    "UpsertTable",
    "VersionedLatest",
    "WindowedAggregate",
]
