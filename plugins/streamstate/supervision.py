"""What supervision remembers between checks, and what it decides. Pure logic: no Airflow, no Spark.

One :class:`SupervisionRecord` per application id lives next to the job's status file
(``<status_dir>/<application_id>.supervision.json``). Every reader-modifier holds
:func:`locked_record` (an ``flock``), so two supervision runs, a retried launch and a stop request
serialize their decisions: the second one sees the launch the first one recorded.

:func:`assess` turns what a check observed (lease holder, status file, dead-letter count, the last
driver's exit code) into the job's supervised state, the action to take and the alert conditions that
hold right now.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from spark_jobs.documents import from_json, to_json
from spark_jobs.driver.lease import FENCED, LeaseHolder
from spark_jobs.driver.lifecycle import BatchProgress, JobState, PublishedStatus, published_by_holder
from spark_jobs.layout import StatusFiles, dead_letter_topic_name
from spark_jobs.registry import JobSpec

DESIRED_RUNNING = "running"
DESIRED_STOPPED = "stopped"


@dataclasses.dataclass
class Launch:
    """One start of the job's driver by Airflow (a first start or a restart)."""

    at: float
    by: str
    launcher_pid: int | None = None
    log: str | None = None
    exit_file: str | None = None
    #: None while starting; then running | failed | already_running
    outcome: str | None = None
    epoch: int | None = None
    error: str | None = None
    #: the lease epoch before this launch: its driver is the first holder with a higher one
    previous_epoch: int = 0


