"""Every name and path a job version owns, in one place: the role of Kafka Streams' ``StateDirectory``.

A job version is known everywhere by its application id (``<job>-v<version>``). What it owns is spread
over four systems, and this module is the only place that spells any of it:

* **checkpoint** (disk): ``<checkpoints>/<application_id>``, with the platform's own files under its
  ``streamstate/`` directory (the start position a reprocessing run leaves, the restore record), and
  the quarantined copies ``<application_id>.corrupt-<stamp>`` of checkpoints that could not resume;
* **Kafka**: one changelog topic per store (``<application_id>-<store>-changelog``), the
  dead-letter topic (``<application_id>-dead-letter``), the drivers' generations topic
  (``<application_id>-generations``) and transactional id (``<application_id>-driver``); a job that
  re-keys its source also owns the repartition topic (``<application_id>-repartition``), the record of
  how far the source was re-keyed (``<application_id>-repartition-progress``) and the re-keying stage's
  transactional id (``<application_id>-repartitioner``) and checkpoint (inside the job's);
* **Delta**: one snapshot table per store (``<lake>/_state/<application_id>/<store>``) and the output
  tables (``<lake>/<output_table>_v<version>`` and its companions);
* **status directory**: the lifecycle status, the last run's report, the lease, the supervision record
  and its lock, a failpoint marker (tests only), the warm standby's own status, lease and supervision
  record (the standby runs under the name ``<application_id>.standby``), the spare driver's (under
  ``<application_id>.spare``), and the state-size audit's plots; driver, spare and follower logs go to
  ``<logs>/jobs/<application_id>[.spare|.standby]-<stamp>.log|.exit``.

Reset, purge, the reprocessing plan and the state-size audit work from :meth:`JobLayout.artifacts`,
and a test runs each reference job with its standby and checks that what exists equals that list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from runtime.object_store import Location
from runtime.settings import METRICS_TARGETS_DIR

if TYPE_CHECKING:  # kept lazy for the driver's start-up
    from runtime.settings import Settings

#: the platform's files inside a checkpoint (Spark ignores directories it does not know)
CHECKPOINT_FILES_DIR = "streamstate"
#: inside a checkpoint: the start position a reprocessing run leaves for the version's first query
START_OFFSETS_FILE = Path(CHECKPOINT_FILES_DIR) / "start-offsets.json"
#: inside a checkpoint: what the driver restored its stores from when the query started
RESTORE_RECORD = Path(CHECKPOINT_FILES_DIR) / "restore.json"
#: inside a checkpoint: a join's reading of its inputs' ends, one file per micro-batch (spark_jobs/state/input_lag.py)
INPUT_LAG_DIR = Path(CHECKPOINT_FILES_DIR) / "input-lag"
#: inside a checkpoint: the checkpoint of the stage that re-keys the source (a query of its own)
REPARTITION_CHECKPOINT = Path(CHECKPOINT_FILES_DIR) / "repartition"
#: the suffix a quarantined checkpoint gets, followed by a time stamp
QUARANTINE_SUFFIX = ".corrupt-"
#: the state-size audit's report directory in the status directory (shared by every job)
AUDIT_REPORT_DIR = "state_audit"
#: the name suffix of a job version's warm standby (its lease, status and supervision record)
STANDBY_SUFFIX = ".standby"
#: the name suffix of a job version's spare driver (its lease, status and supervision record)
SPARE_SUFFIX = ".spare"

ArtifactKind = Literal[
    "checkpoint",
    "quarantined_checkpoint",
    "changelog_topic",
    "repartition_topic",
    "output_topic",
    "dead_letter_topic",
    "generations_topic",
    "snapshot_table",
    "output_table",
    "status_file",
    "log_file",
]
#: where an artifact lives: a path on the local (or shared) file system, a Kafka topic, a Delta table
ArtifactSystem = Literal["disk", "kafka", "delta"]

_SYSTEM: dict[ArtifactKind, ArtifactSystem] = {
    "checkpoint": "disk",
    "quarantined_checkpoint": "disk",
    "changelog_topic": "kafka",
    "repartition_topic": "kafka",
    "output_topic": "kafka",
    "dead_letter_topic": "kafka",
    "generations_topic": "kafka",
    "snapshot_table": "delta",
    "output_table": "delta",
    "status_file": "disk",
    "log_file": "disk",
}


@dataclasses.dataclass(frozen=True)
class Artifact:
    """One thing a job version owns: a topic name or a path."""

    kind: ArtifactKind
    location: str

    @property
    def system(self) -> ArtifactSystem:
        return _SYSTEM[self.kind]


@dataclasses.dataclass(frozen=True)
class StatusFiles:
    """The files one process name (a driver's application id, its spare's or its standby's) keeps in the status
    directory."""

    status_dir: Path
    #: the driver's application id, the spare's ``<application_id>.spare`` or the standby's ``<application_id>.standby``
    name: str

    def _file(self, suffix: str) -> Path:
        return Path(self.status_dir) / f"{self.name}{suffix}"

    @property
    def lifecycle(self) -> Path:
        """The lifecycle status a driver publishes (spark_jobs/driver/lifecycle.py)."""
        return self._file(".status.json")

    @property
    def last_run(self) -> Path:
        """The report of the driver's last run (spark_jobs/driver/run.py)."""
        return self._file(".last-run.json")

    @property
    def lease(self) -> Path:
        """The single-instance lease with its epoch (spark_jobs/driver/lease.py)."""
        return self._file(".lease")

    @property
    def supervision(self) -> Path:
        """Airflow's supervision record: launches and decisions (plugins/streamstate/supervision.py)."""
        return self._file(".supervision.json")

    @property
    def supervision_lock(self) -> Path:
        return self._file(".supervision.lock")

    @property
    def failpoint(self) -> Path:
        """Where a driver stopped by a test's failpoint says so (spark_jobs/driver/failpoints.py)."""
        return self._file(".failpoint.json")

    @property
    def metrics_target(self) -> Path:
        """Where Prometheus finds the process's ``/metrics`` while it serves them (spark_jobs/driver/metrics.py)."""
        return Path(self.status_dir) / METRICS_TARGETS_DIR / f"{self.name}.json"

    @property
    def role(self) -> Literal["driver", "spare", "standby"]:
        """Which of a job version's processes this name is."""
        if self.name.endswith(SPARE_SUFFIX):
            return "spare"
        return "standby" if self.name.endswith(STANDBY_SUFFIX) else "driver"

    def supervised(self) -> tuple[Path, ...]:
        """What every supervised process has: its lease and Airflow's supervision record (and its lock)."""
        return (self.lease, self.supervision, self.supervision_lock)


class NamedStore(Protocol):
    @property
    def name(self) -> str: ...


class LaidOutJob(Protocol):
    """What :meth:`JobLayout.of` reads of a job version: a :class:`spark_jobs.registry.JobSpec` (which imports
    its names from this module, so this module names it only by what it reads)."""

    @property
    def application_id(self) -> str: ...
    @property
    def source_topic(self) -> str: ...
    @property
    def stores(self) -> tuple[NamedStore, ...]: ...
    @property
    def output_table_dirs(self) -> tuple[str, ...]: ...
    @property
    def repartition(self) -> bool: ...
    @property
    def output_topic(self) -> str | None: ...
    @property
    def version(self) -> int: ...
    @property
    def join_topics(self) -> tuple[str, ...]: ...


@dataclasses.dataclass(frozen=True)
class JobLayout:
    """Every artifact of one application id. Build it with :meth:`of`."""

    application_id: str
    source_topic: str
    store_names: tuple[str, ...]
    #: the Structured Streaming checkpoint (the local disk or an object store)
    checkpoint: Location
    status_dir: Path
    #: where the Delta tables are (the local disk or an object store)
    lake: Location
    logs_dir: Path
    output_table_dirs: tuple[str, ...]
    #: the job re-keys its source through a repartition topic (``JobSpec.repartition``)
    repartition: bool = False
    #: the stem of the job's upsert output topic (``JobSpec.output_topic``), None without one
    output_topic_stem: str | None = None
    version: int | None = None
    #: a join's other inputs (``JobSpec.join_topics``), read beside the source
    join_topics: tuple[str, ...] = ()

    @classmethod
    def of(cls, spec: LaidOutJob, settings: Settings) -> JobLayout:
        return cls(
            application_id=spec.application_id,
            source_topic=spec.source_topic,
            store_names=tuple(s.name for s in spec.stores),
            checkpoint=settings.checkpoints / spec.application_id,
            status_dir=settings.status_dir,
            lake=settings.lake,
            logs_dir=settings.logs_dir,
            output_table_dirs=spec.output_table_dirs,
            repartition=spec.repartition,
            output_topic_stem=spec.output_topic,
            version=spec.version,
            join_topics=spec.join_topics,
        )

    # ----- checkpoint ------------------------------------------------------------------------------
    @property
    def start_offsets_file(self) -> Location:
        """The start position a reprocessing run leaves for the version's first query."""
        return self.checkpoint / START_OFFSETS_FILE

    @property
    def restore_record(self) -> Location:
        """What the driver restored its stores from when the query started (``JobContext.restore_record``)."""
        return self.checkpoint / RESTORE_RECORD

    @property
    def input_lag(self) -> Location:
        """Where a job with several inputs keeps, per micro-batch, which of them had records written beyond it
        (:class:`spark_jobs.state.input_lag.InputLagRecord`)."""
        return self.checkpoint / INPUT_LAG_DIR

    @property
    def repartition_checkpoint(self) -> Location:
        """The checkpoint of the query that re-keys the source (inside the job's: a reset or a quarantine of
        the job's checkpoint takes it along, and the stage then resumes from its progress topic)."""
        return self.checkpoint / REPARTITION_CHECKPOINT

    def quarantined_checkpoints(self) -> tuple[Location, ...]:
        prefix = f"{self.checkpoint.name}{QUARANTINE_SUFFIX}"
        return tuple(c for c in self.checkpoint.parent.children() if c.name.startswith(prefix))

    # ----- Kafka -----------------------------------------------------------------------------------
    def changelog_topic(self, store: str) -> str:
        return changelog_topic_name(self.application_id, store)

    @property
    def changelog_topics(self) -> tuple[str, ...]:
        return tuple(self.changelog_topic(s) for s in self.store_names)

    @property
    def dead_letter_topic(self) -> str:
        return dead_letter_topic_name(self.application_id)

    @property
    def generations_topic(self) -> str:
        """The claims of the version's drivers, one generation each (spark_jobs/state/fencing.py). A reset
        keeps it, as the lease file keeps its epoch: a restarted version continues at a higher generation."""
        return f"{self.application_id}-generations"

    @property
    def transactional_id(self) -> str:
        """The Kafka ``transactional.id`` of the version's driver: a new driver's claim fences the older ones."""
        return f"{self.application_id}-driver"

    @property
    def repartition_topic(self) -> str:
        """Kafka Streams' ``<application.id>-<name>-repartition``: the source's records keyed by the job's key."""
        return f"{self.application_id}-repartition"

    @property
    def repartition_progress_topic(self) -> str:
        """The source offsets the repartition topic holds records up to, committed in the same transaction
        as those records (Kafka Streams keeps them as its consumer group's offsets)."""
        return f"{self.application_id}-repartition-progress"

    @property
    def repartition_transactional_id(self) -> str:
        """The ``transactional.id`` of the stage writing the repartition topic: a new driver fences the older."""
        return f"{self.application_id}-repartitioner"

    @property
    def repartition_topics(self) -> tuple[str, ...]:
        """The topics of the re-keying stage (none for a job whose source is keyed by its key)."""
        return (self.repartition_topic, self.repartition_progress_topic) if self.repartition else ()

    @property
    def output_topic(self) -> str | None:
        """The version's upsert output topic (``<output_topic>-v<version>``: versions side by side write
        their own, as their output tables), None when the job writes Delta only."""
        if self.output_topic_stem is None:
            return None
        return output_topic_name(self.output_topic_stem, self.version)

    @property
    def state_input_topic(self) -> str:
        """The topic the stateful stage reads: the repartition topic when the job re-keys, else the source.
        Its offsets are the ones the changelog markers, snapshots and output marks record."""
        return self.repartition_topic if self.repartition else self.source_topic

    @property
    def state_input_topics(self) -> tuple[str, ...]:
        """Every topic the stateful stage reads: :attr:`state_input_topic`, then a join's other inputs."""
        return (self.state_input_topic, *self.join_topics)

    @property
    def topics(self) -> tuple[str, ...]:
        """Every topic the version owns (not its source: that one is shared by all versions)."""
        outputs = (self.output_topic,) if self.output_topic else ()
        return (
            *self.changelog_topics,
            *self.repartition_topics,
            *outputs,
            self.dead_letter_topic,
            self.generations_topic,
        )

    # ----- Delta -----------------------------------------------------------------------------------
    def snapshot_table(self, store: str) -> Location:
        return snapshot_table_path(self.lake, self.application_id, store)

    @property
    def snapshot_tables(self) -> tuple[Location, ...]:
        return tuple(self.snapshot_table(s) for s in self.store_names)

    @property
    def output_table(self) -> Location:
        """The main output table."""
        return self.output_tables[0]

    @property
    def output_tables(self) -> tuple[Location, ...]:
        """Every output table: the main one first."""
        return tuple(self.lake / d for d in self.output_table_dirs)

    @property
    def output_transaction_app_id(self) -> str:
        """The Delta idempotent-write ``txnAppId`` of the version's output writes (the version: the changelog
        batch id, which grows across drivers)."""
        return f"{self.application_id}-outputs"

    # ----- status directory ------------------------------------------------------------------------
    @property
    def driver(self) -> StatusFiles:
        return StatusFiles(self.status_dir, self.application_id)

    @property
    def standby(self) -> StatusFiles:
        return StatusFiles(self.status_dir, standby_name(self.application_id))

    @property
    def spare(self) -> StatusFiles:
        return StatusFiles(self.status_dir, spare_name(self.application_id))

    @property
    def spare_status(self) -> Path:
        """The spare driver's status: warming, ready, taking over (spark_jobs/driver/spare.py)."""
        return spare_status_file(self.status_dir, self.application_id)

    @property
    def standby_status(self) -> Path:
        """The warm standby's status: its stores, lags and snapshot versions (spark_jobs/operations/standby)."""
        return standby_status_file(self.status_dir, self.application_id)

    def audit_plot(self, store: str) -> Path:
        """The state-size audit's plot of one store (spark_jobs/operations/state_audit/report.py)."""
        return audit_plot_file(self.status_dir, self.application_id, store)

    def log_files(self) -> tuple[Path, ...]:
        """The logs and exit-code files of the driver's, the spare's and the standby's detached launches."""
        jobs = self.logs_dir / "jobs"
        names = (self.application_id, spare_name(self.application_id), standby_name(self.application_id))
        found = [path for name in names for path in jobs.glob(f"{name}-*")]
        return tuple(sorted(found))

    # ----- everything --------------------------------------------------------------------------------
    def artifacts(self) -> tuple[Artifact, ...]:
        """Everything this version owns, present or not (quarantined checkpoints and logs: those present)."""
        return tuple(self._artifacts())

    def _artifacts(self) -> Iterator[Artifact]:
        yield Artifact("checkpoint", str(self.checkpoint))
        for path in self.quarantined_checkpoints():
            yield Artifact("quarantined_checkpoint", str(path))
        for topic in self.changelog_topics:
            yield Artifact("changelog_topic", topic)
        for topic in self.repartition_topics:
            yield Artifact("repartition_topic", topic)
        if self.output_topic:
            yield Artifact("output_topic", self.output_topic)
        yield Artifact("dead_letter_topic", self.dead_letter_topic)
        yield Artifact("generations_topic", self.generations_topic)
        for table in self.snapshot_tables:
            yield Artifact("snapshot_table", str(table))
        for table in self.output_tables:
            yield Artifact("output_table", str(table))
        driver = self.driver
        for path in (driver.lifecycle, driver.last_run, driver.failpoint, driver.metrics_target, *driver.supervised()):
            yield Artifact("status_file", str(path))
        for path in (self.spare_status, self.spare.metrics_target, *self.spare.supervised()):
            yield Artifact("status_file", str(path))
        for path in (self.standby_status, self.standby.metrics_target, *self.standby.supervised()):
            yield Artifact("status_file", str(path))
        for store in self.store_names:
            yield Artifact("status_file", str(self.audit_plot(store)))
        for path in self.log_files():
            yield Artifact("log_file", str(path))


def application_id(job: str, version: int) -> str:
    """A job version's application id (Kafka Streams' ``application.id``): ``<job>-v<version>``, the stem of
    every name this module spells."""
    return f"{job}-v{version}"


def job_of(name: str) -> str:
    """The job of a job version's name: its application id ``<job>-v<version>`` (the inverse of
    :func:`application_id`), or its spare's or standby's name. A name of no job version is returned as it is."""
    for suffix in (SPARE_SUFFIX, STANDBY_SUFFIX):
        name = name.removesuffix(suffix)
    job, separator, version = name.rpartition("-v")
    return job if separator and job and version.isdigit() else name


@dataclasses.dataclass(frozen=True)
class JobDags:
    """The Airflow DAG ids of the job named ``job`` (one for every version): the DAG files name their DAGs here, and
    whatever links to, triggers or reads them (the jobs page, alerts, the demo, benchmarks) reads them here."""

    job: str

    @property
    def supervise(self) -> str:
        """Keeps the current version running (dags/supervise_jobs.py)."""
        return f"{SUPERVISE_DAG_PREFIX}{self.job}"

    @property
    def drain(self) -> str:
        """Runs the current version until its input is drained, then stops (dags/drain_jobs.py)."""
        return f"{DRAIN_DAG_PREFIX}{self.job}"


SUPERVISE_DAG_PREFIX, DRAIN_DAG_PREFIX, BATCH_DAG_PREFIX = "supervise__", "drain__", "batch__"


def batch_dag_id(name: str) -> str:
    """The DAG of the batch job ``name`` (dags/batch_jobs.py)."""
    return f"{BATCH_DAG_PREFIX}{name}"


def batch_job_of(dag_id: str) -> str:
    """The batch job whose DAG is ``dag_id`` (the inverse of :func:`batch_dag_id`)."""
    if not dag_id.startswith(BATCH_DAG_PREFIX):
        raise ValueError(f"{dag_id!r} is not a batch job's DAG ({BATCH_DAG_PREFIX}<name>)")
    return dag_id.removeprefix(BATCH_DAG_PREFIX)


def rehearsal_input_topic(application_id: str, index: int) -> str:
    """The scratch copy of the ``index``-th input (0: the source, 1: a join's second input) that a spare's
    rehearsal of ``application_id`` (the rehearsal copy's own id) runs on (``spark_jobs/driver/spare.py: rehearse``)."""
    return f"{application_id}-input-{index}"


#: the comparisons' reports in the status directory (one Markdown file per reprocessing run compared)
COMPARISON_REPORT_DIR = "reports"


def comparison_name(job: str, old_version: int, new_version: int) -> str:
    """A comparison of two versions of ``job``: the name of its Spark application and its report's stem,
    ``<job>-v<old>-v<new>`` (``spark_jobs/operations/reprocess/compare.py``)."""
    return f"{application_id(job, old_version)}-v{new_version}"


def comparison_report_file(status_dir: Path, job: str, old_version: int, new_version: int, run_id: str) -> Path:
    """The report of the comparison that the reprocessing run ``run_id`` (an Airflow run id) made."""
    safe_run_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    name = f"{comparison_name(job, old_version, new_version)}-{safe_run_id}.md"
    return Path(status_dir) / COMPARISON_REPORT_DIR / name


def launch_files(logs_dir: Path, name: str, stamp: str) -> tuple[Path, Path]:
    """The log and exit-code files of one detached launch of ``name`` (a driver's application id, or its
    standby's name) at ``stamp``: what :meth:`JobLayout.log_files` finds."""
    jobs = Path(logs_dir) / "jobs"
    return jobs / f"{name}-{stamp}.log", jobs / f"{name}-{stamp}.exit"


def output_topic_name(stem: str, version: int) -> str:
    """The upsert output topic of version ``version`` of a job with ``JobSpec.output_topic`` = ``stem``."""
    return f"{stem}-v{version}"


def output_topic_version(stem: str, topic: str) -> int | None:
    """Which version's upsert output topic ``topic`` is, for a job with output topic ``stem`` (None: none)."""
    number = topic.removeprefix(f"{stem}-v") if topic.startswith(f"{stem}-v") else ""
    return int(number) if number.isdigit() else None


def changelog_topic_name(application_id: str, store: str) -> str:
    """Kafka Streams' name for a store's changelog: ``<application.id>-<store>-changelog``."""
    return f"{application_id}-{store}-changelog"


def dead_letter_topic_name(application_id: str) -> str:
    return f"{application_id}-dead-letter"


def standby_status_file(status_dir: Path, application_id: str) -> Path:
    return Path(status_dir) / f"{standby_name(application_id)}.json"


def spare_status_file(status_dir: Path, application_id: str) -> Path:
    return Path(status_dir) / f"{spare_name(application_id)}.json"


def audit_plot_file(status_dir: Path, application_id: str, store: str) -> Path:
    return Path(status_dir) / AUDIT_REPORT_DIR / f"{application_id}.{store}.png"


def snapshot_table_path(lake: Location | Path | str, application_id: str, store: str) -> Location:
    return Location.of(lake) / "_state" / application_id / store


def spare_name(application_id: str) -> str:
    """The name the spare driver of ``application_id`` runs under (its lease, status, supervision) until it takes
    over; then it is the driver and holds the driver's lease."""
    return f"{application_id}{SPARE_SUFFIX}"


def standby_name(application_id: str) -> str:
    """The name the warm standby of ``application_id`` runs under (its lease, status, supervision)."""
    return f"{application_id}{STANDBY_SUFFIX}"


#: the Delta table maintenance's record (latest run, latest applied run, totals freed), in the audit's
#: report directory: the state-size audit shows what maintenance freed (spark_jobs/operations/maintenance.py)
TABLE_MAINTENANCE_FILE = Path(AUDIT_REPORT_DIR) / "table_maintenance.json"


def table_maintenance_file(status_dir: Path) -> Path:
    return Path(status_dir) / TABLE_MAINTENANCE_FILE
