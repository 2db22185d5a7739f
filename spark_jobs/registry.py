"""The one registry of streaming jobs. Job definitions are data: a frozen, validated :class:`JobSpec`.

Everything else (the runner, spark-submit, the Airflow DAGs) looks jobs up here by name and version.
A job may have several registered versions at once (the one serving readers and the one being
reprocessed beside it); which one serves is not decided here but by the version pointer
(:mod:`spark_jobs.versions`). Jobs come from :data:`BUILTIN_JOBS` plus the ``JOBS`` iterable of every
module named in ``STREAMSTATE_JOB_MODULES`` (a team's own job package, importable where drivers run).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re
from collections.abc import Mapping
from typing import Literal, get_args

from spark_jobs.layout import output_topic_name

_NAME = re.compile(r"^[a-z][a-z0-9_]{1,62}$")

StoreKind = Literal["key_value", "windowed", "versioned", "session", "lru", "in_memory"]
#: what a store's TTL counts: the wall clock of the driver, or the events' own times (see StoreSpec.ttl_clock)
TtlClock = Literal["processing_time", "event_time"]
#: what an input topic holds: a ``stream`` of events (each counts once, at its time) or a ``table`` (an upsert
#: topic, a key's latest record its row: the topic as a whole is the table, so a reprocessing reads it whole)
InputKind = Literal["stream", "table"]
#: what a job's output topic holds: its outputs' rows by key (an upsert topic) or its results as events (a join's)
OutputTopicKind = Literal["upserts", "events"]


class JobSpecError(ValueError):
    """A job definition is invalid; the message names the job and the field."""


def check_job_name(name: str) -> None:
    """A job's name is the stem of every artifact name: refuse one that cannot be."""
    if not _NAME.match(name):
        raise JobSpecError(f"job name {name!r}: use lower-case letters, digits and _ (2-63 chars)")


@dataclasses.dataclass(frozen=True)
class StateBudget:
    """What a store may grow to before on-call hears of it (None: that measure is not limited).

    Attributes:
        max_rows: live keys (rows of the state store).
        max_bytes: state bytes (the largest of: the store in the checkpoint, its snapshot, its changelog).
        max_restore_s: the estimated restore (latest snapshot + changelog tail) on this deployment.
        warn_days: also alert when the growth trend crosses a budget within this many days.
    """

    max_rows: int | None = None
    max_bytes: int | None = None
    max_restore_s: float | None = None
    warn_days: float = 7.0

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes", "max_restore_s", "warn_days"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise JobSpecError(f"state budget: {name} must be > 0, got {value}")


