"""A job's input, declared: JSON records with a key field, an optional ``type`` vocabulary and rules."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

from pyspark.sql import types as T

from spark_jobs.io import dead_letter
from spark_jobs.registry import InputKind, JobSpecError


@dataclasses.dataclass(frozen=True)
class JsonEvents:
    """The source topic's records: JSON objects decoded to ``schema``, classified by
    :func:`spark_jobs.io.dead_letter.classify_events`. A record without the job's key, with a ``type`` not in
    ``types``, or breaking one of ``rules`` goes to the job's dead-letter topic, named with why.

    Attributes:
        schema: the event's fields (a ``StructType``); the job's ``key_field`` must be a string field.
        types: the values the ``type`` field may take (empty: the events have no ``type`` to check).
        rules: a function returning ``(condition, message)`` pairs over :func:`spark_jobs.io.dead_letter.event`
            fields, checked in order: the first condition that holds rejects the record with its message.
            A function because Spark columns can only be built once Spark runs (a declaration is imported
            by Airflow too).
    """

    schema: T.StructType
    types: tuple[str, ...] = ()
    rules: Callable[[], Sequence[tuple[object, object]]] | None = None
    input_kind: ClassVar[InputKind] = "stream"

    def check(self, job: str, key_field: str) -> None:
        """Refuse a declaration that cannot run, naming the job and the field."""
        if key_field not in self.schema.fieldNames():
            raise JobSpecError(f"job {job}: key_field {key_field!r} is not a field of the event schema")
        if not isinstance(self.schema[key_field].dataType, T.StringType):
            raise JobSpecError(f"job {job}: key_field {key_field!r} must be a string field of the event schema")
        if self.types and "type" not in self.schema.fieldNames():
            raise JobSpecError(f"job {job}: events.types needs a 'type' field in the event schema")

    def classify(self, source, key_field: str, extra_rules: Sequence[tuple[object, object]] = ()):
        """``source`` (the Kafka source DataFrame) decoded and classified (see :func:`dead_letter.classify`):
        ``rules``, then ``extra_rules`` (a primitive's own needs)."""
        rules = [*(self.rules() if self.rules else ()), *extra_rules]
        return dead_letter.classify_events(source, self.schema, key_field, self.types or None, invalid=rules or None)
