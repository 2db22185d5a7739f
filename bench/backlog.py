"""A join job restarted after an outage works its backlog off in bounded micro-batches, and answers as if it had
never stopped.

Three runs of ``order_payments`` (the windowed stream-stream outer join) over the same input (``--orders`` orders
and as many payments, spark_jobs.reference.generators.payments.scaled: both topics advancing together in time), each on a
broker of its own, each driver a spark-submit process as Airflow launches it:

* ``never stopped``: the driver runs (one micro-batch per trigger) while the input is written in steady chunks
  over about ``--write-seconds``, and is stopped once it has read everything;
* ``outage``: the driver reads the first ``--before`` of the input and stops; the rest is written while it is
  down (the backlog); the restarted driver works it off with the default bound on a micro-batch
  (``STREAMSTATE_MAX_OFFSETS_PER_TRIGGER``, or ``--limit``);
* ``outage, no limit``: the same restart with the bound off (0): one micro-batch as large as the backlog.

For each restart: its micro-batches, the largest one's input records (from the checkpoint's offset log), its
wall time, and the peak resident memory of the driver's processes (the spark-submit JVM, which runs the tasks
in ``local[*]``, and the Python driver; their VmRSS summed, sampled every 0.2 s). The three runs' results must be
equal, result for result (bench/answers.py's reading of the output table), or the script fails.

    .venv/bin/python bench/backlog.py --orders 500000
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from bench import answers  # noqa: E402
from bench.private_stack import append_section, private_broker  # noqa: E402
from runtime.process import group_members  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402
from spark_jobs.driver.lease import JobLease  # noqa: E402
from spark_jobs.driver.submit import submit_spec  # noqa: E402
from spark_jobs.io.kafka_topics import ensure_topic  # noqa: E402
from spark_jobs.layout import JobLayout  # noqa: E402
from spark_jobs.reference.generators import payments  # noqa: E402
from spark_jobs.reference.generators.producer import produce_encoded  # noqa: E402
from spark_jobs.registry import get_job  # noqa: E402
from spark_jobs.state.checkpoint_offsets import batch_end_offsets, latest_batch_id, records_between  # noqa: E402
from spark_jobs.state.source_position import committed_ends  # noqa: E402

JOB = "order_payments"


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


class Driver:
    """A driver launched as Airflow launches it, its processes' resident memory sampled until it ends."""

    def __init__(self, settings: Settings, available_now: bool, log: Path) -> None:
        spec = get_job(JOB)
        submit = submit_spec(spec, settings, available_now=available_now)
        env = {**os.environ, **submit.env, "PYTHONPATH": str(PROJECT_ROOT)}
        self.out = open(log, "w")  # noqa: SIM115 - closed in wait()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            submit.command(), env=env, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.peak_bytes = 0
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while self.proc.poll() is None:
            self.peak_bytes = max(self.peak_bytes, sum(_rss_bytes(p) for p in group_members(self.proc.pid)))
            time.sleep(0.2)

    def wait(self) -> float:
        code = self.proc.wait()
        self._sampler.join()
        self.out.close()
        if code != 0:
            raise RuntimeError(f"the driver exited with {code}; see {self.out.name}")
        return time.monotonic() - self.started

    def stop(self, settings: Settings) -> float:
        """SIGTERM to the Python driver, as Airflow's stop sends it: it stops its query and exits 0."""
        holder = JobLease(settings.status_dir, get_job(JOB).application_id).holder()
        if holder is not None:
            os.kill(holder.pid, signal.SIGTERM)
        return self.wait()


def _batches(settings: Settings, first_batch: int) -> list[int]:
    """Input records of each micro-batch of the job's checkpoint from ``first_batch`` on."""
    checkpoint = JobLayout.of(get_job(JOB), settings).checkpoint
    last = latest_batch_id(checkpoint)
    sizes = []
    for batch in range(max(first_batch, 0), (last if last is not None else -1) + 1):
        end = batch_end_offsets(checkpoint, batch)
        start = (
            batch_end_offsets(checkpoint, batch - 1) if batch else {t: dict.fromkeys(ps, 0) for t, ps in end.items()}
        )
        sizes.append(records_between(start, end))
    return sizes


def _caught_up(settings: Settings) -> bool:
    spec = get_job(JOB)
    checkpoint = JobLayout.of(spec, settings).checkpoint
    last = latest_batch_id(checkpoint)
    if last is None:
        return False
    read = batch_end_offsets(checkpoint, last)
    return all(
        read.get(topic, {}).get(p, 0) >= end
        for topic in spec.input_topics
        for p, end in committed_ends(settings.kafka, topic).items()
    )


