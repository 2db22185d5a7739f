"""Where a job's stateful stage starts reading its inputs (spark_jobs/driver/sources.py): after the restored state,
else where a reprocessing run said, else the earliest record; and where each micro-batch started. Pure: files in
a temporary checkpoint, no broker, no Spark."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from runtime.settings import Settings
from spark_jobs.driver.sources import JobSources
from spark_jobs.registry import get_job
from spark_jobs.state.restore import RestoredState


def _restored(store: str, offsets: dict[str, dict[str, int]]) -> RestoredState:
    return RestoredState(
        store=store,
        state={},
        batch_id=4,
        input_offsets=offsets,
        snapshot=None,
        changelog_resume_offsets={},
        changelog_records_read=0,
        changelog_records_applied=0,
        seconds=0.0,
    )


def _sources(tmp_path: Path, restored: dict[str, RestoredState] | None = None) -> JobSources:
    """The sources of a stream-table join (two inputs, two partitions each) in a stack under ``tmp_path``."""
    spec = dataclasses.replace(
        get_job("customer_accounts"), source_topic="customers", join_topics=("accounts",), source_partitions=2
    )
    settings = Settings(data_dir=tmp_path)

    def unused(*_):
        raise AssertionError("not called by what these tests ask")

    return JobSources(None, spec, settings, {} if restored is None else restored, unused, unused)


def _commit(sources: JobSources, batch_id: int, ends: dict[str, dict[str, int]]) -> None:
    """Micro-batch ``batch_id`` of the query's checkpoint, ending at ``ends``."""
    root = Path(str(sources.layout.checkpoint))
    for log, entry in (("offsets", f'{{"batchWatermarkMs":0}}\n{json.dumps(ends)}'), ("commits", "{}")):
        (root / log).mkdir(parents=True, exist_ok=True)
        (root / log / str(batch_id)).write_text(f"v1\n{entry}\n")


def test_a_new_query_starts_after_its_restored_state_else_where_it_was_told_else_at_the_earliest(tmp_path):
    assert _sources(tmp_path).input_topics == ("customers", "accounts")
    assert _sources(tmp_path).starting_offsets == "earliest"
    assert _sources(tmp_path).batch_start(0) is None  # Kafka's earliest: not an offset

    # a reprocessing run's start: the inputs it names; an input it does not, from its earliest
    sources = _sources(tmp_path)
    sources.layout.start_offsets_file.write_text(json.dumps({"customers": {"0": 5, "1": 7}}))
    assert json.loads(sources.starting_offsets) == {
        "customers": {"0": 5, "1": 7},
        "accounts": {"0": -2, "1": -2},
    }
    assert sources.batch_start(0) == {0: 5, 1: 7}

    # restored stores win over the start file, and must agree on one position
    at = {"customers": {"0": 9, "1": 3}, "accounts": {"0": 1, "1": 2}}
    restored = _sources(tmp_path, {"a": _restored("a", at), "b": _restored("b", at)})
    assert json.loads(restored.starting_offsets) == at
    torn = _sources(tmp_path, {"a": _restored("a", at), "b": _restored("b", {"customers": {"0": 1, "1": 3}})})
    with pytest.raises(RuntimeError, match="stores restored to different input positions"):
        _ = torn.starting_offsets


def test_a_micro_batch_starts_where_the_one_before_it_ended(tmp_path):
    sources = _sources(tmp_path)
    _commit(sources, 0, {"customers": {"0": 10, "1": 20}, "accounts": {"0": 3, "1": 4}})
    _commit(sources, 1, {"customers": {"0": 15, "1": 21}, "accounts": {"0": 3, "1": 6}})
    assert sources.batch_start_offsets(0) is None
    assert sources.batch_start_offsets(2) == {"customers": {0: 15, 1: 21}, "accounts": {0: 3, 1: 6}}
    assert sources.batch_start(1) == {0: 10, 1: 20}  # the stateful stage's own input: the join's left side
