"""Which version of a job serves readers: the version pointer, an append-only Delta table.

A job can have several versions registered and even running (side-by-side reprocessing), each with
its own output tables (``<output_table>_v<N>``). Readers must not guess: they ask this module for the
*current* version's output (:func:`current_output_path`, :func:`read_current_output`), and supervision
keeps the current version running. The pointer moves only by promotion (``promote_job_version``
DAG) and the table keeps every move (who, when, which run), so "what did readers see on Tuesday" has
an answer.

The table lives in the lake (``<lake>/_streamstate/job_versions``) next to the outputs it points at,
so any Delta reader can join it. It is read and written with delta-rs (no JVM): Airflow tasks use it
on every supervision check.

Before a job was ever promoted, its current version is the newest registered one; the first launch
*adopts* that version in the table, so registering a newer version later does not silently switch
readers (only a promotion does).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path

from runtime.object_store import Location
from runtime.settings import Settings
from spark_jobs.registry import JobSpec, get_job

PROMOTED, ADOPTED, RETIRED, PURGED = "promoted", "adopted", "retired", "purged"

_SCHEMA_FIELDS = (
    ("job", "string"),
    ("version", "int64"),
    ("event", "string"),
    ("at", "timestamp"),
    ("by", "string"),
    ("run_id", "string"),
    ("retain_until", "timestamp"),
    ("note", "string"),
)


def platform_table(settings: Settings, name: str) -> Location:
    """A table the platform itself keeps (version pointer, audit log, reprocessing reports)."""
    return settings.lake / "_streamstate" / name


@dataclasses.dataclass(frozen=True)
class VersionEvent:
    job: str
    version: int
    event: str
    at: dt.datetime
    by: str
    run_id: str | None = None
    retain_until: dt.datetime | None = None
    note: str | None = None


def _arrow_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.schema([pa.field(name, types[kind]) for name, kind in _SCHEMA_FIELDS])


def append_rows(table: Location, rows: list[dict], schema) -> None:
    """Append rows to a Delta table (created on first write). Appends never conflict with each other."""
    import pyarrow as pa
    from deltalake import write_deltalake

    options = table.storage_options()
    write_deltalake(str(table), pa.Table.from_pylist(rows, schema=schema), mode="append", storage_options=options)


def read_rows(table: Location | str | Path) -> list[dict]:
    """Every row of a Delta table (none when it does not exist); a path or URI names a local table or one
    in no configured object store, a :class:`Location` carries its store's credentials."""
    from deltalake import DeltaTable

    table = Location.of(table)
    options = table.storage_options()
    if not DeltaTable.is_deltatable(str(table), storage_options=options):
        return []
    return DeltaTable(str(table), storage_options=options).to_pyarrow_table().to_pylist()


class JobVersions:
    """The version pointer of every job on this deployment."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = platform_table(settings, "job_versions")

    def history(self, job: str | None = None) -> list[VersionEvent]:
        events = [VersionEvent(**row) for row in read_rows(self.path) if job is None or row["job"] == job]
        return sorted(events, key=lambda e: e.at)

    def current(self, job: str) -> int | None:
        """The promoted (or adopted) version, None when the job was never launched or promoted."""
        pointers = [e for e in self.history(job) if e.event in (PROMOTED, ADOPTED)]
        return pointers[-1].version if pointers else None

    def current_spec(self, job: str, *, adopt_by: str | None = None) -> JobSpec:
        """The current version's spec; without a pointer, the newest registered version (adopted in
        the table when ``adopt_by`` names who is launching it)."""
        version = self.current(job)
        if version is not None:
            return get_job(job, version)
        spec = get_job(job)
        if adopt_by:
            self._append(spec.name, spec.version, ADOPTED, adopt_by, note="first launch: newest registered version")
        return spec

    def promote(self, job: str, version: int, *, by: str, run_id: str | None = None, note: str | None = None) -> bool:
        """Make ``version`` the one readers and supervision use. Idempotent: False when it already is."""
        get_job(job, version)  # must be registered
        if self.current(job) == version:
            return False
        self._append(job, version, PROMOTED, by, run_id=run_id, note=note)
        return True

    def retire(self, job: str, version: int, *, by: str, retain_until: dt.datetime, run_id: str | None = None) -> bool:
        """Record that ``version`` stopped serving and when its data may go. Idempotent."""
        if self.current(job) == version:
            raise ValueError(f"{job} v{version} is the current version; promote another one before retiring it")
        if any(e.event == RETIRED and e.version == version for e in _since_pointer(self.history(job))):
            return False
        self._append(job, version, RETIRED, by, run_id=run_id, retain_until=retain_until)
        return True

    def unfinished_promotion(self, job: str) -> int | None:
        """The version the latest promotion replaced, while it is not retired yet: a promotion run that
        died after moving the pointer (before stopping and retiring the old version) left it so, and a
        re-run must finish that work rather than find "nothing to do"."""
        history = self.history(job)
        pointers = [e for e in history if e.event in (PROMOTED, ADOPTED)]
        if len(pointers) < 2 or pointers[-1].event != PROMOTED or pointers[-2].version == pointers[-1].version:
            return None
        previous = pointers[-2].version
        return None if any(e.event == RETIRED and e.version == previous for e in _since_pointer(history)) else previous

    def retired(self, job: str | None = None) -> list[VersionEvent]:
        """Retired versions whose data has not been purged yet, each by its latest retirement; a version
        promoted back (a rollback) after its retirement is not retired any more."""
        latest: dict[tuple[str, int], VersionEvent] = {}
        for e in self.history(job):
            if e.event == RETIRED:
                latest[(e.job, e.version)] = e
            elif e.event in (PROMOTED, ADOPTED, PURGED):
                latest.pop((e.job, e.version), None)
        return sorted(latest.values(), key=lambda e: e.at)

    def mark_purged(self, job: str, version: int, *, by: str, run_id: str | None = None) -> None:
        self._append(job, version, PURGED, by, run_id=run_id)

    def _append(self, job: str, version: int, event: str, by: str, **extra) -> None:
        row = {
            "job": job,
            "version": version,
            "event": event,
            "at": dt.datetime.now(dt.timezone.utc),
            "by": by,
            "run_id": None,
            "retain_until": None,
            "note": None,
            **extra,
        }
        append_rows(self.path, [row], _arrow_schema())


def _since_pointer(history: list[VersionEvent]) -> list[VersionEvent]:
    """Events from the latest promotion (or adoption) on."""
    last = max((i for i, e in enumerate(history) if e.event in (PROMOTED, ADOPTED)), default=0)
    return history[last:]


def current_output_path(settings: Settings, job: str, table: str | None = None) -> str:
    """Where readers find ``job``'s output now (``table``: a companion output's name)."""
    spec = JobVersions(settings).current_spec(job)
    dirs = dict(zip(("", *spec.companion_outputs), spec.output_table_dirs, strict=True))
    if (table or "") not in dirs:
        raise ValueError(f"{job} has no output {table!r}; outputs: {[n or 'main' for n in dirs]}")
    return str(settings.lake / dirs[table or ""])


def read_current_output(spark, settings: Settings, job: str, table: str | None = None):
    """The current version's output as a Spark DataFrame (what dashboards and downstream jobs read)."""
    return spark.read.format("delta").load(current_output_path(settings, job, table))
