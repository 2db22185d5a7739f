"""Pure logic of changelog topics, batch markers and the checkpoint offset log."""

import pytest

from spark_jobs.state.batch_records import BATCH_HEADER, MAX_VOID_RANGES, BatchMarker, carried_void
from spark_jobs.state.changelog import ChangelogTopic, ChangelogWriter, changelog_topic_name
from spark_jobs.state.changelog_reader import _batch_of
from spark_jobs.state.checkpoint_offsets import (
    CheckpointOffsetsError,
    batch_end_offsets,
    latest_batch_id,
    records_between,
    state_encoding,
)


def test_topic_name_follows_kafka_streams():
    assert changelog_topic_name("purchase_counts-v1", "counts") == "purchase_counts-v1-counts-changelog"


def test_key_value_changelog_is_compacted_and_overridable():
    topic = ChangelogTopic(
        "app-v1", "counts", partitions=2, replication_factor=3, overrides={"segment.bytes": "1048576"}
    )
    configs = topic.configs()
    assert configs["cleanup.policy"] == "compact"
    assert configs["min.insync.replicas"] == "2"
    assert configs["segment.bytes"] == "1048576"
    assert "retention.ms" not in configs


def test_windowed_changelog_compacts_and_deletes_with_retention():
    configs = ChangelogTopic("app-v1", "pulse", 2, kind="windowed", retention_ms=21_665_000).configs()
    assert configs["cleanup.policy"] == "compact,delete"
    assert configs["retention.ms"] == str(21_665_000 + 86_400_000)  # Kafka Streams' extra day


def test_versioned_changelog_keeps_history_from_compaction():
    configs = ChangelogTopic("app-v1", "votes", 2, kind="versioned", retention_ms=3_600_000).configs()
    assert configs["min.compaction.lag.ms"] == "3600000"


def test_windowed_store_without_retention_is_refused():
    with pytest.raises(ValueError, match="needs retention_ms"):
        ChangelogTopic("app-v1", "pulse", 2, kind="windowed")


def test_marker_round_trip():
    marker = BatchMarker(7, {"purchases": {0: 120, 1: 99}}, records=42)
    assert BatchMarker.from_bytes(marker.to_bytes()) == marker


def test_marker_void_ranges_round_trip_and_read_the_single_range_of_older_markers():
    marker = BatchMarker(3_000_000_002, {"in": {0: 9}}, 2, void=((4, 1_000_000_000), (1_000_000_007, 3_000_000_000)))
    assert BatchMarker.from_bytes(marker.to_bytes()) == marker
    assert [b for b in (4, 5, 999_999_999, 1_000_000_000, 1_000_000_007, 2_000_000_001) if marker.is_void(b)] == [
        5,
        999_999_999,
        2_000_000_001,
    ]
    older = BatchMarker.from_bytes(
        b'{"batch_id": 7, "input_offsets": {}, "records": 0, "void_after": 2, "void_before": 6}'
    )
    assert older.void == ((2, 6),) and older.is_void(3) and not older.is_void(7)
    never_restored = b'{"batch_id": 7, "input_offsets": {}, "records": 0, "void_after": null, "void_before": 6}'
    assert BatchMarker.from_bytes(never_restored).void == ()


def test_a_new_driver_carries_the_void_ranges_of_the_last_complete_batch_newest_first_kept():
    assert carried_void((), -1, 1_000_000_000) == ((-1, 1_000_000_000),)
    previous = tuple((n * 10, n * 10 + 5) for n in range(MAX_VOID_RANGES))
    carried = carried_void(previous, 1000, 2000)
    assert len(carried) == MAX_VOID_RANGES and carried[-1] == (1000, 2000) and (0, 5) not in carried


def test_a_batch_committed_before_the_writer_opened_is_recognised_by_its_input_end():
    """Spark replays a batch whose transaction committed when its driver died before Spark's commit log: the
    newest complete marker's input offsets cover its end. A batch reading past them in any partition is new."""
    last = BatchMarker(41, {"orders": {0: 10, 1: 7}, "payments": {0: 3, 1: 5}}, records=9)
    writer = ChangelogWriter(ChangelogTopic("app-v1", "joined", 2), "localhost:9092", last_complete=last)
    assert writer.committed_already({"orders": {0: 10, 1: 7}, "payments": {0: 3, 1: 5}})  # the replay
    assert writer.committed_already({"orders": {0: 9, 1: 7}, "payments": {0: 3, 1: 5}})  # an older batch
    assert not writer.committed_already({"orders": {0: 10, 1: 7}, "payments": {0: 4, 1: 5}})  # one record more
    assert not writer.committed_already({"orders": {0: 10, 1: 7, 2: 1}, "payments": {0: 3, 1: 5}})  # a new partition
    assert not writer.committed_already({})  # nothing known of the batch
    fresh = ChangelogWriter(ChangelogTopic("app-v1", "joined", 2), "localhost:9092")  # no batch complete yet
    assert not fresh.committed_already({"orders": {0: 0}})


def test_offset_log_parsing(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"purchases":{"1":2837,"0":2163}}\n'
    )
    assert batch_end_offsets(tmp_path, 3) == {"purchases": {0: 2163, 1: 2837}}
    assert latest_batch_id(tmp_path) == 3
    with pytest.raises(CheckpointOffsetsError, match="no offset log entry for batch 4"):
        batch_end_offsets(tmp_path, 4)


def test_a_batch_reads_the_records_between_its_start_and_end_over_every_source():
    start = {"purchases": {0: 10, 1: 20}, "repartition": {0: 5}}
    end = {"purchases": {0: 15, 1: 20}, "repartition": {0: 8}}
    assert records_between(start, end) == 5 + 0 + 3
    assert records_between(end, end) == 0
    # a partition added since the start: where it started is not known
    assert records_between(start, {**end, "purchases": {0: 15, 1: 20, 2: 4}}) is None
    assert records_between({}, end) is None


def test_a_checkpoints_state_encoding_is_read_from_its_offset_log(tmp_path):
    assert state_encoding(tmp_path) is None  # no batch yet
    (tmp_path / "offsets").mkdir()
    entry = 'v1\n{"batchWatermarkMs":0,"conf":%s}\n{"purchases":{"0":1}}\n'
    (tmp_path / "offsets" / "0").write_text(entry % "{}")
    assert state_encoding(tmp_path) == "unsaferow"  # a checkpoint from before Spark recorded it
    (tmp_path / "offsets" / "1").write_text(entry % '{"spark.sql.streaming.stateStore.encodingFormat":"avro"}')
    assert state_encoding(tmp_path) == "avro"
    (tmp_path / "offsets" / "2").write_text(entry % '{"spark.sql.streaming.stateStore.encodingFormat":"proto"}')
    with pytest.raises(CheckpointOffsetsError, match="unknown state encoding 'proto'"):
        state_encoding(tmp_path)


def test_a_records_batch_is_its_batch_header_wherever_the_header_is():
    assert _batch_of([(BATCH_HEADER, b"7")]) == 7
    assert _batch_of([("traceparent", b"00-ab"), (BATCH_HEADER, b"12")]) == 12  # another header first
    assert _batch_of([("traceparent", b"00-ab")]) is None
    assert _batch_of([]) is None and _batch_of(None) is None
