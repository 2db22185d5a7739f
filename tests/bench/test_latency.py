"""bench/latency.py's latency computation (pure): produce times and observed counts in, per-event latencies out."""

from __future__ import annotations

import math

import pytest

from bench.latency import Answers, latencies, percentile, summarize


def test_a_count_answers_every_event_up_to_it_at_the_first_moment_it_is_seen():
    produced = {"a": [10.0, 10.5, 11.0], "b": [10.2]}
    answers = Answers(produced)
    answers.observe_snapshot([("a", 2), ("b", 1)], at=12.0)  # one batch: a's first two events, b's only one
    answers.observe_snapshot([("a", 2), ("b", 1)], at=12.5)  # seen again: answered already, nothing changes
    answers.observe("a", 3, at=14.0)
    values, unanswered = latencies(produced, answers.answered_at, start=0.0, end=100.0)
    assert sorted(values) == pytest.approx(sorted([2.0, 1.5, 3.0, 1.8]))
    assert unanswered == 0


def test_a_count_that_skips_numbers_answers_the_skipped_events_too_and_never_goes_back():
    produced = {"a": [1.0, 2.0, 3.0, 4.0]}
    answers = Answers(produced)
    answers.observe("a", 3, at=5.0)
    answers.observe("a", 1, at=6.0)  # an older record read late (another partition, an older snapshot)
    assert answers.answered_at["a"] == [5.0, 5.0, 5.0]


def test_only_events_produced_in_the_window_count_and_the_unanswered_are_counted():
    produced = {"a": [1.0, 5.0, 6.0, 7.0]}  # the first is the warm-up's
    answers = Answers(produced)
    answers.observe("a", 3, at=8.0)
    values, unanswered = latencies(produced, answers.answered_at, start=5.0, end=10.0)
    assert values == pytest.approx([3.0, 2.0])
    assert unanswered == 1  # the 4th event never showed up


def test_a_count_above_what_was_produced_answers_no_more_than_was_produced():
    produced = {"a": [1.0]}
    answers = Answers(produced)
    answers.observe("a", 2, at=3.0)  # an at-least-once duplicate
    answers.observe("zz", 1, at=3.0)  # a key never produced
    assert answers.answered_at["a"] == [3.0]
    assert latencies(produced, answers.answered_at, 0.0, 10.0) == ([2.0], 0)


def test_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([0.3], 99) == 0.3
    assert summarize([3.0, 1.0, 2.0]) == {"p50": 2.0, "p99": 3.0, "max": 3.0}
    assert math.isnan(summarize([])["p50"])
