"""End-to-end latency, from produce to answer: the platform, plain Spark and Kafka Streams at a steady rate.

A private broker; for each peer, rate and trigger interval in turn, a fresh input topic, the peer started in
its own process and, once it runs, purchases produced at a steady ``rate`` events/s (a paced confluent-kafka
producer in a thread; users drawn Zipf-like from ``--users``, purchases only, so every user's count only
grows): ``--warm-up`` seconds, then ``--seconds`` measured. The produce time of every user's n-th purchase is
recorded (just before ``produce()``); an event is answered when a reader first sees that user's count at n
or more, and its latency is that moment minus its produce time. Events produced during the warm-up are not
counted; measured events still unanswered ``--drain`` seconds after the last one are reported as such.

Two sinks, two readers:

* **Delta**: the output table, polled with delta-rs every ``--poll-ms`` (default 50) ms; a new version is
  read whole (user and count), and the moment of the poll that found it is the answer time (so the figures
  include up to one poll interval of a reader's delay);
* **Kafka**: the output topic, read with ``isolation.level=read_committed`` (a record is an answer once its
  transaction commits); the moment the consumer returns a record is its answer time.

Peers:

* **platform**: ``python -m spark_jobs.driver.run latency_<run>`` (bench/latency_jobs.py: purchase_counts with an
  upsert output topic, at the measured trigger interval; the platform's defaults otherwise: changelog,
  snapshots every 10 batches, dead letters, status); both sinks;
* **plain_spark**: bench/plain_spark_peer.py ``--trigger`` (the same Kafka source, RocksDB state and Delta
  MERGE sink, the same trigger, run until stopped); Delta only;
* **kafka_streams**: bench/kafka_streams (purchase_counts, RocksDB, exactly-once v2, commit.interval.ms=100);
  Kafka only (it has no Delta sink). It has no trigger: it is measured once per rate.

Trigger 0 is Spark's ``processingTime`` 0: the next micro-batch starts as soon as the last one ends.

    .venv/bin/python bench/latency.py                                  # the full matrix: about 20 min
    .venv/bin/python bench/latency.py --seconds 20 --rates 1000 --triggers 1 --peers platform,plain_spark

A measurement takes about its start (a Spark driver: about 10 s here) + warm-up + seconds + the drain and
stop: about 1.5 minutes with the defaults; the full matrix (2 rates x (3 triggers x 2 Spark peers + Kafka Streams))
14 of them. Each measured row is added to ``bench/results/latency-<UTC time>.json`` as soon as it is done (a
failed peer is recorded with its error and the run goes on); the BENCHMARKS.md section comes at the end, or
from a saved file (a run stopped part way): ``bench/latency.py --from-results bench/results/latency-<time>.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.private_stack import append_section, private_broker  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402

console = Console()
PYTHON = sys.executable
PEERS = ("platform", "plain_spark", "kafka_streams")
PEER_NAMES = {"platform": "platform", "plain_spark": "plain Spark", "kafka_streams": "Kafka Streams"}
#: the sinks each peer has
SINKS = {"platform": ("delta", "kafka"), "plain_spark": ("delta",), "kafka_streams": ("kafka",)}
#: Kafka Streams' settings: exactly-once, a commit (and so an output transaction) every 100 ms
KAFKA_STREAMS_OPTIONS = ("-Dstreams.processing.guarantee=exactly_once_v2", "-Dstreams.commit.interval.ms=100")
PARTITIONS = 2  # of every input and output topic (the platform's default source partitions)
KEY, COUNT = "user_id", "purchases"


# ----- the latency computation (pure) ----------------------------------------------------------------------
class Answers:
    """What one reader of one sink saw: for every key, the moment each of its events was first answered.

    ``produced[key][i]`` is the produce time of the key's (i+1)-th event; a snapshot saying the key's count is
    ``n`` answers all its events up to the n-th not answered before (a sink may skip counts: one batch can
    hold several events of a key)."""

    def __init__(self, produced: dict[str, list[float]]) -> None:
        self.produced = produced
        self.answered_at: dict[str, list[float]] = defaultdict(list)

    def observe(self, key: str, count: int, at: float) -> None:
        times = self.answered_at[key]
        # never past what was produced (a duplicate counted twice by an at-least-once peer)
        upto = min(count, len(self.produced.get(key, ())))
        if upto > len(times):
            times.extend([at] * (upto - len(times)))

    def observe_snapshot(self, counts: Iterable[tuple[str, int]], at: float) -> None:
        for key, count in counts:
            self.observe(key, count, at)


def latencies(
    produced: dict[str, list[float]], answered_at: dict[str, list[float]], start: float, end: float
) -> tuple[list[float], int]:
    """Seconds from produce to answer of every event produced in ``[start, end)``, and how many of those
    were never answered."""
    values, unanswered = [], 0
    for key, times in produced.items():
        answers = answered_at.get(key, ())
        for n, at in enumerate(times):
            if start <= at < end:
                if n < len(answers):
                    values.append(answers[n] - at)
                else:
                    unanswered += 1
    return values, unanswered


def percentile(sorted_values: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ascending ``sorted_values``."""
    if not sorted_values:
        return math.nan
    return sorted_values[max(0, math.ceil(p / 100 * len(sorted_values)) - 1)]


