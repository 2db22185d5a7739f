"""Key lookup latency of the state query API over HTTP: live view vs standby, p50 / p99.

On a private local broker: a changelog of KEYS keys written as a running job writes it (the same
records and batch markers; no Spark needed for the query path), the warm standby follows it into the
Delta snapshot, and the API runs as users run it (``python -m streamstate_cli state-api``, its own process).
The bench holds the job's lease with a RUNNING status while measuring "live" (that is all the API
looks at), then releases it and measures "standby". Each round sends LOOKUPS random-key GETs on one
keep-alive connection; the figures are the median of ROUNDS rounds (min-max). For scale, the same
lookups as point reads of the Delta snapshot (delta-rs, no cache) are timed in-process.

    .venv/bin/python bench/state_query_latency.py [--keys 100000] [--lookups 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.restore_time import ChangelogSimulator  # noqa: E402
from runtime.kafka_broker import LocalKafkaBroker
from runtime.process import free_port
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import JobState, JobStatus, status_path
from spark_jobs.operations.standby.follower import StoreFollower
from spark_jobs.registry import get_job

console = Console()


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _round(port: int, paths: list[str], expect_source: str) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    for path in paths:
        started = time.perf_counter()
        conn.request("GET", path)
        body = conn.getresponse().read()
        latencies.append((time.perf_counter() - started) * 1000)
        answer = json.loads(body)
        assert answer["source"] == expect_source, answer
    conn.close()
    return latencies


def _delta_point_reads(path: str, keys: list[str]) -> list[float]:
    import pyarrow as pa
    from deltalake import DeltaTable

    latencies = []
    for key in keys:
        started = time.perf_counter()
        # the key's base row and its layers' rows, if any (the newest layer's value wins)
        table = pa.table(DeltaTable(path).scan(predicate=f"key = '{key}'"))
        latencies.append((time.perf_counter() - started) * 1000)
        assert table.num_rows >= 1
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="bench-query-"))
    settings = Settings(
        data_dir=data,
        kafka_port=free_port(),
        kafka_controller_port=free_port(),
        airflow_port=free_port(),
        state_api_port=free_port(),
    )
    spec = get_job("purchase_counts")
    broker = LocalKafkaBroker(settings)
    broker.start()
    api = None
    try:
        from spark_jobs.driver.context import JobContext

        topic = JobContext(None, spec, settings).stores.handle("counts").changelog
        topic.ensure(settings.kafka)
        simulator = ChangelogSimulator(settings, topic, args.keys, 6, args.keys // 5, seed=11)
        simulator.write(6)
        follower = StoreFollower(spec, "counts", settings)
        started = time.monotonic()
        while not (follower.at_head and follower.pending_batch is not None and follower.pending_batch.batch_id == 5):
            follower.step(1.0)
        snapshot = follower.commit()
        follow_s = time.monotonic() - started
        follower.close()

        env = {**os.environ, **settings.to_env()}
        api = subprocess.Popen(
            [sys.executable, "-m", "streamstate_cli", "state-api"],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=open(data / "api.log", "w"),
            stderr=subprocess.STDOUT,
        )
        rng = random.Random(5)
        keys = [f"u{rng.randrange(args.keys):07d}" for _ in range(args.lookups)]
        paths = [f"/jobs/{spec.name}/stores/counts/keys/{k}" for k in keys]
        for _ in range(120):
            try:
                _round(settings.state_api_port, paths[:1], "standby")
                break
            except (ConnectionError, OSError):
                time.sleep(0.5)

        results: dict[str, list[tuple[float, float]]] = {"live": [], "standby": [], "delta point read (no cache)": []}
        lease = JobLease(settings.status_dir, spec.application_id)
        epoch = lease.acquire()
        status = JobStatus(
            spec.application_id, status_path(settings.status_dir, spec.application_id), lease_epoch=epoch
        )
        status.transition_to(JobState.RUNNING)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the first live answer loads the view (may fall back meanwhile)
            conn = http.client.HTTPConnection("127.0.0.1", settings.state_api_port, timeout=30)
            conn.request("GET", paths[0])
            if json.loads(conn.getresponse().read())["source"] == "live":
                break
            time.sleep(0.5)
        for _ in range(args.rounds):
            results["live"].append(_percentiles(_round(settings.state_api_port, paths, "live")))
        lease.release()
        _round(settings.state_api_port, paths[:50], "standby")  # warm: loads the snapshot once
        for _ in range(args.rounds):
            results["standby"].append(_percentiles(_round(settings.state_api_port, paths, "standby")))
        sample = keys[: max(20, args.lookups // 20)]
        for _ in range(args.rounds):
            results["delta point read (no cache)"].append(_percentiles(_delta_point_reads(follower.path, sample)))

        lines = [
            f"## State query latency, one store of {args.keys:,} keys ({dt.date.today().isoformat()})",
            "",
            f"Command: `.venv/bin/python bench/state_query_latency.py --keys {args.keys} --lookups {args.lookups} "
            f"--rounds {args.rounds}`",
            f"Machine: {platform.machine()}, 2 cores (shared), Python {platform.python_version()}; local KRaft broker; "
            "API in its own process (uvicorn), one keep-alive HTTP connection, random keys.",
            f"Standby: the follower read {simulator.next_batch} batches and committed the snapshot ({snapshot.rows:,} rows) "
            f"in {follow_s:.1f} s.",
            "",
            f"| path | p50 ms, median (min-max) of {args.rounds} | p99 ms, median (min-max) |",
            "|---|---|---|",
        ]
        for name, rounds in results.items():
            p50s, p99s = [r[0] for r in rounds], [r[1] for r in rounds]
            lines.append(
                f"| {name} | {statistics.median(p50s):.2f} ({min(p50s):.2f}-{max(p50s):.2f}) | "
                f"{statistics.median(p99s):.2f} ({min(p99s):.2f}-{max(p99s):.2f}) |"
            )
        live, delta = (
            statistics.median(r[0] for r in results["live"]),
            statistics.median(r[0] for r in results["delta point read (no cache)"]),
        )
        lines += ["", f"Ratio live p50 / uncached Delta point read p50: {live / delta:.3f} (same run).", ""]
        text = "\n".join(lines)
        console.print(text)
        out = PROJECT_ROOT / "BENCHMARKS.md"
        out.write_text(out.read_text() + "\n" + text)
    finally:
        if api is not None:
            api.terminate()
            api.wait(30)
        broker.stop()


if __name__ == "__main__":
    main()
