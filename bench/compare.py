"""The platform against its peers: Kafka Streams and plain Spark, same broker, same data, one run.

Six workloads, each the same computation in all three peers: *purchases* (count and amount per user;
``account_closed`` deletes the user), *pulses* (heartbeats per patient per 60 s event-time window,
5 s grace, emitted when the window closes), *temperatures* (readings, average, minimum and maximum
temperature per sensor in 5-minute windows starting every minute, 30 s grace, emitted when they close),
*sessions* (events and page views per user per session, 30 min inactivity gap, 5 min grace, emitted when
a session closes), and two joins of two topics: *enrichment* (each order joined with its customer's profile, a
stream-table left join, 1 min grace; events are the orders, keys the customer profiles, a table topic loaded
before the orders) and *payments* (orders and payments matched within 10 minutes, a windowed stream-stream outer
join, 1 min grace; events are the orders and the payments, as many of each, keys the orders). The joins' inputs
are generated so that the three peers' semantics give the same answer (see :func:`enrichment_input`,
:func:`payments_input` and bench/answers.py, which says what is compared and what is left out). For every size
the input is generated once onto a private local broker; then, for REPEATS rounds, each peer processes the whole
pre-loaded input from a cold start, one after the other:

* **Kafka Streams** (bench/kafka_streams, RocksDB store + changelog): time from the JVM's start until its
  committed offsets reach the input's end; then its state directory is wiped and it is started again, and
  its full changelog restore is timed (restore listener: first start to last end);
* **plain Spark** (bench/plain_spark_peer.py): the same aggregation as a bare query, process start to exit;
* **the platform** (``python -m spark_jobs.driver.run <job> --available-now``: purchase_counts,
  patient_heart_rate, temperature_averages, user_sessions, order_enrichment or order_payments): process start to
  exit, changelog + snapshots + status + dead letters included; then
  two restores of the store it left, each in its own process (bench/platform_restore_probe.py): the full
  changelog replay and snapshot + tail.

Each process's peak memory is its process tree's largest sampled resident size (driver JVM, Python driver
and workers together). Changelog bytes are the changelog topic's log segments on the broker's disk,
divided by the input events. Figures are medians with min-max over the rounds; ratios compare medians
measured in the same invocation.

    .venv/bin/python bench/compare.py        # every workload; 1e6 and 1e7 events; 1e5 and 1e6 users / 1e3 patients, sensors
    .venv/bin/python bench/compare.py --workloads purchases --events 1000000 --keys 100000 --repeats 3
    .venv/bin/python bench/compare.py --workloads enrichment --events 10000000 --profiles 1000000  # 1e7 x 1e6
    .venv/bin/python bench/compare.py --workloads payments --events 20000000  # 1e7 orders + 1e7 payments

Each size's rounds are saved to bench/results/compare-<workload>-<events>x<keys>.json after every round; the
BENCHMARKS.md section (and bench/results/compare-throughput.png) is rebuilt from every saved size, so sizes
can be measured by separate invocations and a run cut short keeps its finished rounds. A size measured again
replaces its file once the new run has as many rounds as the stored one (or has finished).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench import answers  # noqa: E402
from bench.kafka_streams_peer import OUTPUT_TOPIC_CONFIG, KafkaStreamsPeer  # noqa: E402
from bench.kafka_streams_peer import build as build_kafka_streams
from runtime import jvm  # noqa: E402
from runtime.kafka_broker import LocalKafkaBroker  # noqa: E402
from runtime.kafka_connection import KafkaConnection  # noqa: E402
from runtime.process import free_port  # noqa: E402
from runtime.settings import PROJECT_ROOT, Settings  # noqa: E402
from spark_jobs.io.dead_letter import dead_letter_topic  # noqa: E402
from spark_jobs.io.kafka_topics import delete_topics, ensure_topic, partition_offsets  # noqa: E402
from spark_jobs.layout import changelog_topic_name  # noqa: E402
from spark_jobs.reference.generators import orders, payments, pulse, purchases, sessions, temperatures  # noqa: E402
from spark_jobs.reference.generators.producer import produce_encoded  # noqa: E402
from spark_jobs.registry import get_job  # noqa: E402

console = Console()


@dataclasses.dataclass(frozen=True)
class Workload:
    """One stateful computation, as each peer runs it: the platform's reference job and its store, the
    Kafka Streams app's topology, the plain-Spark query; ``keys`` of a size are its users / patients /
    sensors. ``deleting_event``: the event type after which peers mean different things by a key's answer
    (see bench/answers.py), whose keys are left out of the comparisons that say so. ``generate(events,
    keys)``: the input; ``produce``: writes it keyed; the answers: bench/answers.py's readers of the Kafka
    Streams output topic and of a Delta output table; ``windowed``: answers are keyed (key, window start).

    A join of two topics (the job's ``join_topics`` set) has ``generate`` return both topics' records (the source
    topic's, then the join topic's, encoded: bench/compare.py writes them with ``produce``, the join topic first),
    ``check`` comparing its answers (bench/answers.py's ``check_*_agree``: peer -> results compared, and what was
    left out), the Kafka Streams JVM's ``kafka_streams_options``, and ``table_topic`` when its join topic is a
    table (plain Spark reads it as a batch table, not as a stream). Kafka Streams' changelog bytes are those of
    every store of its app for a join (a join has several stores), of ``store`` otherwise."""

    name: str
    job: str
    store: str
    kafka_streams_topology: str
    key_noun: str
    key_field: str
    deleting_event: str
    generate: Callable[[int, int], Iterable[dict]]
    produce: Callable
    kafka_streams_answer: Callable
    table_answer: Callable
    windowed: bool
    check: Callable[[dict[str, dict]], tuple[dict[str, int], str]] | None = None
    kafka_streams_options: tuple[str, ...] = ()
    table_topic: bool = False

    @property
    def spec(self):
        return get_job(self.job)


def user_purchases(events: int, users: int) -> Iterable[dict]:
    """``events`` purchases of ``users`` users, in the past at every size (1e7 events span weeks: see
    purchases.start_ending_by)."""
    return purchases.generate(events, users=users, seed=3, start=purchases.start_ending_by(events))


def heartbeats(events: int, patients: int) -> list[dict]:
    """Exactly ``events`` heartbeats of ``patients`` patients (55-110 bpm, a few seconds of disorder,
    0.1% check-outs): the first ``events`` in arrival order of a run long enough to have them, ending
    before the generator's START (in the past, as for purchases: see purchases.start_ending_by)."""
    seconds = int(events / patients / (55 / 60)) + 60  # at the slowest rate, still enough beats
    start = pulse.START - dt.timedelta(seconds=seconds)
    beats = list(itertools.islice(pulse.generate(patients, seconds=seconds, seed=3, start=start), events))
    assert len(beats) == events, f"generated {len(beats)} of {events} heartbeats"
    return beats


def readings(events: int, sensors: int) -> list[dict]:
    """Exactly ``events`` temperature readings of ``sensors`` sensors (one every 4-6 s each, a few seconds
    of disorder), ending before the generator's START, as :func:`heartbeats`. About 5% of the sensors are
    removed at some point, whatever the size: the peers that cannot delete are compared on the others, so
    a fixed per-reading rate (0.05% removed 40% of the sensors at 1e6 events) would leave little to compare."""
    seconds = int(events / sensors * 6) + 60  # at the slowest rate, still enough readings
    start = temperatures.START - dt.timedelta(seconds=seconds)
    removal_rate = 0.05 * sensors / events  # per reading: 0.05 removals per sensor over the run
    generated = temperatures.generate(sensors, seconds=seconds, seed=3, start=start, removal_rate=removal_rate)
    read = list(itertools.islice(generated, events))
    assert len(read) == events, f"generated {len(read)} of {events} readings"
    return read


def visits(events: int, users: int) -> list[dict]:
    """Exactly ``events`` clicks and page views of ``users`` users in visits separated by 35 min to 2 h of
    inactivity (a few seconds of disorder, 0.05% forget_me), ending before the generator's START, as
    :func:`heartbeats`."""
    seconds = int(events / users * 600 * 2) + 3600  # about one event per 10 min per user; twice that
    start = sessions.START - dt.timedelta(seconds=seconds)
    generated = list(itertools.islice(sessions.generate(users, seconds=seconds, seed=3, start=start), events))
    assert len(generated) == events, f"generated {len(generated)} of {events} visit events"
    return generated


def end_of_join_input() -> int:
    """Where the joins' generated records end (epoch ms): an hour ago, on the minute. Their profiles carry their
    time as the Kafka timestamp, so they lie within the input topic's retention (7 days), unlike the fixed past of
    the other workloads; and in the past, for Kafka Streams stamps its output with event time."""
    return (int(time.time()) // 60 - 60) * 60_000


def enrichment_input(events: int, profiles: int) -> tuple[Iterable, Iterable]:
    """``events`` orders and ``profiles`` customer profiles, one each, every profile earlier than its customer's
    orders (spark_jobs.reference.generators.orders.growing_customers): the row valid at an order's time (the platform,
    Kafka Streams) is the latest one (plain Spark), whatever the micro-batches."""
    return orders.growing_customers(events, profiles, end_of_join_input(), seed=3)


def payments_input(events: int, keys: int) -> tuple[Iterable, Iterable]:
    """``events`` records: ``keys`` orders and as many payments (spark_jobs.reference.generators.payments.scaled), each
    topic in time order."""
    assert events == 2 * keys, f"payments: {events} events are {keys} orders and as many payments"
    return payments.scaled(keys, end_of_join_input(), seed=3)


def _payments_check(answers_: dict[str, dict]) -> tuple[dict[str, int], str]:
    return answers.check_payments_agree(answers_, slack_ms=2 * (10 * 60_000 + 60_000))  # 2 x (window + grace)


WORKLOADS = {
    "purchases": Workload(
        "purchases",
        "purchase_counts",
        "counts",
        "purchase_counts",
        "users",
        "user_id",
        "account_closed",
        user_purchases,
        purchases.produce,
        answers.kafka_streams_purchases,
        answers.table_purchases,
        windowed=False,
    ),
    "pulses": Workload(
        "pulses",
        "patient_heart_rate",
        "pulse-counts",
        "pulse_counts",
        "patients",
        "patient_id",
        "checked_out",
        heartbeats,
        pulse.produce,
        answers.kafka_streams_pulses,
        answers.table_pulses,
        windowed=True,
    ),
    "temperatures": Workload(
        "temperatures",
        "temperature_averages",
        "temperature-windows",
        "temperature_averages",
        "sensors",
        "sensor_id",
        "sensor_removed",
        readings,
        temperatures.produce,
        answers.kafka_streams_temperatures,
        answers.table_temperatures,
        windowed=True,
    ),
    "sessions": Workload(
        "sessions",
        "user_sessions",
        "user-sessions",
        "user_sessions",
        "users",
        "user_id",
        "forget_me",
        visits,
        sessions.produce,
        answers.kafka_streams_sessions,
        answers.table_sessions,
        windowed=True,
    ),
    "enrichment": Workload(
        "enrichment",
        "order_enrichment",
        "customer-profiles",
        "order_enrichment",
        "profiles",
        "customer_id",
        "",
        enrichment_input,
        produce_encoded,
        answers.kafka_streams_enrichment,
        answers.table_enrichment,
        windowed=False,
        check=answers.check_enrichment_agree,
        table_topic=True,
    ),
    "payments": Workload(
        "payments",
        "order_payments",
        "order-payments",
        "order_payments_outer",
        "orders",
        "order_id",
        "",
        payments_input,
        produce_encoded,
        answers.kafka_streams_payments,
        answers.table_payments,
        windowed=False,
        check=_payments_check,
        # the twin's only deterministic setting (spark_jobs/reference/generators/payments.py, docs/writing-jobs/stream-stream-join.md)
        kafka_streams_options=("-Dstreams.__emit.interval.ms.kstreams.outer.join.spurious.results.fix__=0",),
    ),
}
SECTION = "## Platform vs Kafka Streams vs plain Spark"
PYTHON = sys.executable


def process_tree_rss_bytes(pid: int) -> int | None:
    """Resident memory of a process and all its descendants (None: the process is gone)."""
    tree = process_tree_rss(pid)
    return None if tree is None else sum(rss for _, rss in tree.values())


def process_tree_rss(pid: int) -> dict[int, tuple[str, int]] | None:
    """pid -> (command line, resident bytes) of a process and all its descendants (None: it is gone)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return None
    found = {}
    for proc in tree:
        try:
            found[proc.pid] = (" ".join(proc.cmdline())[:160], proc.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


class PeakMemory:
    """Samples the resident memory of a process and all its descendants; keeps the largest sum."""

    def __init__(self, pid: int, interval_s: float = 0.25) -> None:
        self.pid, self.interval_s, self.peak_bytes = pid, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = process_tree_rss_bytes(self.pid)
            if total is None:
                return
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop.wait(self.interval_s)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak_bytes


@dataclasses.dataclass
class Measured:
    """One measured process: its JSON answer, wall seconds from start to exit, peak memory."""

    answer: dict
    seconds: float
    peak_bytes: int


def run_measured(cmd: list[str], env: dict[str, str], timeout_s: float) -> Measured:
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT
    )
    memory = PeakMemory(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    seconds = time.monotonic() - started
    peak = memory.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{err[-3000:]}")
    # The answer is the last JSON object on stdout, on one line or pretty-printed from a line starting "{".
    lines = out.splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith("{")]
    return Measured(json.loads("\n".join(lines[starts[-1] :])) if starts else {}, seconds, peak)


def topic_bytes(broker: LocalKafkaBroker, topic: str) -> int:
    """Bytes of the topic's log segments on the broker's disk (all partitions)."""
    return sum(f.stat().st_size for d in broker.storage_dir.glob(f"{topic}-*") if d.is_dir() for f in d.glob("*.log"))


def changelog_topics(broker: LocalKafkaBroker, application_id: str) -> set[str]:
    """The changelog topics of a Kafka Streams app, from the broker's partition directories (``<topic>-<n>``)."""
    found = broker.storage_dir.glob(f"{application_id}-*-changelog-*")
    return {d.name.rpartition("-")[0] for d in found if d.is_dir()}


@dataclasses.dataclass
class Round:
    """Every figure of one peer in one round."""

    seconds: float
    peak_bytes: int
    changelog_bytes: int | None = None
    restores: dict[str, dict] = dataclasses.field(default_factory=dict)  # name -> seconds, records, peak_bytes
    #: the platform's run report: seconds per phase of its batches (state, dead_letters, outputs, changelog,
    #: snapshot); plain Spark's: its batches' seconds
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    #: keys on which this peer's answer was checked equal to the platform's (bench/answers.py)
    answer_keys: int | None = None


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = Path(tempfile.mkdtemp(prefix="bench-compare-"))
        self.settings = Settings(
            data_dir=self.root / "broker",
            kafka_port=free_port(),
            kafka_controller_port=free_port(),
            airflow_port=free_port(),
        )
        self.broker = LocalKafkaBroker(self.settings)
        self.classpath = build_kafka_streams() if "kafka_streams" in args.peers else ""

    @property
    def bootstrap(self) -> KafkaConnection:
        return self.settings.kafka

    @property
    def job(self):
        return self.workload.spec

    def load(self, events: int, keys: int) -> None:
        """The input every peer reads: ``events`` of the workload over ``keys`` users, patients or sensors
        (each beating or reading for as long as that takes), on the job's source topic; a join's two topics
        (:meth:`load_join`)."""
        if self.job.join_topics:
            self.load_join(events, keys)
            return
        topic, workload = self.job.source_topic, self.workload
        delete_topics(self.bootstrap, [topic])
        ensure_topic(self.bootstrap, topic, self.job.source_partitions)
        t = time.monotonic()
        self.deleted_keys: set[str] = set()
        with console.status(f"producing {events:,} events over {keys:,} {workload.key_noun}"):
            generated = workload.generate(events, keys)
            noted = answers.noting_keys(generated, workload.key_field, workload.deleting_event, self.deleted_keys)
            sent = workload.produce(self.bootstrap, topic, noted)
        ends = sum(high for _, high in partition_offsets(self.bootstrap, topic).values())
        assert sent == events == ends, f"loaded {ends} of {events} events"
        self.loaded = {topic: ends}
        console.print(f"loaded {events:,} events in {time.monotonic() - t:.0f} s")

    def load_join(self, events: int, keys: int) -> None:
        """A join's two topics, the join topic (a table's profiles, or the payments) written first."""
        job, workload = self.job, self.workload
        topics = (job.source_topic, job.join_topics[0])
        delete_topics(self.bootstrap, list(topics))
        for topic in topics:
            ensure_topic(self.bootstrap, topic, job.source_partitions)  # co-partitioned, as a join needs
        t = time.monotonic()
        self.deleted_keys = set()
        with console.status(f"producing {events:,} events, {keys:,} {workload.key_noun}"):
            stream, other = workload.generate(events, keys)
            sent = {job.join_topics[0]: workload.produce(self.bootstrap, job.join_topics[0], other)}
            sent[job.source_topic] = workload.produce(self.bootstrap, job.source_topic, stream)
        self.loaded = {
            topic: sum(high for _, high in partition_offsets(self.bootstrap, topic).values()) for topic in topics
        }
        assert sent == self.loaded, f"loaded {self.loaded} of {sent} records"
        stream_events = self.loaded[job.source_topic] if workload.table_topic else sum(self.loaded.values())
        assert stream_events == events, f"{stream_events} events loaded, not {events}"
        console.print(f"loaded {self.loaded} in {time.monotonic() - t:.0f} s")

    @property
    def input_topic(self) -> str:
        """The job's input topics, comma-separated (Kafka Streams' and plain Spark's argument)."""
        return ",".join(self.loaded)

    @property
    def plain_spark_rows(self) -> int:
        """The records plain Spark's streams read: all of the input, a table topic aside."""
        table = self.job.join_topics[0] if self.workload.table_topic else None
        return sum(n for topic, n in self.loaded.items() if topic != table)

    def kafka_streams(self, n: int, size: str) -> Round:
        app = f"kstreams-{size}-r{n}"
        output = f"{app}-out"
        for sink in (output, f"{output}-updates"):  # not sinks; temperature_averages also writes its updates
            ensure_topic(self.bootstrap, sink, self.job.source_partitions, config=OUTPUT_TOPIC_CONFIG)
        state_dir = self.root / app
        topology = self.workload.kafka_streams_topology
        options = self.workload.kafka_streams_options

        def start() -> KafkaStreamsPeer:
            return KafkaStreamsPeer(
                self.classpath,
                self.settings,
                topology,
                app,
                state_dir,
                self.input_topic,
                output,
                self.args.threads,
                options,
            )

        peer = start()
        seconds = peer.wait_caught_up(self.args.timeout)  # the run's bound: 1e7 + 1e7 payments outlast the default
        peer.stop()
        self.answers["kafka_streams"] = self.workload.kafka_streams_answer(self.bootstrap, output)
        changelogs = (
            changelog_topics(self.broker, app)  # a join's stores: its table or window stores and its buffers
            if self.job.join_topics
            else {changelog_topic_name(app, self.workload.store)}  # Kafka Streams names it as the platform does
        )
        result = Round(seconds, peer.peak_rss_bytes, sum(topic_bytes(self.broker, c) for c in changelogs))
        shutil.rmtree(state_dir)  # the seeds' full restore: no local state, replay the changelog
        again = start()
        again.wait_running()
        again.stop()
        result.restores["full replay"] = {
            "seconds": again.restore_seconds(),
            "records": again.restored_records(),
            "peak_bytes": again.peak_rss_bytes,
        }
        shutil.rmtree(state_dir, ignore_errors=True)
        delete_topics(self.bootstrap, [*changelogs, output, f"{output}-updates"])
        return result

    def plain_spark(self, n: int, size: str, max_offsets: int) -> Round:
        work = self.root / f"plain-{size}-r{n}"
        run = run_measured(
            [
                PYTHON,
                "bench/plain_spark_peer.py",
                self.input_topic,
                str(work),
                "--max-offsets-per-trigger",
                str(max_offsets),
                "--workload",
                self.workload.name,
            ],
            self._platform_settings(work, max_offsets).to_env(),
            self.args.timeout,
        )
        expected = self.plain_spark_rows
        assert run.answer["input_rows"] == expected, f"plain Spark read {run.answer['input_rows']} of {expected}"
        self.answers["plain_spark"] = self._table_answer(work / "output")
        shutil.rmtree(work, ignore_errors=True)
        return Round(run.seconds, run.peak_bytes, phases={"batches": run.answer["batch_seconds"]})

    def platform(self, n: int, size: str, max_offsets: int) -> Round:
        work = self.root / f"platform-{size}-r{n}"
        env = self._platform_settings(work, max_offsets).to_env()
        job, store = self.job, self.workload.store
        run = run_measured(
            [PYTHON, "-m", "spark_jobs.driver.run", job.name, "--version", str(job.version), "--available-now"],
            env,
            self.args.timeout,
        )
        records = sum(self.loaded.values())  # a join's: both topics
        assert run.answer.get("input_rows") == records and not run.answer.get("error"), run.answer
        changelog = changelog_topic_name(job.application_id, store)
        result = Round(
            run.seconds, run.peak_bytes, topic_bytes(self.broker, changelog), phases=run.answer.get("phase_seconds", {})
        )
        for name, mode in (("full replay", "full"), ("snapshot + tail", "snapshot")):
            probe = run_measured(
                [
                    PYTHON,
                    "bench/platform_restore_probe.py",
                    job.name,
                    store,
                    "--mode",
                    mode,
                    "--version",
                    str(job.version),
                ],
                env,
                self.args.timeout,
            )
            result.restores[name] = {
                "seconds": probe.answer["seconds"],
                "records": probe.answer["changelog_records_read"],
                "snapshot_rows": probe.answer["snapshot_rows"],
                "keys": probe.answer["keys"],
                "snapshot_seconds": probe.answer["snapshot_seconds"],
                "peak_bytes": probe.peak_bytes,
            }
        keys = {name: r["keys"] for name, r in result.restores.items()}
        # Both restores rebuild the store the run left: the same, non-empty key set size, or a figure is wrong.
        assert len(set(keys.values())) == 1 and min(keys.values()) > 0, f"restores disagree on the store: {keys}"
        output = self._platform_settings(work, max_offsets).lake / job.output_table_dir
        self.answers["platform"] = self._table_answer(output)
        shutil.rmtree(work, ignore_errors=True)
        delete_topics(self.bootstrap, [changelog, dead_letter_topic(job.application_id)])
        return result

    def _platform_settings(self, work: Path, max_offsets: int) -> Settings:
        return self.settings.replace(data_dir=work, max_offsets_per_trigger=max_offsets)

    def _table_answer(self, table) -> dict:
        return self.workload.table_answer(str(table))

    def check_answers(self, round_: dict[str, Round]) -> None:
        """The peers of one round computed the same answer (bench/answers.py), or the run stops here."""
        ordered = dict(sorted(self.answers.items(), key=lambda item: item[0] != "platform"))  # the platform first
        if self.workload.check:
            compared, left_out = self.workload.check(ordered)
            for peer, keys in compared.items():
                round_[peer].answer_keys = keys
            console.print(f"answers agree, results compared: {compared} ({left_out})")
            self.answers = {}
            return
        deleted, windowed = self.deleted_keys, self.workload.windowed

        def kept(key) -> bool:  # a key whose answer every peer means the same by
            return (key[0] if windowed else key) not in deleted

        # when every key was deleted nothing is left to compare: the run stops saying so (more keys, or fewer
        # events per key, make a size comparable)
        why = f"{self.workload.key_noun} without {self.workload.deleting_event}: {len(deleted):,} had one"
        scopes = {
            "kafka_streams": answers.Scope(kept, why=why) if windowed else answers.Scope(),
            "plain_spark": answers.Scope(kept, only_its_own=windowed, why=why),
        }
        compared = answers.check_agree(ordered, scopes)
        for peer, keys in compared.items():
            round_[peer].answer_keys = keys
        left_out = f"{len(deleted):,} {self.workload.key_noun} with {self.workload.deleting_event}"
        console.print(f"answers agree, keys compared: {compared} ({left_out} left out where a peer means otherwise)")
        self.answers = {}

    def size(
        self,
        workload: Workload,
        events: int,
        keys: int,
        after_round: Callable[[dict[str, list[Round]]], None] = lambda rounds: None,
    ) -> dict[str, list[Round]]:
        """Every round of one size; ``after_round`` gets the rounds so far when each round is complete."""
        self.workload, self.events = workload, events
        self.load(events, keys)
        size = f"{workload.name}-{events}-{keys}"
        max_offsets = max(1, events // self.args.batches)
        rounds: dict[str, list[Round]] = {peer: [] for peer in self.args.peers}
        for n in range(self.args.repeats):
            self.answers: dict[str, dict] = {}
            for peer in self.args.peers:
                t = time.monotonic()
                with console.status(
                    f"round {n + 1}/{self.args.repeats}: {peer}, {workload.name}, {events:,} events, "
                    f"{keys:,} {workload.key_noun}"
                ):
                    if peer == "kafka_streams":
                        result = self.kafka_streams(n, size)
                    elif peer == "plain_spark":
                        result = self.plain_spark(n, size, max_offsets)
                    else:
                        result = self.platform(n, size, max_offsets)
                rounds[peer].append(result)
                console.print(
                    f"round {n + 1} {workload.name} {peer}: {events / result.seconds:,.0f} events/s, peak "
                    f"{result.peak_bytes / 2**20:,.0f} MiB, restores "
                    f"{ {k: round(v['seconds'], 2) for k, v in result.restores.items()} } "
                    f"({time.monotonic() - t:.0f} s)"
                )
            self.check_answers({peer: rounds[peer][-1] for peer in self.args.peers})
            after_round(rounds)
        return rounds


PEERS = ("kafka_streams", "plain_spark", "platform")
PLAIN_SPARK_QUERY = {
    "purchases": "groupBy().agg()",
    "pulses": "window() count, append",
    "temperatures": "hopping window() aggregates, append",
    "sessions": "session_window() aggregates, append",
    "enrichment": "stream-static left join, profiles cached",
    "payments": "stream-stream full outer join, watermarks + time range",
}


def peer_name(peer: str, workload: str) -> str:
    if peer == "kafka_streams":
        return "Kafka Streams 4.3 (RocksDB + changelog)"
    if peer == "plain_spark":
        return f"plain Spark ({PLAIN_SPARK_QUERY[workload]})"
    spec = WORKLOADS[workload].spec
    return f"this platform ({spec.name} v{spec.version}, Java processor)"


RESULTS_DIR = PROJECT_ROOT / "bench" / "results"
PLOT = "compare-throughput.png"


@dataclasses.dataclass
class SizeResult:
    """Every round of one (events, keys) size, with how and where it was measured. Kept as JSON in
    bench/results/ so that sizes measured by separate invocations (a 1e7-event size takes hours) make
    one report; each size's rounds always come from one invocation, peers side by side."""

    workload: str
    events: int
    keys: int
    date: str
    commit: str
    command: str
    machine: str
    batches: int
    threads: int
    rounds: dict[str, list[Round]]

    @property
    def round_count(self) -> int:
        return max((len(runs) for runs in self.rounds.values()), default=0)

    @property
    def path_name(self) -> str:
        return f"compare-{self.workload}-{self.events}x{self.keys}.json"

    def save(self, directory: Path = RESULTS_DIR) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / self.path_name
        data = dataclasses.asdict(self)
        path.write_text(json.dumps(data, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: Path) -> SizeResult:
        data = json.loads(path.read_text())
        data["rounds"] = {peer: [Round(**r) for r in runs] for peer, runs in data["rounds"].items()}
        return cls(**data)


def load_results(directory: Path = RESULTS_DIR) -> list[SizeResult]:
    found = [SizeResult.load(p) for p in directory.glob("compare-*-*x*.json")]
    return sorted(found, key=lambda r: (list(WORKLOADS).index(r.workload), r.events, r.keys))


def keep_rounds(result: SizeResult, repeats: int, directory: Path, out: Path) -> bool:
    """Save a size's rounds so far and rebuild the BENCHMARKS.md section and plot from every saved size.

    Called after every round: a 1e7-event round takes most of an hour, and a run cut short keeps the rounds
    it finished (the report's "rounds" column says how many). A stored result of the same size with more
    rounds stays until this run has as many, or all of its ``repeats``. Returns whether it saved."""
    stored = directory / result.path_name
    stored_rounds = SizeResult.load(stored).round_count if stored.exists() else 0
    if result.round_count < min(stored_rounds, repeats):
        return False
    result.save(directory)
    results = load_results(directory)
    plot_throughput(results, directory / PLOT)
    write_section(report(results, PLOT), out)
    return True


def _stat(values: list[float], fmt: str = "{:,.1f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _median_throughput(result: SizeResult, peer: str) -> float | None:
    runs = result.rounds.get(peer) or []
    return statistics.median(result.events / r.seconds for r in runs) if runs else None


def report(results: list[SizeResult], plot: str | None = None) -> str:
    """The BENCHMARKS.md section: a summary over every measured size, then each size in full."""
    lines = [
        f"{SECTION} ({max(r.date for r in results)})",
        "",
        "`make bench` (= `.venv/bin/python bench/compare.py`) measures every size below; `--events`/`--keys` "
        "measure some of them and keep the others' stored results (bench/results/compare-*.json). Per size and "
        "round, each peer processes the same pre-loaded topic on the same local KRaft broker (2 partitions) from "
        "a cold start, one after the other. *purchases*: purchase events of Zipf-like users, 1% account closures "
        "(deletes); *pulses*: heartbeats of the patients (55-110 bpm, up to 3 s out of order, 0.1% check-outs) "
        "counted per 60 s event-time window with 5 s grace, emitted when the window closes; *temperatures*: readings "
        "of the sensors (every 4-6 s, up to 3 s out of order, about 5% of the sensors removed) aggregated (count, average, min, max) "
        "in 5-minute windows starting every minute, 30 s grace, emitted when they close; *sessions*: clicks and "
        "page views of the users in visits 35 min to 2 h apart (up to 3 s out of order, 0.05% forget_me) "
        "aggregated (events, page views) per session, 30 min inactivity gap, 5 min grace, emitted when it closes; "
        "*enrichment*: orders (the events) left-joined with their customer's profile (the keys: a table topic, each "
        "profile written once, before the orders and earlier than each of its customer's orders, 1% of the orders "
        "of customers with none), 1 min grace (plain Spark: a stream-static join of the profiles read once); "
        "*payments*: orders and payments (the events, half each; the keys are the orders) matched within 10 minutes, "
        "an outer join with 1 min grace (plain Spark: a stream-stream full outer join, 1 min watermarks), 8% of the "
        "orders unpaid, 3% paid outside the window, 4% paid twice, 1% at the window's bounds, 4% payments of no "
        "order; both topics in time order. Spark: "
        "local[*], 2 shuffle partitions, RocksDB state store, at most events/batches records per micro-batch. "
        "Every figure: median (min-max) of the rounds; ratios are of medians from the same invocation. "
        "Since 2026-11-26 a round counts only once the peers' outputs were equal key by key (bench/answers.py: "
        "plain Spark, which cannot delete, on the users who never closed an account; windows on the patients "
        "and sensors never deleted, plain Spark on the windows its watermark closed; enrichment: every joined "
        "order, plain Spark on the orders the others had joined (they still hold each partition's last minute for "
        "the grace period); payments: every matched pair, and the unmatched orders and payments every peer emitted, "
        "the others only checked to be ones a peer had not closed yet when the input ended); a size measured "
        "before says nothing about its answers.",
        "",
        "| workload | events x keys | Kafka Streams events/s | plain Spark events/s | platform events/s "
        "| platform / Kafka Streams | platform / plain Spark | snapshot + tail / Kafka Streams replay | rounds | measured |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        ks, plain, ours = (_median_throughput(result, p) for p in ("kafka_streams", "plain_spark", "platform"))
        fast = _median_restore(result.rounds, "platform", "snapshot + tail")
        ks_full = _median_restore(result.rounds, "kafka_streams", "full replay")
        rounds = result.round_count
        lines.append(
            f"| {result.workload} | {result.events:,} x {result.keys:,} {WORKLOADS[result.workload].key_noun} | "
            f"{_num(ks)} | {_num(plain)} | {_num(ours)} | "
            f"{_ratio(ours, ks)} | {_ratio(ours, plain)} | {_ratio(fast, ks_full)} | {rounds} | "
            f"{result.date}, {result.commit} |"
        )
    lines.append("")
    if plot:
        lines += [f"![events/s per peer and size](bench/results/{plot})", ""]
    for result in results:
        lines += size_section(result)
    return "\n".join(lines).rstrip("\n")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "-" if ours is None or not theirs else f"{ours / theirs:.2f}x"


def size_section(result: SizeResult) -> list[str]:
    events, rounds, workload = result.events, result.rounds, result.workload
    lines = [
        f"### {workload}: {events:,} events, {result.keys:,} {WORKLOADS[workload].key_noun}",
        "",
        f"Command: `{result.command}` ({result.date}, commit {result.commit}; {result.batches} micro-batches; "
        f"Kafka Streams with {result.threads} stream threads, commit interval 1 s)",
        f"Machine: {result.machine}.",
        "",
        "| peer | events/s | seconds start to processed | peak memory MiB | changelog bytes/event |",
        "|---|---|---|---|---|",
    ]
    checked = {peer: runs[-1].answer_keys for peer, runs in rounds.items() if runs and runs[-1].answer_keys}
    if checked:
        agreed = ", ".join(f"{peer_name(peer, workload).split(' (')[0]} on {keys:,}" for peer, keys in checked.items())
        note = "Every round's answers were equal key by key before its figures counted (bench/answers.py)"
        lines[-2:-2] = [f"{note}: {agreed} keys.", ""]
    for peer, runs in rounds.items():
        changelog = [r.changelog_bytes / events for r in runs if r.changelog_bytes is not None]
        lines.append(
            f"| {peer_name(peer, workload)} | {_stat([events / r.seconds for r in runs], '{:,.0f}')} | "
            f"{_stat([r.seconds for r in runs])} | {_stat([r.peak_bytes / 2**20 for r in runs], '{:,.0f}')} | "
            f"{_stat(changelog) if changelog else '-'} |"
        )
    lines += ["", "| restore of the same state | records replayed | seconds | peak memory MiB |", "|---|---|---|---|"]
    for peer, runs in rounds.items():
        for name in runs[0].restores if runs else ():
            restores = [r.restores[name] for r in runs]
            lines.append(
                f"| {peer_name(peer, workload).split(' (')[0]}: {name} | {_stat([x['records'] for x in restores], '{:,.0f}')} | "
                f"{_stat([x['seconds'] for x in restores], '{:,.2f}')} | "
                f"{_stat([x['peak_bytes'] / 2**20 for x in restores], '{:,.0f}')} |"
            )
    return [*lines, "", *ratios(rounds, events), *where_the_time_goes(rounds), *where_the_restore_goes(rounds), ""]


def where_the_restore_goes(rounds: dict[str, list[Round]]) -> list[str]:
    """Snapshot + tail split into reading the Delta snapshot and replaying the changelog tail."""
    restores = [r.restores["snapshot + tail"] for r in rounds.get("platform", []) if "snapshot + tail" in r.restores]
    restores = [x for x in restores if "snapshot_seconds" in x]
    if not restores:
        return []
    snapshot = statistics.median(x["snapshot_seconds"] for x in restores)
    tail = statistics.median(x["seconds"] - x["snapshot_seconds"] for x in restores)
    rows = statistics.median(x["snapshot_rows"] for x in restores)
    return [
        f"- Where the platform's snapshot + tail restore goes (median seconds): reading the snapshot "
        f"({rows:,.0f} rows) {snapshot:.2f}, replaying the changelog tail {tail:.2f}"
    ]


def plot_throughput(results: list[SizeResult], path: Path) -> None:
    """Grouped bars: median events/s per peer for each size, whiskers from min to max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = [p for p in PEERS if any(r.rounds.get(p) for r in results)]
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(results)), 4))
    width = 0.8 / max(1, len(peers))
    for i, peer in enumerate(peers):
        xs, medians, low, high = [], [], [], []
        for x, result in enumerate(results):
            rates = [result.events / r.seconds for r in result.rounds.get(peer) or []]
            if rates:
                m = statistics.median(rates)
                xs.append(x + (i - (len(peers) - 1) / 2) * width)
                medians.append(m), low.append(m - min(rates)), high.append(max(rates) - m)
        ax.bar(xs, medians, width, yerr=[low, high], capsize=3, label=peer_name(peer, "purchases").split(" (")[0])
    ax.set_xticks(
        range(len(results)),
        [f"{r.workload}\n{r.events:.0e} events\n{r.keys:.0e} {WORKLOADS[r.workload].key_noun}" for r in results],
    )
    ax.set_ylabel("events/s (median, min-max)")
    ax.set_title("Stateful throughput, same broker and data (2 cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _median_restore(rounds: dict[str, list[Round]], peer: str, name: str) -> float | None:
    runs = rounds.get(peer) or []
    return statistics.median(r.restores[name]["seconds"] for r in runs) if runs else None


def ratios(rounds: dict[str, list[Round]], events: int) -> list[str]:
    """The goals of issue 9, each as a ratio of medians from this run."""

    def throughput(peer: str) -> float | None:
        return statistics.median(events / r.seconds for r in rounds[peer]) if rounds.get(peer) else None

    def restore(peer: str, name: str) -> float | None:
        return _median_restore(rounds, peer, name)

    ours, kstreams, plain = throughput("platform"), throughput("kafka_streams"), throughput("plain_spark")
    out = []
    if ours and kstreams:
        out.append(f"- Throughput, platform / Kafka Streams: **{ours / kstreams:.2f}x** (goal: at least 1.0x)")
    if ours and plain:
        out.append(
            f"- Throughput, platform / plain Spark: **{ours / plain:.2f}x**, i.e. the platform's features cost "
            f"{(1 - ours / plain) * 100:.0f}% of plain Spark's throughput (goal: at most 25%)"
        )
    fast, ks_full, our_full = (
        restore("platform", "snapshot + tail"),
        restore("kafka_streams", "full replay"),
        restore("platform", "full replay"),
    )
    if fast is not None and ks_full:
        out.append(
            f"- Restore, platform snapshot + tail / Kafka Streams full replay: **{fast / ks_full:.2f}x** "
            "(goal: at most 0.2x)"
        )
    if our_full is not None and ks_full:
        out.append(f"- Restore, platform full replay / Kafka Streams full replay: {our_full / ks_full:.2f}x")
    return out


#: phases the platform's report times in a background thread, overlapping its batches' (JobContext's snapshots)
BACKGROUND_PHASES = ("snapshot_background",)


def where_the_time_goes(rounds: dict[str, list[Round]]) -> list[str]:
    """The platform's run split by its own report: batch phases, and the rest (Spark's start, planning,
    Kafka reads, the clean stop). A phase of a background thread (the snapshots, beside the batches) is named
    apart and counted in neither."""
    runs = [r for r in rounds.get("platform", []) if r.phases]
    if not runs:
        return []
    order = ("reconcile", "state", "dead_letters", "outputs", "changelog", "snapshot")
    names = sorted(runs[0].phases, key=lambda n: order.index(n) if n in order else len(order))
    medians = {name: statistics.median(r.phases.get(name, 0.0) for r in runs) for name in names}
    phases = {name: seconds for name, seconds in medians.items() if name not in BACKGROUND_PHASES}
    rest = statistics.median(
        r.seconds - sum(s for name, s in r.phases.items() if name not in BACKGROUND_PHASES) for r in runs
    )
    parts = ", ".join(f"{name} {seconds:,.1f}" for name, seconds in phases.items())
    beside = "".join(f"; {name} {medians[name]:,.1f} beside the batches" for name in names if name in BACKGROUND_PHASES)
    lines = [f"- Where the platform's run time goes (median seconds): {parts}, everything else {rest:,.1f}{beside}"]
    plain = [r for r in rounds.get("plain_spark", []) if r.phases]
    if plain:  # the same split of the peer: its micro-batches (read, aggregation, write) and the rest
        batches = statistics.median(r.phases["batches"] for r in plain)
        rest = statistics.median(r.seconds - r.phases["batches"] for r in plain)
        ours = sum(phases.values())
        lines.append(
            f"- Where plain Spark's run time goes (median seconds): its micro-batches {batches:,.1f} "
            f"(the platform's: {ours:,.1f}), everything else {rest:,.1f}"
        )
    return lines


def write_section(text: str, path: Path) -> None:
    """Replace this benchmark's previous section of BENCHMARKS.md (other benchmarks' sections stay)."""
    previous = path.read_text() if path.exists() else "# Benchmarks\n\n"
    start = previous.find(SECTION)
    if start >= 0:
        end = previous.find("\n## ", start + len(SECTION))
        previous = previous[:start] + (previous[end + 1 :] if end >= 0 else "")
    path.write_text(previous.rstrip("\n") + "\n\n" + text + "\n")


def versions_line() -> str:
    from importlib.metadata import version

    java_binary = jvm.java_binary(Settings.from_env())  # the platform's JDK, the peer's too
    java = subprocess.run([java_binary, "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    return f"PySpark {version('pyspark')}, delta-spark {version('delta-spark')}, Kafka Streams 4.3.1, {java}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--keys", type=int, nargs="+", default=[100_000, 1_000_000], help="purchases: users")
    parser.add_argument(
        "--patients",
        type=int,
        nargs="+",
        default=[1_000],
        help="pulses: patients (1e6 events of 1,000 patients = ~12 min of beats each, ~13 windows)",
    )
    parser.add_argument(
        "--sensors",
        type=int,
        nargs="+",
        default=[1_000],
        help="temperatures: sensors (1e6 events of 1,000 sensors = ~83 min of readings each)",
    )
    parser.add_argument(
        "--visitors",
        type=int,
        nargs="+",
        default=[10_000],
        help="sessions: users (1e6 events of 10,000 users = ~100 events each, ~10 visits)",
    )
    parser.add_argument(
        "--profiles",
        type=int,
        nargs="+",
        default=[100_000, 1_000_000],
        help="enrichment: customer profiles (events are the orders; 1e7 orders x 1e6 profiles is the issue's size)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--batches", type=int, default=12, help="micro-batches per run: max offsets per trigger = events / this"
    )
    parser.add_argument("--threads", type=int, default=2, help="Kafka Streams stream threads")
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one process may take")
    parser.add_argument("--out", type=Path, default=PROJECT_ROOT / "BENCHMARKS.md")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="where each size's rounds are kept (JSON)")
    args = parser.parse_args()

    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores (shared), {psutil.virtual_memory().total / 2**30:.0f} GiB, "
        f"Python {platform.python_version()}; {versions_line()}"
    )
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=PROJECT_ROOT
        ).stdout.strip()
        or "unknown"
    )
    bench = Bench(args)
    bench.broker.start()
    measured = []
    try:
        option = {
            "purchases": "keys",
            "pulses": "patients",
            "temperatures": "sensors",
            "sessions": "visitors",
            "enrichment": "profiles",
        }

        def keys_of(workload: str, events: int) -> list[int]:  # payments: the keys are the orders, half the events
            return [events // 2] if workload == "payments" else getattr(args, option[workload])

        sizes = [(w, events, keys) for w in args.workloads for events in args.events for keys in keys_of(w, events)]
        for workload, events, keys in sizes:
            keys_option = f" --{option[workload]} {keys}" if workload in option else ""
            command = (
                f".venv/bin/python bench/compare.py --workloads {workload} --events {events}{keys_option} "
                f"--repeats {args.repeats} --batches {args.batches}"
            )
            result = SizeResult(
                workload,
                events,
                keys,
                dt.date.today().isoformat(),
                commit,
                command,
                machine,
                args.batches,
                args.threads,
                {},
            )

            def keep(rounds: dict[str, list[Round]], result: SizeResult = result) -> None:
                result.rounds = rounds
                keep_rounds(result, args.repeats, args.results, args.out)

            bench.size(WORKLOADS[workload], events, keys, after_round=keep)
            measured.append(result)
    finally:
        bench.broker.stop()
        shutil.rmtree(bench.root, ignore_errors=True)
    table = Table("size", "ratio")
    for result in measured:
        for line in ratios(result.rounds, result.events):
            table.add_row(f"{result.workload} {result.events:,} x {result.keys:,}", line.lstrip("- "))
    console.print(table)


if __name__ == "__main__":
    main()
