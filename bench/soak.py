"""Soak run: purchase_counts at a steady rate for a long time, with its periodic snapshots, the
compaction-tuning DAG and the state-size audit DAG running on a cadence; memory, lag and state size
are sampled over time, charted, and checked for growth without bound.

On a private stack (own broker, Airflow metadata DB in the data dir; nothing else running needed):

    .venv/bin/python bench/soak.py [--minutes 30] [--rate 100] [--users 5000] [--dags-every-min 5]
                                   [--burst-at-min 10] [--burst-x 10] [--burst-min 1] [--tune-mode apply]

A burst of ``--burst-x`` times the rate for ``--burst-min`` minutes (the slow-consumer case) lands at
``--burst-at-min``. Writes ``bench/results/soak-<time>.csv`` and ``.png`` and prints a verdict per
series after warm-up (the first third; the burst lands there by default): a series "grows" when a
least-squares line through it rises by more than 10% of its mean (and more than a floor). At the end the input stops, the lag must drain, and the
job's Delta output must equal the plain-Python computation over every event in the topic.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.compare import process_tree_rss_bytes  # noqa: E402
from runtime.airflow_standalone import LocalAirflow  # noqa: E402
from runtime.alert_inbox import AlertInbox  # noqa: E402
from runtime.kafka_broker import LocalKafkaBroker  # noqa: E402
from runtime.process import free_service_ports, stop_process_group  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402
from spark_jobs.driver.lifecycle import BatchProgress, read_status  # noqa: E402
from spark_jobs.driver.submit import submit_spec  # noqa: E402
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets  # noqa: E402
from spark_jobs.layout import JobLayout  # noqa: E402
from spark_jobs.reference.generators import purchases  # noqa: E402
from spark_jobs.registry import get_job  # noqa: E402
from spark_jobs.state.checkpoint_offsets import committed_input_offsets  # noqa: E402
from spark_jobs.state.snapshots import snapshot_history, snapshot_path  # noqa: E402

console = Console()
RESULTS = PROJECT_ROOT / "bench" / "results"
#: series checked for growth, with the floor under which a rise is noise (same unit as the series)
CHECKED = {"driver_rss_mib": 100.0, "input_lag_records": 2_000.0, "state_rows": 500.0, "changelog_bytes": 5 * 2**20}


def _tree_rss_mib(pid: int) -> float:
    return (process_tree_rss_bytes(pid) or 0) / 2**20


def _dir_bytes(path: Path) -> int:
    # allocated blocks, not st_size: Kafka preallocates its index files (10 MiB each, sparse)
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def sample(settings: Settings, spec, driver_pid: int, started: float) -> dict:
    """One row of the time series."""
    bootstrap = settings.kafka
    status = read_status(settings.status_dir, spec.application_id)
    progress = (status.progress if status else None) or BatchProgress()
    end = {p: high for p, (_, high) in partition_offsets(bootstrap, spec.source_topic, 10).items()}
    done = committed_input_offsets(JobLayout.of(spec, settings).checkpoint, spec.source_topic) or {}
    changelog = JobLayout.of(spec, settings).changelog_topic("counts")
    logs = settings.kafka_dir / "data"  # the local broker's log.dirs
    return {
        "minute": round((time.monotonic() - started) / 60, 2),
        "driver_rss_mib": round(_tree_rss_mib(driver_pid), 1),
        "input_lag_records": sum(max(0, high - done.get(p, 0)) for p, high in end.items()),
        "state_rows": progress.state_rows,
        "batch_id": progress.batch_id,
        "changelog_bytes": sum(_dir_bytes(d) for d in logs.glob(f"{changelog}-*") if d.is_dir()),
        "snapshots": len(snapshot_history(snapshot_path(settings.lake, spec.application_id, "counts"))),
        "state": status.state.value if status else None,
        "phase": "run",
    }


def drain(
    settings: Settings, spec, driver_pid: int, started: float, rows: list[dict], timeout_s: float = 600
) -> float | None:
    """Seconds until the input lag reached 0 after the input stopped (None: it did not)."""
    stopped = time.monotonic()
    while time.monotonic() - stopped < timeout_s:
        time.sleep(5)
        rows.append({**sample(settings, spec, driver_pid, started), "phase": "drain"})
        if rows[-1]["input_lag_records"] == 0:
            return time.monotonic() - stopped
    return None


def output_matches_reference(settings: Settings, spec) -> bool:
    """The job's Delta output (read with delta-rs) against plain Python over every event in the topic."""
    from decimal import Decimal

    from deltalake import DeltaTable

    from spark_jobs.io.kafka_topics import read_json_records

    expected = purchases.expected_counts(read_json_records(settings.kafka, spec.source_topic))
    rows = (
        DeltaTable(str(settings.lake / spec.output_table_dir))
        .to_pyarrow_table(columns=["user_id", "purchases", "amount_spent"])
        .to_pylist()
    )
    got = {r["user_id"]: (r["purchases"], Decimal(r["amount_spent"]).quantize(Decimal("0.01"))) for r in rows}
    if got != expected:
        wrong = [k for k in set(got) | set(expected) if got.get(k) != expected.get(k)]
        console.print(
            f"[red]{len(wrong)} of {len(expected)} users differ[/], e.g. {[(k, got.get(k), expected.get(k)) for k in wrong[:3]]}"
        )
    return got == expected