@dataclasses.dataclass(frozen=True)
class StoreSpec:
    """A state store of a job; each store gets a changelog topic ``<application_id>-<name>-changelog``.

    Attributes:
        name: store name (letters, digits, ``-``/``_``).
        kind: ``windowed`` changelogs also delete by time; ``versioned`` keep ``retention_ms`` of history;
            ``lru`` keeps the ``max_entries`` most recently used keys per source partition (Kafka Streams'
            ``Stores.lruMap``, one per task), evicting the least recently used with a tombstone; ``in_memory``
            is a key-value store in Spark's in-memory state store (Kafka Streams' ``inMemoryKeyValueStore``:
            each partition's keys in a JVM map, loaded in full at every start; no TTL).
        retention_ms: windowed: how long a window is kept, counted from its start (Kafka Streams'
            ``Materialized.withRetention``; at least ``window_ms + grace_ms``, so a window is never dropped
            while it still accepts events); versioned: history kept.
        changelog_configs: topic config overrides (the seeds' ``withLoggingEnabled(map)``); the
            changelog tuning DAG never changes a config named here, it only reports what it would do.
        ttl_ms: key-value stores: evict a key idle this long, with a tombstone (the seeds' bounded store;
            None keeps keys until deleted).
        ttl_clock: what ``ttl_ms`` counts: ``processing_time`` (the default: idle on the wall clock) or
            ``event_time`` (the key's latest event time is ``ttl_ms`` behind the stream time of its source
            partition; the job's primitive declares the event's time field, see ``KeyedAggregate.time``).
        window_ms: windowed stores: the window size.
        advance_ms: windowed stores: how far apart windows start (hopping windows, Kafka Streams'
            ``advanceBy``: each event belongs to ``window_ms / advance_ms`` windows); None: ``window_ms``
            (tumbling windows).
        grace_ms: windowed stores: how long after its end a window still accepts late events; session
            stores: how long after its end + ``gap_ms`` a session still accepts them.
        gap_ms: session stores: the inactivity gap (Kafka Streams' ``SessionWindows``): events of a key
            less than ``gap_ms`` apart are one session; ``retention_ms`` (at least ``gap_ms + grace_ms``)
            counts from a session's end.
        budget: the limits the state-size audit holds the store to.
        max_entries: ``lru`` stores: the keys kept per source partition (N entries per partition, as
            Kafka Streams keeps N per task).
    """

    name: str
    kind: StoreKind = "key_value"
    retention_ms: int | None = None
    changelog_configs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ttl_ms: int | None = None
    ttl_clock: TtlClock = "processing_time"
    window_ms: int | None = None
    grace_ms: int = 0
    advance_ms: int | None = None
    budget: StateBudget = StateBudget()
    gap_ms: int | None = None
    max_entries: int | None = None

    def __post_init__(self) -> None:
        self._check_name_and_kind()
        if self.kind == "windowed":
            self._check_windowed()
        if self.kind == "session":
            self._check_session()
        elif self.gap_ms is not None:
            raise JobSpecError(f"store {self.name!r}: gap_ms is for session stores")
        if self.advance_ms is not None and self.kind != "windowed":
            raise JobSpecError(f"store {self.name!r}: advance_ms is for windowed stores")
        self._check_ttl()

    def _check_name_and_kind(self) -> None:
        """The name, a known kind, and what the kind needs: an lru store its max_entries, a store that expires
        by time its retention."""
        if not re.match(r"^[a-z][a-z0-9_-]{0,62}$", self.name):
            raise JobSpecError(f"store name {self.name!r}: use lower-case letters, digits, - and _")
        if self.kind not in get_args(StoreKind):
            raise JobSpecError(f"store {self.name!r}: kind {self.kind!r} is not one of {get_args(StoreKind)}")
        if (self.kind == "lru") != (self.max_entries is not None):
            raise JobSpecError(f"store {self.name!r}: max_entries is for, and needed by, an lru store")
        if self.kind == "lru" and self.max_entries < 1:
            raise JobSpecError(f"lru store {self.name!r}: max_entries must be >= 1, got {self.max_entries}")
        if self.kind not in ("key_value", "lru", "in_memory") and not self.retention_ms:
            raise JobSpecError(f"{self.kind} store {self.name!r} needs retention_ms")

    def _check_windowed(self) -> None:
        """A windowed store: a positive size, no negative grace, an advance within the size, and a retention
        covering size + grace."""
        if not self.window_ms or self.window_ms <= 0 or self.grace_ms < 0:
            raise JobSpecError(f"windowed store {self.name!r} needs window_ms > 0 and grace_ms >= 0")
        if self.advance_ms is not None and not 0 < self.advance_ms <= self.window_ms:
            raise JobSpecError(
                f"windowed store {self.name!r}: advance_ms {self.advance_ms} must be > 0 and at most "
                f"window_ms {self.window_ms}"
            )
        if self.retention_ms < self.window_ms + self.grace_ms:
            # The seeds: retention must cover window size + grace, or windows vanish while open.
            raise JobSpecError(
                f"windowed store {self.name!r}: retention_ms {self.retention_ms} is shorter "
                f"than window_ms + grace_ms = {self.window_ms + self.grace_ms}"
            )

    def _check_ttl(self) -> None:
        """A TTL only on a key-value store and positive; a known clock, other than the default only with a TTL."""
        if self.ttl_ms is not None and (self.kind != "key_value" or self.ttl_ms <= 0):
            raise JobSpecError(
                f"store {self.name!r}: ttl_ms must be positive and is for key_value stores "
                "(windowed stores expire by retention_ms)"
            )
        if self.ttl_clock not in get_args(TtlClock):
            raise JobSpecError(f"store {self.name!r}: ttl_clock {self.ttl_clock!r} is not one of {get_args(TtlClock)}")
        if self.ttl_clock != "processing_time" and self.ttl_ms is None:
            raise JobSpecError(f"store {self.name!r}: ttl_clock is for a store with ttl_ms")

    def _check_session(self) -> None:
        """A session store: a positive gap, no negative grace, and a retention (from a session's end)
        covering gap + grace, as Kafka Streams' ``SessionStoreMaterializer`` demands."""
        if not self.gap_ms or self.gap_ms <= 0 or self.grace_ms < 0:
            raise JobSpecError(f"session store {self.name!r} needs gap_ms > 0 and grace_ms >= 0")
        if self.window_ms is not None:
            raise JobSpecError(f"session store {self.name!r}: window_ms is for windowed stores (sessions have gap_ms)")
        if self.retention_ms < self.gap_ms + self.grace_ms:
            raise JobSpecError(
                f"session store {self.name!r}: retention_ms {self.retention_ms} is shorter "
                f"than gap_ms + grace_ms = {self.gap_ms + self.grace_ms}"
            )

    @property
    def window_advance_ms(self) -> int | None:
        """Windowed stores: how far apart windows start (``advance_ms``, or ``window_ms`` when they tumble);
        every window start is a multiple of it."""
        return self.advance_ms or self.window_ms


