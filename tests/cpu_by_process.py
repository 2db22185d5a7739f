"""Where a test run's CPU went, by kind of process: printed at the end of every suite run (``tests/conftest.py``).

The suite is CPU-bound (its two workers keep the two cores 85-90% busy), so its time is the CPU its processes
burn: Spark's JVMs, the brokers, Airflow, Chromium. Every process on the machine is sampled every
:data:`PERIOD_S` from ``/proc`` (its user and system time so far, Linux only); a process is known by its pid
and start time, and counted at its last sample (a process that lives less than a period may be missed: the
report says how much CPU it saw of the machine's busy time). Then each is named by the first rule of
:data:`KINDS` its last command line matches.

Rules first, no I/O in :func:`kind_of` and :func:`tally`; :class:`Sampler` owns the thread and the reads.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

#: how often every process is sampled
PERIOD_S = 3.0

#: (kind, a regular expression searched in the command line), the first match wins; the rest is "other"
KINDS: tuple[tuple[str, str], ...] = (
    ("Spark: in-process sessions (pytest's, DAG tasks')", r"pyspark-shell\s*$"),
    ("Kafka brokers", r"\bkafka\.Kafka\b"),
    ("Spark: spark-submit drivers", r"(java|spark-class).*(SparkSubmit|spark_jobs/\S+\.py)"),
    ("Spark: standalone masters, workers, executors", r"org\.apache\.spark\.deploy\.|CoarseGrainedExecutorBackend"),
    ("Kafka Streams peers", r"java.*(kafka_streams|kafka-streams)"),
    ("other JVMs (object store, ...)", r"\bjava\b"),
    ("Chromium", r"chrom"),
    # before Airflow's: a backend's title names its database user, which is "airflow" here
    ("PostgreSQL", r"^(\S*/)?postgres\b"),
    ("Airflow: airflow dags test forks", r"dag_test_server|dags test"),
    ("Airflow: services and task processes", r"airflow"),
    ("drivers', standbys' and spares' Python", r"python.*spark_jobs"),
    ("PySpark's Python workers", r"pyspark\.daemon"),
    ("pytest workers' Python", r"pytest|xdist"),
    ("Prometheus", r"prometheus|promtool"),
)
_COMPILED = tuple((kind, re.compile(pattern)) for kind, pattern in KINDS)


def kind_of(command_line: str) -> str:
    """The kind of process ``command_line`` (its arguments joined by spaces) starts."""
    return next((kind for kind, pattern in _COMPILED if pattern.search(command_line)), "other")


@dataclasses.dataclass(frozen=True)
class Seen:
    """A process at its last sample: its command line, and its CPU seconds (user and system) so far."""

    command_line: str
    cpu_s: float


def tally(processes: Iterable[Seen]) -> dict[str, tuple[float, int]]:
    """kind -> (CPU seconds, processes), the most CPU first."""
    totals: dict[str, tuple[float, int]] = {}
    for process in processes:
        kind = kind_of(process.command_line)
        cpu, count = totals.get(kind, (0.0, 0))
        totals[kind] = (cpu + process.cpu_s, count + 1)
    return dict(sorted(totals.items(), key=lambda item: -item[1][0]))


def report_lines(totals: Mapping[str, tuple[float, int]], machine_busy_s: float) -> list[str]:
    """The report: a line per kind, then what the samples saw of the machine's busy time."""
    seen = sum(cpu for cpu, _ in totals.values())
    lines = (
        [f"{cpu:7.0f}  {cpu / seen:4.0%}  {kind} ({count})" for kind, (cpu, count) in totals.items()] if seen else []
    )
    lines.append(f"{seen:7.0f}  CPU-seconds seen, of the machine's {machine_busy_s:.0f} busy")
    return lines


class Sampler:
    """Samples every process's CPU every :data:`PERIOD_S` on a daemon thread until :meth:`stop`."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._seen: dict[tuple[int, int], Seen] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-by-process", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[Seen]:
        """Stop sampling, after a last sample; every process seen."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._sample()
        return list(self._seen.values())

    def _run(self) -> None:
        while not self._stopped.wait(PERIOD_S):
            self._sample()

    def _sample(self) -> None:
        for entry in self._proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                # after the command name (in parentheses, which may hold spaces): utime, stime at 11, 12; start at 19
                fields = stat[stat.rindex(")") + 2 :].split()
                key = (int(entry.name), int(fields[19]))
                cpu_s = (int(fields[11]) + int(fields[12])) / self._ticks
                # read again each time: a process may exec another program (spark-class execs java) or retitle
                # itself (pytest-xdist's workers); an exited one's is empty, and its last one is kept
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                before = self._seen.get(key)
                self._seen[key] = Seen(command or (before.command_line if before else ""), cpu_s)
            except (OSError, ValueError, IndexError):  # gone between the listing and the read
                continue
