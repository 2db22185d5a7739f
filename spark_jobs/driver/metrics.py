"""Prometheus metrics of a driver or a warm standby, served over HTTP while it runs.

Every driver (``spark_jobs.driver.run``) and every standby follower (``python -m spark_jobs.operations.standby``) serves
``/metrics`` (Prometheus' text format, ``prometheus_client``) on ``settings.host`` and the port
``STREAMSTATE_METRICS_PORT`` names; 0, the default, takes a free port, so several drivers share a
host. The port a process serves on is in its status file (``metrics_port``) and, while it serves, in its
Prometheus target file ``<status_dir>/metrics-targets/<name>.json`` (:attr:`StatusFiles.metrics_target`), which a
scrape configuration reads by file-based service discovery (``monitoring/prometheus.yml``): a process appears there
when it starts serving and leaves when it stops; one killed leaves its file until its next start replaces it, and
Prometheus' ``up`` is then 0 for it.

A driver's metrics are what its status publishes (:class:`DriverMetrics` is fed every status
document, so the two never disagree), labelled with the ``application_id``:

=========================================================  ===========================================
``streamstate_job_state{state}``                           1 for the lifecycle state the driver is in
``streamstate_batch_id``                                   the latest micro-batch
``streamstate_batch_duration_seconds``                     how long the latest micro-batch took
``streamstate_input_rows_per_second``                      input rate of the latest micro-batch
``streamstate_processed_rows_per_second``                  processing rate of the latest micro-batch
``streamstate_input_lag_records{partition}``               records of ``<topic>-<partition>`` not read yet
``streamstate_state_rows`` / ``..._state_memory_bytes``    live state rows and their memory
``streamstate_restore_records_read{store}``                changelog records a running restore has read
``streamstate_snapshot_timestamp_seconds{store}``          when the latest snapshot was taken
``streamstate_snapshot_rows{store}``                       rows a restore reads from the latest snapshot
                                                           (its live keys; for a layered one, base + layers)
``streamstate_dead_letter_records``                        records the dead-letter topic holds (read
                                                           from Kafka at each scrape: every writer counts)
``streamstate_dead_letters_written{reason}``               dead letters this driver run wrote, by reason
``streamstate_restore_started_timestamp_seconds{store}``   when the store's running restore began (gone when
                                                           it finished)
=========================================================  ===========================================

and, beside them, the job's own limits (:class:`Budgets`: what supervision holds it to), so one set of alert rules
(``monitoring/alerts.yml``) compares every job with its own: ``streamstate_input_lag_budget_records``,
``streamstate_restore_budget_seconds`` and ``streamstate_state_budget_rows`` (when every store declares one).

plus the restore metrics of :mod:`spark_jobs.state.restore` (``streamstate_restore_records_total`` and
``streamstate_restore_last_seconds``, by application_id and store) and, in a standby, its lag gauges
(:mod:`spark_jobs.operations.standby.follower`). An age is a timestamp metric, as Prometheus recommends:
``time() - streamstate_snapshot_timestamp_seconds`` is the snapshot's age.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.files import write_atomically
from runtime.kafka_connection import KafkaTarget
from runtime.settings import Settings
from spark_jobs.driver.lifecycle import BatchProgress, JobState, PublishedStatus
from spark_jobs.io.kafka_topics import partition_offsets
from spark_jobs.layout import SPARE_SUFFIX, STANDBY_SUFFIX, StatusFiles
from spark_jobs.registry import JobSpec

log = logging.getLogger("streamstate.metrics")

LABEL = "application_id"

JOB_STATE = Gauge("streamstate_job_state", "1 for the lifecycle state the driver is in", [LABEL, "state"])
BATCH_ID = Gauge("streamstate_batch_id", "The latest micro-batch", [LABEL])
BATCH_SECONDS = Gauge("streamstate_batch_duration_seconds", "How long the latest micro-batch took", [LABEL])
INPUT_RATE = Gauge("streamstate_input_rows_per_second", "Input rate of the latest micro-batch", [LABEL])
PROCESSED_RATE = Gauge("streamstate_processed_rows_per_second", "Processing rate of the latest micro-batch", [LABEL])
INPUT_LAG = Gauge(
    "streamstate_input_lag_records", "Source records not read yet, per <topic>-<partition>", [LABEL, "partition"]
)
STATE_ROWS = Gauge("streamstate_state_rows", "Live state rows (all stateful operators)", [LABEL])
STATE_MEMORY = Gauge("streamstate_state_memory_bytes", "Memory the state stores use", [LABEL])
RESTORE_READ = Gauge(
    "streamstate_restore_records_read", "Changelog records the store's restore has read", [LABEL, "store"]
)
SNAPSHOT_TAKEN = Gauge(
    "streamstate_snapshot_timestamp_seconds", "When the store's latest Delta snapshot was taken", [LABEL, "store"]
)
DEAD_LETTERS_WRITTEN = Gauge(
    "streamstate_dead_letters_written", "Dead letters this driver run wrote, by reason", [LABEL, "reason"]
)
SNAPSHOT_ROWS = Gauge(
    "streamstate_snapshot_rows", "Rows a restore reads from the store's latest Delta snapshot", [LABEL, "store"]
)
RESTORE_STARTED = Gauge(
    "streamstate_restore_started_timestamp_seconds", "When the store's running restore began", [LABEL, "store"]
)
INPUT_LAG_BUDGET = Gauge(
    "streamstate_input_lag_budget_records", "The input lag (all partitions) the job is held to", [LABEL]
)
RESTORE_BUDGET = Gauge("streamstate_restore_budget_seconds", "How long a restore of the job may take", [LABEL])
STATE_ROWS_BUDGET = Gauge("streamstate_state_budget_rows", "The live state rows the job's stores may hold", [LABEL])
#: a scrape waits at most this long for the dead-letter topic's offsets (the metric is left out otherwise)
DEAD_LETTER_SCRAPE_TIMEOUT_S = 2.0


class MetricsServer:
    """``/metrics`` of this process, on ``settings.host`` and ``STREAMSTATE_METRICS_PORT`` (0: a free port), listed
    in the process's Prometheus target file while it serves."""

    def __init__(self, settings: Settings, target: StatusFiles, port: int | None = None) -> None:
        """``target``: the process's files (its name: a driver's application id, a spare's, a standby's);
        ``port``: instead of ``settings.metrics_port``."""
        self._server: WSGIServer
        self._thread: threading.Thread
        chosen = settings.metrics_port if port is None else port
        self._server, self._thread = start_http_server(chosen, addr=settings.host)
        self.port: int = self._server.server_port
        self.target = MetricsTarget.of(target, settings.host, self.port)
        self.target.write(target.metrics_target)
        self._target_file = target.metrics_target

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        # only this process's own entry: a newer process of the same name (a restart) may have replaced it
        if MetricsTarget.read(self._target_file) == self.target:
            self._target_file.unlink(missing_ok=True)


