"""Answers state queries from the live view or the standby, and says which and how fresh.

The choice, per query (Kafka Streams 2.5+: query the active, fall back to a standby while it restores):

1. the job version's driver holds its lease and reports RUNNING -> the live view, if it is ready
   within ``state_api_timeout_s`` (the first query of a store waits up to ``state_api_first_load_s``:
   its view is being built, the snapshot read and the changelog caught up, which takes seconds on a
   loaded machine; a stale standby answer would be the wrong one to give then);
2. otherwise (job down, restoring, live view loading or failed) -> the standby snapshot, with the
   reason in ``fallback_reason``.

Every answer carries ``batch_id`` (the job's micro-batch the state is at), ``as_of`` (every change the
job wrote to the changelog before this time is included) and ``staleness_ms`` (how far ``as_of`` is
behind now; 0 for a standby that already holds everything in the changelog).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import time

from streamstate.state_api.keys import InvalidKey, KeySchema
from streamstate.state_api.views import LiveView, StandbyView, StateTable

from runtime.settings import Settings
from spark_jobs.driver.lifecycle import current_state, observe_standby
from spark_jobs.layout import JobLayout
from spark_jobs.registry import JobSpec, JobSpecError, StoreSpec, get_job, registered_versions, store
from spark_jobs.state.changelog_reader import last_complete_batch
from spark_jobs.state.snapshots import SnapshotInfo, SnapshotStore
from spark_jobs.versions import JobVersions

#: a live view nobody queried for this long is stopped (its memory freed); the next query rebuilds it
LIVE_VIEW_IDLE_S = 600
#: seconds before an unreachable broker is asked again for a changelog's last complete batch
KAFKA_RETRY_S = 30.0


class UnknownStore(LookupError):
    """Not a registered job, version or store; the message lists what is."""


@dataclasses.dataclass
class Source:
    """Where an answer came from, and how fresh it is."""

    source: str  # "live" | "standby"
    fallback_reason: str | None
    job_state: str
    batch_id: int | None
    snapshot_version: int | None
    as_of_ms: int | None
    staleness_ms: int | None
    table: StateTable

    def describe(self) -> dict:
        return {
            "source": self.source,
            "fallback_reason": self.fallback_reason,
            "job_state": self.job_state,
            "batch_id": self.batch_id,
            "snapshot_version": self.snapshot_version,
            "as_of": _iso(self.as_of_ms),
            "staleness_ms": self.staleness_ms,
        }


def _iso(ms: int | None) -> str | None:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds") if ms else None


def decode_value(raw: str | None):
    """Changelog values are JSON documents; anything else is returned as the string it is."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class StateQueryService:
    """The live views and standby views of every queried store, and the choice between them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._live: dict[tuple[str, str], LiveView] = {}
        self._standby: dict[tuple[str, str], StandbyView] = {}
        #: changelog topic -> (when read, its last complete batch id)
        #: changelog topic -> (when asked, its last complete batch, whether Kafka failed to answer)
        self._last_complete: dict[str, tuple[float, int | None, bool]] = {}
        self._lock = threading.Lock()

    # ----- addressing ------------------------------------------------------------------------
    def resolve(self, job: str, store_name: str, version: int | None = None) -> tuple[JobSpec, StoreSpec]:
        """The registered job version (default: the one serving readers) and store, or :class:`UnknownStore`."""
        try:
            spec = get_job(job, version) if version is not None else JobVersions(self.settings).current_spec(job)
            return spec, store(spec, store_name)
        except JobSpecError as err:
            raise UnknownStore(str(err)) from None

    def catalog(self) -> list[dict]:
        pointer = JobVersions(self.settings)
        jobs = []
        for name, versions in registered_versions().items():
            current = pointer.current_spec(name)
            jobs.append(
                {
                    "job": name,
                    "current_version": current.version,
                    "versions": list(versions),
                    "stores": [
                        {"store": s.name, "kind": s.kind, "key": KeySchema.of(current, s).describe()}
                        for s in current.stores
                    ],
                }
            )
        return jobs

    # ----- reading -----------------------------------------------------------------------------
    def source(self, spec: JobSpec, store_spec: StoreSpec) -> Source:
        """The copy to answer from now (see the module docstring)."""
        key = (spec.application_id, store_spec.name)
        state = current_state(self.settings.status_dir, spec.application_id)
        if state == "RUNNING":
            view = self._live_view(spec, store_spec)
            timeout_s = self.settings.state_api_timeout_s
            if view.wait_ready(timeout_s if view.loaded_once else max(timeout_s, self.settings.state_api_first_load_s)):
                with view.lock:
                    table, batch_id, as_of = view.table, view.batch_id, view.as_of_ms
                return Source("live", None, state, batch_id, None, as_of, max(0, _now_ms() - as_of), table)
            reason = "live_view_failed" if view.error else "timeout"
        else:
            reason = "restoring" if state == "RESTORING" else "job_not_running"
        with self._lock:
            standby = self._standby.setdefault(key, StandbyView(self._snapshots(spec, store_spec)))
        snapshot, table = standby.current()
        if snapshot is None:
            return Source("standby", reason, state, None, None, None, None, table)
        as_of = snapshot.as_of_ms or int(dt.datetime.fromisoformat(snapshot.taken_at).timestamp() * 1000)
        return Source(
            "standby",
            reason,
            state,
            snapshot.batch_id,
            snapshot.delta_version,
            as_of,
            self._standby_staleness(spec, store_spec, snapshot, as_of),
            table,
        )

    def _standby_staleness(self, spec: JobSpec, store_spec: StoreSpec, snapshot: SnapshotInfo, as_of: int) -> int:
        """0 when the snapshot holds every batch complete in the changelog, else how old ``as_of`` is. (By
        batch, not offset: the changelog's last offset may be a transaction's commit marker, no record.)"""
        try:
            last = self._last_complete_batch(JobLayout.of(spec, self.settings).changelog_topic(store_spec.name))
        except Exception:  # Kafka down: the standby still answers; its staleness is then an upper bound
            last = None
        if last is not None and snapshot.batch_id is not None and snapshot.batch_id >= last:
            return 0
        return max(0, _now_ms() - as_of)

    def _last_complete_batch(self, topic: str) -> int | None:
        """The changelog's last complete batch, asked of Kafka at most once a second. An unreachable broker
        is asked again only after ``KAFKA_RETRY_S``, each time for at most the query timeout: during a Kafka
        outage the standby answers at once, not after the client's timeouts on every request."""
        cached = self._last_complete.get(topic)
        if cached and time.monotonic() - cached[0] < (KAFKA_RETRY_S if cached[2] else 1.0):
            return cached[1]
        try:
            marker = last_complete_batch(self.settings.kafka, topic, timeout_s=self.settings.state_api_timeout_s)
        except Exception:
            self._last_complete[topic] = (time.monotonic(), None, True)
            raise
        last = marker.batch_id if marker is not None else None
        self._last_complete[topic] = (time.monotonic(), last, False)
        return last

    def _live_view(self, spec: JobSpec, store_spec: StoreSpec) -> LiveView:
        key = (spec.application_id, store_spec.name)
        with self._lock:
            for other_key, other in list(self._live.items()):
                if not other.alive or time.monotonic() - other.last_used > LIVE_VIEW_IDLE_S:
                    other.stop()
                    del self._live[other_key]
            view = self._live.get(key)
            if view is None:
                view = LiveView(
                    self._snapshots(spec, store_spec),
                    self.settings.kafka,
                    JobLayout.of(spec, self.settings).changelog_topic(store_spec.name),
                )
                self._live[key] = view
            return view

    def _snapshots(self, spec: JobSpec, store_spec: StoreSpec) -> SnapshotStore:
        return SnapshotStore.of(JobLayout.of(spec, self.settings), store_spec.name)

    # ----- answers ------------------------------------------------------------------------------
    def get(
        self,
        spec: JobSpec,
        store_spec: StoreSpec,
        key: str,
        window_start: int | None = None,
        valid_at: int | None = None,
    ) -> dict:
        """One key's stored value; with ``valid_at`` (epoch ms, versioned stores) the version valid then."""
        schema = KeySchema.of(spec, store_spec)
        stored_key = schema.encode(key, window_start)
        if valid_at is not None and store_spec.kind != "versioned":
            raise InvalidKey(f"valid_at applies to versioned stores only; {store_spec.name!r} is {store_spec.kind}")
        source = self.source(spec, store_spec)
        value = decode_value(source.table.get(stored_key))
        if valid_at is not None and isinstance(value, dict):
            from spark_jobs.primitives.versioned import version_valid_at  # (imports pyspark: only when asked)

            value = version_valid_at(value, valid_at)
        return {
            "job": spec.name,
            "version": spec.version,
            "store": store_spec.name,
            "key": schema.decode(stored_key),
            "found": value is not None,
            "value": value,
            **source.describe(),
        }

    def scan(
        self,
        spec: JobSpec,
        store_spec: StoreSpec,
        *,
        prefix: str | None,
        start: str | None,
        end: str | None,
        after: str | None,
        limit: int,
    ) -> dict:
        schema = KeySchema.of(spec, store_spec)
        for what, text in (("prefix", prefix), ("start", start), ("end", end)):
            if text is not None:
                KeySchema(schema.field).validate_text(text, what)  # bounds may hold the window separator
        source = self.source(spec, store_spec)
        items, last = source.table.scan(start=start, end=end, prefix=prefix, after=after, limit=limit)
        return {
            "job": spec.name,
            "version": spec.version,
            "store": store_spec.name,
            "items": [{"key": schema.decode(k), "value": decode_value(v)} for k, v in items],
            "next_after": last,
            **source.describe(),
        }

    def describe_store(self, spec: JobSpec, store_spec: StoreSpec) -> dict:
        source = self.source(spec, store_spec)
        standby = observe_standby(self.settings.status_dir, spec.application_id)
        follower = standby.status
        store_view = follower.stores.get(store_spec.name) if follower else None
        return {
            "job": spec.name,
            "version": spec.version,
            "application_id": spec.application_id,
            "store": store_spec.name,
            "kind": store_spec.kind,
            "key": KeySchema.of(spec, store_spec).describe(),
            "changelog_topic": JobLayout.of(spec, self.settings).changelog_topic(store_spec.name),
            "keys": len(source.table),
            "standby": {
                "follower_running": standby.alive,
                "follower_state": follower.state.value if follower else None,
                "lag_ms": store_view.lag_ms if store_view else None,
                "max_lag_ms": follower.max_lag_ms if follower else None,
            },
            **source.describe(),
        }

    def close(self) -> None:
        with self._lock:
            for view in self._live.values():
                view.stop(wait_s=5.0)
            self._live.clear()


def _now_ms() -> int:
    return int(time.time() * 1000)