@dataclasses.dataclass(frozen=True)
class StoreMigration:
    """How a store of this version is built from a store of the previous version's state (the
    ``migrate`` mode of ``reprocess_job``; :mod:`spark_jobs.state.migration`), instead of recomputing it
    from the source topic.

    Attributes:
        store: the store of this version it builds.
        from_store: the previous version's store it reads (default: the same name).
        function: ``module:function`` taking the old store as DataFrame(key STRING, value STRING: its JSON)
            and returning the new one in the same shape (a value of null drops the key); None copies
            the store as it is (right when the value's fields only gained nullable ones: a missing field
            reads back as null).
    """

    store: str
    from_store: str | None = None
    function: str | None = None

    @property
    def source_store(self) -> str:
        return self.from_store or self.store


_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(milliseconds?|ms|seconds?|s|minutes?|min|m)\s*$")
_UNIT_S = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1,
    "second": 1,
    "seconds": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "minutes": 60,
}


def trigger_interval_s(interval: str) -> float:
    """``"5 seconds"`` -> 5.0 (the forms Spark's processingTime trigger takes that the registry uses)."""
    match = _INTERVAL.match(interval)
    if not match:
        raise JobSpecError(f"trigger interval {interval!r}: expected e.g. '5 seconds', '500 ms', '1 minute'")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclasses.dataclass(frozen=True)
