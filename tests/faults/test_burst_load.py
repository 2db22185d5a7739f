"""Burst load, CI-sized: the reference job runs under spark-submit at a steady rate, then gets 10x that
rate for 20 seconds (8,000 events, four times the batch bound). The driver's memory stays bounded, micro-batches stay within
``max_offsets_per_trigger`` (the job catches up in bounded steps instead of one huge batch), the input
lag drains back to its steady level, and the output equals the reference computation. Memory: the
driver stays within its budget (heap limit + 2 GiB) while the burst is worked through.

The 30-minute version (with the DAGs running too, and a chart) is ``bench/soak.py``; this test uses
its sampling so both measure the same things.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
import time

import pytest

from bench.compare import process_tree_rss
from bench.soak import output_matches_reference, sample
from runtime.process import stop_process_group
from spark_jobs.driver.lifecycle import read_status
from spark_jobs.driver.submit import submit_spec
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from tests.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.faults]

JOB = get_job("purchase_counts")
RATE, BURST_X, USERS = 40, 10, 500  # events/s; the burst is 400/s, well above what the job does per second here
#: the warm-up covers the 5 samples (3 s apart) the steady lag is read from
WARM_UP_S, BURST_S, DRAIN_LIMIT_S = 15, 20, 240
STEADY_SAMPLES = 5
MAX_BATCH = 2000
#: the driver tree's budget: its JVM heap limit (spark.driver.memory) + 2 GiB for the rest (metaspace,
#: code cache, RocksDB, 2 Python workers). The heap grows in steps towards its limit whatever the input
#: (here: 2.0-3.5 GiB in runs with and without the burst; the 40-min soak 2.4-3.3 GiB), so a ratio to
#: the warmed-up peak measures GC, not the burst; the budget is what must hold.
RSS_BUDGET_MIB = 2 * 1024 + 2048


def test_a_ten_x_burst_keeps_memory_bounded_and_the_lag_drains(private_stack):
    settings = private_stack.replace(max_offsets_per_trigger=MAX_BATCH)
    ensure_topic(settings.kafka, JOB.source_topic, JOB.source_partitions)
    burst = threading.Event()
    stop = threading.Event()

    def produce() -> None:
        seed = 0
        while not stop.is_set():
            tick, seed = time.monotonic(), seed + 1
            count = RATE * (BURST_X if burst.is_set() else 1)
            purchases.produce(settings.kafka, JOB.source_topic, purchases.generate(count, users=USERS, seed=seed))
            stop.wait(max(0.0, 1.0 - (time.monotonic() - tick)))

    submit = submit_spec(JOB, settings)
    log = open(settings.data_dir / "driver.log", "w")  # noqa: SIM115 - closed in finally
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    driver = subprocess.Popen(
        submit.command(), env={**os.environ, **submit.env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    started = time.monotonic()
    rows: list[dict] = []
    batch_sizes: list[int] = []
    over_budget: list[tuple[float, dict | None]] = []

    def record(phase: str) -> dict:
        assert driver.poll() is None, f"the driver exited ({driver.returncode}); see {log.name}"
        row = {**sample(settings, JOB, driver.pid, started), "phase": phase}
        if row["driver_rss_mib"] > RSS_BUDGET_MIB:  # which processes: kept for the failure's message
            over_budget.append((row["minute"], process_tree_rss(driver.pid)))
        status = read_status(settings.status_dir, JOB.application_id)
        if status and status.progress and status.progress.input_rows:
            batch_sizes.append(status.progress.input_rows)
        rows.append(row)
        return row

    try:
        wait_for(
            lambda: (record("warm-up")["batch_id"] or 0) >= 2,
            240,
            "the job's first batches",
            diagnose=lambda: (settings.data_dir / "driver.log").read_text()[-3000:],
        )
        warm_up_end = time.monotonic() + WARM_UP_S
        while time.monotonic() < warm_up_end:
            record("warm-up")
            time.sleep(3)
        steady_lag = max(r["input_lag_records"] for r in rows[-STEADY_SAMPLES:])
        burst.set()
        burst_end = time.monotonic() + BURST_S
        while time.monotonic() < burst_end:
            record("burst")
            time.sleep(3)
        burst.clear()
        peak_lag = max(r["input_lag_records"] for r in rows if r["phase"] == "burst")
        # Back at the steady rate: the lag must come down to (about) where it was before the burst.
        drained_at = None
        drain_end = time.monotonic() + DRAIN_LIMIT_S
        while time.monotonic() < drain_end and drained_at is None:
            if record("after")["input_lag_records"] <= steady_lag + 2 * RATE * 5:
                drained_at = time.monotonic() - (burst_end)
            time.sleep(3)
        stop.set()
        producer.join(10)
        wait_for(lambda: record("drain")["input_lag_records"] == 0, 180, "the last input to be processed")
    finally:
        stop.set()
        stop_process_group(driver)
        log.close()
        for r in rows:
            print(
                f"{r['minute']:5.2f} min {r['phase']:8s} rss {r['driver_rss_mib']:7.1f} MiB lag {r['input_lag_records']:6d} "
                f"batch {r['batch_id']} state {r['state_rows']}"
            )

    warm_rss = max(r["driver_rss_mib"] for r in rows if r["phase"] == "warm-up")
    # Held for two samples in a row (3 s apart): a single sample of a process tree once read 4.9 GiB between
    # two of 1.8 GiB (CI, 2026-11-26), which no heap of 2 GiB can do and undo in 3 s; a sum of per-process
    # RSS counts twice what a process shares with a child it is cloning. A growth that matters persists.
    later = [r["driver_rss_mib"] for r in rows if r["phase"] != "warm-up"]
    later_rss = max(min(pair) for pair in itertools.pairwise(later))
    assert peak_lag > steady_lag + RATE * BURST_X, f"the burst did not outrun the job (lag {steady_lag} -> {peak_lag})"
    assert drained_at is not None, f"the lag stayed above its steady level {DRAIN_LIMIT_S} s after the burst"
    assert max(batch_sizes) <= MAX_BATCH, f"a micro-batch of {max(batch_sizes)} records (limit {MAX_BATCH})"
    assert settings.spark_driver_memory == "2g", "RSS_BUDGET_MIB assumes the default 2 GiB heap"
    assert later_rss <= RSS_BUDGET_MIB, (
        f"driver RSS {warm_rss:.0f} MiB before the burst, {later_rss:.0f} after; over budget: {over_budget}"
    )
    if over_budget:  # a one-sample spike: said, so a run that shows it can be read
        print(f"single samples over the budget (process tree then): {over_budget}")
    assert rows[-1]["state_rows"] <= USERS
    assert output_matches_reference(settings, JOB)
    print(
        f"steady lag {steady_lag}, peak {peak_lag}, back to steady {drained_at:.0f} s after the burst; "
        f"RSS {warm_rss:.0f} -> {later_rss:.0f} MiB; largest batch {max(batch_sizes)}"
    )
