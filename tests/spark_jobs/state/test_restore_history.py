"""Restore-time estimates from this deployment's measured restores (pure), and store budgets."""

from __future__ import annotations

import pytest

from spark_jobs.registry import JobSpecError, StateBudget, StoreSpec
from spark_jobs.state.restore_history import LinearCost, RestoreRates


def _m(store, snapshot_rows, snapshot_s, records, changelog_s, app="a-v1"):
    return {
        "store": store,
        "application_id": app,
        "snapshot_rows": snapshot_rows,
        "snapshot_seconds": snapshot_s,
        "changelog_records_read": records,
        "changelog_seconds": changelog_s,
    }


def test_linear_cost_recovers_a_fixed_cost_and_a_rate():
    # 2 s to start, 50,000 records/s
    cost = LinearCost.fit([(n, 2 + n / 50_000) for n in (10_000, 100_000, 400_000)])
    assert cost.fixed_s == pytest.approx(2, abs=1e-6) and cost.per_s == pytest.approx(50_000)
    assert cost.seconds(1_000_000) == pytest.approx(22)


def test_one_size_or_noise_falls_back_to_the_mean_rate():
    assert LinearCost.fit([(1000, 2.0), (1000, 4.0)]) == LinearCost(0.0, 2000 / 6, 2)  # records over seconds
    # bigger was faster: the size effect is below the noise, the cost is the fixed part
    assert LinearCost.fit([(1000, 5.0), (2000, 4.0)]).seconds(10_000) == pytest.approx(4.5)
    assert LinearCost.fit([(0, 1.0)]) is None


def test_restore_estimate_adds_snapshot_and_tail_and_prefers_the_stores_own_rates():
    measured = [
        _m("counts", 0, 0, 100_000, 2.0),
        _m("counts", 50_000, 1.0, 10_000, 0.2),
        _m("counts", 200_000, 4.0, 0, 0),
        _m("other", 0, 0, 1_000, 10.0, app="b-v1"),
    ]
    rates = RestoreRates.fit(measured, store="counts", application_id="a-v1")
    full = rates.estimate(snapshot_rows=None, changelog_records=1_000_000)
    assert full == pytest.approx(20, rel=0.01)  # 50,000 records/s
    assert rates.estimate(snapshot_rows=100_000, changelog_records=50_000) == pytest.approx(2 + 1, rel=0.01)
    assert RestoreRates.fit([]).estimate(snapshot_rows=None, changelog_records=10) is None  # nothing measured yet
    with_fixed = RestoreRates(snapshot=LinearCost(1.5, 1000.0, 2), changelog=None)
    assert with_fixed.estimate(snapshot_rows=0, changelog_records=0) == 1.5  # an empty snapshot is still read


def test_budgets_are_validated():
    assert StoreSpec("s", budget=StateBudget(max_rows=10)).budget.max_rows == 10
    with pytest.raises(JobSpecError, match="max_bytes"):
        StateBudget(max_bytes=0)