class SupervisionPolicy:
    """How Airflow keeps a job running and when it tells on-call staff (plugins/streamstate).

    Attributes:
        check_every_s: the supervision DAG's schedule.
        start_timeout_s: a launched driver that is not RUNNING by then counts as a failed start.
        restart_backoff_s: wait after a restart before the next one; doubles with every further
            restart in the crash-loop window, up to ``restart_backoff_max_s``.
        crash_loop_restarts: K: after K restarts within ``crash_loop_window_s`` the job is marked
            crash-looping and is no longer restarted (until someone starts it again).
        max_input_lag_records: alert when the input lag (all partitions) exceeds this.
        no_progress_triggers: alert when neither a batch nor an idle report came for this many
            trigger intervals (a hung batch; at least 120 s: a first batch after a restart catches
            up and may legitimately take minutes).
        batch_duration_budget_s: alert when a micro-batch takes longer.
        restore_budget_s: alert when a restore takes (or has been taking) longer.
        dead_letter_growth_records: alert when the dead-letter topic grew by more than this between
            two checks.
        watch: between checks, the supervise DAG's watch task restarts a driver that exits within
            seconds (with the same check: backoff, crash loop, alerts); False: only the scheduled
            checks restart it.
        spare_driver: keep a spare driver of the job warm beside its driver (spark_jobs/driver/spare.py): it takes
            over within seconds when the driver dies, at the cost of a second driver's memory. The
            deployment's ``STREAMSTATE_SPARE_DRIVERS=false`` turns every job's off.
    """

    check_every_s: int = 120
    start_timeout_s: int = 240
    # Kubernetes' CrashLoopBackOff schedule: 10 s, doubling, at most 5 min.
    restart_backoff_s: int = 10
    restart_backoff_max_s: int = 300
    crash_loop_restarts: int = 3
    crash_loop_window_s: int = 1800
    max_input_lag_records: int = 100_000
    no_progress_triggers: int = 60
    batch_duration_budget_s: float = 60.0
    restore_budget_s: float = 600.0
    dead_letter_growth_records: int = 1_000
    watch: bool = True
    spare_driver: bool = True

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.name not in ("watch", "spare_driver") and getattr(self, field.name) <= 0:
                raise JobSpecError(f"supervision policy: {field.name} must be > 0, got {getattr(self, field.name)}")
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise JobSpecError("supervision policy: restart_backoff_max_s must be >= restart_backoff_s")

    def backoff_s(self, recent_restarts: int) -> float:
        """The wait before the next restart, given the restarts already made in the window."""
        if recent_restarts <= 0:
            return 0.0
        return float(min(self.restart_backoff_max_s, self.restart_backoff_s * 2 ** (recent_restarts - 1)))


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """What a stateful streaming job is: where it reads, how it is keyed, where it writes.

    Attributes:
        name: registry key and the stem of every artifact name (checkpoint, tables, topics).
        version: the job version; a new version gets its own application id and checkpoint.
        source_topic: Kafka topic the job consumes.
        source_partitions: partitions the platform creates the source topic with.
        key_field: the event field state is keyed by.
        output_table: Delta table the job's results are merged into; each version writes its own,
            ``<lake>/<output_table>_v<version>`` (see :attr:`output_table_dir`).
        entrypoint: ``module:function``, ``build(ctx: JobContext)``: returns the query's stream writer
            (spark_jobs/driver/context.py gives it the session, the spec, the settings and the artifacts).
        trigger_interval: micro-batch interval, e.g. ``"5 seconds"`` (the seeds' commit interval).
        stores: the job's state stores, each logged to its own changelog topic.
        snapshot_every_batches: take a Delta state snapshot after every N-th micro-batch (0: never).
        supervision: restart and alert thresholds for this job (Airflow supervision).
        output_key: the columns that identify a row of the output table (default: ``key_field``);
            reprocessing compares two versions' outputs on them.
        companion_outputs: further output tables the job writes, ``<output_table_dir>_<name>`` each
            (reset truncates them, retirement deletes them with the main one).
        migrations: how this version's stores are built from the previous version's state by a
            ``migrate`` reprocessing; a store without one is copied from the previous version's store of
            the same name, or starts empty when there is none.
        repartition: the source is not keyed by ``key_field`` (producers that set no Kafka key, or key by
            another field): the job re-keys it first, as Kafka Streams' ``selectKey``/``groupBy`` does,
            through the version's repartition topic (``<application_id>-repartition``, keyed by
            ``key_field``), and its stateful stage reads that topic. False (the default): every record's
            Kafka key must equal its ``key_field``, checked record by record (a ``wrong_key`` dead letter
            otherwise), because a key spread over partitions would be counted in several tasks.
        repartition_partitions: the repartition topic's partitions: the stateful stage's tasks, and its
            changelogs' partitions (default: ``source_partitions``).
        output_topic: the outputs also go to Kafka, for jobs that read them (a job feeding a job): the topic
            ``<output_topic>-v<version>`` (per version, as the output tables are), written in the batch's
            transaction with its changelog markers (:meth:`JobContext.state_change_sink`). For an aggregate,
            an upsert topic keyed by the job's key, the output row as a JSON value, a tombstone for a deleted
            key, compacted; for a join of events (stream-table, stream-stream), an event topic: each result
            once, keyed by the join key and partitioned as Kafka's Java clients do, the output row as JSON,
            deleted by retention (``JobSpec.output_topic_kind``).
        output_topic_partitions: the upsert topic's partitions (default: the stateful stage's); 1 to finish
            in one place, as the seeds' two-stage pattern does (a reader sees every key in one task).
        join_topics: a join's other inputs (its right side; ``source_topic`` is the left), read by the same
            query as the source: one topic for a table join and a stream-stream join, one per table for a stream
            joined with several tables. All are keyed by the join key, ``key_field``, and **co-partitioned**, as
            Kafka Streams requires of a join's inputs: the same number of partitions (:attr:`state_partitions`),
            a key in the same partition of each; a topic with another count is refused at start, naming both.
            With ``repartition`` the left side is re-keyed by ``key_field`` first (Kafka Streams'
            ``selectKey(...).join(table)``): its repartition topic is the left input, and
            ``repartition_partitions`` must be the join topics' count, as Kafka Streams sizes the repartition
            topic of a join by the other side's. A join topic itself is never re-keyed.
        max_task_idle_ms: how long a join's task waits, of wall-clock time, for an input that has nothing more
            written before it takes the other input's later records (Kafka Streams' ``max.task.idle.ms``). 0, the
            default: it waits only for records written and not yet read (a rate limit's cut), never for records
            not yet written. A longer wait lets a topic whose producer is a little behind (a CDC connector's
            commit) still come first, at the cost of that much latency; the wait ends at the first micro-batch
            after it (a batch runs when an input has new records).
    """

    name: str
    version: int
    source_topic: str
    key_field: str
    output_table: str
    entrypoint: str
    source_partitions: int = 2
    trigger_interval: str = "5 seconds"
    stores: tuple[StoreSpec, ...] = ()
    snapshot_every_batches: int = 10
    supervision: SupervisionPolicy = SupervisionPolicy()
    description: str = ""
    output_key: tuple[str, ...] = ()
    companion_outputs: tuple[str, ...] = ()
    migrations: tuple[StoreMigration, ...] = ()
    repartition: bool = False
    repartition_partitions: int | None = None
    output_topic: str | None = None
    output_topic_partitions: int | None = None
    join_topics: tuple[str, ...] = ()
    max_task_idle_ms: int = 0

    def __post_init__(self) -> None:
        check_job_name(self.name)
        if self.version < 1:
            raise JobSpecError(f"job {self.name}: version must be >= 1, got {self.version}")
        if self.source_partitions < 1:
            raise JobSpecError(f"job {self.name}: source_partitions must be >= 1")
        if self.snapshot_every_batches < 0:
            raise JobSpecError(f"job {self.name}: snapshot_every_batches must be >= 0")
        if self.repartition_partitions is not None and (not self.repartition or self.repartition_partitions < 1):
            raise JobSpecError(f"job {self.name}: repartition_partitions must be >= 1 and needs repartition=True")
        if self.output_topic_partitions is not None and (not self.output_topic or self.output_topic_partitions < 1):
            raise JobSpecError(f"job {self.name}: output_topic_partitions must be >= 1 and needs an output_topic")
        if isinstance(self.join_topics, str):
            raise JobSpecError(f"job {self.name}: join_topics is a tuple of topics: ({self.join_topics!r},)")
        if self.max_task_idle_ms < 0 or (self.max_task_idle_ms and not self.join_topics):
            raise JobSpecError(f"job {self.name}: max_task_idle_ms must be >= 0, and is for a job with join_topics")
        if len(set(self.input_topics)) != len(self.input_topics):
            raise JobSpecError(
                f"job {self.name}: join_topics {self.join_topics} must differ from each other and from source_topic "
                f"{self.source_topic!r}"
            )
        if len({store.name for store in self.stores}) != len(self.stores):
            raise JobSpecError(f"job {self.name}: store names must be unique")
        if ":" not in self.entrypoint:
            raise JobSpecError(f"job {self.name}: entrypoint must be 'module:function', got {self.entrypoint!r}")
        trigger_interval_s(self.trigger_interval)  # raises on a malformed interval
        stores = [s.name for s in self.stores]
        for migration in self.migrations:
            if migration.store not in stores:
                raise JobSpecError(
                    f"job {self.name}: migrations: store {migration.store!r} is not one of its stores {stores}"
                )
            if migration.function is not None and ":" not in migration.function:
                raise JobSpecError(
                    f"job {self.name}: migrations: store {migration.store!r}: function must be "
                    f"'module:function', got {migration.function!r}"
                )
        if len({m.store for m in self.migrations}) != len(self.migrations):
            raise JobSpecError(f"job {self.name}: migrations: one migration per store")

    @property
    def trigger_interval_s(self) -> float:
        return trigger_interval_s(self.trigger_interval)

    @property
    def state_partitions(self) -> int:
        """The partitions of the stateful stage's input (the source, or the repartition topic): its tasks,
        and the partitions of its changelogs and dead-letter topic."""
        if self.repartition:
            return self.repartition_partitions or self.source_partitions
        return self.source_partitions

    @property
    def input_topics(self) -> tuple[str, ...]:
        """The topics the job reads from producers: ``source_topic``, then the ``join_topics``."""
        return (self.source_topic, *self.join_topics)

    def input_kinds(self) -> dict[str, InputKind]:
        """Each of :attr:`input_topics` with what it holds (:data:`InputKind`): the declaration's inputs
        (``StoreDeclaration.input_kinds``), or streams for a job built by a function. Imports the entrypoint."""
        kinds = getattr(self._entrypoint(), "input_kinds", None) or ("stream",) * len(self.input_topics)
        return dict(zip(self.input_topics, kinds, strict=True))

    def output_topic_kind(self) -> OutputTopicKind:
        """What :attr:`output_topic` holds (``StoreDeclaration.output_topic_kind``; upserts for a job built by a
        function). Imports the entrypoint."""
        return getattr(self._entrypoint(), "output_topic_kind", "upserts")

    def _entrypoint(self):
        """The object :attr:`entrypoint` names: a declaration, or the job's build function."""
        module_name, _, name = self.entrypoint.partition(":")
        return getattr(importlib.import_module(module_name), name, None)

    @property
    def output_partitions(self) -> int:
        """The partitions of the upsert output topic (``output_topic_partitions``, default the stateful stage's)."""
        return self.output_topic_partitions or self.state_partitions

    @property
    def output_table_dir(self) -> str:
        """The output table's directory under the lake: per version, like everything else of an
        application id, so a new version never merges into rows an older one computed (a user
        deleted by v2 would otherwise keep v1's row) and versions can run side by side."""
        return f"{self.output_table}_v{self.version}"

    @property
    def output_keys(self) -> tuple[str, ...]:
        return self.output_key or (self.key_field,)

    @property
    def output_table_dirs(self) -> tuple[str, ...]:
        """Every output table directory of this version: the main one first."""
        return (self.output_table_dir, *(f"{self.output_table_dir}_{name}" for name in self.companion_outputs))

    @property
    def application_id(self) -> str:
        """Kafka Streams' application.id: names the checkpoint, consumer prefix and changelog topics."""
        from spark_jobs.layout import application_id

        return application_id(self.name, self.version)