def summarize(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": percentile(ordered, 50), "p99": percentile(ordered, 99), "max": ordered[-1] if ordered else math.nan}


# ----- the load --------------------------------------------------------------------------------------------
class SteadyProducer:
    """Purchases at ``rate`` events/s from a thread, each user's produce times in ``produced``."""

    def __init__(self, settings: Settings, topic: str, rate: int, users: int, seed: int = 11) -> None:
        from confluent_kafka import Producer

        from runtime.kafka_connection import client_config

        self.topic, self.rate = topic, rate
        self.producer = Producer(client_config(settings.kafka, {"queue.buffering.max.messages": 1_000_000}))
        rng = random.Random(seed)
        weights = [1.0 / (rank + 1) ** 0.8 for rank in range(users)]
        self._draws = iter(lambda: rng.choices(range(users), weights=weights, k=10_000), None)
        self._queue: list[int] = []
        self.produced: dict[str, list[float]] = defaultdict(list)
        self.count = 0
        self.failed = 0
        self.error: BaseException | None = None

    def _next_user(self) -> str:
        if not self._queue:
            self._queue = next(self._draws)[::-1]
        return f"u{self._queue.pop():05d}"

    def run(self, seconds: float) -> tuple[float, float]:
        """Produce for ``seconds`` at the rate (in this thread); returns the window's (start, end) times. Not
        flushed: :meth:`flush` after the last window."""
        started = time.time()
        sent = 0
        while (now := time.time()) < started + seconds:
            due = int((now - started) * self.rate) + 1
            stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).isoformat(timespec="milliseconds")
            stamp = stamp.replace("+00:00", "Z")
            while sent < due:
                user = self._next_user()
                value = (
                    f'{{"event_id":"l-{self.count}","type":"purchase","user_id":"{user}","item":"sku-0001",'
                    f'"amount":12.5,"event_time":"{stamp}"}}'
                )
                at = time.time()
                self.produced[user].append(at)  # before produce(): no answer can come before its time is known
                while True:
                    try:
                        self.producer.produce(self.topic, value.encode(), user.encode(), on_delivery=self._acked)
                        break
                    except BufferError:
                        self.producer.poll(0.01)
                sent += 1
                self.count += 1
            self.producer.poll(0)
            # until the next event is due, but at least 2 ms: at 10,000/s a few events per round
            time.sleep(max(0.002, started + sent / self.rate - time.time()))
        return started, started + seconds

    def flush(self) -> None:
        if self.producer.flush(30):
            raise RuntimeError("the producer could not deliver its last events within 30 s")

    def _acked(self, err, _msg) -> None:
        if err is not None:
            self.failed += 1


