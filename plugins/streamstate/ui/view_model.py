"""What the "Streaming jobs" page shows, as typed rows: one :class:`JobRow` per registered job, built from
the files the drivers, the standby, supervision, the alert ledger and the tuning DAG publish (no Spark,
works while a job is down).

The page's template (``templates/jobs.html``) renders these rows, ``/streamstate/api/jobs`` serves them as
JSON (:func:`spark_jobs.documents.to_json`), and a client reads them back with
:func:`spark_jobs.documents.from_json` (the demo does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from streamstate.alert_ledger import AlertLedger
from streamstate.supervision import DESIRED_STOPPED, read_record

from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease
from spark_jobs.driver.lifecycle import SnapshotTaken, StoreRestore, observe_driver, observe_spare, observe_standby
from spark_jobs.layout import JobDags
from spark_jobs.operations.changelog_tuning.latest import LatestMeasurement, read_latest
from spark_jobs.registry import JobSpec, registered_versions
from spark_jobs.versions import JobVersions


@dataclasses.dataclass(frozen=True)
class SupervisionView:
    """The last supervision check of the job version (``supervise__<job>``) and what was asked of it."""

    state: str | None = None
    action: str | None = None
    reason: str | None = None
    desired: str | None = None
    stop_reason: str | None = None
    crash_looping: bool = False
    last_check_at: float | None = None
    launches: int = 0
    launched_by: str | None = None

    @property
    def why(self) -> str | None:
        """A stop request is news before the next check assesses it: shown at once."""
        return f"stopped on request: {self.stop_reason}" if self.desired == DESIRED_STOPPED else self.reason


@dataclasses.dataclass(frozen=True)
class DriverProcess:
    """The process holding the job version's lease."""

    pid: int | None
    host: str | None
    lease_epoch: int


@dataclasses.dataclass(frozen=True)
class StandbyStoreRow:
    batch_id: int | None = None
    rows: int | None = None
    lag_ms: int | None = None


@dataclasses.dataclass(frozen=True)
class StandbyView:
    running: bool = False
    #: its published state while it runs, else NOT_RUNNING
    state: str = "NOT_RUNNING"
    lag_ms: int | None = None
    stores: Mapping[str, StandbyStoreRow] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StoreRef:
    store: str
    kind: str


@dataclasses.dataclass(frozen=True)
class AlertRow:
    """One open alert of the job version, of any source (the alert ledger)."""

    source: str
    condition: str
    severity: str
    summary: str
    since: str
    dedup_key: str


@dataclasses.dataclass(frozen=True)
class Links:
    supervise_dag: str
    start_dag: str
    stop_dag: str
    drain_dag: str
    reprocess_dag: str
    promote_dag: str
    tune_dag: str
    #: the live driver's Spark UI (None: no live driver)
    spark_ui: str | None = None


@dataclasses.dataclass(frozen=True)
class JobRow:
    """One job on the page: its current version's lifecycle, supervision, numbers, state and alerts."""

    job: str
    application_id: str
    version: int
    #: what the job is doing now (``DriverView.state``): never a dead driver's last state
    lifecycle_state: str
    #: the one answer on-call reads: "RUNNING at batch 12", or "DOWN since ..., last RUNNING at batch 12"
    lifecycle_summary: str
    last_published_state: str | None
    supervision: SupervisionView
    driver: DriverProcess | None
    links: Links
    input_lag_records: int | None = None
    batch_id: int | None = None
    batch_duration_ms: int | None = None
    processed_rows_per_second: float | None = None
    state_rows: int | None = None
    state_memory_bytes: int | None = None
    progress_at: str | None = None
    idle_at: str | None = None
    error: str | None = None
    snapshots: Mapping[str, SnapshotTaken] = dataclasses.field(default_factory=dict)
    standby: StandbyView = StandbyView()
    #: the spare driver's state while it runs (WARMING, READY: it takes over when the driver dies), else None
    spare: str | None = None
    stores: tuple[StoreRef, ...] = ()
    restore: Mapping[str, StoreRestore] = dataclasses.field(default_factory=dict)
    open_alerts: tuple[AlertRow, ...] = ()
    #: store -> its changelog's newest measurement (the tuning DAG)
    changelogs: Mapping[str, LatestMeasurement] = dataclasses.field(default_factory=dict)
    #: other versions with a live driver: a side-by-side reprocessing, or a retired one still stopping
    other_versions_running: tuple[int, ...] = ()