BUILTIN_JOBS: tuple[JobSpec, ...] = (
    JobSpec(
        name="purchase_counts",
        # v2: state moved to a transformWithState processor (deletes on account_closed); its
        # changelog values carry touched_at_ms, so v1 changelogs are not restored into it.
        # v3: the same rules and change rows, computed by the Java processor (its checkpoint's
        # state keys are encoded differently from v2's Python processor, hence a new version).
        version=3,
        source_topic="purchases",
        key_field="user_id",
        output_table="purchase_counts",
        entrypoint="spark_jobs.reference.jobs.purchase_counts:build",
        stores=(StoreSpec("counts", budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600)),),
        description="Purchases and amount spent per user; account_closed deletes the user (the seeds' "
        "purchase-count scenario).",
    ),
    JobSpec(
        name="patient_heart_rate",
        # v2: the same windows and rows, computed by the Java processor (its checkpoint's state keys
        # are encoded differently from v1's Python processor, hence a new version).
        # v3: Kafka Streams' semantics record by record: stream time per source partition, advanced
        # by each record (v2 judged a whole micro-batch by the stream time before it); the store is
        # keyed by partition and its entries carry the partition, plus one stream-time entry each.
        # v4: the processor grouped by each partition's task key, not its number (partitions 0 and 1
        # shared one task: streamstate.primitives.PartitionTask); the checkpoint's state keys differ.
        version=4,
        source_topic="patient-events",
        key_field="patient_id",
        output_table="patient_heart_rate",
        entrypoint="spark_jobs.reference.jobs.patient_heart_rate:build",
        stores=(
            StoreSpec(
                "pulse-counts",
                kind="windowed",
                window_ms=60_000,
                grace_ms=5_000,
                retention_ms=6 * 3600 * 1000,
                budget=StateBudget(max_rows=2_000_000, max_bytes=1024**3, max_restore_s=600),
            ),
        ),
        description="Heart rate per patient per 60 s tumbling window (5 s grace, 6 h retention), emitted "
        "when the window closes; a check-out deletes the patient's windows (the seeds' pulse scenario).",
        output_key=("patient_id", "window_start"),
    ),
    JobSpec(
        name="temperature_averages",
        # v2: the processor grouped by each partition's task key, not its number (partitions 0 and 1
        # shared one task: streamstate.primitives.PartitionTask); the checkpoint's state keys differ.
        version=2,
        source_topic="sensor-readings",
        key_field="sensor_id",
        output_table="temperature_averages",
        entrypoint="spark_jobs.reference.jobs.temperature_averages:AVERAGES",
        stores=(
            StoreSpec(
                "temperature-windows",
                kind="windowed",
                window_ms=5 * 60_000,
                advance_ms=60_000,
                grace_ms=30_000,
                retention_ms=2 * 3600 * 1000,
                budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600),
            ),
        ),
        description="Average, minimum and maximum temperature per sensor over the last 5 minutes, every "
        "minute (hopping windows, 30 s grace, 2 h retention), emitted when a window closes; sensor_removed "
        "deletes the sensor's windows (the seeds' hopping-window example).",
        output_key=("sensor_id", "window_start"),
    ),
    JobSpec(
        name="user_sessions",
        # v2: each stored session says whether it is reopened (it merged a closed, emitted one), so the job
        # appends the other sessions it emits instead of merging them; the state's schema differs from v1's.
        version=2,
        source_topic="user-activity",
        key_field="user_id",
        output_table="user_sessions",
        entrypoint="spark_jobs.reference.jobs.user_sessions:VISITS",
        stores=(
            StoreSpec(
                "user-sessions",
                kind="session",
                gap_ms=30 * 60_000,
                grace_ms=5 * 60_000,
                retention_ms=2 * 3600 * 1000,
                budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600),
            ),
        ),
        description="Visits per user: clicks and page views in sessions of activity separated by 30 minutes "
        "of inactivity (5 min grace, 2 h retention), emitted when a session closes; forget_me deletes the "
        "user's sessions (Kafka Streams' session windows).",
        output_key=("user_id", "session_start"),
    ),
    JobSpec(
        name="customer_accounts",
        version=1,
        source_topic="customers",
        join_topics=("accounts",),
        key_field="customer_id",
        output_table="customer_accounts",
        entrypoint="spark_jobs.reference.jobs.customer_accounts:CUSTOMER_ACCOUNTS",
        stores=(
            StoreSpec(
                "customer-accounts",
                budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600),
            ),
        ),
        description="Every customer with their account's fields: the customers and accounts CDC topics joined "
        "on customer_id (a table-table left join; a change on either side updates the row).",
    ),
    JobSpec(
        name="order_enrichment",
        version=1,
        source_topic="orders",
        join_topics=("customer-profiles",),
        key_field="customer_id",
        output_table="order_enrichment",
        entrypoint="spark_jobs.reference.jobs.order_enrichment:ORDER_ENRICHMENT",
        stores=(
            StoreSpec(
                "customer-profiles",
                kind="versioned",
                retention_ms=24 * 3600 * 1000,
                budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600),
            ),
        ),
        output_key=("source_partition", "source_offset"),
        description="Each order with its customer's name and tier as they were at the order's time: orders "
        "joined with the customers' change stream (a stream-table left join over a versioned table, 1 min grace).",
    ),
    JobSpec(
        name="order_credit_enrichment",
        version=1,
        source_topic="orders",
        join_topics=("customer-profiles", "credit-lines"),
        key_field="customer_id",
        output_table="order_credit_enrichment",
        entrypoint="spark_jobs.reference.jobs.order_credit_enrichment:ORDER_CREDIT_ENRICHMENT",
        stores=(
            StoreSpec(
                "customer-credit",
                kind="versioned",
                retention_ms=24 * 3600 * 1000,
                budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600),
            ),
        ),
        output_key=("source_partition", "source_offset"),
        description="Each order with its customer's name and tier and its credit line as they were at the "
        "order's time: orders joined with two change streams keyed by customer (a stream joined with two "
        "versioned tables, in one task).",
    ),
    JobSpec(
        name="order_payments",
        version=1,
        source_topic="placed-orders",
        join_topics=("payments",),
        key_field="order_id",
        output_table="order_payments",
        entrypoint="spark_jobs.reference.jobs.order_payments:ORDER_PAYMENTS",
        stores=(
            StoreSpec(
                "order-payments",
                budget=StateBudget(max_rows=5_000_000, max_bytes=2 * 1024**3, max_restore_s=600),
            ),
        ),
        output_key=("source_partition", "left_offset", "right_offset"),
        description="Orders matched with their payments within 10 minutes (a windowed stream-stream outer join, "
        "1 min grace): every match, and each order or payment left unmatched once its window closed.",
    ),
    JobSpec(
        name="vote_counts",
        version=1,
        source_topic="votes",
        key_field="voter_id",
        output_table="votes",
        entrypoint="spark_jobs.reference.jobs.vote_counts:build",
        stores=(
            StoreSpec(
                "latest-votes",
                kind="versioned",
                retention_ms=24 * 3600 * 1000,
                budget=StateBudget(max_rows=10_000_000, max_bytes=4 * 1024**3, max_restore_s=600),
            ),
        ),
        description="Each voter's latest vote by event time (voters change their minds, events arrive out "
        "of order) and the counts per candidate.",
        companion_outputs=("counts",),
    ),
    JobSpec(
        name="stock_price_changes",
        version=1,
        source_topic="stock-ticks",
        key_field="symbol",
        output_table="stock_price_changes",
        entrypoint="spark_jobs.reference.jobs.stock_price_changes:DAILY_CHANGES",
        stores=(
            StoreSpec(
                "daily-changes",
                kind="windowed",
                window_ms=86_400_000,
                grace_ms=600_000,
                retention_ms=3 * 86_400_000,
                budget=StateBudget(max_rows=1_000_000, max_bytes=1024**3, max_restore_s=600),
            ),
        ),
        description="Daily price change per stock (1-day tumbling windows, 10 min grace), written when the "
        "day closes, to Delta and to the one-partition upsert topic stock-daily-changes-v1: stage 1 of the "
        "seeds' top-movers pipeline, whose stage 2 is the streaming job top_movers and the batch step "
        "daily_top_movers.",
        output_key=("symbol", "window_start"),
        output_topic="stock-daily-changes",
        output_topic_partitions=1,
    ),
    JobSpec(
        name="top_movers",
        version=1,
        source_topic=output_topic_name("stock-daily-changes", 1),
        source_partitions=1,
        key_field="window_start",
        output_table="top_movers",
        entrypoint="spark_jobs.reference.jobs.top_movers:TOP_MOVERS",
        stores=(
            StoreSpec(
                "day-members", budget=StateBudget(max_rows=1_000_000, max_bytes=512 * 1024**2, max_restore_s=300)
            ),
        ),
        description="The day's ten largest price moves, streaming: stock_price_changes' upsert topic read as a "
        "table, ranked per day (stage 2 of the seeds' top-movers pipeline; the batch step daily_top_movers is "
        "its twin for closed days).",
        output_key=("window_start", "rank"),
    ),
    JobSpec(
        name="recent_buyers",
        version=1,
        source_topic="purchases",
        key_field="user_id",
        output_table="recent_buyers",
        entrypoint="spark_jobs.reference.jobs.recent_buyers:RECENT",
        stores=(
            StoreSpec(
                "recent-buyers",
                kind="lru",
                max_entries=10_000,
                budget=StateBudget(max_rows=1_000_000, max_bytes=512 * 1024**2, max_restore_s=300),
            ),
        ),
        description="Purchases and amount spent of the 10,000 most recently active users per source partition "
        "(an lru store, Kafka Streams' Stores.lruMap); account_closed deletes the user, an eviction too.",
    ),
    JobSpec(
        name="purchase_counts_in_memory",
        version=1,
        source_topic="purchases",
        key_field="user_id",
        output_table="purchase_counts_in_memory",
        # purchase_counts' declaration as it is: the store's kind is the spec's choice, not the declaration's
        entrypoint="spark_jobs.reference.jobs.purchase_counts:COUNTS",
        stores=(
            StoreSpec(
                "counts",
                kind="in_memory",
                budget=StateBudget(max_rows=1_000_000, max_bytes=512 * 1024**2, max_restore_s=120),
            ),
        ),
        description="purchase_counts in an in_memory store (Kafka Streams' Stores.inMemoryKeyValueStore): each "
        "partition's users in a JVM map, loaded in full at every start; no local database.",
    ),
)


