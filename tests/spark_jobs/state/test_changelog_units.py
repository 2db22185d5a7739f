"""Pure logic of changelog topics, batch markers and the checkpoint offset log."""

import pytest

from spark_jobs.state.changelog import BatchMarker, ChangelogTopic, changelog_topic_name
from spark_jobs.state.checkpoint_offsets import CheckpointOffsetsError, batch_end_offsets, latest_batch_id


def test_topic_name_follows_kafka_streams():
    assert changelog_topic_name("purchase_counts-v1", "counts") == "purchase_counts-v1-counts-changelog"


def test_key_value_changelog_is_compacted_and_overridable():
    topic = ChangelogTopic("app-v1", "counts", partitions=2, replication_factor=3,
                           overrides={"segment.bytes": "1048576"})  # fmt: skip
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


def test_offset_log_parsing(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"purchases":{"1":2837,"0":2163}}\n'
    )
    assert batch_end_offsets(tmp_path, 3) == {"purchases": {0: 2163, 1: 2837}}
    assert latest_batch_id(tmp_path) == 3
    with pytest.raises(CheckpointOffsetsError, match="no offset log entry for batch 4"):
        batch_end_offsets(tmp_path, 4)
