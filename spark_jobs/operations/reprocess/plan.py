"""The reprocessing plan: every topic, offset, path and table a run would touch, with sizes.

A plan is made from the registry, the version pointer and what exists right now (topics and their
offsets, checkpoints, Delta tables); making it changes nothing. The dry run prints it; a real run
makes the same plan and then executes exactly it (the steps read their targets from the plan).

Three modes: the seeds' two reprocessing patterns (section 3.8), and a migration of state:

* ``side_by_side``: the new version runs under its own application id (own checkpoint, consumer
  group prefix, changelog topics, snapshots, output tables) from the start position, beside the
  current version, which keeps serving; a report compares their outputs; ``promote`` switches.
* ``reset`` (Kafka Streams' application reset tool): stop the job, delete its internal topics,
  checkpoint and snapshots, optionally truncate its outputs, start it again from the position.
* ``migrate``: like ``side_by_side``, but the new version starts from the current version's state,
  migrated (:mod:`spark_jobs.state.migration`), at the current version's input position, instead of
  recomputing its state from the source (which may no longer hold the history).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

from runtime.kafka_connection import KafkaTarget
from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.driver.lease import JobLease, LeaseHolder
from spark_jobs.io.kafka_topics import existing_topics, partition_offsets
from spark_jobs.layout import JobLayout
from spark_jobs.operations.reprocess.chain import chain_notes, readers_of
from spark_jobs.operations.reprocess.positions import EARLIEST, OFFSETS, BadStartPosition, StartPosition
from spark_jobs.registry import InputKind, JobSpec, JobSpecError, get_job, registered_versions
from spark_jobs.state.checkpoint_offsets import KafkaOffsets, latest_committed_batch_id
from spark_jobs.state.source_position import committed_source_offsets
from spark_jobs.versions import JobVersions

SIDE_BY_SIDE, RESET, MIGRATE = "side_by_side", "reset", "migrate"
MODES = (SIDE_BY_SIDE, RESET, MIGRATE)
#: the modes that run a new version beside the current one
BESIDE = (SIDE_BY_SIDE, MIGRATE)


class BadReprocessRequest(ValueError):
    """The trigger form asks for something that cannot be done; the message says what to change."""


@dataclasses.dataclass
class Action:
    """One thing the run does: ``verb`` ``target`` (a ``kind``), with its size now."""

    step: str
    verb: str
    kind: str
    target: str
    size: str = ""
    detail: str = ""


def _int_keys(offsets: dict) -> KafkaOffsets:
    """topic -> partition -> number with the partitions as ints again (JSON gave them as strings)."""
    return {topic: {int(p): int(n) for p, n in by_partition.items()} for topic, by_partition in offsets.items()}


@dataclasses.dataclass
class ReprocessPlan:
    job: str
    mode: str
    current_version: int
    target_version: int
    #: every topic the version reads from producers (``JobSpec.input_topics``) -> what it holds (stream or table)
    inputs: dict[str, InputKind]
    start: str
    #: topic -> partition -> first offset to process (explicit: resolved when the plan was made)
    start_offsets: KafkaOffsets
    #: topic -> partition -> high watermark when the plan was made
    input_end: KafkaOffsets
    truncate_outputs: bool
    made_at: str
    actions: list[Action] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: topic -> partition -> records the topic no longer held before the requested start (accepted gaps only)
    history_gap: KafkaOffsets = dataclasses.field(default_factory=dict)
    #: topic -> its time and size retention when the plan was made
    source_retention: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)

    @property
    def records_to_process(self) -> int:
        return sum(
            max(0, self.input_end.get(topic, {}).get(p, 0) - o)
            for topic, offsets in self.start_offsets.items()
            for p, o in offsets.items()
        )

    def spec(self) -> JobSpec:
        """The version this run (re)processes with."""
        return get_job(self.job, self.target_version)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        for name in ("start_offsets", "input_end", "history_gap"):
            data[name] = {t: {str(p): n for p, n in by_p.items()} for t, by_p in getattr(self, name).items()}
        data["records_to_process"] = self.records_to_process
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ReprocessPlan:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        for name in ("start_offsets", "input_end", "history_gap"):
            values[name] = _int_keys(data.get(name, {}))
        values["actions"] = [Action(**a) for a in data.get("actions", [])]
        return cls(**values)

    def render(self) -> str:
        """The plan as people read it (task log, dry run)."""
        target = f"v{self.target_version}" + ("" if self.mode == RESET else f" beside v{self.current_version}")
        target += f", state migrated from v{self.current_version}" if self.mode == MIGRATE else ""
        lines = [f"Reprocessing plan: {self.job} {target}, mode {self.mode} (made {self.made_at})"]
        for topic, kind in self.inputs.items():
            start = self.start if kind == "stream" or self.mode == MIGRATE else "earliest (a table is read whole)"
            retention = self.source_retention.get(topic, {})
            lines += [
                f"  input {topic} ({kind}), start: {start}",
                "    retention: " + (", ".join(f"{k}={v}" for k, v in retention.items()) or "unknown"),
                *(
                    f"    HISTORY GAP (accepted): partition {p}: up to {n} records before the start are no longer "
                    "in the topic; the new state is built without them"
                    for p, n in sorted(self.history_gap.get(topic, {}).items())
                ),
                *(
                    f"    partition {p}: from offset {o} (end now {self.input_end.get(topic, {}).get(p)}; "
                    f"{max(0, self.input_end.get(topic, {}).get(p, 0) - o)} records)"
                    for p, o in sorted(self.start_offsets.get(topic, {}).items())
                ),
            ]
        lines += [f"  records to process: {self.records_to_process}", "  steps:"]
        width = max((len(a.verb) for a in self.actions), default=4)
        for i, a in enumerate(self.actions, 1):
            size = f" [{a.size}]" if a.size else ""
            detail = f" - {a.detail}" if a.detail else ""
            lines.append(f"   {i:2}. {a.step:<16} {a.verb:<{width}} {a.kind} {a.target}{size}{detail}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def history_gap_text(self) -> str:
        """The accepted history gap in a sentence ("" without one): a report must not look like a full replay."""
        return ", ".join(
            f"{topic} partition {p}: up to {n} records before the start were no longer in the topic"
            for topic, gaps in self.history_gap.items()
            for p, n in sorted(gaps.items())
        )


# ----- sizes of what exists ------------------------------------------------------------------------
def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def delta_size(location: Location) -> str:
    """``rows, bytes, version`` of a Delta table (from its log, no scan), or ``absent``."""
    from deltalake import DeltaTable

    options = location.storage_options()
    if not DeltaTable.is_deltatable(str(location), storage_options=options):
        return "absent" if not location.exists() else f"not a Delta table, {human_bytes(location.size_bytes())}"
    table = DeltaTable(str(location), storage_options=options)
    import pyarrow as pa

    files = pa.table(table.get_add_actions(flatten=True)).select(["size_bytes", "num_records"]).to_pylist()
    rows = sum(f["num_records"] or 0 for f in files)
    return f"{rows} rows, {human_bytes(sum(f['size_bytes'] for f in files))}, Delta version {table.version()}"


def source_retention(kafka: KafkaTarget, topic: str) -> dict[str, str]:
    """The topic's ``cleanup.policy``, ``retention.ms`` and ``retention.bytes`` as the broker applies them."""
    from confluent_kafka.admin import AdminClient

    from runtime.kafka_connection import client_config
    from spark_jobs.operations.changelog_tuning.topic_configs import describe

    configs = describe(AdminClient(client_config(kafka)), [topic])[topic]
    names = ("cleanup.policy", "retention.ms", "retention.bytes")
    return {name: str(configs[name].value) for name in names if name in configs}