def store(spec: JobSpec, name: str) -> StoreSpec:
    for candidate in spec.stores:
        if candidate.name == name:
            return candidate
    raise JobSpecError(f"job {spec.name} has no store {name!r}; stores: {[s.name for s in spec.stores]}")


@functools.lru_cache(maxsize=8)
def _registered(job_modules: str) -> dict[str, dict[int, JobSpec]]:
    specs = list(BUILTIN_JOBS)
    for module_name in filter(None, (m.strip() for m in job_modules.split(","))):
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise JobSpecError(
                f"job module {module_name!r} (STREAMSTATE_JOB_MODULES) cannot be imported: {err}"
            ) from err
        module_specs = getattr(module, "JOBS", ())
        specs.extend(module_specs)
        for spec in module_specs:  # a declaration beside its specs is checked now, not when a driver starts
            entry_module, _, entry = getattr(spec, "entrypoint", "").partition(":")
            if entry_module == module_name and hasattr(declared := getattr(module, entry, None), "check"):
                declared.check(spec)
    versions: dict[str, dict[int, JobSpec]] = {}
    for spec in specs:
        if not isinstance(spec, JobSpec):
            raise JobSpecError(f"job modules must list JobSpec objects in JOBS, got {spec!r}")
        if spec.version in versions.setdefault(spec.name, {}):
            raise JobSpecError(f"job {spec.name} version {spec.version} is registered twice")
        versions[spec.name][spec.version] = spec
    _check_own_output_tables(specs)
    return {name: dict(sorted(by_version.items())) for name, by_version in sorted(versions.items())}