@dataclasses.dataclass(frozen=True)
class MetricsTarget:
    """One process's entry for Prometheus' file-based service discovery: where it serves, and the labels every
    series scraped from it gets (``application_id``; ``role``: driver, spare or standby)."""

    address: str
    application_id: str
    role: str

    @classmethod
    def of(cls, files: StatusFiles, host: str, port: int) -> MetricsTarget:
        application_id = files.name.removesuffix(SPARE_SUFFIX).removesuffix(STANDBY_SUFFIX)
        return cls(f"{host}:{port}", application_id, files.role)

    def write(self, path: Path) -> None:
        """The file Prometheus reads, replaced whole (it may read at any moment)."""
        labels = {LABEL: self.application_id, "role": self.role}
        write_atomically(path, json.dumps([{"targets": [self.address], "labels": labels}], indent=2) + "\n")

    @classmethod
    def read(cls, path: Path) -> MetricsTarget | None:
        try:
            (entry,) = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(entry["targets"][0], entry["labels"][LABEL], entry["labels"]["role"])


class DeadLetterCollector(Collector):
    """``streamstate_dead_letter_records``: what the job's dead-letter topic holds, read at scrape time,
    so every batch's dead letters (the rules' and late events) are counted."""

    def __init__(self, application_id: str, topic: str, kafka: KafkaTarget) -> None:
        self.application_id, self.topic, self.kafka = application_id, topic, kafka

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            offsets = partition_offsets(self.kafka, self.topic, DEAD_LETTER_SCRAPE_TIMEOUT_S)
        except Exception as err:  # noqa: BLE001 - a scrape during a Kafka outage shows the other metrics
            log.warning("dead-letter offsets of %s not read: %s", self.topic, err)
            return
        family = GaugeMetricFamily(
            "streamstate_dead_letter_records", "Records the job's dead-letter topic holds", labels=[LABEL]
        )
        family.add_metric([self.application_id], sum(high - low for low, high in offsets.values()))
        yield family


