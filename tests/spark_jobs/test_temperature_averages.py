"""temperature_averages: hopping windows and aggregates beyond a count, held to the plain-Python reference
of Kafka Streams' semantics (spark_jobs.reference.generators.temperatures.expected):

* the windows processor on the same events cut into micro-batches in different ways: what it emits on
  close, every update (``emit="update"``), the store and the late events must be the same whatever the cut;
* the registered job end to end on the real broker, Spark and Delta (two runs, the second restoring its
  store from the changelog after the checkpoint was lost), its outputs and dead letters; and the same declaration with ``emit="update"``, whose outputs are every
  window's latest values.

The Kafka Streams app itself runs the same topology on the same input in tests/bench/test_kafka_streams_peer.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil

import pytest

from spark_jobs.primitives.event_time import LATE
from spark_jobs.reference.generators import temperatures, windows
from spark_jobs.reference.jobs.temperature_averages import AVERAGES, EVENT_SCHEMA
from spark_jobs.registry import get_job
from spark_jobs.registry import store as store_spec
from spark_jobs.testing import JobHarness
from spark_jobs.versions import read_rows
from tests.helpers import collect_available_now, file_stream, source_rows, with_source_columns

pytestmark = pytest.mark.integration

PARTITIONS = 2
SPEC = get_job("temperature_averages")
STORE = store_spec(SPEC, "temperature-windows")
VALUES = tuple(AVERAGES.values)
SEEDS = [int(s) for s in os.environ.get("WINDOW_SEEDS", "1").split(",")]
#: the update-mode twin of the job (its entrypoint: this module), for the end-to-end test
UPDATES = dataclasses.replace(
    AVERAGES,
    emit="update",
    summaries={
        "per_window": "SELECT window_start, COUNT(1) AS sensors, MAX(max_temperature) AS max_temperature "
        "FROM {outputs} GROUP BY window_start"
    },
)


def _expected(events: list[dict]) -> windows.Windows:
    return temperatures.expected(
        events, STORE.window_ms, STORE.advance_ms, STORE.grace_ms, STORE.retention_ms, PARTITIONS
    )


def _run(spark, tmp_path, events: list[dict], cut: int, name: str) -> windows.Windows:
    """The processor over ``events`` in micro-batches of ``cut`` records; what it emitted on close, every
    window's latest update, what it kept and refused, in the reference's terms."""
    rows = source_rows(events, EVENT_SCHEMA, "sensor_id", PARTITIONS, temperatures.START)
    batches = [rows[i : i + cut] for i in range(0, len(rows), cut)]
    stream = file_stream(spark, batches, with_source_columns(EVENT_SCHEMA), tmp_path / f"events-{name}")
    changes = AVERAGES.changes(stream, "sensor_id", None, STORE, job="temperature_averages")

    def row_of(row, batch_id: int) -> tuple:
        return batch_id, tuple(sorted(row.asDict().items(), key=lambda item: item[0]))

    seen = sorted(collect_available_now(changes, "append", tmp_path / f"checkpoint-{name}", row_of), key=lambda r: r[0])
    got = windows.Windows({}, {}, {}, {}, {})
    for _, items in seen:
        row = dict(items)
        window, values = (row["sensor_id"], row["window_start_ms"]), tuple(row[v] for v in VALUES)
        if row["kind"] == LATE:
            got.late[bytes(row["raw"]).decode()] = row["open_windows"]
            assert row["window_start_ms"] + STORE.window_ms + STORE.grace_ms <= row["stream_time_ms"]
        elif row["sensor_id"] is None:
            got.stream_times[row["source_partition"]] = row["stream_time_ms"]
        else:
            if row["closed"]:
                assert window not in got.emitted, f"window {window} emitted twice"
                got.emitted[window] = values
            if not row["tombstone"] or row["closed"]:
                got.updated[window] = values
            elif row["closed"] is False:  # a delete removed the open window
                got.updated.pop(window, None)
            if row["tombstone"]:
                got.state.pop(window, None)
            else:
                got.state[window] = (values, row["closed"])
    return got


@pytest.mark.parametrize("seed", SEEDS)
def test_hopping_windows_match_kafka_streams_semantics_whatever_the_batching(spark, tmp_path, seed):
    events = list(temperatures.adversarial(160, sensors=5, seed=seed))
    want = _expected(events)
    # The input really tests what hopping adds: events late for some of their windows and not others,
    # events late for all of them, removals, and windows that closed.
    assert any(0 < n < 5 for n in want.late.values()) and 0 in want.late.values()
    assert want.emitted and any(e["type"] == temperatures.SENSOR_REMOVED for e in events)
    assert set(want.updated) - set(want.emitted), "open windows are only in the update view"
    for cut in (len(events), 5):
        assert _run(spark, tmp_path, events, cut, f"s{seed}-{cut}") == want, f"micro-batches of {cut}"


@pytest.mark.parametrize("source_partitions, shuffle_partitions", [(2, 2), (4, 2), (3, 3), (6, 4)])
def test_each_shuffle_partition_runs_its_share_of_the_source_partitions(
    spark, tmp_path, source_partitions, shuffle_partitions
):
    """The processor of source partition p runs in shuffle partition p mod N, so the partitions' work spreads
    over the cores (grouped by the partition number, partitions 0 and 1 hashed into one of two shuffle
    partitions, and one task ran both while the other core idled)."""
    from pyspark.sql import functions as F

    events = list(temperatures.generate(sensors=40, seconds=60, seed=9))
    rows = source_rows(events, EVENT_SCHEMA, "sensor_id", source_partitions, temperatures.START)
    assert {row["partition"] for row in rows} == set(range(source_partitions))
    stream = file_stream(spark, [rows], with_source_columns(EVENT_SCHEMA), tmp_path / "events")
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))  # a new checkpoint takes it
    try:
        changes = AVERAGES.changes(stream, "sensor_id", None, STORE, job="temperature_averages")
        placed = changes.select("source_partition", F.spark_partition_id().alias("task"))
        seen: set[tuple[int, int]] = set()
        writer = placed.writeStream.foreachBatch(lambda batch, _: seen.update(map(tuple, batch.collect())))
        query = writer.option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start()
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    assert sorted(seen) == [(p, p % shuffle_partitions) for p in range(source_partitions)]


def _outputs(rows: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["sensor_id"], int(r["window_start"].timestamp() * 1000)): r for r in rows}


def test_the_job_writes_closed_windows_dead_letters_late_readings_and_survives_a_lost_checkpoint(
    spark, kafka_broker, settings, unique
):
    spec = dataclasses.replace(
        SPEC,
        source_topic=f"sensor-readings-{unique}",
        name=f"temperatures_{unique}",
        output_table=f"temperatures_{unique}",
    )
    events = list(temperatures.generate(sensors=4, seconds=600, seed=7))
    # 200 s before the end: the reading's earliest windows have closed, its latest are open
    at = temperatures.START + dt.timedelta(
        milliseconds=windows.millis(events[-1]["event_time"]) - 200_000 - int(temperatures.START.timestamp() * 1000)
    )
    late = dict(events[-1], event_id="late-one", event_time=at.isoformat().replace("+00:00", "Z"), temperature=99.5)
    bad = {"event_id": "bad", "type": "reading", "sensor_id": "s001", "event_time": events[-1]["event_time"]}
    rounds = [events[: len(events) // 2], [*events[len(events) // 2 :], late, bad]]
    want = _expected([*events, late])  # the bad reading is a dead letter, not an event
    with JobHarness(settings=settings, spark=spark) as harness:
        first = harness.run(spec, rounds[0])
        # Lose the checkpoint: the second run restores the windows (four values each) and the partitions'
        # stream times from the changelog, and goes on exactly as if nothing had happened.
        shutil.rmtree(first.report.checkpoint)
        second = harness.run(spec, rounds[1])
    assert second.report.restores[STORE.name].keys > 0
    outputs = _outputs(second.outputs)
    assert outputs.keys() == want.emitted.keys() and len(outputs) > 20
    for window, values in want.emitted.items():
        row = outputs[window]
        assert row["window_end"].timestamp() * 1000 == window[1] + STORE.window_ms
        assert {k: row[k] for k in ("readings", "avg_temperature", "min_temperature", "max_temperature")} == (
            temperatures.average(values)
        ), window
    assert len(first.outputs) < len(outputs)
    (late_letter,) = [x for x in second.dead_letters if b'"late-one"' in (x.value or b"")]
    assert late_letter.reason == "late" and "had closed" in late_letter.message
    assert want.late.keys() == {"late-one"} and 0 < want.late["late-one"] < 5
    assert late_letter.message.endswith(f"; counted in its {want.late['late-one']} open windows")
    assert any(x.message.endswith(": a reading needs a temperature") for x in second.dead_letters), [
        (x.reason, x.message) for x in second.dead_letters
    ]


def test_the_update_mode_outputs_every_windows_latest_values(spark, kafka_broker, settings, unique):
    spec = dataclasses.replace(
        SPEC,
        source_topic=f"sensor-updates-{unique}",
        name=f"temperature_updates_{unique}",
        output_table=f"temperature_updates_{unique}",
        entrypoint=f"{__name__}:UPDATES",
        companion_outputs=("per_window",),
    )
    events = list(temperatures.adversarial(120, sensors=4, seed=3))
    want = _expected(events)
    assert set(want.updated) - set(want.emitted) and any(e["type"] == temperatures.SENSOR_REMOVED for e in events)
    with JobHarness(settings=settings, spark=spark) as harness:
        harness.run(spec, events[:70])
        result = harness.run(spec, events[70:])
    outputs = _outputs(result.outputs)
    assert outputs.keys() == want.updated.keys()
    for window, values in want.updated.items():
        assert {k: outputs[window][k] for k in ("readings", "avg_temperature")} == {
            k: v for k, v in temperatures.average(values).items() if k in ("readings", "avg_temperature")
        }, window
    # the summary, recomputed from the outputs after the batches that changed them
    per_window: dict[int, tuple[int, float]] = {}
    for (_, start), values in want.updated.items():
        sensors, warmest = per_window.get(start, (0, float("-inf")))
        per_window[start] = (sensors + 1, max(warmest, temperatures.average(values)["max_temperature"]))
    summary = read_rows(str(settings.lake / spec.output_table_dirs[1]))
    assert {int(r["window_start"].timestamp() * 1000): (r["sensors"], r["max_temperature"]) for r in summary} == (
        per_window
    )
