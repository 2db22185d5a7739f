"""The job registry: typed, validated definitions; every artifact of a version is its own."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from spark_jobs.registry import JobSpecError, StoreMigration, StoreSpec, get_job, latest_jobs, registered_versions


def test_versions_write_separate_output_tables_and_changelogs():
    v2 = get_job("purchase_counts")
    v3 = dataclasses.replace(v2, version=v2.version + 1)
    assert v2.output_table_dir != v3.output_table_dir
    assert v2.application_id != v3.application_id


def test_reference_jobs_are_registered_with_their_state_size_controls():
    assert {"purchase_counts", "patient_heart_rate", "vote_counts"} <= set(latest_jobs())
    pulse = get_job("patient_heart_rate").stores[0]
    assert (pulse.kind, pulse.window_ms, pulse.grace_ms, pulse.retention_ms) == (
        "windowed",
        60_000,
        5_000,
        6 * 3600_000,
    )
    assert get_job("vote_counts").stores[0].kind == "versioned"


def test_windowed_retention_must_cover_window_and_grace():
    with pytest.raises(JobSpecError, match="shorter than window_ms \\+ grace_ms = 65000"):
        StoreSpec("w", kind="windowed", window_ms=60_000, grace_ms=5_000, retention_ms=60_000)


def test_ttl_is_for_key_value_stores():
    with pytest.raises(JobSpecError, match="ttl_ms"):
        StoreSpec("w", kind="windowed", window_ms=1000, retention_ms=2000, ttl_ms=10)
    assert StoreSpec("counts", ttl_ms=1000).ttl_ms == 1000


def test_a_migration_names_one_of_the_versions_stores_and_a_function():
    v3 = get_job("purchase_counts", 3)
    ok = dataclasses.replace(
        v3, version=4, migrations=(StoreMigration("counts", function="my_jobs.migrations:add_tier"),)
    )
    assert ok.migrations[0].source_store == "counts"
    with pytest.raises(JobSpecError, match="purchase_counts: migrations: store 'totals' is not one of its stores"):
        dataclasses.replace(v3, migrations=(StoreMigration("totals"),))
    with pytest.raises(JobSpecError, match="function must be 'module:function'"):
        dataclasses.replace(v3, migrations=(StoreMigration("counts", function="add_tier"),))
    with pytest.raises(JobSpecError, match="one migration per store"):
        dataclasses.replace(v3, migrations=(StoreMigration("counts"), StoreMigration("counts", from_store="old")))


def test_two_jobs_writing_one_output_table_are_refused(tmp_path, monkeypatch):
    (tmp_path / "twin_jobs.py").write_text(
        "import dataclasses\n"
        "from spark_jobs.registry import get_job\n"
        "JOBS = (dataclasses.replace(get_job('purchase_counts'), name='twin_counts'),)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(
            JobSpecError,
            match="jobs purchase_counts-v3 and twin_counts-v3 both write the output table "
            "'purchase_counts_v3'; give one of them an output_table of its own",
        ):
            registered_versions("twin_jobs")
    finally:
        sys.modules.pop("twin_jobs", None)


def test_max_task_idle_is_a_joins_and_never_negative():
    spec = get_job("order_payments")
    assert spec.max_task_idle_ms == 0  # Kafka Streams' default: wait only for records written
    assert dataclasses.replace(spec, max_task_idle_ms=2_000).max_task_idle_ms == 2_000
    for job, wait in (("order_payments", -1), ("purchase_counts", 5)):
        with pytest.raises(JobSpecError, match="max_task_idle_ms must be >= 0, and is for a job with join_topics"):
            dataclasses.replace(get_job(job), max_task_idle_ms=wait)