@dataclasses.dataclass(frozen=True)
class Budgets:
    """A job's limits, exported beside what they limit: its supervision policy's input lag and restore budget,
    and the sum of its stores' row budgets (None when a store declares none)."""

    input_lag_records: int
    restore_seconds: float
    state_rows: int | None

    @classmethod
    def of(cls, spec: JobSpec) -> Budgets:
        rows = [store.budget.max_rows for store in spec.stores]
        return cls(
            spec.supervision.max_input_lag_records,
            spec.supervision.restore_budget_s,
            sum(rows) if rows and None not in rows else None,
        )


class DriverMetrics:
    """The driver's metrics, set from each status document it publishes (``JobStatus.publish_listeners``),
    and its dead-letter topic's size, read at scrape time. :meth:`close` unregisters the latter."""

    def __init__(
        self, application_id: str, dead_letter_topic: str, kafka: KafkaTarget, budgets: Budgets | None = None
    ) -> None:
        self.application_id = application_id
        self._lag_partitions: set[str] = set()
        self._restoring: set[str] = set()
        self._dead_letters = DeadLetterCollector(application_id, dead_letter_topic, kafka)
        REGISTRY.register(self._dead_letters)
        if budgets is not None:
            INPUT_LAG_BUDGET.labels(application_id).set(budgets.input_lag_records)
            RESTORE_BUDGET.labels(application_id).set(budgets.restore_seconds)
            _set(STATE_ROWS_BUDGET.labels(application_id), budgets.state_rows)

    def close(self) -> None:
        REGISTRY.unregister(self._dead_letters)

    def update(self, status: PublishedStatus) -> None:
        app = self.application_id
        for state in JobState:
            JOB_STATE.labels(app, state.value).set(1 if status.state is state else 0)
        progress = status.progress or BatchProgress()
        _set(BATCH_ID.labels(app), progress.batch_id)
        duration_ms = progress.batch_duration_ms
        _set(BATCH_SECONDS.labels(app), duration_ms / 1000 if duration_ms is not None else None)
        _set(INPUT_RATE.labels(app), progress.input_rows_per_second)
        _set(PROCESSED_RATE.labels(app), progress.processed_rows_per_second)
        lag = status.input_lag  # a re-keyed job's source partitions too
        for partition in self._lag_partitions - set(lag):
            INPUT_LAG.remove(app, partition)
        for partition, records in lag.items():
            INPUT_LAG.labels(app, partition).set(records)
        self._lag_partitions = set(lag)
        if status.progress is not None:
            _set(STATE_ROWS.labels(app), progress.state_rows)
            _set(STATE_MEMORY.labels(app), progress.state_memory_bytes)
        for store, restore in status.restore.items():
            _set(RESTORE_READ.labels(app, store), restore.records_read)
        running = {
            store: dt.datetime.fromisoformat(restore.started_at).timestamp()
            for store, restore in status.restore.items()
            if restore.started_at and not restore.finished_at
        }
        for store in self._restoring - set(running):
            RESTORE_STARTED.remove(app, store)
        for store, started in running.items():
            RESTORE_STARTED.labels(app, store).set(started)
        self._restoring = set(running)
        for reason, records in status.dead_letters.items():
            DEAD_LETTERS_WRITTEN.labels(app, reason).set(records)
        for store, snapshot in status.snapshots.items():
            _set(
                SNAPSHOT_ROWS.labels(app, store),
                snapshot.rows_scanned if snapshot.rows_scanned is not None else snapshot.rows,
            )
            SNAPSHOT_TAKEN.labels(app, store).set(dt.datetime.fromisoformat(snapshot.taken_at).timestamp())


def _set(gauge, value) -> None:
    if value is not None:
        gauge.set(value)
