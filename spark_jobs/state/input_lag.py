"""Which inputs of a job with several inputs (a join) have records written beyond a micro-batch: what the
join's tasks need to take their topics in Kafka Streams' order however a rate limit cuts them
(``streamstate.primitives.InputMerge``, Java).

The rules:

1. **Lagging.** An input topic's partition is *lagging* in a micro-batch when the batch ends before that
   partition's last stable offset (what a ``read_committed`` reader can reach): records are written that the
   batch did not read. A task whose one input runs out while it is lagging keeps the other input's later
   records waiting for it, as a Kafka Streams task with ``max.task.idle.ms = 0`` waits for records it knows
   exist; an input caught up holds nothing back (nothing waits for records not yet written).
2. **Read once per micro-batch, before it runs.** The driver reads the topics' ends as a batch starts (after
   Spark wrote the batch's end offsets) and keeps the reading in the checkpoint (:attr:`JobLayout.input_lag`);
   a batch Spark replays after a crash reads the kept reading, never a new one, so its tasks take their records
   in the same order as the first attempt did (its outputs may already be written).
3. **Handed to the tasks as a session setting** (:data:`LAGGING_CONF`) for the batch's Spark jobs: the
   ``<input>:<partition>`` pairs of the lagging inputs, input 0 being the stateful stage's first topic (the
   source, or its repartition topic), then each join topic in ``JobSpec.join_topics`` order.
4. **Kept for a while.** A reading is deleted :data:`KEPT_BATCHES` batches later (Spark keeps its own offset
   log for 100 batches by default: no batch older than that is replayed).
5. **Waiting longer** (``JobSpec.max_task_idle_ms``, Kafka Streams' ``max.task.idle.ms > 0``): an input caught
   up is still waited for until that long has passed, of the driver's clock, since a micro-batch last read a
   record of it (its buffer emptied then, in Kafka Streams' terms): it counts as lagging until then. A restarted
   driver starts the wait again, as a restarted Kafka Streams task does.

:func:`lagging_pairs` is the rule; :class:`InputLagRecord` keeps it with the checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

from runtime.object_store import Location

#: the session setting the join processors read (InputMerge.LAGGING_CONF)
LAGGING_CONF = "spark.streamstate.inputs.lagging"
#: how many batches a reading is kept for (Spark's spark.sql.streaming.minBatchesToRetain default)
KEPT_BATCHES = 100

#: topic -> partition -> offset
Offsets = Mapping[str, Mapping[int, int]]


@dataclasses.dataclass(frozen=True)
class InputLag:
    """One micro-batch's reading: the (input, partition) pairs with records written beyond the batch."""

    batch_id: int
    lagging: tuple[tuple[int, int], ...]

    def conf(self) -> dict[str, str]:
        """The session setting the batch's tasks read (rule 3)."""
        return {LAGGING_CONF: ",".join(f"{i}:{p}" for i, p in self.lagging)}

    def to_json(self) -> str:
        return json.dumps({"batch_id": self.batch_id, "lagging": [list(pair) for pair in self.lagging]})

    @classmethod
    def from_json(cls, text: str) -> InputLag:
        data = json.loads(text)
        return cls(int(data["batch_id"]), tuple((int(i), int(p)) for i, p in data["lagging"]))


def lagging_pairs(topics: tuple[str, ...], batch_end: Offsets, topic_end: Offsets) -> tuple[tuple[int, int], ...]:
    """Rule 1: the (input index, partition) pairs of ``topics`` whose ``batch_end`` is below ``topic_end`` (a
    partition missing from ``batch_end`` was not read at all: lagging if anything is written)."""
    pairs = []
    for index, topic in enumerate(topics):
        read = {int(p): int(o) for p, o in (batch_end.get(topic) or {}).items()}
        for partition, end in sorted((int(p), int(o)) for p, o in (topic_end.get(topic) or {}).items()):
            if read.get(partition, 0) < end:
                pairs.append((index, partition))
    return tuple(pairs)


def waited_for(
    topics: tuple[str, ...], batch_start: Offsets | None, batch_end: Offsets, last_read: dict, now_ms: int, wait_ms: int
) -> tuple[tuple[int, int], ...]:
    """Rule 5: the (input, partition) pairs still waited for at ``now_ms``: those that read a record less than
    ``wait_ms`` ago. ``last_read`` ((input, partition) -> when a batch last read a record of it, this driver's) is
    brought up to date: a pair whose batch read records between ``batch_start`` and ``batch_end`` read them now;
    one this driver never saw read anything starts its wait now (None ``batch_start``: this driver's first batch)."""
    waited = []
    for index, topic in enumerate(topics):
        start = {int(p): int(o) for p, o in ((batch_start or {}).get(topic) or {}).items()}
        for partition, end in sorted((int(p), int(o)) for p, o in (batch_end.get(topic) or {}).items()):
            if batch_start is None or start.get(partition, 0) < end:
                last_read[index, partition] = now_ms
            else:
                last_read.setdefault((index, partition), now_ms)
            if now_ms - last_read[index, partition] < wait_ms:
                waited.append((index, partition))
    return tuple(waited)


class InputLagRecord:
    """The readings of one checkpoint, one small file per micro-batch (rules 2, 4 and 5).

    ``max_task_idle_ms``: rule 5's wait; ``clock``: milliseconds of wall-clock time (replaced by a test's)."""

    def __init__(
        self,
        directory: Location,
        topics: tuple[str, ...],
        topic_ends: Callable[[str], dict[int, int]],
        max_task_idle_ms: int = 0,
        clock: Callable[[], int] | None = None,
    ):
        import time

        self.directory, self.topics, self.topic_ends = directory, topics, topic_ends
        self.max_task_idle_ms, self.clock = max_task_idle_ms, clock or (lambda: int(time.time() * 1000))
        #: (input, partition) -> when a batch of this driver last read a record of it (rule 5)
        self.last_read: dict[tuple[int, int], int] = {}

    def reading(self, batch_id: int, batch_end: Offsets, batch_start: Offsets | None = None) -> InputLag:
        """Batch ``batch_id``'s reading: the kept one when the batch ran before, else read now and kept.
        ``batch_start``: where the batch started (the previous batch's end; None: not known)."""
        kept = self.directory / f"{batch_id}.json"
        if kept.exists():
            return InputLag.from_json(kept.read_text())
        ends = {topic: self.topic_ends(topic) for topic in self.topics}
        pairs = lagging_pairs(self.topics, batch_end, ends)
        if self.max_task_idle_ms:
            now = self.clock()
            waited = waited_for(self.topics, batch_start, batch_end, self.last_read, now, self.max_task_idle_ms)
            pairs = tuple(sorted({*pairs, *waited}))
        lag = InputLag(batch_id, pairs)
        kept.write_text(lag.to_json())
        if batch_id >= KEPT_BATCHES:
            (self.directory / f"{batch_id - KEPT_BATCHES}.json").remove()
        return lag
