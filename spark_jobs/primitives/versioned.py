"""The versioned primitive: per key, the latest version by event time and the history within the store's
retention, as Kafka Streams' ``VersionedKeyValueStore`` keeps it; its outputs are the latest versions.

Semantics (``streamstate.primitives.VersionedLatest``, Java): versions order by their time, ties by their
id, so the latest never depends on arrival order; the same id again replaces that version (a replayed
record changes nothing); a version older than the latest only enters the history, and one older than
the retention keeps changes nothing. "As of" reads (the state API's ``valid_at``) take the history's
version valid at the time asked (:func:`version_valid_at`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from spark_jobs.io import dead_letter
from spark_jobs.primitives.events import JsonEvents
from spark_jobs.primitives.pipeline import StoreDeclaration
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec
from spark_jobs.state.store_changes import TOMBSTONE

HISTORY = "history"


@dataclasses.dataclass(frozen=True)
class VersionedLatest(StoreDeclaration):
    """A job whose store keeps, per key, the latest version by event time and its history.

    Attributes:
        store: a ``versioned`` ``StoreSpec``; its ``retention_ms`` is how much history is kept.
        events: the job's input.
        values: the stored version's fields, in order: stored name -> event field. The outputs are the
            job's ``key_field`` and these fields of each key's latest version.
        time: the stored name of the version's time (a TIMESTAMP field of ``values``).
        version_id: the stored name of the field that identifies a version (a string field of ``values``).
        summaries: companion outputs recomputed from the outputs after every batch.

    Records without a valid time or id are dead letters (rules added after the job's own).
    """

    store: str
    events: JsonEvents
    values: Mapping[str, str]
    time: str
    version_id: str
    summaries: Mapping[str, str] = dataclasses.field(default_factory=dict)
    store_kinds: ClassVar[tuple[str, ...]] = ("versioned",)

    def _stored_type(self, name: str) -> str:
        field = self.values[name]
        if field not in self.events.schema.fieldNames():
            raise JobSpecError(f"values.{name}: {field!r} is not a field of the event schema")
        return self.events.schema[field].dataType.simpleString().upper()

    @property
    def state_ddl(self) -> str:
        """The latest version's fields, then ``history`` (versions oldest first: the time, then the others)."""
        fields = [f"{name} {self._stored_type(name)}" for name in self.values]
        ordered = [self.time, *(name for name in self.values if name != self.time)]
        version = ", ".join(f"{name}: {self._stored_type(name)}" for name in ordered)
        return ", ".join([*fields, f"{HISTORY} ARRAY<STRUCT<{version}>>"])

    @property
    def output_values(self) -> tuple[str, ...]:
        return tuple(self.values)

    def check_primitive(self, spec: JobSpec) -> None:
        for name in self.values:
            if name in ("key", TOMBSTONE, HISTORY, spec.key_field):
                raise JobSpecError(f"values.{name}: not key, {TOMBSTONE}, {HISTORY} or the key field")
        for role, name, wanted in (("time", self.time, "TIMESTAMP"), ("version_id", self.version_id, "STRING")):
            if name not in self.values:
                raise JobSpecError(f"{role}: {name!r} is not one of values {sorted(self.values)}")
            if self._stored_type(name) != wanted:
                raise JobSpecError(f"{role}: {name!r} must be a {wanted} field, not {self._stored_type(name)}")
        self.state_ddl  # noqa: B018 - raises on a value that is not an event field

    def rules(self) -> list:
        """What the processor cannot do without: a time and an id (checked after the job's own rules)."""
        time_field, id_field = self.values[self.time], self.values[self.version_id]
        return [
            (dead_letter.bad_event_time(time_field), f"{time_field} is not a time between 1970 and 2200"),
            (dead_letter.event(id_field).isNull(), f"{id_field} is missing"),
        ]

    def classify(self, source, key_field: str):
        return self.events.classify(source, key_field, extra_rules=self.rules())

    def changes(self, events, key_field: str, initial, store: StoreSpec, job: str = "?", offset_ordered: bool = False):
        """The store's change rows for ``events`` (a job's processor input), seeded with ``initial``."""
        from pyspark.sql import DataFrame
        from pyspark.sql import functions as F

        letter = [dead_letter.LETTER_COLUMN] if dead_letter.LETTER_COLUMN in events.columns else []
        needed = events.select(key_field, *(F.col(f).alias(name) for name, f in self.values.items()), *letter)
        spark = events.sparkSession
        jdf = spark._jvm.streamstate.primitives.VersionedLatest.changes(
            needed._jdf,
            key_field,
            None if initial is None else initial._jdf,
            self.store,
            self.state_ddl,
            self.change_ddl,
            store.retention_ms,
            self.time,
            self.version_id,
        )
        return DataFrame(jdf, spark)


def version_valid_at(value: dict, at_ms: int) -> dict | None:
    """The version of a stored value (a changelog value, decoded: the latest version's fields and
    ``history``) valid at ``at_ms`` (epoch ms): the history's last version whose time is at or before it
    (versions are oldest first, each its time then its other fields; ties in time are ordered by id, so
    the last is the one that counts). None when no retained version was valid then."""
    import datetime as dt

    def millis(version: dict) -> int:
        time = next(iter(version.values()))
        return int(dt.datetime.fromisoformat(str(time).replace("Z", "+00:00")).timestamp() * 1000)

    valid = [version for version in value.get(HISTORY) or () if millis(version) <= at_ms]
    return valid[-1] if valid else None
