"""Where reprocessing starts in the input: Kafka Streams' reset-tool positions, resolved to offsets.

The reset tool takes ``--to-earliest``, ``--to-datetime``, ``--by-duration`` and ``--to-offset``; the
trigger form takes the same four. Whatever the form says, the plan carries *explicit* offsets per
partition, resolved once when the plan is made: the dry run shows exactly what a real run does, and
a retried step reuses the plan instead of resolving "6 hours ago" a second time.

A job with several inputs (a join) gets a start per input topic (:meth:`StartPosition.resolve_inputs`): the
position applies to its **streams**; a **table** (an upsert topic, ``JobSpec.input_kinds``) is read from its
earliest offset whatever the position, because the topic as a whole is the table: started at "6 hours ago" it
would lack every row last changed before then, and a stream event joined to it would miss its row. (Kafka
Streams' reset tool moves every input topic alike; a table's topic then loses its old rows the same way.)
Explicit offsets name their topic when a job has two streams: ``{"orders": {"0": 120}, "payments": {"0": 95}}``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Mapping

from runtime.kafka_connection import KafkaTarget
from spark_jobs.io.kafka_topics import offsets_for_time, partition_offsets
from spark_jobs.registry import InputKind
from spark_jobs.state.checkpoint_offsets import KafkaOffsets

EARLIEST, DATETIME, DURATION, OFFSETS = "earliest", "datetime", "duration", "offsets"
KINDS = (EARLIEST, DATETIME, DURATION, OFFSETS)

_DURATION = re.compile(r"^\s*(\d+)\s*(s|m|h|d)\s*$")
_ISO_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class BadStartPosition(ValueError):
    """The requested start position cannot be used; the message says why and what would work."""


def parse_duration(text: str) -> dt.timedelta:
    """``"6h"``, ``"90m"``, ``"2d"``, ``"30s"`` or ISO 8601 ``"PT6H"`` / ``"P1DT2H"``."""
    text = (text or "").strip()
    if match := _DURATION.match(text):
        seconds = int(match.group(1)) * _UNITS[match.group(2)]
    elif (match := _ISO_DURATION.match(text.upper())) and any(match.groups()):
        days, hours, minutes, secs = (int(g or 0) for g in match.groups())
        seconds = ((days * 24 + hours) * 60 + minutes) * 60 + secs
    else:
        raise BadStartPosition(f"duration {text!r}: expected e.g. 6h, 90m, 2d, 30s or PT6H")
    if seconds <= 0:
        raise BadStartPosition(f"duration {text!r} must be longer than zero")
    return dt.timedelta(seconds=seconds)


def parse_datetime(text: str) -> dt.datetime:
    """An ISO 8601 date-time; without a zone it is UTC (what the Airflow UI shows)."""
    try:
        value = dt.datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadStartPosition(f"date-time {text!r}: expected ISO 8601, e.g. 2026-11-22T09:30:00Z") from None
    return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


@dataclasses.dataclass(frozen=True)
class StartPosition:
    """A requested start position (the trigger form's fields), before resolution."""

    kind: str = EARLIEST
    datetime: str | None = None
    duration: str | None = None
    offsets: Mapping[str, int] | None = None

    @classmethod
    def from_params(cls, params: Mapping) -> StartPosition:
        offsets = params.get("start_offsets")
        if isinstance(offsets, str):
            try:
                offsets = json.loads(offsets) if offsets.strip() else None
            except ValueError:
                raise BadStartPosition(
                    f'start_offsets {offsets!r} is not JSON; expected e.g. {{"0": 120, "1": 95}}'
                ) from None
        return cls(
            kind=params.get("start_from") or EARLIEST,
            datetime=params.get("start_datetime") or None,
            duration=params.get("start_duration") or None,
            offsets=offsets or None,
        )

    def validate(self, now: dt.datetime) -> None:
        """Checks that need no broker: the kind, the field it needs, a date-time in the past."""
        if self.kind not in KINDS:
            raise BadStartPosition(f"start_from {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.kind == DATETIME:
            if not self.datetime:
                raise BadStartPosition("start_from=datetime needs start_datetime")
            at = parse_datetime(self.datetime)
            if at > now:
                raise BadStartPosition(
                    f"start_datetime {at.isoformat()} is in the future (now {now.isoformat(timespec='seconds')})"
                )
        elif self.kind == DURATION:
            if not self.duration:
                raise BadStartPosition("start_from=duration needs start_duration (e.g. 6h)")
            parse_duration(self.duration)
        elif self.kind == OFFSETS:
            if not self.offsets or not isinstance(self.offsets, Mapping):
                raise BadStartPosition('start_from=offsets needs start_offsets, e.g. {"0": 120, "1": 95}')
            for offsets in self.offsets.values() if self.names_topics else (self.offsets,):
                if not isinstance(offsets, Mapping):
                    raise BadStartPosition(
                        'start_offsets: name every topic\'s offsets, e.g. {"orders": {"0": 120}, "payments": {"0": 95}}'
                    )
                _check_partition_offsets(offsets)

    @property
    def names_topics(self) -> bool:
        """Explicit offsets given per topic (``{"orders": {"0": 120}}``) rather than per partition."""
        return bool(self.offsets) and any(not str(name).isdigit() for name in self.offsets)

    def describe(self) -> str:
        return {
            EARLIEST: "earliest",
            DATETIME: f"records from {self.datetime}",
            DURATION: f"the last {self.duration}",
            OFFSETS: f"offsets {dict(self.offsets or {})}",
        }.get(self.kind, self.kind)

    def resolve(
        self, kafka: KafkaTarget, topic: str, now: dt.datetime, *, accept_history_gap: bool = False
    ) -> tuple[dict[int, int], dict[int, int]]:
        """(partition -> first offset to process, partition -> records the source no longer holds
        before it). Validates against the topic as it is now.

        A start older than what a partition still holds (retention deleted the head of its log) would
        build the new state on partial history: refused, unless ``accept_history_gap``; then the start
        is the partition's first offset and the gap is returned (for a date-time, the records deleted
        are an upper bound: some may be older than the date-time).

        Raises:
            BadStartPosition: the topic is missing, a partition does not exist, an offset is beyond
                what the partition holds, a date-time is in the future, or a history gap not accepted.
        """
        offsets, gaps = self._resolve(kafka, topic, now)
        if gaps and not accept_history_gap:
            lost = ", ".join(
                f"partition {p}: up to {n} records before offset {offsets[p]}" for p, n in sorted(gaps.items())
            )
            raise BadStartPosition(
                f"{topic} no longer holds the start of {self.describe()} ({lost}: deleted by "
                "retention); reprocessing from here builds state on partial history. Choose a "
                "later start, or set accept_history_gap to proceed and record the gap"
            )
        return offsets, gaps

    def resolve_inputs(
        self,
        kafka: KafkaTarget,
        inputs: Mapping[str, InputKind],
        now: dt.datetime,
        *,
        accept_history_gap: bool = False,
    ) -> tuple[KafkaOffsets, KafkaOffsets]:
        """:meth:`resolve` for each of a job's ``inputs`` (topic -> kind, ``JobSpec.input_kinds``): (topic ->
        partition -> first offset, topic -> partition -> records no longer held before it). A stream starts at
        this position; a table at its earliest offset (see the module docstring), unless explicit offsets name
        it. Explicit offsets for a job with two streams must name their topics.

        Raises:
            BadStartPosition: as :meth:`resolve`, and offsets naming a topic the job does not read, or not
                saying which of two streams they are for.
        """
        self.validate(now)
        streams = [topic for topic, kind in inputs.items() if kind == "stream"]
        if self.kind == OFFSETS:
            if not self.names_topics and len(streams) != 1:
                raise BadStartPosition(
                    f"start_offsets: the job reads {', '.join(inputs)}: name each topic's offsets, e.g. "
                    + json.dumps({topic: {"0": 0} for topic in inputs})
                )
            unknown = sorted(set(self.offsets) - set(inputs)) if self.names_topics else []
            if unknown:
                raise BadStartPosition(f"start_offsets: the job does not read {unknown} (it reads {', '.join(inputs)})")
        starts: KafkaOffsets = {}
        gaps: KafkaOffsets = {}
        for topic, kind in inputs.items():
            position = self._for_input(topic, kind, streams)
            starts[topic], gap = position.resolve(kafka, topic, now, accept_history_gap=accept_history_gap)
            if gap:
                gaps[topic] = gap
        return starts, gaps

    def _for_input(self, topic: str, kind: InputKind, streams: list[str]) -> StartPosition:
        """The position one input starts at (see :meth:`resolve_inputs`)."""
        if self.kind == OFFSETS:
            offsets = self.offsets.get(topic) if self.names_topics else (self.offsets if topic in streams else None)
            return StartPosition(OFFSETS, offsets=offsets) if offsets else StartPosition(EARLIEST)
        return self if kind == "stream" else StartPosition(EARLIEST)

    def _resolve(self, kafka: KafkaTarget, topic: str, now: dt.datetime) -> tuple[dict[int, int], dict[int, int]]:
        self.validate(now)
        try:
            bounds = partition_offsets(kafka, topic)
        except KeyError:
            raise BadStartPosition(f"input topic {topic!r} does not exist") from None
        if self.kind == EARLIEST:  # everything the topic holds, by definition: a deleted head is a plan note
            return {p: low for p, (low, _high) in bounds.items()}, {}
        if self.kind in (DATETIME, DURATION):
            at_ms = (
                int(parse_datetime(self.datetime).timestamp() * 1000)
                if self.kind == DATETIME
                else int(now.timestamp() * 1000) - int(parse_duration(self.duration).total_seconds() * 1000)
            )  # in milliseconds: a duration longer than the calendar's years (before year 1) is still a time
            found = offsets_for_time(kafka, topic, at_ms)  # before 1970: from the first record
            start = {p: max(found[p], bounds[p][0]) for p in bounds}
            # Every record still held is at or after the date-time, and some were deleted: those may
            # have been too (Kafka cannot say when deleted records were written).
            gaps = {p: low for p, (low, _high) in bounds.items() if low > 0 and start[p] == low}
            return start, gaps
        requested = {int(p): int(o) for p, o in self.offsets.items()}
        missing = sorted(set(requested) - set(bounds))
        if missing:
            raise BadStartPosition(
                f"start_offsets: topic {topic!r} has no partition {missing} (it has {sorted(bounds)})"
            )
        gaps = {}
        for p, offset in requested.items():
            low, high = bounds[p]
            if offset > high:
                raise BadStartPosition(f"start_offsets: partition {p} holds offsets {low}..{high}; {offset} is outside")
            if offset < low:
                gaps[p] = low - offset
        # Partitions not named keep the earliest position, like the reset tool's per-partition form.
        return {p: max(requested.get(p, low), low) for p, (low, _high) in bounds.items()}, gaps


def _check_partition_offsets(offsets: Mapping) -> None:
    for partition, offset in offsets.items():
        if not str(partition).isdigit():
            raise BadStartPosition(f"start_offsets: partition {partition!r} is not a partition number")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise BadStartPosition(f"start_offsets: offset {offset!r} of partition {partition} must be an integer >= 0")
