"""Declarations of the primitives other than the keyed aggregate (see test_keyed_aggregate.py): their
state format follows from the declaration, and one that cannot run is refused naming the job and field."""

from __future__ import annotations

import dataclasses

import pytest

from spark_jobs.primitives import Aggregate
from spark_jobs.reference.jobs import vote_counts
from spark_jobs.registry import JobSpecError, StoreSpec, get_job

VOTES, SPEC = vote_counts.VOTES, get_job("vote_counts")


def test_vote_counts_declared_keeps_the_state_format_its_versions_wrote():
    VOTES.check(SPEC)
    assert VOTES.state_ddl == (
        "candidate STRING, voted_at TIMESTAMP, event_id STRING, "
        "history ARRAY<STRUCT<voted_at: TIMESTAMP, candidate: STRING, event_id: STRING>>"
    )
    assert VOTES.output_values == ("candidate", "voted_at", "event_id")


@pytest.mark.parametrize(
    ("change", "spec_change", "message"),
    [
        ({"time": "candidate"}, {}, "time: 'candidate' must be a TIMESTAMP field, not STRING"),
        ({"version_id": "voted_at"}, {}, "version_id: 'voted_at' must be a STRING field, not TIMESTAMP"),
        ({"time": "at"}, {}, "time: 'at' is not one of values"),
        ({"values": {**VOTES.values, "weight": "weight"}}, {}, "values.weight: 'weight' is not a field"),
        ({"values": {**VOTES.values, "history": "candidate"}}, {}, "values.history: not key, tombstone, history"),
        ({}, {"stores": (StoreSpec("latest-votes"),)}, "store 'latest-votes': this primitive keeps a versioned store"),
        ({}, {"companion_outputs": ()}, "summaries: \\['counts'\\] must name the spec's companion_outputs \\[\\]"),
        ({"summaries": {"counts": "SELECT 1"}}, {}, "summaries.counts: the query reads the outputs as {outputs}"),
    ],
)
def test_a_versioned_declaration_that_cannot_run_is_refused(change, spec_change, message):
    with pytest.raises(JobSpecError, match=f"job vote_counts: {message}"):
        dataclasses.replace(VOTES, **change).check(dataclasses.replace(SPEC, **spec_change))


def test_patient_heart_rate_declared_keeps_the_state_format_its_versions_wrote():
    from spark_jobs.reference.jobs import patient_heart_rate

    declared, spec = patient_heart_rate.HEART_RATE, get_job("patient_heart_rate")
    declared.check(spec)
    assert declared.state_ddl_for(spec.key_field) == (
        "patient_id STRING, window_start_ms BIGINT, beats BIGINT, closed BOOLEAN, source_partition INT, stream_time_ms BIGINT"
    )
    assert declared.output_key(spec.key_field) == spec.output_key == ("patient_id", "window_start")


@pytest.mark.parametrize(
    ("change", "spec_change", "message"),
    [
        ({"time": "event_id"}, {}, "time: 'event_id' must be a TIMESTAMP field"),
        ({"time": "at"}, {}, "time: 'at' is not a field of the event schema"),
        (
            {"values": {"patient_id": Aggregate.count()}},
            {},
            "values.patient_id: use lower-case letters, digits and _, and not the key",
        ),
        (
            {"outputs": {"window_end": "beats"}},
            {},
            "outputs.window_end: use lower-case letters, digits and _, and not the key",
        ),
        ({"values": {}}, {}, "values: declare at least one aggregate"),
        (
            {"values": {"beats": Aggregate.sum("patient_id")}},
            {},
            "values.beats: cannot sum 'patient_id', a string field",
        ),
        ({"emit": "sometimes"}, {}, "emit: 'sometimes' is not one of \\('close', 'update'\\)"),
        ({}, {"stores": (StoreSpec("pulse-counts"),)}, "store 'pulse-counts': this primitive keeps a windowed store"),
        (
            {},
            {"output_key": ("patient_id",)},
            "output_key: the outputs are keyed by \\('patient_id', 'window_start'\\)",
        ),
    ],
)
def test_a_windows_declaration_that_cannot_run_is_refused(change, spec_change, message):
    from spark_jobs.reference.jobs import patient_heart_rate

    spec = get_job("patient_heart_rate")
    with pytest.raises(JobSpecError, match=f"job patient_heart_rate: {message}"):
        dataclasses.replace(patient_heart_rate.HEART_RATE, **change).check(dataclasses.replace(spec, **spec_change))
