"""The Kafka Streams peer of the benchmarks: the seeds' own system on the same broker.

Builds ``bench/kafka_streams`` (Maven, from Maven Central only), runs it over pre-loaded input until
its committed offsets reach the input's end (stateful throughput), then wipes its state directory and
starts it again: Kafka Streams restores the store from its changelog (a full replay), timed from start
to RUNNING with the records its restore listener reports. Peak memory is the process's VmHWM.

    .venv/bin/python bench/kafka_streams_peer.py [--events 1000000] [--users 100000] [--threads 2]

Prints the figures of this peer alone; bench/compare.py (``make bench``) runs it beside plain Spark and
this platform and writes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from rich.console import Console

from runtime import jvm
from runtime.kafka_broker import LocalKafkaBroker
from runtime.kafka_connection import client_config
from runtime.process import free_port
from runtime.settings import PROJECT_ROOT, Settings
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets
from spark_jobs.reference.generators import purchases

console = Console()
APP_DIR = PROJECT_ROOT / "bench" / "kafka_streams"
#: The config of an output topic of the app: it stamps its records with event time, and benchmark and test
#: events lie days or weeks in the past, so the broker's time retention (7 days, checked every 5 minutes)
#: would delete them at a random moment of a run (a 1e6-event comparison read 14,000 of 95,000 users
#: missing from Kafka Streams' answer).
OUTPUT_TOPIC_CONFIG = {"retention.ms": "-1"}


def _sources_digest() -> str:
    """What the build is made from: the pom and every source file (paths, sizes, modification times)."""
    files = [APP_DIR / "pom.xml", *sorted(p for p in (APP_DIR / "src").rglob("*") if p.is_file())]
    listing = "\n".join(f"{p.relative_to(APP_DIR)} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def build() -> str:
    """Compile the peer and copy its jars unless the last build was made from the same sources (Maven's own
    up-to-date check still costs a JVM start and seconds of CPU, once per caller); returns the Java classpath.
    Processes building at once (the suite's workers) take turns."""
    classpath = f"{APP_DIR / 'target' / 'classes'}:{APP_DIR / 'target' / 'dependency'}/*"
    stamp = APP_DIR / "target" / "streamstate-built-from"
    (APP_DIR / "target").mkdir(exist_ok=True)
    with open(APP_DIR / "target" / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest = _sources_digest()
        if stamp.exists() and stamp.read_text() == digest:
            return classpath
        _maven_build()
        stamp.write_text(digest)
    return classpath


def _maven_build() -> None:
    subprocess.run(
        [
            "mvn",
            "-B",
            "-q",
            "-s",
            str(PROJECT_ROOT / "jvm" / "settings.xml"),
            "-f",
            str(APP_DIR / "pom.xml"),
            "package",
            "dependency:copy-dependencies",
        ],
        check=True,
    )


#: JVM flags every peer of this process starts with, before its own ``jvm_options``: none for the benchmarks; the
#: test suite's peers, which live seconds, run C1 only (tests/conftest.py)
DEFAULT_JVM_OPTIONS: tuple[str, ...] = ()


class KafkaStreamsPeer:
    """One run of the Java app; its JSON event lines and peak memory are collected while it runs."""

    def __init__(
        self,
        classpath: str,
        settings: Settings,
        job: str,
        application_id: str,
        state_dir: Path,
        input_topic: str,
        output_topic: str,
        threads: int = 2,
        jvm_options: tuple[str, ...] = (),
    ) -> None:
        """``jvm_options``: more JVM flags, e.g. ``-Dstreams.commit.interval.ms=100`` (BenchApp reads every
        ``streams.<config>`` system property as a Kafka Streams config)."""
        self.settings, self.application_id, self.input_topic = settings, application_id, input_topic
        self.events: list[dict] = []
        self.peak_rss_bytes = 0
        #: the library's own log (slf4j-simple writes to stderr); its tail goes into any failure's message
        self.log_path = state_dir.with_name(f"{state_dir.name}.log")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                # The bench's private broker is PLAINTEXT: the app gets bootstrap servers only.
                [
                    jvm.java_binary(settings),
                    "-Xmx2g",
                    *DEFAULT_JVM_OPTIONS,
                    *jvm_options,
                    "-cp",
                    classpath,
                    "streamstate.bench.BenchApp",
                    job,
                    settings.kafka.bootstrap_servers,
                    application_id,
                    str(state_dir),
                    input_topic,
                    output_topic,
                    str(threads),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def _sample_memory(self) -> None:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss_bytes = max(self.peak_rss_bytes, int(line.split()[1]) * 1024)
        except FileNotFoundError:
            pass

    def check_running(self) -> None:
        """Raise with the app's own account of it when it failed: an error event, or the process ended."""
        errors = [e for e in self.events if e.get("event") == "error"]
        if not errors and self.proc.poll() is None:
            return
        self.proc.wait(35)  # it closes its client (up to 30 s) before exiting
        log = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        lines = [line for line in log if " ERROR " in line or "Exception" in line][-8:] or log[-8:]
        raise RuntimeError(
            f"the Kafka Streams app {self.application_id} failed (exit {self.proc.poll()}): "
            f"{errors[-1] if errors else self.events[-3:]}\n" + "\n".join(lines)
        )

    def wait_caught_up(self, timeout_s: float = 1800) -> float:
        """Seconds from start until the committed offsets reach the input's end (every topic of a
        comma-separated input, e.g. a join's ``customers,accounts``)."""
        # (an empty partition has nothing to commit: Kafka Streams never commits an offset for it)
        end = {
            (topic, p): high
            for topic in self.input_topic.split(",")
            for p, (low, high) in partition_offsets(self.settings.kafka, topic).items()
            if high > low
        }
        # A consumer of the app's group that never subscribes: it only reads the group's committed offsets.
        # (AdminClient.list_consumer_group_offsets crashed the interpreter here: confluent-kafka 2.16.1.)
        watcher = Consumer(
            client_config(
                self.settings.kafka, {"group.id": self.application_id, "enable.auto.commit": False, "log_level": 3}
            )
        )
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                self._sample_memory()
                self.check_running()
                try:
                    committed = {
                        (tp.topic, tp.partition): tp.offset
                        for tp in watcher.committed([TopicPartition(t, p) for t, p in end], timeout=10)
                    }
                except KafkaException:  # the group coordinator is still loading (NOT_COORDINATOR): ask again
                    committed = {}
                if all(committed.get(p, -1) >= high for p, high in end.items()):
                    return time.monotonic() - self.started
                time.sleep(0.2)
        finally:
            watcher.close()
        raise TimeoutError(f"not caught up after {timeout_s}s")

    def wait_running(self, timeout_s: float = 1800) -> float:
        """Seconds from start until the app reported RUNNING (after any restore)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._sample_memory()
            if any(e.get("event") == "state" and e.get("to") == "RUNNING" for e in self.events):
                running_at = next(
                    e["at_ms"] for e in self.events if e.get("event") == "state" and e.get("to") == "RUNNING"
                )
                created_at = next(e["at_ms"] for e in self.events if e.get("event") == "state")
                return (running_at - created_at) / 1000
            self.check_running()
            time.sleep(0.1)
        raise TimeoutError(f"not RUNNING after {timeout_s}s")

    def restored_records(self) -> int:
        return sum(e["records"] for e in self.events if e.get("event") == "restore_end")

    def restore_seconds(self) -> float:
        """From the first store partition's restore start to the last one's end: the changelog replay itself
        (start to RUNNING also waits out the previous instance's session: Kafka Streams does not leave the
        group on close, so a restart on the same application id waits up to session.timeout.ms)."""
        starts = [e["at_ms"] for e in self.events if e.get("event") == "restore_start"]
        ends = [e["at_ms"] for e in self.events if e.get("event") == "restore_end"]
        return (max(ends) - min(starts)) / 1000 if starts and ends else 0.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    classpath = build()
    data = Path(tempfile.mkdtemp(prefix="bench-kstreams-"))
    settings = Settings(
        data_dir=data, kafka_port=free_port(), kafka_controller_port=free_port(), airflow_port=free_port()
    )
    broker = LocalKafkaBroker(settings)
    broker.start()
    try:
        topic = "purchases"
        ensure_topic(settings.kafka, topic, 2)
        # Kafka Streams creates its internal topics but not sink topics (the broker auto-creates nothing).
        ensure_topic(settings.kafka, "kstreams-purchase-counts", 2)
        with console.status(f"producing {args.events:,} events"):
            start = purchases.start_ending_by(args.events)  # in the past: Kafka Streams stamps its output with it
            purchases.produce(
                settings.kafka, topic, list(purchases.generate(args.events, users=args.users, seed=3, start=start))
            )
        state_dir = data / "kstreams-state"
        peer = KafkaStreamsPeer(
            classpath,
            settings,
            "purchase_counts",
            "kstreams-purchases",
            state_dir,
            topic,
            "kstreams-purchase-counts",
            args.threads,
        )
        seconds = peer.wait_caught_up()
        peer.stop()
        console.print(
            f"Kafka Streams purchase_counts: {args.events:,} events, {args.users:,} users in {seconds:.1f} s "
            f"= {args.events / seconds:,.0f} events/s (from start, incl. JVM start); peak RSS "
            f"{peer.peak_rss_bytes / 2**20:,.0f} MiB"
        )

        shutil.rmtree(state_dir)  # the seeds' full restore: no local state, replay the changelog
        restore = KafkaStreamsPeer(
            classpath,
            settings,
            "purchase_counts",
            "kstreams-purchases",
            state_dir,
            topic,
            "kstreams-purchase-counts",
            args.threads,
        )
        restore_s = restore.wait_running()
        restore.stop()
        console.print(
            f"Kafka Streams full changelog restore: {restore.restored_records():,} records replayed in "
            f"{restore.restore_seconds():.1f} s ({restore_s:.1f} s start to RUNNING); peak RSS "
            f"{restore.peak_rss_bytes / 2**20:,.0f} MiB"
        )
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