@dataclasses.dataclass
class SupervisionRecord:
    application_id: str
    desired: str = DESIRED_RUNNING
    stop_reason: str | None = None
    launches: list[Launch] = dataclasses.field(default_factory=list)
    #: when the job was marked crash-looping (no restarts until someone starts it again)
    crash_loop_since: float | None = None
    #: restarts before this (a manual start) no longer count towards the crash-loop limit
    restarts_reset_at: float | None = None
    #: dead-letter records at the previous check (growth is measured between checks)
    dead_letters_seen: int | None = None
    last_check_at: float | None = None
    #: what the last check decided (None before the first)
    last_assessment: Assessment | None = None

    @property
    def last_launch(self) -> Launch | None:
        return self.launches[-1] if self.launches else None

    def launches_since(self, since: float) -> list[Launch]:
        """Starts made since ``since`` (one that found the job already running started nothing)."""
        return [launch for launch in self.launches if launch.at >= since and launch.outcome != "already_running"]

    def to_json(self) -> str:
        return json.dumps(to_json(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SupervisionRecord:
        data = json.loads(text)
        if not data.get("last_assessment"):  # {} before the first check, as records said it before
            data.pop("last_assessment", None)
        return from_json(cls, data)  # (open_alerts, kept here before the alert ledger: ignored)


def record_path(status_dir: Path, application_id: str) -> Path:
    return StatusFiles(status_dir, application_id).supervision


def read_record(status_dir: Path, application_id: str) -> SupervisionRecord:
    """The record as last written (no lock: for readers such as the UI page)."""
    try:
        return SupervisionRecord.from_json(record_path(status_dir, application_id).read_text())
    except FileNotFoundError:
        return SupervisionRecord(application_id)


@contextlib.contextmanager
def locked_record(status_dir: Path, application_id: str, keep_launches: int = 50) -> Iterator[SupervisionRecord]:
    """The record under an exclusive lock; written back (atomically) when the block exits normally."""
    files = StatusFiles(status_dir, application_id)
    path = files.supervision
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(files.supervision_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        record = read_record(status_dir, application_id)
        yield record
        record.launches = record.launches[-keep_launches:]
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(record.to_json())
        tmp.replace(path)
    finally:
        os.close(fd)  # releases the lock


@dataclasses.dataclass(frozen=True)
class Observation:
    """What one check saw."""

    now: float
    #: the lease holder record (spark_jobs/driver/lease.py), None when no driver holds the lease
    holder: LeaseHolder | None
    #: the job's published status (spark_jobs/driver/lifecycle.py), None when it never ran here
    status: PublishedStatus | None
    #: whether the process that ran the last launch is still alive
    launcher_alive: bool = False
    #: total records in the dead-letter topic, None when unknown (topic missing, Kafka down)
    dead_letters: int | None = None
    #: the exit code of the last launch's driver, None while it runs or when unknown
    last_exit_code: int | None = None


@dataclasses.dataclass(frozen=True)
class Condition:
    """Something on-call should know about, with the numbers and the next step."""

    name: str
    severity: str  # critical | error | warning
    summary: str
    numbers: dict
    next_step: str


#: what a check decides to do
Action = Literal["none", "start", "restart", "wait_backoff", "give_up"]


@dataclasses.dataclass(frozen=True)
class Assessment:
    """What one check found and decided (:func:`assess`)."""

    #: running | restoring | starting | stopped | taken_over | down | crash_looping | not_started, or the driver's
    #: published lifecycle state in lower case while it holds the lease (pending_shutdown, error, ...)
    state: str
    action: Action
    reason: str
    conditions: tuple[Condition, ...] = ()
    backoff_remaining_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """What the check task returns (its XCom): the assessment's decision and the alerts it fired and resolved. The
    supervise DAG's ``should_start`` and the watch read it back with :meth:`of`."""

    state: str
    action: Action
    reason: str
    fired: tuple[str, ...] = ()
    resolved: tuple[str, ...] = ()

    @classmethod
    def of(cls, xcom: dict) -> CheckResult:
        return from_json(cls, xcom)


def assess(spec: JobSpec, seen: Observation, record: SupervisionRecord, *, log_hint: str = "") -> Assessment:
    """Decide what the job needs, from one observation and the record of earlier checks."""
    policy = spec.supervision
    conditions = list(_dead_letter_conditions(spec, seen, record))
    if seen.holder is not None:
        state, metric_conditions = _alive(spec, seen)
        return Assessment(
            state,
            "none",
            f"driver pid {seen.holder.pid} holds lease epoch {seen.holder.epoch}",
            tuple(conditions + metric_conditions),
        )
    if record.desired == DESIRED_STOPPED:
        return Assessment(
            "stopped", "none", f"stopped on request: {record.stop_reason or 'no reason given'}", tuple(conditions)
        )
    last = record.last_launch
    recent = record.launches_since(max(seen.now - policy.crash_loop_window_s, record.restarts_reset_at or 0.0))
    error = (seen.status and seen.status.error) or (last.error if last else None)
    where = f" Driver log: {last.log}." if last and last.log else log_hint
    in_flight = (
        last is not None
        and last.outcome is None
        and seen.launcher_alive
        and seen.now - last.at < policy.start_timeout_s
    )
    # a driver of this version published, or a launch was made other than the one still in flight
    ran_before = seen.status is not None or len(record.launches) > (1 if in_flight else 0)
    if in_flight:
        if ran_before:
            # a restart in flight: the job is still down, and its alert stays open until a driver holds the lease
            # (resolved now, a launch that fails would page on-call a second time for the same outage)
            conditions.append(_down(spec, seen, recent, error, where))
        return Assessment("starting", "none", f"launched {seen.now - last.at:.0f}s ago by {last.by}", tuple(conditions))
    if seen.last_exit_code == FENCED:
        # Another driver of this version (another host, another Airflow) claimed it and refused this one's
        # writes. Restarting here would fence that one in turn, and its supervisor would restart it: the
        # version would move between hosts forever. Whoever started the other driver owns the job now.
        error = (seen.status and seen.status.error) or "another driver claimed this job version"
        conditions.append(
            Condition(
                "taken_over",
                "warning",
                f"{spec.application_id} was taken over by another driver: {error}",
                {"exit_code": FENCED, "last_update": seen.status.updated_at if seen.status else None},
                "Nothing to do if the job is meant to run where that driver runs; supervision here no longer "
                f"restarts it. To run it here again, trigger the start_streaming_job DAG with job={spec.name} "
                "(its driver fences the other one).",
            )
        )
        return Assessment("taken_over", "none", "another driver holds the job version", tuple(conditions))

    if ran_before:
        conditions.append(_down(spec, seen, recent, error, where))
    if record.crash_loop_since is not None or len(recent) >= policy.crash_loop_restarts:
        conditions.append(
            Condition(
                "crash_loop",
                "critical",
                f"{spec.application_id} failed {len(recent)} times within "
                f"{policy.crash_loop_window_s}s; supervision stopped restarting it",
                {"restarts_in_window": len(recent), "window_s": policy.crash_loop_window_s, "last_error": error},
                f"Fix the cause ({error or 'see the driver log'}).{where} Then trigger the start_streaming_job DAG "
                f"with job={spec.name} (it clears the crash-loop mark).",
            )
        )
        return Assessment("crash_looping", "give_up", "too many restarts in the window", tuple(conditions))
    action = "restart" if ran_before else "start"
    wait = policy.backoff_s(len(recent)) - (seen.now - last.at) if last is not None and recent else 0.0
    if wait > 0:
        return Assessment(
            "down" if ran_before else "not_started",
            "wait_backoff",
            f"backoff after {len(recent)} start(s) in the window",
            tuple(conditions),
            round(wait, 1),
        )
    return Assessment("down" if ran_before else "not_started", action, "no driver holds the lease", tuple(conditions))


def _down(spec: JobSpec, seen: Observation, recent: list, error: str | None, where: str) -> Condition:
    """The ``down`` condition: no driver holds the lease of a job that ran before."""
    return Condition(
        "down",
        "error",
        f"{spec.application_id} is not running (last state "
        f"{seen.status.state.value if seen.status else 'unknown'}{'; ' + error if error else ''})",
        {
            "restarts_in_window": len(recent),
            "max_restarts": spec.supervision.crash_loop_restarts,
            "last_update": seen.status.updated_at if seen.status else None,
        },
        "Supervision restarts it with backoff; nothing to do unless it keeps failing." + where,
    )


def _alive(spec: JobSpec, seen: Observation) -> tuple[str, list[Condition]]:
    policy = spec.supervision
    status = seen.status
    if status is None or not published_by_holder(status, seen.holder):
        return "starting", []  # the new driver has not published yet
    state = status.state
    conditions: list[Condition] = []
    progress = status.progress or BatchProgress()
    if state is JobState.RESTORING:
        started = min(
            (_ts(r.started_at) for r in status.restore.values() if r.started_at),
            default=_ts(status.started_at),
        )
        if started and seen.now - started > policy.restore_budget_s:
            conditions.append(
                Condition(
                    "restore_slow",
                    "warning",
                    f"{spec.application_id} has been restoring for {seen.now - started:.0f}s",
                    {
                        "elapsed_s": round(seen.now - started),
                        "budget_s": policy.restore_budget_s,
                        "records_read": {s: r.records_read for s, r in status.restore.items()},
                    },
                    "Let it finish; if restores keep exceeding the budget, snapshot more often "
                    "(snapshot_every_batches) or compact the changelog.",
                )
            )
        return "restoring", conditions
    restore_s = sum(r.seconds or 0.0 for r in status.restore.values())
    if restore_s > policy.restore_budget_s:
        conditions.append(
            Condition(
                "restore_slow",
                "warning",
                f"{spec.application_id}'s last restore took {restore_s:.0f}s",
                {"restore_s": round(restore_s, 1), "budget_s": policy.restore_budget_s},
                "Snapshot more often (snapshot_every_batches) or compact the changelog so the next restore is faster.",
            )
        )
    if state is not JobState.RUNNING:
        return state.value.lower(), conditions
    lag = status.input_lag_records or 0  # a re-keyed job's re-keying stage's lag included
    if lag > policy.max_input_lag_records:
        conditions.append(
            Condition(
                "input_lag",
                "warning",
                f"{spec.application_id} is {lag:,} records behind its input",
                {
                    "lag_records": lag,
                    "threshold": policy.max_input_lag_records,
                    "processed_rows_per_second": progress.processed_rows_per_second,
                },
                "Check the batch duration and the Spark UI; add executors/partitions if the input rate outgrew the job.",
            )
        )
    duration_s = (progress.batch_duration_ms or 0) / 1000
    # The first batch after a (re)start replays or catches up on a cold JVM: not a slow job. A hung
    # one is caught by no_progress.
    catching_up = progress.batch_id is not None and progress.batch_id == status.first_batch_id
    if duration_s > policy.batch_duration_budget_s and not catching_up:
        conditions.append(
            Condition(
                "batch_duration",
                "warning",
                f"{spec.application_id}'s last micro-batch took {duration_s:.1f}s",
                {
                    "batch_duration_s": duration_s,
                    "budget_s": policy.batch_duration_budget_s,
                    "batch_id": progress.batch_id,
                },
                "Look at the batch in the Spark UI (state store, shuffle, output MERGE); raise the budget only if expected.",
            )
        )
    quiet_limit = max(120.0, policy.no_progress_triggers * spec.trigger_interval_s)
    last_sign = max(
        filter(None, (_ts(progress.progress_at), _ts(status.idle_at), _ts(status.started_at))),
        default=None,
    )
    if last_sign is not None and seen.now - last_sign > quiet_limit:
        conditions.append(
            Condition(
                "no_progress",
                "error",
                f"{spec.application_id} reported neither a batch nor idleness for {seen.now - last_sign:.0f}s",
                {
                    "silent_s": round(seen.now - last_sign),
                    "limit_s": quiet_limit,
                    "last_batch_id": progress.batch_id,
                },
                "The driver holds its lease but makes no progress (a hung batch?). Check the Spark UI and the driver log; "
                "stop it with the stop_streaming_job DAG and supervision starts it again.",
            )
        )
    conditions += _wrong_key_conditions(spec, status)
    return "running", conditions


def _wrong_key_conditions(spec: JobSpec, status: PublishedStatus) -> list[Condition]:
    """Records of the running driver's source whose Kafka key is not their key field: refused, never applied
    (spark_jobs/io/dead_letter.py), so the job's answers leave them out until the source is keyed or re-keyed."""
    from spark_jobs.io.dead_letter import WRONG_KEY  # pyspark: not at DAG parse time

    refused = status.dead_letters.get(WRONG_KEY, 0)
    if not refused:
        return []
    return [
        Condition(
            "source_not_keyed",
            "error",
            f"{refused:,} records of {spec.source_topic} were not keyed by {spec.key_field} and were refused by "
            f"{spec.application_id} since it started",
            {"wrong_key_records": refused, "key_field": spec.key_field, "source_topic": spec.source_topic},
            f"Their producers set no Kafka key or another one ({dead_letter_topic_name(spec.application_id)} holds "
            f"them, reason wrong_key). Key the source by {spec.key_field}, or register a version with "
            "repartition=True (it re-keys the source) and reprocess the dead letters' range with it.",
        )
    ]


def _dead_letter_conditions(spec: JobSpec, seen: Observation, record: SupervisionRecord) -> list[Condition]:
    if seen.dead_letters is None or record.dead_letters_seen is None:
        return []
    growth = seen.dead_letters - record.dead_letters_seen
    if growth <= spec.supervision.dead_letter_growth_records:
        return []
    return [
        Condition(
            "dead_letters_growing",
            "warning",
            f"{growth:,} new dead letters for {spec.application_id} since the last check",
            {
                "new_records": growth,
                "threshold": spec.supervision.dead_letter_growth_records,
                "total": seen.dead_letters,
            },
            f"Read {dead_letter_topic_name(spec.application_id)} (the reason header says why) and fix the producer or the schema.",
        )
    ]


def _ts(value) -> float | None:
    """ISO-8601 text (status files, Spark progress) -> epoch seconds."""
    if not value:
        return None
    import datetime as dt

    try:
        parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.timezone.utc)
    return parsed.timestamp()
