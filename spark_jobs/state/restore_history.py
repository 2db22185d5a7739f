"""Restore throughput as measured on this deployment, and restore-time estimates from it.

The restore path records every restore it performs (``record_restore``) in an append-only Delta table,
``<lake>/_streamstate/restore_measurements``: how many snapshot rows and changelog records it read and
how long each part took. :class:`RestoreRates` fits ``seconds = fixed + amount / rate`` to those rows,
for the snapshot part and the changelog part separately, so an estimate for a store of any size uses
this machine's numbers, not constants.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from runtime.settings import Settings
from spark_jobs.registry import JobSpec
from spark_jobs.state.restore import RestoredState
from spark_jobs.versions import append_rows, platform_table, read_rows

log = logging.getLogger(__name__)

_INTS = ("version", "snapshot_rows", "changelog_records_read", "changelog_records_applied", "keys")
_FLOATS = ("seconds", "snapshot_seconds", "changelog_seconds")
_STRINGS = ("job", "application_id", "store", "mode")


def restore_measurements_table(settings: Settings):
    return platform_table(settings, "restore_measurements")


def _schema():
    import pyarrow as pa

    return pa.schema(
        [pa.field("at", pa.timestamp("us", tz="UTC"))]
        + [pa.field(n, pa.int64()) for n in _INTS]
        + [pa.field(n, pa.float64()) for n in _FLOATS]
        + [pa.field(n, pa.string()) for n in _STRINGS]
    )


def record_restore(settings: Settings, spec: JobSpec, result: RestoredState) -> None:
    """Append one restore's numbers. A restore that read nothing teaches nothing and is skipped; a
    failure to record is logged, never raised (the restore itself succeeded)."""
    if not result.snapshot_rows and not result.changelog_records_read:
        return
    row = {
        "at": dt.datetime.now(dt.timezone.utc),
        "job": spec.name,
        "version": spec.version,
        "application_id": spec.application_id,
        "store": result.store,
        "mode": "full_replay" if result.full_replay else "snapshot_and_tail",
        "snapshot_rows": result.snapshot_rows,
        "changelog_records_read": result.changelog_records_read,
        "changelog_records_applied": result.changelog_records_applied,
        "keys": result.keys,
        "seconds": result.seconds,
        "snapshot_seconds": result.snapshot_seconds,
        "changelog_seconds": max(0.0, result.seconds - result.snapshot_seconds),
    }
    try:
        append_rows(restore_measurements_table(settings), [row], _schema())
    except Exception as err:  # noqa: BLE001 - the measurement is a by-product of the restore
        log.warning("restore of %s/%s not recorded: %s", spec.application_id, result.store, err)


def restore_measurements(settings: Settings) -> list[dict]:
    return sorted(read_rows(restore_measurements_table(settings)), key=lambda r: r["at"])


@dataclasses.dataclass(frozen=True)
class LinearCost:
    """``seconds = fixed_s + amount / per_s``, fitted by least squares (fixed >= 0)."""

    fixed_s: float
    per_s: float
    samples: int

    def seconds(self, amount: float) -> float:
        return self.fixed_s + amount / self.per_s

    @classmethod
    def fit(cls, points: list[tuple[float, float]]) -> LinearCost | None:
        """``points``: (amount, seconds). None without a point that moved any data."""
        points = [(n, t) for n, t in points if n > 0 and t > 0]
        if not points:
            return None
        if len({n for n, _ in points}) < 2:
            # one size seen: all of the time is attributed to the amount (a conservative rate)
            return cls(0.0, sum(n for n, _ in points) / sum(t for _, t in points), len(points))
        mean_n = sum(n for n, _ in points) / len(points)
        mean_t = sum(t for _, t in points) / len(points)
        slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / sum((n - mean_n) ** 2 for n, _ in points)
        fixed = mean_t - slope * mean_n
        if slope <= 0:  # noise larger than the size effect: at these sizes the cost is the fixed part
            return cls(mean_t, float("inf"), len(points))
        if fixed < 0:  # through the origin instead
            slope = sum(n * t for n, t in points) / sum(n * n for n, _ in points)
            fixed = 0.0
        return cls(fixed, 1 / slope, len(points))


@dataclasses.dataclass(frozen=True)
class RestoreRates:
    """How fast this deployment reads snapshots and replays changelogs."""

    snapshot: LinearCost | None
    changelog: LinearCost | None

    @classmethod
    def fit(cls, measurements: list[dict], store: str | None = None, application_id: str | None = None) -> RestoreRates:
        """Rates from the store's own restores when it has enough (3+), else from every store's."""
        own = [
            m
            for m in measurements
            if (store is None or m["store"] == store)
            and (application_id is None or m["application_id"] == application_id)
        ]
        rows = own if len(own) >= 3 else measurements
        return cls(
            snapshot=LinearCost.fit([(m["snapshot_rows"], m["snapshot_seconds"]) for m in rows if m["snapshot_rows"]]),
            changelog=LinearCost.fit([(m["changelog_records_read"], m["changelog_seconds"]) for m in rows]),
        )

    def estimate(self, *, snapshot_rows: int | None, changelog_records: int) -> float | None:
        """Seconds to restore from a snapshot of ``snapshot_rows`` plus ``changelog_records`` of tail
        (``snapshot_rows=None``: no snapshot, a full replay; an empty snapshot still costs its read).
        None when this deployment has not measured the parts needed."""
        total = 0.0
        if snapshot_rows is not None:
            if self.snapshot is None:
                return None
            total += self.snapshot.seconds(snapshot_rows)
        if changelog_records:
            if self.changelog is None:
                return None
            total += self.changelog.seconds(changelog_records)
        return total
