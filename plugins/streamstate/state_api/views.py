"""The two copies of a store the state API reads: the live view and the standby.

**Live** (:class:`LiveView`): the job's committed state. The fast path is the changelog, not the job:
every micro-batch writes its changes and then its markers, so "snapshot + every complete batch of the
changelog" *is* the state of the job's last committed batch. The view loads the standby snapshot once,
then a thread follows the changelog (:class:`~spark_jobs.state.changelog_reader.ChangelogTail`) and
applies each batch as its markers complete it. A lookup is a dict read under a lock (microseconds;
BENCHMARKS.md), the view trails the job by one poll (about 0.2 s), and the job pays nothing: asking
Spark instead (the ``statestore`` data source over the checkpoint) costs a Spark job per lookup (seconds)
and reads RocksDB files the running query is replacing.

**Standby** (:class:`StandbyView`): the store's Delta snapshot table as the warm standby keeps it
(spark_jobs/operations/standby), loaded once per Delta version. It needs neither the job nor Kafka to be up.

Both hold a :class:`StateTable`: a dict for point lookups and a sorted key list, rebuilt only when
the state changed since the last range scan, for range and prefix scans with paging.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time

from confluent_kafka import KafkaException

from runtime.kafka_connection import KafkaTarget
from spark_jobs.io.kafka_topics import is_transient
from spark_jobs.state.changelog_reader import ChangelogTail
from spark_jobs.state.snapshots import SnapshotInfo, SnapshotStore

log = logging.getLogger("streamstate.state_api")


def _now_ms() -> int:
    return int(time.time() * 1000)


class StateTable:
    """Key -> value strings, with ordered scans."""

    def __init__(self, state: dict[str, str] | None = None) -> None:
        self.state: dict[str, str] = state if state is not None else {}
        self._sorted: list[str] | None = None

    def changed(self) -> None:
        self._sorted = None

    def get(self, key: str) -> str | None:
        return self.state.get(key)

    def scan(
        self, *, start: str | None, end: str | None, prefix: str | None, after: str | None, limit: int
    ) -> tuple[list[tuple[str, str]], str | None]:
        """Keys in ``[start, end)`` (or starting with ``prefix``), after ``after``, at most ``limit``.
        Returns (items, the last key when more follow, else None)."""
        if self._sorted is None:
            self._sorted = sorted(self.state)
        keys = self._sorted
        low = start or ""
        if prefix:
            low = max(low, prefix)
        i = bisect.bisect_left(keys, low)
        if after is not None:
            i = max(i, bisect.bisect_right(keys, after))
        items: list[tuple[str, str]] = []
        while i < len(keys) and len(items) <= limit:
            key = keys[i]
            if (end is not None and key >= end) or (prefix and not key.startswith(prefix)):
                break
            value = self.state.get(key)
            if value is not None:
                items.append((key, value))
            i += 1
        more = len(items) > limit
        items = items[:limit]
        return items, (items[-1][0] if more and items else None)

    def __len__(self) -> int:
        return len(self.state)


class StandbyView:
    """The store's Delta snapshot, reloaded when a newer version is committed (checked at most every ``recheck_s``)."""

    def __init__(self, snapshots: SnapshotStore, recheck_s: float = 0.5) -> None:
        self.snapshots = snapshots
        self.recheck_s = recheck_s
        self.snapshot: SnapshotInfo | None = None
        self.table = StateTable()
        self._checked = 0.0
        self._lock = threading.Lock()

    def current(self) -> tuple[SnapshotInfo | None, StateTable]:
        with self._lock:
            if time.monotonic() - self._checked >= self.recheck_s:
                self._checked = time.monotonic()
                latest = self.snapshots.latest()
                if latest is not None and (
                    self.snapshot is None or latest.delta_version != self.snapshot.delta_version
                ):
                    self.table = StateTable(self.snapshots.read_text(latest))
                    self.snapshot = latest
            return self.snapshot, self.table


class LiveView:
    """The job's committed state: the standby snapshot plus every complete changelog batch after it.

    A daemon thread loads and follows; :meth:`wait_ready` bounds how long a query waits for the first load.
    """

    def __init__(self, snapshots: SnapshotStore, kafka: KafkaTarget, topic: str, poll_s: float = 0.2) -> None:
        self.snapshots = snapshots
        self.kafka = kafka
        self.topic = topic
        self.poll_s = poll_s
        self.table = StateTable()
        self.batch_id: int | None = None
        #: every change written to the changelog before this time is in the view (epoch ms)
        self.as_of_ms = 0
        self.error: str | None = None
        self.last_used = time.monotonic()
        self.lock = threading.Lock()
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"live-view-{topic}", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        self.last_used = time.monotonic()
        return self._ready.wait(timeout_s) and self.error is None

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def loaded_once(self) -> bool:
        """Whether the first load ended (ready, or failed)."""
        return self._ready.is_set()

    def stop(self, wait_s: float = 0.0) -> None:
        self._stop.set()
        if wait_s:
            self._thread.join(wait_s)

    def _follow(self) -> None:
        tail = None
        try:
            snapshot = self.snapshots.latest()
            state = self.snapshots.read_text(snapshot) if snapshot else {}
            self.batch_id = snapshot.batch_id if snapshot else None
            tail = ChangelogTail(self.kafka, self.topic, snapshot.changelog_offsets if snapshot else None)
            with self.lock:
                self.table = StateTable(state)
            while not self._stop.is_set():
                # Everything written before ``checked_at`` is in the view once the positions pass ``end``.
                checked_at = _now_ms()
                try:
                    end = tail.end_offsets()
                except KafkaException as err:
                    if not is_transient(err.args[0]):
                        raise
                    # The broker is restarting or slow: keep answering from what is loaded; ``as_of_ms``
                    # stops advancing, so the staleness each answer reports grows until it is back.
                    log.info("live view of %s: %s (transient, retrying)", self.topic, err)
                    self._stop.wait(1.0)
                    continue
                complete = tail.poll(self.poll_s)
                if complete is not None:
                    with self.lock:
                        for key, value in complete.changes:
                            if value is None:
                                state.pop(key.decode(), None)
                            else:
                                state[key.decode()] = value.decode()
                        self.table.changed()
                        self.batch_id = complete.batch_id
                if tail.has_read(end):
                    self.as_of_ms = checked_at
                    self._ready.set()
        except Exception as err:  # the service drops a failed view and builds a new one on the next query
            self.error = f"{type(err).__name__}: {err}"
            log.warning("live view of %s failed: %s", self.topic, self.error)
            self._ready.set()
        finally:
            if tail is not None:
                tail.close()
