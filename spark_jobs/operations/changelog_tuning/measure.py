"""What a changelog topic holds, and how much of it a restore would replay for nothing.

Three sources, each for what it can tell:

- **AdminClient** (confluent-kafka): partitions, the topic's configs, the broker's ``log.dirs``.
- **A bounded scan** (a consumer reading each partition from its low watermark): records, distinct
  live keys, tombstones, superseded ("obsolete") records and their ages. Offsets alone cannot tell:
  a compacted partition has gaps, so ``high - low`` only bounds the record count from above.
- **The broker's log directories**: librdkafka has no DescribeLogDirs, so bytes, segment files, the
  active segment and Kafka's own dirty ratio (from ``cleaner-offset-checkpoint``) are read from the
  partition directories when the broker's ``log.dirs`` are on this machine (the embedded broker, or a
  mounted volume). Otherwise bytes are the sum of key + value sizes seen by the scan and the dirty
  ratio is estimated as the share of superseded records; ``bytes_source`` / ``dirty_ratio_source``
  say which.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from runtime.kafka_connection import KafkaTarget, client_config
from spark_jobs.io.kafka_topics import BOUNDED_READ_PREFETCH, watermark_offsets
from spark_jobs.operations.changelog_tuning import topic_configs
from spark_jobs.registry import JobSpec, StoreSpec, registered_versions
from spark_jobs.state.batch_records import MARKER_KEY
from spark_jobs.state.changelog import changelog_topic_name

#: the configs the tuning reads and may change
TUNED_CONFIGS = (
    "cleanup.policy",
    "segment.bytes",
    "segment.ms",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "max.compaction.lag.ms",
    "delete.retention.ms",
    "retention.ms",
)


@dataclasses.dataclass(frozen=True)
class ChangelogTarget:
    """A store of a registered job version and its changelog topic."""

    spec: JobSpec
    store: StoreSpec

    @property
    def topic(self) -> str:
        return changelog_topic_name(self.spec.application_id, self.store.name)


def changelog_targets() -> list[ChangelogTarget]:
    """Every store of every registered job version (topics that do not exist yet included)."""
    return [
        ChangelogTarget(spec, store)
        for versions in registered_versions().values()
        for spec in versions.values()
        for store in spec.stores
    ]


@dataclasses.dataclass
class LogFiles:
    """One topic's partition directories on the broker's disk."""

    bytes: int = 0
    segments: int = 0
    #: bytes of the newest segment of each partition, summed (the cleaner never touches those)
    active_segment_bytes: int = 0
    #: Kafka's cleanable ratio: bytes of closed segments at or after the cleaner's checkpoint over
    #: all closed segments' bytes (what ``min.cleanable.dirty.ratio`` is compared with)
    dirty_ratio: float = 0.0


@dataclasses.dataclass
class ChangelogMeasurement:
    """One topic at one moment. Counts cover the scanned records (all of them unless
    ``scan_complete`` is False)."""

    topic: str
    measured_at: dt.datetime
    partitions: int
    configs: dict[str, str | None]
    #: configs set on the topic itself (the others are broker defaults)
    overridden: list[str]
    #: sum over partitions of high - low watermark: an upper bound of the records
    offset_span: int
    records: int
    scan_complete: bool
    live_keys: int
    #: bytes of the latest key + value of every live key (what a perfectly compacted log would hold)
    live_bytes: int
    #: tombstone records present (deleted keys not yet removed by the cleaner)
    tombstones: int
    #: batch markers present (one per partition per micro-batch until compacted)
    markers: int
    #: records superseded by a later record of the same key: what compaction removes
    obsolete: int
    #: obsolete records younger than min.compaction.lag.ms: kept on purpose (a versioned store's history)
    history_records: int
    #: age of the oldest obsolete record compaction is allowed to remove but has not (None: none)
    oldest_obsolete_age_ms: int | None
    bytes: int
    bytes_source: str
    segments: int | None
    active_segment_bytes: int | None
    dirty_ratio: float
    dirty_ratio_source: str
    #: bytes written per second per partition over the last hour of records seen (0: nothing recent)
    write_bytes_per_s: float
    scan_seconds: float

    @property
    def replay_ratio(self) -> float:
        """Records a full restore replays per live key (1.0 = a perfectly compacted log)."""
        return self.records / max(self.live_keys, 1)

    @property
    def excess_replay_ratio(self) -> float:
        """As :attr:`replay_ratio`, without the history kept on purpose by min.compaction.lag.ms."""
        return (self.records - self.history_records) / max(self.live_keys, 1)

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["measured_at"] = self.measured_at.isoformat()
        data.update(replay_ratio=round(self.replay_ratio, 3), excess_replay_ratio=round(self.excess_replay_ratio, 3))
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ChangelogMeasurement:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["measured_at"] = dt.datetime.fromisoformat(data["measured_at"])
        return cls(**values)


def broker_log_dirs(admin: AdminClient, timeout_s: float = 30.0) -> list[Path]:
    """The log directories of every broker that exist on this machine (empty for a remote cluster)."""
    brokers = admin.list_topics(timeout=timeout_s).brokers
    resources = [ConfigResource(ResourceType.BROKER, str(broker_id)) for broker_id in brokers]
    dirs: list[Path] = []
    for future in admin.describe_configs(resources, request_timeout=timeout_s).values():
        configs = future.result(timeout=timeout_s)
        entry = configs.get("log.dirs")
        if entry is None or not entry.value:
            entry = configs.get("log.dir")
        value = entry.value if entry is not None and entry.value else ""
        dirs += [Path(d) for d in value.split(",") if d and Path(d).is_dir()]
    return dirs


def _cleaner_checkpoints(log_dir: Path) -> dict[tuple[str, int], int]:
    """(topic, partition) -> first dirty offset, from Kafka's ``cleaner-offset-checkpoint``
    (format: version line, count line, then ``topic partition offset`` lines)."""
    path = log_dir / "cleaner-offset-checkpoint"
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()[2:]
    checkpoints = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            checkpoints[(parts[0], int(parts[1]))] = int(parts[2])
    return checkpoints


def read_log_files(log_dirs: list[Path], topic: str, partitions: int) -> LogFiles | None:
    """Sizes of ``topic``'s segment files, or None when a partition's directory is not here."""
    files = LogFiles()
    clean = cleanable = 0
    for p in range(partitions):
        found = [d for d in log_dirs if (d / f"{topic}-{p}").is_dir()]
        if not found:
            return None
        directory = found[0] / f"{topic}-{p}"
        first_dirty = _cleaner_checkpoints(found[0]).get((topic, p), 0)
        # segment files are named by their base offset; the newest is the active one
        segments = sorted((int(f.stem), f.stat().st_size) for f in directory.glob("*.log") if f.stem.isdigit())
        files.segments += len(segments)
        files.bytes += sum(size for _, size in segments)
        if segments:
            files.active_segment_bytes += segments[-1][1]
        for i, (_base, size) in enumerate(segments[:-1]):
            next_base = segments[i + 1][0]
            if next_base <= first_dirty:
                clean += size
            else:
                cleanable += size
    files.dirty_ratio = cleanable / (clean + cleanable) if clean + cleanable else 0.0
    return files


@dataclasses.dataclass
class _ScanTally:
    """What a scan of a changelog has counted so far (the counts of :class:`ChangelogMeasurement`)."""

    now_ms: int
    #: records younger than this when superseded are history kept on purpose (min.compaction.lag.ms)
    min_lag_ms: int
    #: (partition, key) -> (timestamp ms, is tombstone, key + value bytes) of its latest record
    latest: dict[tuple[int, bytes], tuple[int, bool, int]] = dataclasses.field(default_factory=dict)
    records: int = 0
    markers: int = 0
    obsolete: int = 0
    history: int = 0
    oldest_obsolete_ms: int | None = None
    scanned_bytes: int = 0
    #: bytes of the records of the last hour
    recent_bytes: int = 0
    complete: bool = True

    def count(self, partition: int, key: bytes, value: bytes | None, ts: int) -> None:
        """Counts one record of ``partition`` (``key`` b"" for a null key; ``value`` None for a tombstone)."""
        size = len(key) + len(value or b"")
        self.records += 1
        self.scanned_bytes += size
        if ts >= self.now_ms - 3600_000:
            self.recent_bytes += size
        if key == MARKER_KEY:
            self.markers += 1
        previous = self.latest.get((partition, key))
        if previous is not None:
            self.obsolete += 1
            if self.now_ms - previous[0] < self.min_lag_ms:
                self.history += 1
            elif self.oldest_obsolete_ms is None or previous[0] < self.oldest_obsolete_ms:
                self.oldest_obsolete_ms = previous[0]
        self.latest[(partition, key)] = (ts, value is None, size)


def measure_changelog(
    kafka: KafkaTarget,
    topic: str,
    *,
    max_records: int,
    log_dirs: list[Path] | None = None,
    poll_timeout_s: float = 30.0,
) -> ChangelogMeasurement:
    """Measure ``topic``: configs by the AdminClient, contents by a scan of at most ``max_records``
    records, bytes and segments from ``log_dirs`` when given and present."""
    started = time.monotonic()
    admin = AdminClient(client_config(kafka, {"log_level": 3}))
    configs = topic_configs.describe(admin, [topic], poll_timeout_s)[topic]
    now_ms = int(time.time() * 1000)
    min_lag_ms = int(configs["min.compaction.lag.ms"].value or 0) if "min.compaction.lag.ms" in configs else 0
    tally = _ScanTally(now_ms, min_lag_ms)

    consumer = Consumer(
        client_config(
            kafka,
            {
                "group.id": f"streamstate-measure-{topic}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 3,
                **BOUNDED_READ_PREFETCH,
            },
        )
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=poll_timeout_s).topics[topic].partitions)
        bounds = {p: watermark_offsets(consumer, TopicPartition(topic, p), poll_timeout_s) for p in partitions}
        per_partition_cap = max(1, max_records // max(len(partitions), 1))
        for p in partitions:
            _scan_partition(consumer, TopicPartition(topic, p), bounds[p], per_partition_cap, tally, poll_timeout_s)
    finally:
        consumer.close()

    files = read_log_files(log_dirs or [], topic, len(partitions))
    return _measurement(topic, configs, len(partitions), bounds, tally, files, started)


def _scan_partition(
    consumer: Consumer,
    partition: TopicPartition,
    bounds: tuple[int, int],
    cap: int,
    tally: _ScanTally,
    poll_timeout_s: float,
) -> None:
    """Counts ``partition``'s records from its low watermark to its high one (``bounds``), at most ``cap`` of
    them (``tally.complete`` False when it stops there)."""
    topic, p = partition.topic, partition.partition
    low, high = bounds
    if high <= low:
        return
    consumer.assign([TopicPartition(topic, p, low)])
    read = 0
    while True:
        msg = consumer.poll(poll_timeout_s)
        if msg is None:
            raise TimeoutError(f"scanning {topic}[{p}]: no data for {poll_timeout_s}s before offset {high}")
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                break
            raise RuntimeError(f"scanning {topic}[{p}]: {msg.error()}")
        tally.count(p, msg.key() or b"", msg.value(), msg.timestamp()[1])
        read += 1
        if msg.offset() + 1 >= high:
            break
        if read >= cap:
            tally.complete = False
            break


def _measurement(
    topic: str,
    configs: dict,
    partitions: int,
    bounds: dict[int, tuple[int, int]],
    tally: _ScanTally,
    files: LogFiles | None,
    started: float,
) -> ChangelogMeasurement:
    """The measurement from the scan's counts and, when they were here, the log files (else the scan's estimates)."""
    live = [(k, v) for k, v in tally.latest.items() if k[1] != MARKER_KEY and not v[1]]
    offset_span = sum(high - low for low, high in bounds.values())
    scan_dirty = tally.obsolete / tally.records if tally.records else 0.0
    oldest = tally.oldest_obsolete_ms
    return ChangelogMeasurement(
        topic=topic,
        measured_at=dt.datetime.now(dt.timezone.utc),
        partitions=partitions,
        configs={name: configs[name].value for name in TUNED_CONFIGS if name in configs},
        overridden=sorted(name for name, value in configs.items() if not value.is_default),
        offset_span=offset_span,
        records=tally.records if tally.complete else offset_span,
        scan_complete=tally.complete,
        live_keys=len(live),
        live_bytes=sum(v[2] for _, v in live),
        tombstones=sum(1 for v in tally.latest.values() if v[1]),
        markers=tally.markers,
        obsolete=tally.obsolete,
        history_records=tally.history,
        oldest_obsolete_age_ms=None if oldest is None else max(0, tally.now_ms - oldest),
        bytes=files.bytes if files else tally.scanned_bytes,
        bytes_source="log_dirs" if files else "scan",
        segments=files.segments if files else None,
        active_segment_bytes=files.active_segment_bytes if files else None,
        dirty_ratio=round(files.dirty_ratio if files else scan_dirty, 4),
        dirty_ratio_source="log_dirs" if files else "scan",
        write_bytes_per_s=round(tally.recent_bytes / 3600 / max(partitions, 1), 3),
        scan_seconds=round(time.monotonic() - started, 3),
    )


def describe_measurement(m: ChangelogMeasurement) -> str:
    """One line for a task log."""
    age = "-" if m.oldest_obsolete_age_ms is None else f"{m.oldest_obsolete_age_ms / 1000:.0f}s"
    return (
        f"{m.topic}: {m.records:,} records ({m.bytes:,} B, {m.bytes_source}) for {m.live_keys:,} live keys "
        f"= replay ratio {m.replay_ratio:.1f}; {m.tombstones} tombstones, {m.obsolete:,} obsolete "
        f"({m.history_records:,} kept as history), dirty ratio {m.dirty_ratio:.2f} ({m.dirty_ratio_source}), "
        f"oldest removable {age}" + ("" if m.scan_complete else " [scan truncated]")
    )
