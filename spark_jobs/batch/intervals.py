"""What a batch step reads and replaces for one data interval: rules only, no I/O.

Rules:

1. **An interval is settled** ``settle`` after its end: by then the streaming jobs it reads have had the
   time to close its windows (their grace) and to write them (a trigger or two). A run for an interval that
   is not settled yet is refused; the DAG waits for it (a deferred sensor, no worker slot).
2. **Each input is read as of the settle time**, through Delta time travel: the newest commit of the input
   table at or before it. A rerun of the interval then reads the same data however much the stream wrote
   since, so it writes the same rows.
3. **An input written after the settle time** (no commit at or before it: history loaded later, a
   reprocessed version's fresh table) is read at its newest commit when the run starts, and the run
   records that it did. For windows that closed before, that is the same answer.
4. **A query names the interval** ``:interval_start`` and ``:interval_end`` (TIMESTAMPs; bound before Spark
   parses it, as literals: named parameters do not reach Spark's binder through Delta's SQL parser).
5. **The output is replaced per interval**: a run overwrites exactly the rows of its interval (the output
   table is partitioned by ``interval_start``, and the write replaces that partition), so a rerun or a
   backfill never duplicates and never touches another interval.

:func:`plan_reads` applies 2 and 3 to the commits of each input; :class:`Interval` gives 1, 4 and 5.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Literal

#: how an input's commit was chosen (rule 2 or rule 3)
ReadRule = Literal["as_of_settle_time", "written_after_settle_time"]


class BatchIntervalError(ValueError):
    """An interval cannot be run (yet): the message says which and when it can."""


@dataclasses.dataclass(frozen=True)
class Commit:
    """One commit of a Delta table: its version and when it was committed (UTC)."""

    version: int
    timestamp: dt.datetime


@dataclasses.dataclass(frozen=True)
class InputRead:
    """Which commit of an input table a run reads, and by which rule."""

    table: str
    version: int
    committed_at: dt.datetime
    rule: ReadRule


@dataclasses.dataclass(frozen=True)
class Interval:
    """A data interval ``[start, end)`` (Airflow's ``data_interval_start`` / ``data_interval_end``), UTC."""

    start: dt.datetime
    end: dt.datetime

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            if getattr(self, name).tzinfo is None:
                raise BatchIntervalError(f"interval {name} {getattr(self, name)} needs a time zone")
        if self.end <= self.start:
            raise BatchIntervalError(f"interval [{self.start}, {self.end}) is empty")

    @classmethod
    def parse(cls, start: str, end: str) -> Interval:
        """From ISO 8601 times (``Z`` or an offset)."""
        return cls(*(dt.datetime.fromisoformat(t.replace("Z", "+00:00")).astimezone(dt.UTC) for t in (start, end)))

    def settled_at(self, settle: dt.timedelta) -> dt.datetime:
        """Rule 1: when the interval's inputs are final."""
        return self.end + settle

    def check_settled(self, settle: dt.timedelta, now: dt.datetime) -> None:
        """Rule 1: refuse a run before the interval settled."""
        if now < self.settled_at(settle):
            raise BatchIntervalError(
                f"interval [{self.start.isoformat()}, {self.end.isoformat()}) settles at "
                f"{self.settled_at(settle).isoformat()} (its end + {settle}); it is {now.isoformat()}"
            )

    def bind(self, sql: str) -> str:
        """Rule 4: ``sql`` with ``:interval_start`` and ``:interval_end`` (outside string literals) as TIMESTAMP literals."""
        values = {"interval_start": _timestamp(self.start), "interval_end": _timestamp(self.end)}
        return _MARKER.sub(lambda m: values[m.group(1)] if m.group(1) else m.group(0), sql)

    @property
    def replace_where(self) -> str:
        """Rule 5: the predicate of the rows a run replaces (Delta's ``replaceWhere``)."""
        return f"interval_start = {_timestamp(self.start)}"


#: a string literal (left as it is) or an interval marker
_MARKER = re.compile(r"'(?:[^'\\]|\\.|'')*'|:(interval_start|interval_end)\b")


def _timestamp(at: dt.datetime) -> str:
    return f"TIMESTAMP '{at.astimezone(dt.UTC).strftime('%Y-%m-%d %H:%M:%S.%f')}'"


def plan_reads(commits: Mapping[str, Sequence[Commit]], settled_at: dt.datetime) -> dict[str, InputRead]:
    """Rules 2 and 3: for each input table (name -> its commits), the commit the run reads."""
    reads = {}
    for table, history in commits.items():
        if not history:
            raise BatchIntervalError(f"input {table} has no commit: its job has written nothing yet")
        before = [c for c in history if c.timestamp <= settled_at]
        if before:
            chosen, rule = max(before, key=lambda c: c.version), "as_of_settle_time"
        else:
            chosen, rule = max(history, key=lambda c: c.version), "written_after_settle_time"
        reads[table] = InputRead(table, chosen.version, chosen.timestamp, rule)
    return reads
