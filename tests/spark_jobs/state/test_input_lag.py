"""The rules of spark_jobs/state/input_lag.py: which join inputs have records written beyond a micro-batch, read
once per batch and kept, so that a replayed batch's tasks wait for the same records as its first attempt did."""

from __future__ import annotations

from runtime.object_store import Location
from spark_jobs.state.input_lag import KEPT_BATCHES, LAGGING_CONF, InputLag, InputLagRecord, lagging_pairs, waited_for

TOPICS = ("orders", "profiles")


def test_a_partition_is_lagging_when_the_batch_ends_before_what_is_written():
    batch_end = {"orders": {0: 10, 1: 4}, "profiles": {0: 7, 1: 3}}
    topic_end = {"orders": {0: 10, 1: 9}, "profiles": {0: 7, 1: 3, 2: 1}}
    # orders[1] was cut short; profiles[2] was not read at all but has a record; the rest are read to their end
    assert lagging_pairs(TOPICS, batch_end, topic_end) == ((0, 1), (1, 2))
    # offsets as Spark's offset log spells them (partition numbers as text) read the same
    textual = {t: {str(p): o for p, o in ends.items()} for t, ends in batch_end.items()}
    assert lagging_pairs(TOPICS, textual, topic_end) == ((0, 1), (1, 2))
    assert lagging_pairs(TOPICS, topic_end, topic_end) == ()


def test_the_tasks_read_the_lagging_inputs_from_one_session_setting():
    assert InputLag(3, ((0, 1), (1, 2))).conf() == {LAGGING_CONF: "0:1,1:2"}
    assert InputLag(3, ()).conf() == {LAGGING_CONF: ""}  # set, so no setting of an earlier batch lingers
    assert LAGGING_CONF == "spark.streamstate.inputs.lagging"  # InputMerge.LAGGING_CONF, the Java side's name


def test_a_replayed_batch_reads_the_first_attempts_reading_and_old_readings_go(tmp_path):
    ends = {"orders": {0: 10}, "profiles": {0: 5}}
    reads = []

    def topic_ends(topic: str) -> dict[int, int]:
        reads.append(topic)
        return ends[topic]

    record = InputLagRecord(Location.of(tmp_path / "input-lag"), TOPICS, topic_ends)
    first = record.reading(7, {"orders": {0: 6}, "profiles": {0: 5}})
    assert first.lagging == ((0, 0),) and reads == list(TOPICS)
    ends["orders"] = {0: 6}  # the topic's end moved since (in a replay it may have moved either way)
    assert record.reading(7, {"orders": {0: 6}, "profiles": {0: 5}}) == first  # kept: not read again
    assert reads == list(TOPICS)

    for batch_id in range(8, KEPT_BATCHES + 9):
        record.reading(batch_id, ends)
    kept = sorted(int(p.stem) for p in (tmp_path / "input-lag").glob("*.json"))
    assert kept == list(range(9, KEPT_BATCHES + 9))  # 100 batches back at most


def test_with_max_task_idle_an_input_caught_up_is_waited_for_until_it_has_been_quiet_that_long(tmp_path):
    """Kafka Streams' ``max.task.idle.ms > 0``: the orders' partition 0 is read to its end by batch 0 and read
    nothing new after: it is waited for until 5 s after batch 0; partition 1 is read again by batch 1, so it is
    waited for until 5 s after that. The profiles, which never had a record, start their wait at the driver's
    first batch."""
    now = [1_000]
    first_end = {"orders": {0: 4, 1: 2}, "profiles": {0: 0, 1: 0}}
    second_end = {"orders": {0: 4, 1: 3}, "profiles": {0: 0, 1: 0}}
    record = InputLagRecord(
        Location.of(tmp_path), TOPICS, lambda t: second_end[t], max_task_idle_ms=5_000, clock=lambda: now[0]
    )
    assert record.reading(0, first_end).lagging == ((0, 0), (0, 1), (1, 0), (1, 1))  # orders[1] lags, the rest wait
    now[0] = 4_000
    assert record.reading(1, second_end, first_end).lagging == ((0, 0), (0, 1), (1, 0), (1, 1))  # none quiet 5 s
    now[0] = 6_500  # orders[0] and the profiles quiet for 5.5 s; orders[1] read 2.5 s ago
    assert record.reading(2, second_end, second_end).lagging == ((0, 1),)
    # without the wait (the default) nothing caught up is waited for
    assert (
        InputLagRecord(Location.of(tmp_path / "none"), TOPICS, lambda t: second_end[t]).reading(0, second_end).lagging
        == ()
    )


def test_the_wait_clock_of_each_input_partition():
    last_read: dict = {}
    both = {"orders": {0: 3}, "profiles": {0: 1}}
    assert waited_for(TOPICS, None, both, last_read, 100, 50) == ((0, 0), (1, 0))
    assert last_read == {(0, 0): 100, (1, 0): 100}
    assert waited_for(TOPICS, both, {"orders": {0: 5}, "profiles": {0: 1}}, last_read, 140, 50) == ((0, 0), (1, 0))
    assert last_read == {(0, 0): 140, (1, 0): 100}  # the orders read 2 records at 140
    assert waited_for(TOPICS, both, both, last_read, 160, 50) == ((0, 0),)  # the profiles quiet for 60 ms