# ----- the readers -----------------------------------------------------------------------------------------
class DeltaReader(threading.Thread):
    """Polls a Delta table; each new version's (user, count) rows are a snapshot of answers."""

    def __init__(self, path: Path, answers: Answers, poll_s: float) -> None:
        super().__init__(daemon=True)
        self.path, self.answers, self.poll_s = path, answers, poll_s
        self.stop = threading.Event()
        self.versions = 0

    def run(self) -> None:
        from deltalake import DeltaTable

        table, version = None, -1
        while not self.stop.is_set():
            tick = time.monotonic()
            try:
                if table is None:
                    table = DeltaTable(str(self.path))
                else:
                    table.update_incremental()
                at = time.time()
                if table.version() != version:
                    version = table.version()
                    self.versions += 1
                    rows = table.to_pyarrow_table(columns=[KEY, COUNT])
                    self.answers.observe_snapshot(zip(rows[KEY].to_pylist(), rows[COUNT].to_pylist(), strict=True), at)
            except Exception:  # noqa: BLE001 - not created yet (or a version being written): poll again
                pass
            self.stop.wait(max(0.0, self.poll_s - (time.monotonic() - tick)))


class KafkaReader(threading.Thread):
    """Reads an output topic from its start, committed records only; each record's count is an answer."""

    def __init__(self, settings: Settings, topic: str, answers: Answers) -> None:
        super().__init__(daemon=True)
        self.settings, self.topic, self.answers = settings, topic, answers
        self.stop = threading.Event()
        self.records = 0

    def run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from runtime.kafka_connection import client_config

        consumer = Consumer(
            client_config(
                self.settings.kafka,
                {
                    "group.id": f"latency-reader-{self.topic}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 10,
                    "log_level": 3,
                },
            )
        )
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        try:
            while not self.stop.is_set():
                # poll() returns as soon as a record is there; consume(timeout=0) then takes what else has
                # arrived, without waiting (consume(n, timeout) waits for n records or the whole timeout)
                first = consumer.poll(0.1)
                if first is None:
                    continue
                at = time.time()
                for message in [first, *consumer.consume(num_messages=10_000, timeout=0)]:
                    if message.error() or message.value() is None:  # a tombstone deletes; none expected here
                        continue
                    self.records += 1
                    self.answers.observe(message.key().decode(), int(json.loads(message.value())[COUNT]), at)
        finally:
            consumer.close()


# ----- the peers -------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Running:
    """A started peer: where its answers appear, and how to stop it."""

    delta: Path | None
    topic: str | None
    stop: Callable[[], None]
    check: Callable[[], None]  # raises when the peer died
    log: Path
    #: after the stop: what its micro-batches took (seconds per batch, by phase), where the peer says
    batches: Callable[[], dict] = dict


def _process_check(proc: subprocess.Popen, log: Path, what: str):
    def check() -> None:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n" + "\n".join(tail))

    return check


def _process_stop(proc: subprocess.Popen):
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()  # the Python driver stops its query; its JVM follows it
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)

    return stop


def _pythonpath() -> str:
    """This checkout first, for the peer and its Python workers (the virtualenv may be another checkout's)."""
    return os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))


