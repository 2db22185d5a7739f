"""Growth, projections and unbounded growth, from a store's audit rows (pure functions).

- growth per day: least-squares slope of a measure over the audits of the last ``window_days``;
- days until a budget is crossed at that growth (None: not growing, or no budget);
- unbounded growth: keys only ever added (the key count never fell over the last audits and grew,
  with no tombstone ever seen in the changelog), a declared TTL the changelog shows is not enforced
  (:mod:`.ttl`), or, for a windowed store, windows older than its retention still present. A TTL makes
  a store bounded only once it is verified; until then the store is judged as one without.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

from spark_jobs.operations.state_audit.rows import BudgetCheck, Measure, StoreAudit
from spark_jobs.registry import StateBudget, StoreSpec

if TYPE_CHECKING:
    from spark_jobs.operations.state_audit.ttl import TtlCheck

__all__ = ["BudgetCheck", "Unbounded", "budget_checks", "days_until", "growth_per_day", "unbounded_growth"]

DAY_S = 86_400.0
#: how many audits in a row must show only additions before a store counts as unbounded
UNBOUNDED_AFTER_AUDITS = 3


def growth_per_day(points: list[tuple[dt.datetime, float]], window_days: float = 7.0) -> float | None:
    """Slope (units per day) of ``(time, value)`` points within ``window_days`` of the newest and since
    the state last shrank (growth before a cleanup says nothing about after it); None with fewer than
    two such points in distinct times."""
    points = sorted((t, v) for t, v in points if v is not None)
    shrank = [i for i in range(1, len(points)) if points[i][1] < points[i - 1][1]]
    if shrank:
        points = points[shrank[-1] :]
    if len(points) < 2:
        return None
    newest = points[-1][0]
    points = [(t, v) for t, v in points if (newest - t).total_seconds() <= window_days * DAY_S]
    xs = [(t - points[0][0]).total_seconds() / DAY_S for t, _ in points]
    if len(points) < 2 or max(xs) == 0:
        return None
    mean_x, mean_y = sum(xs) / len(xs), sum(v for _, v in points) / len(points)
    return sum((x - mean_x) * (v - mean_y) for x, (_, v) in zip(xs, points, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )


def days_until(current: float | None, limit: float | None, per_day: float | None) -> float | None:
    """Days until ``current`` growing ``per_day`` reaches ``limit``; 0 when already beyond it."""
    if current is None or limit is None:
        return None
    if current >= limit:
        return 0.0
    if not per_day or per_day <= 0:
        return None
    return (limit - current) / per_day


@dataclasses.dataclass(frozen=True)
class Unbounded:
    flagged: bool
    reason: str


def unbounded_growth(
    store: StoreSpec, history: list[StoreAudit], windows_beyond_retention: int | None, ttl: TtlCheck | None = None
) -> Unbounded:
    """``history``: this store's audits, oldest first, the current one last (their live rows and changelog
    tombstones are read); ``ttl``: the measured eviction of a store with ``ttl_ms``."""
    if store.kind in ("windowed", "session"):
        things, since = ("windows", "start") if store.kind == "windowed" else ("sessions", "end")
        if windows_beyond_retention:
            return Unbounded(
                True,
                f"{windows_beyond_retention:,} {things} older than the store's retention "
                f"({store.retention_ms or 0:,} ms from their {since}) are still in the state: "
                "expiry is not deleting them",
            )
        return Unbounded(False, f"{things} expire with the retention")
    if store.ttl_ms:
        if ttl is not None and ttl.verdict == "ttl_verified":
            return Unbounded(False, f"keys idle for {store.ttl_ms:,} ms are evicted (measured: {ttl.reason})")
        if ttl is not None and ttl.verdict == "ttl_not_enforced":
            return Unbounded(True, f"the declared TTL is not enforced: {ttl.reason}")
        # A declared TTL proves nothing until the changelog shows keys leaving: judged as a store without.
        keys = _keys_only_added(history)
        unverified = ttl.reason if ttl is not None else "not measured"
        return Unbounded(keys.flagged, f"TTL of {store.ttl_ms:,} ms not verified ({unverified}); {keys.reason}")
    return _keys_only_added(history)


def _keys_only_added(history: list[StoreAudit]) -> Unbounded:
    recent = [r for r in history if r.state_rows is not None][-UNBOUNDED_AFTER_AUDITS:]
    if len(recent) < UNBOUNDED_AFTER_AUDITS:
        return Unbounded(False, f"fewer than {UNBOUNDED_AFTER_AUDITS} audits")
    keys = [r.state_rows for r in recent]
    tombstones = max((r.changelog_tombstones or 0) for r in history)
    if all(b >= a for a, b in itertools.pairwise(keys)) and keys[-1] > keys[0] and tombstones == 0:
        return Unbounded(
            True,
            f"keys only ever added: {keys[0]:,} -> {keys[-1]:,} over the last {len(keys)} audits, "
            "no tombstone ever seen in the changelog: nothing deletes or evicts a key",
        )
    return Unbounded(False, "keys are removed (tombstones seen) or the key count is stable")


def budget_checks(
    budget: StateBudget, current: Mapping[Measure, float | None], per_day: Mapping[Measure, float | None]
) -> list[BudgetCheck]:
    """Every limited measure with a current value: where it is, how fast it grows, days left."""
    limits: dict[Measure, float | None] = {
        "rows": budget.max_rows,
        "bytes": budget.max_bytes,
        "restore_s": budget.max_restore_s,
    }
    checks = []
    for measure, limit in limits.items():
        value = current.get(measure)
        if limit is None or value is None:
            continue
        checks.append(
            BudgetCheck(
                measure,
                float(value),
                float(limit),
                per_day.get(measure),
                days_until(value, limit, per_day.get(measure)),
            )
        )
    return checks
