"""Airflow knows the chain: the plan of a reprocessing run names every job reading the job's outputs (a
batch step over its Delta table, a streaming job over its upsert topic) and what to do about each
(spark_jobs/operations/reprocess/chain.py; pure, from the registries)."""

from __future__ import annotations

import pytest

from spark_jobs.operations.reprocess.chain import Readers, chain_notes, readers_of
from spark_jobs.registry import get_job


@pytest.fixture
def chain(monkeypatch):
    monkeypatch.setenv("STREAMSTATE_JOB_MODULES", "tests.fixtures.chain_jobs")


def test_a_batch_step_reading_a_job_is_named_with_the_backfill_it_needs():
    spec = get_job("stock_price_changes")
    readers = readers_of(spec)
    assert readers == Readers(
        "stock_price_changes",
        batch_jobs=("daily_top_movers",),
        streaming_jobs=(("top_movers", "stock-daily-changes-v1"),),  # stage 2 over its upsert topic
    )
    beside, reader = chain_notes(readers, "side_by_side", spec, spec, truncate_outputs=False)
    assert "once v1 is promoted its next runs read it" in beside and "--dag-id batch__daily_top_movers" in beside
    assert "top_movers" in reader
    (reset, _) = chain_notes(readers, "reset", spec, spec, truncate_outputs=True)
    assert "which the reset rewrites" in reset and "backfill the intervals it recomputed" in reset
    assert readers_of(get_job("purchase_counts")) == Readers("purchase_counts")


def test_a_streaming_job_reading_a_jobs_upsert_topic_is_told_about_the_new_versions_topic(chain):
    current, target = get_job("chain_counts", 3), get_job("chain_counts", 4)
    readers = readers_of(current)
    assert readers.streaming_jobs == (("chain_reader", "chain-counts-v3"),) and readers.batch_jobs == ()
    (beside,) = chain_notes(readers, "side_by_side", current, target, truncate_outputs=False)
    assert "v4 writes chain-counts-v4, which chain_reader does not read" in beside
    assert chain_notes(readers, "reset", current, current, truncate_outputs=False) == []
    (emptied,) = chain_notes(readers, "reset", current, current, truncate_outputs=True)
    assert "reads chain-counts-v3, which the reset empties" in emptied