def _check_own_output_tables(specs: list[JobSpec]) -> None:
    """Every output table directory belongs to one job version: two jobs naming the same ``output_table``
    would MERGE into one Delta table (and a retirement of one would drop the other's rows)."""
    owners: dict[str, str] = {}
    for spec in specs:
        for directory in spec.output_table_dirs:
            owner = owners.setdefault(directory, spec.application_id)
            if owner != spec.application_id:
                raise JobSpecError(
                    f"jobs {owner} and {spec.application_id} both write the output table {directory!r}; "
                    "give one of them an output_table of its own"
                )


def registered_versions(job_modules: str | None = None) -> dict[str, dict[int, JobSpec]]:
    """name -> version -> spec, for every registered job (built-ins and ``job_modules``, by default
    ``Settings.from_env().job_modules``)."""
    if job_modules is None:
        from runtime.settings import Settings

        job_modules = Settings.from_env().job_modules or ""
    return _registered(job_modules)


def latest_jobs() -> dict[str, JobSpec]:
    """name -> the newest registered version (what a job starts as before any promotion)."""
    return {name: by_version[max(by_version)] for name, by_version in registered_versions().items()}


def get_job(name: str, version: int | str | None = None) -> JobSpec:
    """The spec of ``name`` at ``version`` (default: the newest registered).

    Raises:
        JobSpecError: unknown job or version (the message lists what is registered).
    """
    jobs = registered_versions()
    if name not in jobs:
        raise JobSpecError(f"unknown job {name!r}; registered jobs: {', '.join(sorted(jobs))}")
    if version is None or version == "":
        return jobs[name][max(jobs[name])]
    try:
        return jobs[name][int(version)]
    except (KeyError, ValueError):
        raise JobSpecError(f"job {name} has no version {version!r}; registered versions: {list(jobs[name])}") from None