def _produce(settings: Settings, orders: list, paid: list) -> None:
    spec = get_job(JOB)
    produce_encoded(settings.kafka, spec.join_topics[0], paid)  # as bench/compare.py writes a join's input
    produce_encoded(settings.kafka, spec.source_topic, orders)


def _run(name: str, args, orders: list, paid: list, console: Console) -> dict:
    spec = get_job(JOB)
    with private_broker(f"backlog-{name.replace(' ', '-').replace(',', '')}-") as base:
        limit = 0 if name.endswith("no limit") else args.limit or base.max_offsets_per_trigger
        settings = base.replace(max_offsets_per_trigger=limit)
        for topic in spec.input_topics:
            ensure_topic(settings.kafka, topic, spec.source_partitions)
        logs = settings.data_dir
        result = {"name": name, "limit": limit}
        if name == "never stopped":
            chunks = 20
            driver = Driver(settings, available_now=False, log=logs / "driver.log")
            for n in range(chunks):
                _produce(settings, orders[n * len(orders) // chunks : (n + 1) * len(orders) // chunks], [])
                _produce(settings, [], paid[n * len(paid) // chunks : (n + 1) * len(paid) // chunks])
                time.sleep(args.write_seconds / chunks)
            deadline = time.monotonic() + args.timeout
            while not _caught_up(settings):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name}: the driver did not catch up in {args.timeout} s")
                time.sleep(1)
            result["seconds"] = driver.stop(settings)
            result["peak_bytes"] = driver.peak_bytes
            result["batches"] = _batches(settings, 0)
        else:
            cut_orders, cut_paid = int(len(orders) * args.before), int(len(paid) * args.before)
            _produce(settings, orders[:cut_orders], paid[:cut_paid])
            Driver(settings, available_now=True, log=logs / "driver-before.log").wait()
            done = latest_batch_id(JobLayout.of(spec, settings).checkpoint)
            _produce(settings, orders[cut_orders:], paid[cut_paid:])  # written while the job is down
            restart = Driver(settings, available_now=True, log=logs / "driver-restart.log")
            result["seconds"] = restart.wait()
            result["peak_bytes"] = restart.peak_bytes
            result["batches"] = _batches(settings, (done or 0) + 1)
        result["answer"] = answers.table_payments(str(JobLayout.of(spec, settings).output_table))
        console.print(
            f"{name}: {len(result['batches'])} batches, largest {max(result['batches'], default=0):,} records, "
            f"peak {result['peak_bytes'] / 2**20:,.0f} MiB, {result['seconds']:.1f} s, {len(result['answer']):,} results"
        )
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--orders", type=int, default=500_000, help="orders, and as many payments")
    parser.add_argument("--before", type=float, default=0.2, help="the share of the input read before the outage")
    parser.add_argument("--limit", type=int, default=None, help="records per micro-batch (default: the setting's)")
    parser.add_argument("--write-seconds", type=float, default=60.0, help="how long 'never stopped' writes for")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--runs", default="never stopped,outage,outage no limit")
    args = parser.parse_args(argv)
    console = Console()
    orders_iter, paid_iter = payments.scaled(args.orders, (int(time.time()) // 60 - 60) * 60_000, seed=3)
    orders, paid = list(orders_iter), list(paid_iter)
    results = [_run(name.strip(), args, orders, paid, console) for name in args.runs.split(",")]
    reference = results[0]["answer"]
    for r in results[1:]:
        if r["answer"] != reference:
            differ = sum(1 for k in set(reference) | set(r["answer"]) if reference.get(k) != r["answer"].get(k))
            raise SystemExit(f"{r['name']}: {differ} results differ from {results[0]['name']}'s")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"\n## A join's backlog after an outage, worked off in bounded batches ({dt.date.today()}, {commit})\n",
        f"`.venv/bin/python bench/backlog.py {' '.join(sys.argv[1:] if argv is None else argv)}`: `order_payments` over {len(orders):,} orders "
        f"and {len(paid):,} payments; the outage runs read {args.before:.0%} of them, stop, and restart on the rest. "
        f"Answers equal in all runs ({len(reference):,} results).\n",
        "| run | records per batch | batches | largest batch | driver peak RSS | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        bound = "no limit" if not r["limit"] else f"{r['limit']:,}"
        lines.append(
            f"| {r['name']} | {bound} | {len(r['batches'])} | {max(r['batches'], default=0):,} | "
            f"{r['peak_bytes'] / 2**20:,.0f} MiB | {r['seconds']:.1f} |"
        )
    append_section(lines, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
