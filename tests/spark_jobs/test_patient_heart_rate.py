"""The seeds' windowed pulse store on the real stack: windows close once, late pulses are dead-lettered,
check-outs delete, retention evicts, and a lost checkpoint is rebuilt exactly."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from spark_jobs.driver.context import JobContext
from spark_jobs.driver.run import run
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic, read_json_records
from spark_jobs.reference.generators import pulse
from spark_jobs.registry import get_job, store
from spark_jobs.state.changelog import windowed_changelog_retention_ms
from spark_jobs.state.changelog_reader import read_changelog
from tests.spark_jobs.test_dead_letter import read_with_headers

pytestmark = pytest.mark.integration

STORE = "pulse-counts"


@pytest.fixture
def job(unique):
    spec = get_job("patient_heart_rate")
    return dataclasses.replace(
        spec, name=f"heart_rate_{unique}", source_topic=f"patients-{unique}", output_table=f"heart_rate_{unique}"
    )


def _expected(job, rounds) -> pulse.Expected:
    s = store(job, STORE)
    return pulse.expected(rounds, s.window_ms, s.grace_ms, s.retention_ms)


def _emitted(spark, job, settings) -> dict[tuple[str, int], int]:
    rows = spark.read.format("delta").load(str(settings.lake / job.output_table_dir)).collect()
    keys = [(r.patient_id, int(r.window_start.replace(tzinfo=dt.timezone.utc).timestamp() * 1000)) for r in rows]
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    return {k: r.heart_rate for k, r in zip(keys, rows, strict=True)}


def _store(settings, job) -> tuple[dict[tuple[str, int], tuple[int, bool]], dict[int, int]]:
    """The store as its changelog holds it: windows, and each partition's stream time."""
    topic = JobContext(None, job, settings).stores.handle(STORE).changelog.name
    windows, stream_times = {}, {}
    for value in read_changelog(settings.kafka_bootstrap_servers, topic).state.values():
        v = json.loads(value)
        if v.get("patient_id") is None:
            stream_times[v["source_partition"]] = v["stream_time_ms"]
        else:
            windows[(v["patient_id"], v["window_start_ms"])] = (v["beats"], v["closed"])
    return windows, stream_times


def _late_ids(settings, job) -> set[str]:
    records = read_json_records(settings.kafka_bootstrap_servers, dead_letter_topic(job.application_id))
    return {r["event_id"] for r in records}


def _check(spark, settings, job, rounds) -> pulse.Expected:
    want = _expected(job, rounds)
    assert _emitted(spark, job, settings) == want.emitted
    assert _store(settings, job) == (want.state, want.stream_times)
    assert _late_ids(settings, job) == want.late
    return want


def _late_pulse(patient: str, at: dt.datetime, n: int) -> dict:
    return {
        "event_id": f"late-{n}",
        "type": "pulse",
        "patient_id": patient,
        "event_time": at.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
    }


def test_windows_close_once_late_pulses_dead_letter_checkouts_delete_retention_evicts(
    spark, kafka_broker, settings, job
):
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    start = pulse.START
    rounds = []

    def play(events):
        rounds.append(events)
        pulse.produce(bootstrap, job.source_topic, events)
        report = run(job, settings, available_now=True, spark=spark)
        assert report.error is None
        return report

    play(list(pulse.generate(patients=6, seconds=200, seed=1, start=start, checkout_rate=0)))
    want = _check(spark, settings, job, rounds)
    assert len(want.emitted) >= 6 * 2 and not want.late  # the first two minutes closed for everyone

    # Two minutes later: a pulse for a closed window (late), a check-out, and a re-admission.
    second = list(
        pulse.generate(patients=6, seconds=120, seed=2, start=start + dt.timedelta(seconds=200), checkout_rate=0)
    )
    checkout_at = (start + dt.timedelta(seconds=260)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    second.insert(
        len(second) // 2, {"event_id": "out-1", "type": "checked_out", "patient_id": "p001", "event_time": checkout_at}
    )
    second.insert(3, _late_pulse("p002", start + dt.timedelta(seconds=10), 1))
    play(second)
    want = _check(spark, settings, job, rounds)
    assert want.late == {"late-1"}
    [letter] = read_with_headers(bootstrap, dead_letter_topic(job.application_id))
    assert letter["headers"]["reason"] == "late", letter
    assert (
        "window starting 2026-11-01T09:00:00.000Z had closed: stream time of partition" in letter["headers"]["message"]
    )
    base = int(start.timestamp() * 1000)
    assert all(s >= base + 240_000 for p, s in want.state if p == "p001")  # older windows deleted

    # Seven hours later (both partitions: stream time is per partition): everything from the first
    # rounds leaves the store (6 h retention).
    play(list(pulse.generate(patients=6, seconds=70, seed=3, start=start + dt.timedelta(hours=7), checkout_rate=0)))
    want = _check(spark, settings, job, rounds)
    assert all(s >= int((start + dt.timedelta(hours=1)).timestamp() * 1000) for _, s in want.state)


def test_windowed_changelog_deletes_by_time_and_restore_keeps_stream_time(spark, kafka_broker, settings, job):
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    ctx = JobContext(spark, job, settings)
    rounds = [list(pulse.generate(patients=4, seconds=180, seed=11, checkout_rate=0))]
    pulse.produce(bootstrap, job.source_topic, rounds[0])
    run(job, settings, available_now=True, spark=spark)

    name = ctx.stores.handle(STORE).changelog.name
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = next(iter(admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, name)]).values())).result()
    assert described["cleanup.policy"].value == "compact,delete"
    assert described["retention.ms"].value == str(windowed_changelog_retention_ms(store(job, STORE).retention_ms))

    # Lose the checkpoint. The next round holds a pulse for a window that closed before the loss:
    # still late after the restore, because stream time was restored with the state.
    shutil.rmtree(ctx.layout.checkpoint)
    rounds.append(
        list(
            pulse.generate(
                patients=4, seconds=60, seed=12, checkout_rate=0, start=pulse.START + dt.timedelta(seconds=180)
            )
        )
    )
    rounds[1].insert(0, _late_pulse("p003", pulse.START + dt.timedelta(seconds=5), 2))
    pulse.produce(bootstrap, job.source_topic, rounds[1])
    report = run(job, settings, available_now=True, spark=spark)
    assert report.restores[STORE].keys > 0  # windows and stream times came back from the changelog
    assert report.input_rows == len(rounds[1])
    want = _check(spark, settings, job, rounds)
    assert want.late == {"late-2"}
