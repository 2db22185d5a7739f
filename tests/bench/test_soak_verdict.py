"""The soak's growth verdict (pure): warm-up ignored, a late rise above the floor flagged."""

from __future__ import annotations

from bench.soak import CHECKED, verdict


def _rows(values: list[float]) -> list[dict]:
    return [{name: v for name in CHECKED} for v in values]


def test_a_plateau_after_warm_up_does_not_grow():
    result = verdict(_rows([0, 500, 1000] + [1000] * 6))
    assert not any(grew for _, _, grew in result.values())


def test_a_late_rise_above_the_floor_grows_and_below_it_is_noise():
    big = verdict(_rows([0] * 3 + [1e9] * 3 + [2e9] * 3))
    assert all(grew for _, _, grew in big.values())
    small = verdict(_rows([0] * 3 + [10] * 3 + [20] * 3))  # doubles, but by less than every floor
    assert not any(grew for _, _, grew in small.values())