def _wait(predicate, check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        check()
        if predicate():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")


def start_platform(settings: Settings, work: Path, run: str, trigger_s: float) -> Running:
    from bench import latency_jobs
    from spark_jobs.driver.lifecycle import observe_driver
    from spark_jobs.layout import output_topic_name

    spec = latency_jobs.spec(run, trigger_s)
    assert spec.source_topic == f"bench-latency_{run}"  # measure() created it
    peer_settings = settings.replace(data_dir=work, job_modules="bench.latency_jobs")
    env = {
        **os.environ,
        **peer_settings.to_env(),
        "BENCH_LATENCY_RUN": run,
        "BENCH_LATENCY_TRIGGER_S": f"{trigger_s:g}",
        "PYTHONPATH": _pythonpath(),
    }
    log = work / "peer.log"
    proc = subprocess.Popen(
        [PYTHON, "-m", "spark_jobs.driver.run", spec.name, "--version", str(spec.version)],
        env=env,
        cwd=PROJECT_ROOT,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    check = _process_check(proc, log, "the platform's driver")

    def batches() -> dict:
        """The run report's seconds per phase (state, dead letters, outputs, changelog, snapshot), per batch."""
        from spark_jobs.driver.run import report_path

        report = json.loads(report_path(spec, peer_settings).read_text())
        n = max(1, report.get("batches") or 0)
        phases = {name: round(seconds / n, 3) for name, seconds in report.get("phase_seconds", {}).items()}
        return {"batches": report.get("batches"), "seconds_per_batch": phases}

    running = Running(
        work / "lake" / spec.output_table_dir,
        output_topic_name(spec.output_topic, spec.version),
        _process_stop(proc),
        check,
        log,
        batches,
    )
    try:
        _wait(
            lambda: observe_driver(peer_settings.status_dir, spec.application_id).state == "RUNNING",
            check,
            600,
            "the platform's driver to run",
        )
    except BaseException:
        running.stop()
        raise
    return running


def start_plain_spark(settings: Settings, work: Path, topic: str, trigger_s: float) -> Running:
    log = work / "peer.log"
    started = threading.Event()
    answer: dict = {}
    proc = subprocess.Popen(
        [PYTHON, "bench/plain_spark_peer.py", topic, str(work), "--trigger", f"{trigger_s:g}"],
        env={**os.environ, **settings.replace(data_dir=work).to_env(), "PYTHONPATH": _pythonpath()},
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        text=True,
        start_new_session=True,
    )

    def read() -> None:
        for line in proc.stdout:
            if line.startswith('{"event": "started"'):
                started.set()
            elif line.startswith("{"):
                answer.update(json.loads(line))  # after the stop: its batches and their seconds

    def batches() -> dict:
        reader.join(10)  # the process has ended: its last line is on its way
        n = max(1, answer.get("batches") or 0)
        return {"batches": answer.get("batches"), "seconds_per_batch": {"batch": round(answer["batch_seconds"] / n, 3)}}

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    check = _process_check(proc, log, "the plain Spark peer")
    running = Running(work / "output", None, _process_stop(proc), check, log, batches)
    try:
        _wait(started.is_set, check, 600, "the plain Spark peer to start its query")
    except BaseException:
        running.stop()
        raise
    return running


def start_kafka_streams(settings: Settings, work: Path, classpath: str, topic: str) -> Running:
    from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer
    from spark_jobs.io.kafka_topics import ensure_topic

    output = f"{topic}-out"
    ensure_topic(settings.kafka, output, PARTITIONS, config=OUTPUT_TOPIC_CONFIG)
    peer = KafkaStreamsPeer(
        classpath,
        settings,
        "purchase_counts",
        f"{topic}-app",
        work / "kstreams-state",
        topic,
        output,
        jvm_options=KAFKA_STREAMS_OPTIONS,
    )
    running = Running(None, output, peer.stop, peer.check_running, peer.log_path)
    try:
        peer.wait_running(600)
    except BaseException:
        peer.stop()
        raise
    return running


# ----- one measurement -------------------------------------------------------------------------------------
def create_source(settings: Settings, topic: str) -> None:
    """The input topic, as its owner creates it on this Kafka: as many copies as the platform's own topics (three
    on bench/production_shape.py's cluster, ``min.insync.replicas=2``)."""
    from spark_jobs.io.kafka_topics import ensure_topic

    in_sync = {"min.insync.replicas": str(settings.kafka_min_insync_replicas)}
    ensure_topic(settings.kafka, topic, PARTITIONS, settings.kafka_replication_factor, in_sync)


def measure(settings: Settings, args, root: Path, peer: str, rate: int, trigger_s: float | None, classpath) -> dict:

    tag = f"r{rate}" + ("" if trigger_s is None else f"_t{trigger_s:g}".replace(".", "p"))
    run = f"{peer}_{tag}_{int(time.time()) % 100000}"
    work = root / run
    work.mkdir(parents=True)
    topic = f"bench-latency_{run}"
    started = time.monotonic()
    create_source(settings, topic)
    if peer == "platform":
        running = start_platform(settings, work, run, trigger_s)
    elif peer == "plain_spark":
        running = start_plain_spark(settings, work, topic, trigger_s)
    else:
        running = start_kafka_streams(settings, work, classpath, topic)
    start_s = time.monotonic() - started
    console.print(f"[dim]{run}: running after {start_s:.0f} s; producing {rate:,}/s[/]")
    producer = SteadyProducer(settings, topic, rate, args.users)
    readers: dict[str, Answers] = {}
    threads = []
    try:
        if running.delta is not None:
            readers["delta"] = Answers(producer.produced)
            threads.append(DeltaReader(running.delta, readers["delta"], args.poll_ms / 1000))
        if running.topic is not None:
            readers["kafka"] = Answers(producer.produced)
            threads.append(KafkaReader(settings, running.topic, readers["kafka"]))
        for thread in threads:
            thread.start()
        outcome: dict = {}

        def produce() -> None:
            try:
                outcome["warm_up"] = producer.run(args.warm_up)
                outcome["measured"] = producer.run(args.seconds)
                producer.flush()
            except BaseException as err:  # noqa: BLE001 - reported below
                producer.error = err

        load = threading.Thread(target=produce, daemon=True)
        load.start()
        while load.is_alive():
            running.check()
            load.join(0.5)
        if producer.error:
            raise producer.error
        start, end = outcome["measured"]
        load = os.getloadavg()[0]  # the machine's, as the measured window ends (another process's work shows)
        # drain: until every measured event is answered in every sink (or the drain timeout)
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:
            running.check()
            if all(latencies(producer.produced, a.answered_at, start, end)[1] == 0 for a in readers.values()):
                break
            time.sleep(1.0)
    finally:
        for thread in threads:
            thread.stop.set()
        for thread in threads:
            thread.join(10)
        running.stop()
    row = {
        "peer": peer,
        "rate": rate,
        "trigger_s": trigger_s,
        "start_s": round(start_s, 1),
        "measured_s": round(end - start, 1),
        "produced_rate": round(
            sum(1 for times in producer.produced.values() for t in times if start <= t < end) / (end - start)
        ),
        "delivery_failures": producer.failed,
        "load_1m": round(load, 1),
        "sinks": {},
    }
    try:
        row.update(running.batches())
    except Exception as err:  # noqa: BLE001 - a figure of context, not the measurement
        console.print(f"[yellow]{run}: no batch figures ({err})[/]")
    for sink, answers in readers.items():
        values, unanswered = latencies(producer.produced, answers.answered_at, start, end)
        row["sinks"][sink] = {"events": len(values), "unanswered": unanswered, **summarize(values)}
    return row


# ----- the report ------------------------------------------------------------------------------------------
def _trigger_label(trigger_s) -> str:
    return "commit 100 ms" if trigger_s is None else f"{trigger_s:g} s"


def _fmt(sink: dict | None) -> str:
    if not sink or not sink.get("events"):
        return "—"
    text = f"{sink['p50']:.2f} / {sink['p99']:.2f} / {sink['max']:.2f}"
    return text + (f" ({sink['unanswered']:,} unanswered)" if sink.get("unanswered") else "")


def _ratio(a: dict | None, b: dict | None, key: str) -> str:
    if not a or not b or not a.get("events") or not b.get("events") or not b[key]:
        return "—"
    return f"{a[key] / b[key]:.2f}x"


def _find(rows: list[dict], peer: str, rate: int, trigger_s, sink: str) -> dict | None:
    for row in rows:
        if row["peer"] == peer and row["rate"] == rate and row.get("trigger_s") == trigger_s and "sinks" in row:
            return row["sinks"].get(sink)
    return None


def report_lines(rows: list[dict], command: str, args) -> list[str]:
    """The BENCHMARKS.md section of one run's rows."""
    rates = sorted({r["rate"] for r in rows})
    triggers = sorted({r["trigger_s"] for r in rows if r.get("trigger_s") is not None})
    lines = [
        f"## End-to-end latency, produce to answer ({dt.date.today().isoformat()})",
        "",
        (
            f"`{command}` on {platform.machine()}, {os.cpu_count()} cores, one private broker: purchase_counts "
            f"(purchases only, {args.users:,} users, Zipf-like), a paced producer at each rate, "
            f"{args.warm_up:g} s warm-up then {args.seconds:g} s measured; seconds from `produce()` to the first "
            f"read of an answer counting the event: the Delta table polled with delta-rs every {args.poll_ms} ms, "
            "the output topic read committed. p50 / p99 / max, seconds."
        ),
        "",
        "| rate | trigger | sink | platform | plain Spark | Kafka Streams (EOS, commit 100 ms) "
        "| platform / plain Spark p50 | p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rate in rates:
        kafka_streams = _find(rows, "kafka_streams", rate, None, "kafka")
        for trigger in triggers:
            ours, plain = (
                _find(rows, "platform", rate, trigger, "delta"),
                _find(rows, "plain_spark", rate, trigger, "delta"),
            )
            lines.append(
                f"| {rate:,}/s | {trigger:g} s | Delta | {_fmt(ours)} | {_fmt(plain)} | — | "
                f"{_ratio(ours, plain, 'p50')} | {_ratio(ours, plain, 'p99')} |"
            )
            ours_kafka = _find(rows, "platform", rate, trigger, "kafka")
            lines.append(
                f"| {rate:,}/s | {trigger:g} s | Kafka | {_fmt(ours_kafka)} | — | {_fmt(kafka_streams)} | — | — |"
            )
        if not triggers and kafka_streams:
            lines.append(f"| {rate:,}/s | — | Kafka | — | — | {_fmt(kafka_streams)} | — | — |")
    failed = [r for r in rows if r.get("error")]
    if failed:
        lines += [
            "",
            "Failed: "
            + "; ".join(
                f"{r['peer']} {r['rate']}/s {_trigger_label(r.get('trigger_s'))}: {r['error'].splitlines()[0][:200]}"
                for r in failed
            )
            + ".",
        ]
    produced = [r for r in rows if "produced_rate" in r]
    if produced:
        rates_reached = ", ".join(
            f"{PEER_NAMES[r['peer']]} {r['rate']:,}/s {_trigger_label(r['trigger_s'])}: {r['produced_rate']:,}"
            for r in produced
        )
        lines += [
            "",
            f"Rates reached (measured events / s): {rates_reached}. Kafka Streams is measured once per rate (it has "
            "no trigger); its figures stand beside every trigger's.",
        ]
        loads = [r for r in produced if "load_1m" in r]
        if loads:
            lines += [
                "",
                "The machine's 1-minute load average as each measured window ended (2 cores; above 2, something "
                "waited for a core): "
                + ", ".join(
                    f"{PEER_NAMES[r['peer']]} {r['rate']:,}/s {_trigger_label(r['trigger_s'])}: {r['load_1m']}"
                    for r in loads
                )
                + ".",
            ]
    profiled = [r for r in rows if r.get("seconds_per_batch")]
    if profiled:
        lines += ["", "Where a micro-batch's time goes (seconds per batch over the run, warm-up included):", ""]
        for r in profiled:
            phases = ", ".join(f"{name} {seconds:.3f}" for name, seconds in r["seconds_per_batch"].items() if seconds)
            lines.append(
                f"- {PEER_NAMES[r['peer']]}, {r['rate']:,}/s, trigger {_trigger_label(r['trigger_s'])}: "
                f"{r['batches']:,} batches; {phases or 'nothing measured'}"
            )
    lines += ["", *goal_lines(rows), ""]
    return lines


def goal_lines(rows: list[dict]) -> list[str]:
    """The issue's three goals, each met or not by this run's figures (where it measured them)."""
    out = []
    checks = []
    for row in rows:
        if row["peer"] != "platform" or "sinks" not in row:
            continue
        plain = _find(rows, "plain_spark", row["rate"], row["trigger_s"], "delta")
        ours = row["sinks"].get("delta")
        where = f"{row['rate']:,}/s, trigger {row['trigger_s']:g} s"
        if ours and plain and ours.get("events") and plain.get("events"):
            checks.append(("p99 <= 1.2x plain Spark's (Delta)", where, ours["p99"] <= 1.2 * plain["p99"]))
            checks.append(("Delta p50 below plain Spark's", where, ours["p50"] < plain["p50"]))
        kafka = row["sinks"].get("kafka")
        if row["rate"] == 1000 and row["trigger_s"] == 1 and kafka and kafka.get("events"):
            checks.append(("Kafka output p50 <= 1 s (1 s trigger, 1,000/s)", where, kafka["p50"] <= 1.0))
    for goal in dict.fromkeys(name for name, _, _ in checks):
        results = [(where, ok) for name, where, ok in checks if name == goal]
        missed = [where for where, ok in results if not ok]
        verdict = "met" if not missed else f"missed at {'; '.join(missed)}"
        out.append(f"- Goal: {goal}: {verdict} ({len(results) - len(missed)} of {len(results)}).")
    return out


def plot_latency(rows: list[dict], path: Path) -> None:
    """Per rate, bars of p50 with whiskers up to p99 for each trigger: the platform's two sinks and plain Spark's
    Delta; Kafka Streams' p50 and p99 as lines (it has no trigger)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = sorted({r["rate"] for r in rows})
    triggers = sorted({r["trigger_s"] for r in rows if r.get("trigger_s") is not None})
    series = [("platform", "delta"), ("platform", "kafka"), ("plain_spark", "delta")]
    fig, axes = plt.subplots(1, len(rates), figsize=(5 * len(rates), 4), squeeze=False, sharey=True)
    width = 0.8 / len(series)
    for ax, rate in zip(axes[0], rates, strict=True):
        for i, (peer, sink) in enumerate(series):
            xs, p50s, whiskers = [], [], []
            for x, trigger in enumerate(triggers):
                figures = _find(rows, peer, rate, trigger, sink)
                if figures and figures.get("events"):
                    xs.append(x + (i - (len(series) - 1) / 2) * width)
                    p50s.append(figures["p50"])
                    whiskers.append(figures["p99"] - figures["p50"])
            ax.bar(xs, p50s, width, yerr=[[0] * len(xs), whiskers], capsize=3, label=f"{PEER_NAMES[peer]}, {sink}")
        kafka_streams = _find(rows, "kafka_streams", rate, None, "kafka")
        if kafka_streams and kafka_streams.get("events"):
            ax.axhline(kafka_streams["p50"], color="black", linestyle="--", linewidth=1, label="Kafka Streams p50")
            ax.axhline(kafka_streams["p99"], color="black", linestyle=":", linewidth=1, label="Kafka Streams p99")
        ax.set_xticks(range(len(triggers)), [f"trigger {t:g} s" for t in triggers])
        ax.set_title(f"{rate:,} events/s")
    axes[0][0].set_ylabel("seconds, produce to answer (p50, whisker to p99)")
    legend = {}
    for ax in axes[0]:
        legend.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))  # label -> handle, once each
    axes[0][-1].legend(list(legend.values()), list(legend), fontsize=8)
    fig.suptitle("End-to-end latency, purchase_counts (2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(rows: list[dict]) -> None:
    table = Table(title="end-to-end latency, s: p50 / p99 / max")
    for column in ("peer", "rate", "trigger", "sink", "events", "p50 / p99 / max", "unanswered", "start s"):
        table.add_column(column)
    for row in rows:
        if "sinks" not in row:
            table.add_row(
                row["peer"],
                f"{row['rate']:,}",
                _trigger_label(row.get("trigger_s")),
                "—",
                "—",
                f"[red]{row.get('error', '?').splitlines()[0][:80]}[/]",
                "—",
                "—",
            )
            continue
        for sink, figures in row["sinks"].items():
            table.add_row(
                PEER_NAMES[row["peer"]],
                f"{row['rate']:,} ({row['produced_rate']:,})",
                _trigger_label(row["trigger_s"]),
                sink,
                f"{figures['events']:,}",
                _fmt({**figures, "unanswered": 0}),
                f"{figures['unanswered']:,}",
                f"{row['start_s']:.0f}",
            )
    console.print(table, width=160)


def _plot(rows: list[dict], path: Path) -> None:
    try:
        plot_latency([r for r in rows if "sinks" in r], path)
        console.print(f"chart: {path.relative_to(PROJECT_ROOT) if path.is_relative_to(PROJECT_ROOT) else path}")
    except ImportError:  # matplotlib is optional
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60, help="measured seconds of steady input")
    parser.add_argument("--warm-up", type=float, default=15, help="seconds of input before the measured ones")
    parser.add_argument("--drain", type=float, default=60, help="seconds to wait for the last answers")
    parser.add_argument("--rates", default="1000,10000", help="events/s, comma-separated")
    parser.add_argument("--triggers", default="0,1,5", help="Spark trigger intervals, seconds (0: as fast as possible)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {','.join(PEERS)}")
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--poll-ms", type=int, default=50, help="how often the Delta reader polls the table")
    parser.add_argument("--no-report", action="store_true", help="do not append a section to BENCHMARKS.md")
    parser.add_argument(
        "--from-results", type=Path, help="measure nothing: report the rows of a saved bench/results/latency-*.json"
    )
    args = parser.parse_args()
    if args.from_results:  # e.g. a run stopped part way: its finished rows, with its own command and settings
        saved = json.loads(args.from_results.read_text())
        print_table(saved["rows"])
        _plot(saved["rows"], args.from_results.with_suffix(".png"))
        measured_with = {"users": 10_000, "warm_up": 15, "seconds": 60, "poll_ms": 50, **saved.get("args", {})}
        lines = report_lines(saved["rows"], saved["command"], argparse.Namespace(**measured_with))
        if args.no_report:
            console.print("\n".join(lines))
        else:
            append_section(lines, console)
        return
    rates = [int(r) for r in args.rates.split(",")]
    triggers = [float(t) for t in args.triggers.split(",")]
    peers = [p for p in args.peers.split(",") if p]
    unknown = set(peers) - set(PEERS)
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}")
    command = " ".join(["python bench/latency.py", shlex.join(sys.argv[1:])]).rstrip()

    results = PROJECT_ROOT / "bench" / "results" / f"latency-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%MZ}.json"
    rows: list[dict] = []

    def save() -> None:
        results.parent.mkdir(parents=True, exist_ok=True)
        measured_with = {k: getattr(args, k) for k in ("users", "warm_up", "seconds", "poll_ms")}
        results.write_text(json.dumps({"command": command, "args": measured_with, "rows": rows}, indent=1) + "\n")

    classpath = None
    if "kafka_streams" in peers:
        from bench.kafka_streams_peer import build

        classpath = build()
    with private_broker("streamstate-latency-") as settings:
        root = Path(tempfile.mkdtemp(prefix="streamstate-latency-work-"))
        plan = [
            (peer, rate, trigger)
            for rate in rates
            for peer in peers
            for trigger in ([None] if peer == "kafka_streams" else triggers)
        ]
        for peer, rate, trigger in plan:
            label = f"{PEER_NAMES[peer]} at {rate:,}/s, {_trigger_label(trigger)}"
            console.rule(label)
            try:
                row = measure(settings, args, root, peer, rate, trigger, classpath)
            except Exception as err:  # noqa: BLE001 - a failed peer is a row with its error; the run goes on
                console.print(f"[red]{label} failed: {err}[/]")
                row = {"peer": peer, "rate": rate, "trigger_s": trigger, "error": f"{type(err).__name__}: {err}"}
            rows.append(row)
            save()
            console.print(json.dumps(row))
        shutil.rmtree(root, ignore_errors=True)  # the peers' checkpoints, tables and state
    shutil.rmtree(settings.data_dir, ignore_errors=True)  # the broker's log (over a GB at 10,000/s), once it stopped
    print_table(rows)
    console.print(f"rows saved to {results.relative_to(PROJECT_ROOT)}")
    _plot(rows, results.with_suffix(".png"))
    lines = report_lines(rows, command, args)
    if args.no_report:
        console.print("\n".join(lines))
    else:
        append_section(lines, console)


if __name__ == "__main__":
    main()