def job_row(
    spec: JobSpec,
    settings: Settings,
    measured: Mapping[str, LatestMeasurement] | None = None,
    other_versions_running: tuple[int, ...] = (),
) -> JobRow:
    """The row of one job version. ``measured``: the tuning DAG's newest measurements (read once per page)."""
    driver = observe_driver(settings.status_dir, spec.application_id)
    status, holder = driver.status, driver.holder
    progress = status.progress if status else None
    record = read_record(settings.status_dir, spec.application_id)
    assessment = record.last_assessment
    standby = observe_standby(settings.status_dir, spec.application_id).live_status
    measured = read_latest(settings) if measured is None else measured
    spare = observe_spare(settings.status_dir, spec.application_id).live_status
    return JobRow(
        job=spec.name,
        application_id=spec.application_id,
        version=spec.version,
        lifecycle_state=driver.state,
        lifecycle_summary=driver.summary(),
        last_published_state=status.state.value if status else None,
        supervision=SupervisionView(
            state=assessment.state if assessment else None,
            action=assessment.action if assessment else None,
            reason=assessment.reason if assessment else None,
            desired=record.desired,
            stop_reason=record.stop_reason,
            crash_looping=record.crash_loop_since is not None,
            last_check_at=record.last_check_at,
            launches=len(record.launches),
            launched_by=record.last_launch.by if record.last_launch else None,
        ),
        driver=DriverProcess(holder.pid, holder.host, holder.epoch) if holder else None,
        links=Links(
            supervise_dag=f"/dags/{JobDags(spec.name).supervise}",
            # Airflow 3's UI has no trigger URL: a DAG's page opens its form with the Trigger button
            start_dag="/dags/start_streaming_job",
            stop_dag="/dags/stop_streaming_job",
            drain_dag=f"/dags/{JobDags(spec.name).drain}",
            reprocess_dag="/dags/reprocess_job",
            promote_dag="/dags/promote_job_version",
            tune_dag="/dags/tune_changelog_compaction",
            spark_ui=status.spark_ui if status and driver.alive else None,
        ),
        input_lag_records=status.input_lag_records if status else None,
        batch_id=progress.batch_id if progress else None,
        batch_duration_ms=progress.batch_duration_ms if progress else None,
        processed_rows_per_second=progress.processed_rows_per_second if progress else None,
        state_rows=progress.state_rows if progress else None,
        state_memory_bytes=progress.state_memory_bytes if progress else None,
        progress_at=progress.progress_at if progress else None,
        idle_at=status.idle_at if status else None,
        error=status.error if status else None,
        snapshots=dict(status.snapshots) if status else {},
        standby=StandbyView(
            running=True,
            state=standby.state.value,
            lag_ms=standby.lag_ms,
            stores={n: StandbyStoreRow(v.batch_id, v.rows, v.lag_ms) for n, v in standby.stores.items()},
        )
        if standby is not None
        else StandbyView(),
        spare=spare.state.value if spare is not None else None,
        stores=tuple(StoreRef(s.name, s.kind) for s in spec.stores),
        restore=dict(status.restore) if status else {},
        open_alerts=tuple(
            AlertRow(a.source, a.condition, a.severity, a.summary, a.opened_at, a.dedup_key)
            for a in AlertLedger(settings.status_dir).open_alerts(spec.application_id)
        ),
        changelogs={m.store: m for m in measured.values() if m.application_id == spec.application_id},
        other_versions_running=other_versions_running,
    )


def job_rows(settings: Settings) -> list[JobRow]:
    """Every registered job's row, at its current version."""
    pointer = JobVersions(settings)
    measured = read_latest(settings)
    rows = []
    for name, versions in registered_versions().items():
        current = pointer.current_spec(name)
        running = tuple(
            v
            for v, spec in versions.items()
            if v != current.version and JobLease(settings.status_dir, spec.application_id).holder() is not None
        )
        rows.append(job_row(current, settings, measured, running))
    return rows