def topic_size(bootstrap: KafkaTarget, topic: str, present: set[str]) -> str:
    if topic not in present:
        return "absent"
    offsets = partition_offsets(bootstrap, topic)
    return f"{sum(high - low for low, high in offsets.values())} records in {len(offsets)} partitions"


def checkpoint_size(layout: JobLayout, kafka: KafkaTarget) -> str:
    """The checkpoint's size, newest committed batch and how far the version has consumed its source."""
    checkpoint = layout.checkpoint
    if not checkpoint.exists():
        return "absent"
    batch = latest_committed_batch_id(checkpoint)
    where = (
        f"committed batch {batch}, source at {committed_source_offsets(layout, kafka)}"
        if batch is not None
        else "no committed batch"
    )
    return f"{human_bytes(checkpoint.size_bytes())}, {where}"


# ----- making the plan -----------------------------------------------------------------------------
def make_plan(settings: Settings, params: dict, now: dt.datetime | None = None) -> ReprocessPlan:
    """Validate the trigger form's ``params`` against the registry and the cluster, and plan the run.

    Raises:
        BadReprocessRequest: unknown job or version, a bad start position, a missing confirmation...
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    job, mode, current, target = _requested_versions(settings, params)
    _refuse_missing_inputs(settings, job, target)
    inputs = target.input_kinds()
    bounds = {topic: partition_offsets(settings.kafka, topic) for topic in inputs}
    end = {topic: {p: high for p, (_low, high) in by_p.items()} for topic, by_p in bounds.items()}
    position, start, gap, start_text = _start_of(settings, params, mode, current, inputs, now)
    plan = ReprocessPlan(
        job=job,
        mode=mode,
        current_version=current.version,
        target_version=target.version,
        inputs=inputs,
        start=start_text,
        start_offsets=start,
        input_end=end,
        truncate_outputs=bool(params.get("truncate_outputs")),
        made_at=now.isoformat(timespec="seconds"),
        history_gap=gap,
        source_retention={topic: source_retention(settings.kafka, topic) for topic in inputs},
    )
    if position is not None:
        plan.notes += _start_notes(position, inputs, bounds)
    if mode == SIDE_BY_SIDE:
        _side_by_side_actions(plan, settings, current, target)
    elif mode == MIGRATE:
        _migrate_actions(plan, settings, current, target)
    else:
        _reset_actions(plan, settings, current, target)
    plan.notes += chain_notes(readers_of(current), mode, current, target, plan.truncate_outputs)
    return plan


def _requested_versions(settings: Settings, params: dict) -> tuple[str, str, JobSpec, JobSpec]:
    """``(job, mode, current version, target version)`` the form asks for, refused when the registry or the
    mode cannot have it (a target that is not newer, state a migration cannot carry, a reset unconfirmed)."""
    job, mode = params.get("job"), params.get("mode")
    if job not in registered_versions():
        raise BadReprocessRequest(f"unknown job {job!r}; registered jobs: {', '.join(registered_versions())}")
    if mode not in MODES:
        raise BadReprocessRequest(f"mode {mode!r}: choose {', '.join(MODES)}")
    current = JobVersions(settings).current_spec(job)
    try:
        target = get_job(job, params.get("version")) if mode in BESIDE else current
    except JobSpecError as err:
        raise BadReprocessRequest(str(err)) from None
    if mode in BESIDE and target.version == current.version:
        raise BadReprocessRequest(
            f"{job} v{target.version} is already the current version; {mode} needs a "
            f"newer registered version (registered: {list(registered_versions()[job])}), "
            "or use mode=reset to reprocess in place"
        )
    if mode == MIGRATE:
        from spark_jobs.state.migration import MigrationRefused, refuse_unportable_position

        try:
            refuse_unportable_position(current, target)
        except MigrationRefused as err:
            raise BadReprocessRequest(str(err)) from None
    dry_run = bool(params.get("dry_run", True))
    if mode == RESET and not dry_run and params.get("confirm") != job:
        raise BadReprocessRequest(
            f"reset deletes {job}'s state: type the job name {job!r} in 'confirm' to run it "
            "(or run with dry_run to see the plan)"
        )
    return job, mode, current, target


def _refuse_missing_inputs(settings: Settings, job: str, target: JobSpec) -> None:
    present = existing_topics(settings.kafka, list(target.input_topics))
    missing = [topic for topic in target.input_topics if topic not in present]
    if missing:
        raise BadReprocessRequest(
            f"{job} v{target.version}'s input topic {missing[0]!r} does not exist on "
            f"{settings.kafka_bootstrap_servers}: there is nothing to reprocess"
        )


def _start_of(
    settings: Settings, params: dict, mode: str, current: JobSpec, inputs: dict[str, InputKind], now: dt.datetime
) -> tuple[StartPosition | None, KafkaOffsets, KafkaOffsets, str]:
    """``(the requested position (None for a migration), start offsets, history gap, the start described)``."""
    if mode == MIGRATE:
        # the new version starts where the current version's state stands, not at a chosen position
        committed = committed_source_offsets(JobLayout.of(current, settings), settings.kafka)
        start_text = f"v{current.version}'s input position (its last complete batch when the migration runs)"
        return None, committed or {}, {}, start_text
    position = StartPosition.from_params(params)
    try:
        start, gap = position.resolve_inputs(
            settings.kafka, inputs, now, accept_history_gap=bool(params.get("accept_history_gap"))
        )
    except BadStartPosition as err:
        raise BadReprocessRequest(str(err)) from None
    return position, start, gap, position.describe()


def _start_notes(
    position: StartPosition, inputs: dict[str, InputKind], bounds: dict[str, dict[int, tuple[int, int]]]
) -> list[str]:
    """What a requested position does not give: history that retention already deleted; tables read whole."""
    notes = []
    for topic, by_p in bounds.items():
        from_earliest = position.kind == EARLIEST or inputs[topic] == "table"
        if from_earliest and any(low > 0 for low, _h in by_p.values()):
            notes.append(
                f"the retention of {topic} already deleted the head of "
                + ", ".join(f"partition {p} (offsets below {low})" for p, (low, _h) in sorted(by_p.items()) if low > 0)
                + ": earliest is what remains, not the whole history"
            )
    if position.kind != EARLIEST and "table" in inputs.values():
        tables = [topic for topic, kind in inputs.items() if kind == "table"]
        notes.append(
            f"{', '.join(tables)} {'is a table' if len(tables) == 1 else 'are tables'}: read from earliest whatever "
            "the start (the topic is the table: started later, rows last changed before the start would be missing)"
            + (" unless start_offsets name it" if position.kind == OFFSETS else "")
        )
    return notes


def _sizes(settings: Settings, spec: JobSpec):
    art = JobLayout.of(spec, settings)
    bootstrap = settings.kafka
    present = existing_topics(bootstrap, list(art.topics))
    return art, bootstrap, present


def _holder_text(holder: LeaseHolder | None) -> str:
    return f"running, pid {holder.pid} on {holder.host}" if holder else "not running"


def _migrate_actions(plan: ReprocessPlan, settings: Settings, current: JobSpec, target: JobSpec) -> None:
    from spark_jobs.state.migration import MigrationRefused, migrated_and_running, plan_migration

    if (done := migrated_and_running(settings, target)) is not None:  # a re-run of this reprocessing
        plan.notes.append(f"{target.application_id} started from {done.migrated_from} and has run since: it resumes")
        _side_by_side_actions(plan, settings, current, target, start_file=False)
        return
    try:
        migration = plan_migration(settings, current, target)
    except MigrationRefused as err:
        raise BadReprocessRequest(str(err)) from None
    for store in migration.stores:
        if store.migrated is not None:
            rows, origin = f"{store.migrated.rows} rows", f"from {store.migrated.migrated_from}"
            plan.actions.append(Action("migrate_state", "keep", "migrated snapshot", store.target, rows, origin))
        elif store.from_store is None:
            why = f"v{current.version} has no store {store.store!r}"
            plan.actions.append(Action("migrate_state", "start empty", "store", store.store, "", why))
        else:
            snapshot_rows = store.snapshot.rows_scanned if store.snapshot else 0
            size = f"{snapshot_rows} snapshot rows + {store.tail_records} changelog records"
            how = f"{current.application_id}/{store.from_store} through {store.function}"
            plan.actions.append(Action("migrate_state", "write", "migrated snapshot", store.target, size, how))
    if migration.copies_outputs:
        for source, table in migration.outputs:
            how = f"copy of {source} as of the migration point"
            plan.actions.append(Action("migrate_state", "replace", "output table", table, "", how))
    plan.notes.append(
        f"v{target.version} starts from the migrated state at v{current.version}'s position: the source's "
        "history before it is not read (it may be gone)"
    )
    _side_by_side_actions(plan, settings, current, target, start_file=False)


def _side_by_side_actions(
    plan: ReprocessPlan, settings: Settings, current: JobSpec, target: JobSpec, *, start_file: bool = True
) -> None:
    art, bootstrap, present = _sizes(settings, target)
    add = plan.actions.append
    resumes = latest_committed_batch_id(art.checkpoint) is not None
    if resumes and start_file:
        plan.notes.append(
            f"{target.application_id} already has a checkpoint (an earlier run of this reprocessing): "
            "it resumes from there; the start position applies to a fresh checkpoint only"
        )
    holder = JobLease(settings.status_dir, target.application_id).holder()
    if start_file:
        add(
            Action(
                "prepare",
                "keep" if resumes else "write",
                "start position",
                str(art.start_offsets_file),
                checkpoint_size(art, bootstrap),
                _starts_text(plan)
                + (
                    f" (its re-keying stage's start; {art.repartition_topic} from its beginning)"
                    if art.repartition
                    else ""
                ),
            )
        )
    for topic in art.changelog_topics:
        add(Action("launch", "create", "changelog topic", topic, topic_size(bootstrap, topic, present)))
    add(
        Action(
            "launch",
            "create",
            "dead-letter topic",
            art.dead_letter_topic,
            topic_size(bootstrap, art.dead_letter_topic, present),
        )
    )
    for table in (*art.snapshot_tables, *art.output_tables):
        add(Action("launch", "create", "Delta table", str(table), delta_size(table)))
    add(
        Action(
            "launch",
            "start" if holder is None else "keep",
            "driver",
            target.application_id,
            "" if holder is None else f"running, pid {holder.pid}",
            f"consumer group prefix {target.application_id}",
        )
    )
    add(
        Action(
            "wait_caught_up",
            "wait",
            "input position",
            ", ".join(plan.inputs),
            f"{plan.records_to_process} records",
            f"until v{target.version} has committed the input end at that time"
            + (f" (re-keyed, and applied from {art.repartition_topic})" if art.repartition else ""),
        )
    )
    old = JobLayout.of(current, settings)
    add(
        Action(
            "compare",
            "compare",
            "Delta tables",
            f"{old.output_table} vs {art.output_table}",
            f"{delta_size(old.output_table)} vs {delta_size(art.output_table)}",
            f"on {', '.join(target.output_keys)}; report in {settings.lake / '_streamstate'}",
        )
    )
    running_old = JobLease(settings.status_dir, current.application_id).holder()
    plan.notes.append(
        f"{current.application_id} keeps running and serving readers "
        f"({'pid ' + str(running_old.pid) if running_old else 'not running now'}); "
        "promote_job_version switches readers after you read the report"
    )


def _reset_actions(plan: ReprocessPlan, settings: Settings, current: JobSpec, target: JobSpec) -> None:
    art, bootstrap, present = _sizes(settings, target)
    add = plan.actions.append
    # the spare first: it would take over a stopped driver's lease (spark_jobs/driver/spare.py)
    stops = (
        (
            "spare driver",
            art.spare.name,
            "first: it would take over the driver; the reset holds its lease, supervision restarts it after",
        ),
        ("driver", target.application_id, "clean shutdown (SIGTERM), kept stopped until the restart"),
        (
            "warm standby",
            art.standby.name,
            "it writes the snapshot tables deleted below; the reset holds its lease, supervision restarts it after",
        ),
    )
    for kind, name, why in stops:
        holder = JobLease(settings.status_dir, name).holder()
        add(Action("stop", "stop" if holder else "keep", kind, name, _holder_text(holder), why))
    add(
        Action(
            "reset",
            "delete",
            "checkpoint",
            str(art.checkpoint),
            checkpoint_size(art, bootstrap),
            "input positions live here (Spark commits no consumer-group offsets)",
        )
    )
    for path in art.quarantined_checkpoints():
        add(Action("reset", "delete", "quarantined checkpoint", str(path), human_bytes(path.size_bytes())))
    for topic in art.changelog_topics:
        add(
            Action(
                "reset",
                "delete",
                "changelog topic",
                topic,
                topic_size(bootstrap, topic, present),
                "re-created empty by the restart",
            )
        )
    for topic in art.repartition_topics:
        add(
            Action(
                "reset",
                "delete",
                "repartition topic" if topic == art.repartition_topic else "repartition progress topic",
                topic,
                topic_size(bootstrap, topic, present),
                "the re-keying stage writes it again from the start position",
            )
        )
    for table in art.snapshot_tables:
        add(Action("reset", "delete", "snapshot table", str(table), delta_size(table)))

    def outputs(kind: str, target: str, size: str, truncated: str = "", kept: str = "") -> None:
        """What the reset does to an output (``truncate_outputs``: emptied; else kept, and written over)."""
        verb = "truncate" if plan.truncate_outputs else "keep"
        add(Action("reset", verb, kind, target, size, truncated if plan.truncate_outputs else kept))

    if art.output_topic:
        events = target.output_topic_kind() == "events"
        outputs(
            "output topic",
            art.output_topic,
            topic_size(bootstrap, art.output_topic, present),
            "jobs reading it see the results recomputed from the start position",
            "reprocessed results are appended after the existing ones: a reader sees them again"
            if events
            else "reprocessed keys are written over the existing records",
        )
    for table in art.output_tables:
        outputs(
            "output table",
            str(table),
            delta_size(table),
            "rows deleted, history kept (time travel)",
            "reprocessed keys are merged over the existing rows",
        )
    outputs("dead-letter topic", art.dead_letter_topic, topic_size(bootstrap, art.dead_letter_topic, present))
    add(
        Action(
            "reset",
            "write",
            "start position",
            str(art.start_offsets_file),
            "",
            _starts_text(plan),
        )
    )
    add(Action("restart", "start", "driver", target.application_id, "", "supervision resumes"))
    if plan.start != "earliest":
        plan.notes.append(
            "state is rebuilt from the start position only: keys whose events all precede it are "
            "absent from the new state"
        )


def _starts_text(plan: ReprocessPlan) -> str:
    return "; ".join(f"{topic} from {offsets}" for topic, offsets in plan.start_offsets.items())


def write_start_offsets(layout: JobLayout, offsets: KafkaOffsets) -> Location:
    """Leave the start position (topic -> partition -> offset, every input of the version) where the job's first
    query reads it (``JobSources.starting_offsets``)."""
    path = layout.start_offsets_file
    path.write_text(
        json.dumps({topic: {str(p): o for p, o in sorted(by_p.items())} for topic, by_p in offsets.items()}, indent=2)
    )
    return path
