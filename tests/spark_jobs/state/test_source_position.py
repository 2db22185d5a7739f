"""How far a version has consumed its source (``committed_source_offsets``), without a broker: offset logs
written as Spark writes them, the repartition topic's committed end and pending origins stubbed.

A re-keyed version has consumed a source record only when its re-keying stage committed it *and* its
stateful stage applied what that stage wrote for it; a migration to or from a re-keyed version is refused
with the job, the versions and the reason."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from streamstate.triggers.streaming_job import StreamingJobCaughtUpTrigger

from runtime.object_store import Location
from spark_jobs.layout import JobLayout
from spark_jobs.registry import get_job
from spark_jobs.state import source_position
from spark_jobs.state.migration import MigrationRefused, refuse_unportable_position
from spark_jobs.state.source_position import (
    applied_source_offsets,
    committed_source_offsets,
    pending_ranges,
    source_behind,
)

SOURCE = "monitor-events"


def _layout(tmp_path: Path, *, repartition: bool, join_topics: tuple[str, ...] = ()) -> JobLayout:
    return JobLayout(
        application_id="pulses-v2",
        source_topic=SOURCE,
        store_names=("counts",),
        checkpoint=Location.of(tmp_path / "pulses-v2"),
        status_dir=tmp_path,
        lake=Location.of(tmp_path / "lake"),
        logs_dir=tmp_path,
        output_table_dirs=("pulses_v2",),
        repartition=repartition,
        version=2,
        join_topics=join_topics,
    )


def _commit(checkpoint: Location, batch_id: int, topic: str, ends: dict[int, int], **more: dict[int, int]) -> None:
    """A committed micro-batch of ``checkpoint``'s query, ending at ``ends`` of ``topic`` (and of the topics
    ``more`` names, for a query reading several)."""
    root = Path(str(checkpoint))
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(parents=True, exist_ok=True)
    entry = {name: {str(p): o for p, o in offsets.items()} for name, offsets in {topic: ends, **more}.items()}
    (root / "offsets" / str(batch_id)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(entry)}\n')
    (root / "commits" / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


@pytest.fixture
def repartition_topic(monkeypatch):
    """The repartition topic as the reader sees it: its committed end, and the origins of records in ranges."""
    topic = {"ends": {}, "origins": [], "read": []}
    monkeypatch.setattr(source_position, "committed_ends", lambda _kafka, _topic: dict(topic["ends"]))

    def origins(_kafka, _topic, _source, ranges):
        topic["read"].append(ranges)
        return list(topic["origins"])

    monkeypatch.setattr(source_position, "_pending_origins", origins)
    return topic


def test_a_plain_version_has_consumed_what_its_checkpoint_committed(tmp_path):
    layout = _layout(tmp_path, repartition=False)
    assert committed_source_offsets(layout, None) is None
    _commit(layout.checkpoint, 0, SOURCE, {0: 4, 1: 9})
    assert committed_source_offsets(layout, None) == {SOURCE: {0: 4, 1: 9}}


def test_a_join_has_consumed_what_its_checkpoint_committed_of_each_input(tmp_path):
    layout = _layout(tmp_path, repartition=False, join_topics=("payments",))
    _commit(layout.checkpoint, 0, SOURCE, {0: 4, 1: 9}, payments={0: 2, 1: 0})
    _commit(layout.checkpoint, 1, SOURCE, {0: 6, 1: 9}, payments={0: 3, 1: 1})
    assert committed_source_offsets(layout, None) == {SOURCE: {0: 6, 1: 9}, "payments": {0: 3, 1: 1}}
    assert source_behind(committed_source_offsets(layout, None), {SOURCE: {"0": 6}, "payments": {"1": 4}}) == {
        "payments": {1: 3}
    }


def test_a_rekeyed_version_has_consumed_what_it_rekeyed_and_applied(tmp_path, repartition_topic):
    layout = _layout(tmp_path, repartition=True)
    assert committed_source_offsets(layout, None) is None  # nothing re-keyed yet
    _commit(layout.repartition_checkpoint, 3, SOURCE, {0: 10, 1: 7, 2: 5})
    # the stateful checkpoint's own offsets are the repartition topic's: never read as source offsets
    repartition_topic["ends"] = {0: 12, 1: 9}
    assert committed_source_offsets(layout, None) is None  # re-keyed, not applied by any batch yet
    repartition_topic["ends"] = {0: 0, 1: 0}  # every record so far was a dead letter: nothing to apply
    assert committed_source_offsets(layout, None) == {SOURCE: {0: 10, 1: 7, 2: 5}}

    repartition_topic["ends"] = {0: 12, 1: 9}
    _commit(layout.checkpoint, 0, layout.repartition_topic, {0: 12, 1: 9})
    assert committed_source_offsets(layout, None) == {SOURCE: {0: 10, 1: 7, 2: 5}}
    assert repartition_topic["read"] == []  # caught up: no record read

    # the re-keying stage wrote on (its newest batch ends past what it had committed when read), the stateful
    # stage has applied partition 1 only up to 9: its pending records' origins lower the position
    repartition_topic["ends"] = {0: 12, 1: 15}
    repartition_topic["origins"] = [(1, 6), (2, 3), (1, 8), (0, 11)]
    assert committed_source_offsets(layout, None) == {SOURCE: {0: 10, 1: 6, 2: 3}}
    assert repartition_topic["read"] == [{1: (9, 15)}]


def test_pure_parts():
    assert pending_ranges({0: 12, 1: 9, 2: 0}, {0: 12, 1: 4}) == {1: (4, 9)}
    assert pending_ranges({0: 3}, {}) == {0: (0, 3)}
    assert applied_source_offsets({0: 10, 1: 7}, [(1, 9), (0, 2), (5, 1)]) == {0: 2, 1: 7}
    assert source_behind(None, {SOURCE: {"0": 3}}) == {SOURCE: {0: 3}}
    assert source_behind({SOURCE: {0: 5, 1: 2}}, {SOURCE: {"0": 5, "1": 4}}) == {SOURCE: {1: 2}}
    assert source_behind({SOURCE: {0: 6}}, {SOURCE: {0: 5}}) == {}


def test_a_migration_to_or_from_a_rekeyed_version_is_refused(settings, monkeypatch):
    monkeypatch.setenv("STREAMSTATE_JOB_MODULES", "tests.fixtures.reprocess_jobs")
    v1, v2 = get_job("rekeyed_tiered_counts", 1), get_job("rekeyed_tiered_counts", 2)
    with pytest.raises(
        MigrationRefused, match=r"job rekeyed_tiered_counts: migrate v1 -> v2 is not supported: v1 re-keys"
    ):
        refuse_unportable_position(v1, v2)
    refuse_unportable_position(get_job("tiered_counts", 1), get_job("tiered_counts", 2))  # neither re-keys: allowed
    joined = get_job("joined_orders", 1)
    with pytest.raises(
        MigrationRefused, match=r"v1 reads reprocess-orders, reprocess-profiles and v2 reprocess-orders;"
    ):
        refuse_unportable_position(joined, dataclasses.replace(joined, version=2, join_topics=()))


def test_the_catch_up_trigger_names_the_version_not_a_checkpoint():
    trigger = StreamingJobCaughtUpTrigger("pulses", 2, "/status", {SOURCE: {0: 5, "1": 7}}, timeout_s=60)
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("StreamingJobCaughtUpTrigger")
    assert kwargs == {
        "job": "pulses",
        "version": 2,
        "status_dir": "/status",
        "targets": {SOURCE: {"0": 5, "1": 7}},
        "timeout_s": 60,
        "poll_s": 0.5,
        "fires_after": 0.0,
    }
    assert StreamingJobCaughtUpTrigger(**kwargs).serialize() == (classpath, kwargs)
