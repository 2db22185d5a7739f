"""The soak's growth verdict (pure): warm-up ignored, a steady creep above the floor flagged."""

from __future__ import annotations

from bench.soak import CHECKED, verdict


def _rows(values: list[float]) -> list[dict]:
    return [{"minute": i, **{name: v for name in CHECKED}} for i, v in enumerate(values)]


def test_a_plateau_after_warm_up_does_not_grow():
    result = verdict(_rows([0, 500, 1000] + [1000] * 6))
    assert not any(grew for _, _, grew in result.values())


def test_a_steady_creep_above_the_floor_grows_and_below_it_is_noise():
    creep = verdict(_rows([0] * 3 + [1e9 + 1e8 * i for i in range(6)]))  # +50% over the measured span
    assert all(grew for _, _, grew in creep.values())
    small = verdict(_rows([0] * 3 + [10 + 2 * i for i in range(6)]))  # doubles, but by less than every floor
    assert not any(grew for _, _, grew in small.values())


def test_a_spike_that_passes_is_not_growth():
    assert not verdict(_rows([0] * 3 + [1e9, 1e9, 3e9, 1e9, 1e9, 1e9]))["driver_rss_mib"][2]