def verdict(rows: list[dict]) -> dict[str, tuple[float, float, bool]]:
    """series -> (mean, rise, grows?) over the samples after warm-up (the first third is left out).

    ``rise`` is what a least-squares line through those samples climbs over their span: a steady
    creep shows up here even when no single sample stands out. A series grows when it rose by more
    than 10% of its mean and more than its floor in :data:`CHECKED`.
    """
    measured = rows[len(rows) // 3 :]
    out = {}
    for name, floor in CHECKED.items():
        xs, ys = [r["minute"] for r in measured], [float(r[name]) for r in measured]
        if len(xs) < 2 or max(xs) == min(xs):
            out[name] = (ys[0] if ys else 0.0, 0.0, False)
            continue
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
        rise = slope * (max(xs) - min(xs))
        out[name] = (my, rise, rise > max(floor, 0.1 * abs(my)))
    return out


def print_verdict(rows: list[dict], title: str) -> bool:
    """Print :func:`verdict` as a table; whether any series grew."""
    table = Table(title=f"{title}: {len(rows)} samples; after warm-up (the first third)")
    for column in ("series", "mean", "rise (fitted)", "grows?"):
        table.add_column(column)
    grows = False
    for name, (mean, rise, grew) in verdict(rows).items():
        grows |= grew
        table.add_row(name, f"{mean:,.1f}", f"{rise:+,.1f}", "[red]YES[/]" if grew else "no")
    console.print(table)
    return grows


def chart(rows: list[dict], path: Path, title: str, burst_min: tuple[float, float], dag_min: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [
        ("driver_rss_mib", "driver process tree RSS (MiB)"),
        ("input_lag_records", "input lag (records)"),
        ("state_rows", "state rows"),
        ("changelog_bytes", "changelog on disk (MiB)"),
    ]
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 10), sharex=True)
    minutes = [r["minute"] for r in rows]
    for ax, (name, label) in zip(axes, series, strict=True):
        values = [r[name] / 2**20 if name == "changelog_bytes" else r[name] for r in rows]
        ax.axvspan(*burst_min, color="tab:orange", alpha=0.15, label="burst")
        for m in dag_min:
            ax.axvline(m, color="tab:gray", linestyle=":", linewidth=0.8)
        ax.plot(minutes, values)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    axes[-1].set_xlabel("minutes (dotted: tuning and audit DAG runs)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--rate", type=int, default=100, help="events per second")
    parser.add_argument("--users", type=int, default=5000, help="distinct keys (state is bounded by this)")
    parser.add_argument("--dags-every-min", type=float, default=5)
    parser.add_argument(
        "--tune-mode",
        choices=("dry_run", "apply"),
        default="dry_run",
        help="the compaction tuning DAG's mode (scheduled runs use dry_run)",
    )
    parser.add_argument("--burst-at-min", type=float, default=None, help="default: a third of the way in")
    parser.add_argument("--burst-x", type=int, default=10)
    parser.add_argument("--burst-min", type=float, default=1)
    parser.add_argument("--sample-every-s", type=float, default=10)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument(
        "--report", type=Path, default=None, help="only print the verdict of a soak CSV written earlier"
    )
    args = parser.parse_args(argv)
    if args.report:
        with args.report.open() as f:
            rows = [
                {k: (float(v) if k in CHECKED or k == "minute" else v) for k, v in r.items()} for r in csv.DictReader(f)
            ]
        print_verdict([r for r in rows if r.get("phase", "run") == "run"], args.report.stem)
        return 0
    # kill/SIGTERM stops the run like Ctrl-C: the driver, the broker and the results are still taken care of
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    data_dir = args.data_dir or Path(f"/tmp/streamstate-soak-{os.getpid()}")
    settings = Settings(data_dir=data_dir, **free_service_ports())
    spec = get_job("purchase_counts")
    broker, airflow = LocalKafkaBroker(settings), LocalAirflow(settings)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%MZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = RESULTS / f"soak-{stamp}.csv", RESULTS / f"soak-{stamp}.png"
    rows: list[dict] = []
    dag_runs: list[tuple[float, str, int, float]] = []
    burst = (0.0, 0.0)
    inbox = AlertInbox()
    stop = threading.Event()
    driver = None
    console.print(f"soak: {args.minutes} min at {args.rate} events/s over {args.users} users; data in {data_dir}")
    try:
        broker.start()
        airflow.prepare()
        bootstrap = settings.kafka
        ensure_topic(bootstrap, spec.source_topic, spec.source_partitions)

        burst_at = (args.minutes / 3 if args.burst_at_min is None else args.burst_at_min) * 60
        burst = (burst_at, burst_at + args.burst_min * 60)

        def produce() -> None:
            seed = 0
            while not stop.is_set():
                tick = time.monotonic()
                seed += 1
                in_burst = burst[0] <= tick - started < burst[1]
                count = args.rate * (args.burst_x if in_burst else 1)
                purchases.produce(bootstrap, spec.source_topic, purchases.generate(count, users=args.users, seed=seed))
                stop.wait(max(0.0, 1.0 - (time.monotonic() - tick)))

        started = time.monotonic()

        threading.Thread(target=produce, daemon=True).start()
        submit = submit_spec(spec, settings)
        log = open(data_dir / "driver.log", "w")
        driver = subprocess.Popen(
            submit.command(),
            env={**os.environ, **submit.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = started + args.minutes * 60
        next_dags = started + args.dags_every_min * 60
        while time.monotonic() < deadline:
            if driver.poll() is not None:
                raise RuntimeError(f"the driver exited ({driver.returncode}); see {log.name}")
            rows.append(sample(settings, spec, driver.pid, started))
            last = rows[-1]
            console.print(
                f"[dim]{last['minute']:6.1f} min[/] rss {last['driver_rss_mib']:7.1f} MiB  lag "
                f"{last['input_lag_records']:6d}  state {last['state_rows']:6d}  batch {last['batch_id']}  "
                f"snapshots {last['snapshots']}"
            )
            if time.monotonic() >= next_dags:
                for dag_id, dag_file in (
                    ("tune_changelog_compaction", "tune_changelogs.py"),
                    ("audit_state_size", "audit_state_size.py"),
                ):
                    t0 = time.monotonic()
                    conf = {"mode": args.tune_mode} if dag_id == "tune_changelog_compaction" else None
                    result = airflow.dags_test(
                        dag_id,
                        conf=conf,
                        dag_file=PROJECT_ROOT / "dags" / dag_file,
                        env={"AIRFLOW_CONN_STREAMSTATE_WEBHOOK": inbox.connection},
                    )
                    output = data_dir / "dag-runs" / f"{len(dag_runs) + 1:03d}-{dag_id}.log"
                    output.parent.mkdir(exist_ok=True)
                    output.write_text(result.stdout + "\n--- stderr ---\n" + result.stderr)
                    dag_runs.append((round((t0 - started) / 60, 2), dag_id, result.returncode, time.monotonic() - t0))
                    console.print(
                        f"  {dag_id}: {'ok' if result.returncode == 0 else f'FAILED (see {output})'} "
                        f"in {time.monotonic() - t0:.0f} s; alerts so far: {len(inbox.received)}"
                    )
                next_dags = time.monotonic() + args.dags_every_min * 60
            time.sleep(max(0.0, args.sample_every_s - (time.monotonic() % args.sample_every_s)))
        stop.set()
        run_rows = list(rows)  # the verdict is about the run; the drain samples follow
        drained_in = drain(settings, spec, driver.pid, started, rows)
        matches = output_matches_reference(settings, spec)
    finally:
        stop.set()
        if driver is not None:
            stop_process_group(driver)
        broker.stop()
        if rows:
            with csv_path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            chart(
                rows,
                png_path,
                f"soak {stamp}: purchase_counts, {args.rate} events/s ({args.burst_x}x burst), {args.users} users",
                (burst[0] / 60, burst[1] / 60),
                [r[0] for r in dag_runs],
            )

    grows = print_verdict(run_rows, f"soak {stamp}")
    failed = [r for r in dag_runs if r[2] != 0]
    console.print(f"DAG runs: {len(dag_runs)}, failed: {len(failed)} {failed}")
    alerts = [(a.get("condition"), a.get("status")) for a in inbox.received]
    console.print(f"alerts received: {len(alerts)} {alerts}")
    console.print(
        f"lag drained after the input stopped: {'in %.0f s' % drained_in if drained_in is not None else '[red]NO[/]'}"
    )
    console.print(f"output equals the reference over every event: {'yes' if matches else '[red]NO[/]'}")
    console.print(f"results: {csv_path.relative_to(PROJECT_ROOT)}, {png_path.relative_to(PROJECT_ROOT)}")
    return 1 if grows or failed or drained_in is None or not matches else 0


if __name__ == "__main__":
    sys.exit(main())
