"""bench/summary.py: the newest result per benchmark and size, its figures, and the pages that quote them (pure)."""

from __future__ import annotations

import json
import random
import re

import pytest

from bench import summary
from bench.summary import (
    BENCHMARKS,
    END,
    PLOT,
    RESULTS_DIR,
    START,
    Result,
    answers_equal,
    build,
    current_block,
    fmt_ratio,
    load,
    main,
    parse,
    quoted_figures,
    render,
    replace_block,
    restore,
    select_newest,
    throughput,
    throughput_ratios,
)


def _round(seconds: float, answer_keys: int | None = 10, restores: dict | None = None) -> dict:
    return {
        "seconds": seconds,
        "peak_bytes": 1,
        "changelog_bytes": None,
        "restores": restores or {},
        "phases": {},
        "answer_keys": answer_keys,
    }


def _compare(workload="purchases", events=1000, keys=10, date="2026-11-01", commit="aaaaaaa", rounds=None) -> dict:
    return {
        "workload": workload,
        "events": events,
        "keys": keys,
        "date": date,
        "commit": commit,
        "command": f"bench/compare.py --workloads {workload} --events {events}",
        "machine": "test",
        "batches": 12,
        "threads": 2,
        "rounds": rounds or {"kafka_streams": [_round(4.0)], "plain_spark": [_round(5.0)], "platform": [_round(8.0)]},
    }


def _latency_row(peer: str, rate: int, trigger: float | None, p50: float) -> dict:
    sink = {"events": 100, "unanswered": 0, "p50": p50, "p99": 2 * p50, "max": 3 * p50}
    sinks = {
        "platform": {"delta": sink, "kafka": sink},
        "plain_spark": {"delta": sink},
        "kafka_streams": {"kafka": sink},
    }
    return {"peer": peer, "rate": rate, "trigger_s": trigger, "sinks": sinks[peer]}


def _write(directory, name: str, data: dict) -> None:
    (directory / name).write_text(json.dumps(data))


# ----- selecting ----------------------------------------------------------------------------------------------------
def test_the_newest_result_of_each_workload_and_size_is_selected(tmp_path):
    _write(tmp_path, "compare-purchases-1000x10.json", _compare(date="2026-11-05", commit="new0001"))
    _write(tmp_path, "compare-purchases-1000x10-earlier.json", _compare(date="2026-11-01", commit="old0001"))
    _write(tmp_path, "compare-purchases-1000x20.json", _compare(keys=20, date="2026-10-01", commit="other01"))
    _write(tmp_path, "compare-pulses-1000x10.json", _compare(workload="pulses", date="2026-10-02", commit="pulse01"))
    side_by_side = [_latency_row("platform", 1000, 1.0, 1.0), _latency_row("plain_spark", 1000, 1.0, 2.0)]
    _write(tmp_path, "latency-20261101T0100Z.json", {"command": "older, beside", "rows": side_by_side})
    _write(tmp_path, "latency-20261102T0100Z.json", {"command": "newer, beside", "rows": side_by_side})
    alone = [_latency_row("platform", 1000, 1.0, 0.5)]
    _write(tmp_path, "latency-20261103T0100Z-abcdef1.json", {"command": "newest, alone", "rows": alone})
    _write(tmp_path, "soak-20261101T0100Z.json", {"what": "a kind with no reader"})

    results, unread = load(tmp_path)
    newest = select_newest(results)

    assert unread == ["soak-20261101T0100Z.json"]
    assert [(r.kind, r.workload, r.size, r.when, r.commit) for r in newest] == [
        ("compare", "purchases", (1000, 10), "2026-11-05", "new0001"),
        ("compare", "purchases", (1000, 20), "2026-10-01", "other01"),
        ("compare", "pulses", (1000, 10), "2026-10-02", "pulse01"),
        # the platform measured beside a peer, and the platform alone, are apart: the newer run alone does not
        # hide the newest side-by-side one (its ratios are the comparison)
        ("latency", "beside its peers", (1000, 1.0), "2026-11-02T01:00Z", ""),
        ("latency", "alone", (1000, 1.0), "2026-11-03T01:00Z", "abcdef1"),
    ]


def test_equal_times_are_broken_by_the_file_name_and_the_input_order_does_not_matter():
    a = Result("compare", "purchases", (1, 1), "2026-11-01", "a", "", "compare-a.json", {})
    b = Result("compare", "purchases", (1, 1), "2026-11-01", "b", "", "compare-b.json", {})
    c = Result("compare", "pulses", (1, 1), "2026-11-01", "c", "", "compare-c.json", {})
    for _ in range(5):
        shuffled = random.sample([a, b, c], 3)
        assert [r.commit for r in select_newest(shuffled)] == ["b", "c"]


def test_kafka_streams_in_a_latency_run_stands_beside_every_trigger_of_its_rate():
    rows = [
        _latency_row("platform", 1000, 0.0, 1.0),
        _latency_row("platform", 1000, 1.0, 1.5),
        _latency_row("kafka_streams", 1000, None, 0.1),
        _latency_row("platform", 10000, 1.0, 3.0),
        {"peer": "plain_spark", "rate": 10000, "trigger_s": 1.0, "error": "RuntimeError: it failed"},
    ]
    results = parse("latency-20261101T0100Z.json", {"command": "c", "rows": rows})
    assert [(r.workload, r.size, sorted(r.data["peers"])) for r in results] == [
        ("beside its peers", (1000, 0.0), ["kafka_streams", "platform"]),
        ("beside its peers", (1000, 1.0), ["kafka_streams", "platform"]),
        ("alone", (10000, 1.0), ["platform"]),  # a failed peer's row is no measurement
    ]


# ----- figures ------------------------------------------------------------------------------------------------------
def test_throughput_and_ratios_are_medians_of_events_per_second_as_compare_py_computes_them():
    restores = {"full replay": {"seconds": 3.0}, "snapshot + tail": {"seconds": 1.0}}
    rounds = {
        "kafka_streams": [_round(4.0, restores={"full replay": {"seconds": 2.0}}), _round(5.0)],
        "plain_spark": [_round(8.0), _round(10.0), _round(20.0)],
        "platform": [_round(16.0, restores=restores), _round(25.0, restores=restores)],
    }
    (result,) = parse("compare-purchases-1000x10.json", _compare(rounds=rounds))
    assert throughput(result, "kafka_streams") == pytest.approx((1000 / 4 + 1000 / 5) / 2)  # 225
    assert throughput(result, "plain_spark") == pytest.approx(1000 / 10)  # the median round, not the mean
    assert throughput(result, "platform") == pytest.approx((1000 / 16 + 1000 / 25) / 2)  # 51.25
    ratios = throughput_ratios(result)
    assert ratios["plain_spark"] == pytest.approx(51.25 / 100)
    assert ratios["kafka_streams"] == pytest.approx(51.25 / 225)
    assert [fmt_ratio(ratios[p]) for p in ("plain_spark", "kafka_streams")] == ["0.51x", "0.23x"]
    assert restore(result, "platform", "snapshot + tail") == 1.0
    assert restore(result, "kafka_streams", "full replay") == 2.0  # only the round that restored counts
    assert answers_equal(result) is True


def test_a_missing_peer_or_answer_check_is_said_not_guessed():
    rounds = {"plain_spark": [_round(5.0, answer_keys=None)], "platform": [_round(10.0, answer_keys=None)]}
    (result,) = parse("compare-payments-1000x500.json", _compare("payments", 1000, 500, rounds=rounds))
    assert throughput_ratios(result) == {"plain_spark": pytest.approx(0.5), "kafka_streams": None}
    assert answers_equal(result) is None
    row = next(line for line in render([result]).splitlines() if line.startswith("| payments"))
    assert "| **0.50x** | **—** | not checked | — |" in row


def test_quoted_figures_finds_every_ratio_a_page_quotes():
    text = "ran at **0.61x** plain Spark (1.02x Kafka Streams; 1.6x at 1e6), 16.5x before; v1.2 and 3x are not"
    assert quoted_figures(text) == {"0.61x", "1.02x", "1.6x", "16.5x"}


# ----- rendering and the page ---------------------------------------------------------------------------------------
def test_rendering_is_deterministic_and_names_unread_files():
    results, _ = load(RESULTS_DIR)
    first = render(select_newest(results), ["b.json", "a.json"], "img.png")
    again = render(select_newest(random.sample(results, len(results))), ["a.json", "b.json"], "img.png")
    assert first == again
    assert first.startswith(START) and first.endswith(END)
    assert "Not summarised (no reader for their kind in bench/summary.py): a.json, b.json." in first


def test_the_block_holds_no_heading_bench_compare_py_looks_for():
    """compare.py's write_section replaces from the first "## Platform vs Kafka Streams vs plain Spark" it finds to
    the next "## ": were it in the summary, a `make bench` would cut the summary and the log's top away."""
    from bench.compare import SECTION, WORKLOADS

    assert SECTION not in current_block(BENCHMARKS.read_text())
    assert summary.KEY_NOUNS == {name: workload.key_noun for name, workload in WORKLOADS.items()}


def test_replacing_the_block_leaves_the_rest_of_the_page_as_it_was():
    page = f"# Benchmarks\n\npreamble\n\n{START}\nold\n{END}\n\n## Log\n\n## A section (2026-11-01)\n"
    new = f"{START}\nnew\n{END}"
    assert replace_block(page, new) == page.replace(f"{START}\nold\n{END}", new)
    with pytest.raises(ValueError):
        replace_block("# Benchmarks\n", new)


def test_benchmarks_md_shows_what_the_saved_results_render_now():
    """A result saved without `make bench-summary` (or a hand edit of the block) fails here."""
    text = BENCHMARKS.read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.index(START) < text.index("\n## Log (dated, newest last)")
    assert current_block(text) == build(RESULTS_DIR, BENCHMARKS, PLOT), "stale: run `make bench-summary`"
    assert PLOT.exists()


def test_check_fails_once_a_new_result_is_saved_and_passes_after_the_rewrite(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    _write(results, "compare-purchases-1000x10.json", _compare(date="2026-11-01"))
    page = tmp_path / "BENCHMARKS.md"
    page.write_text(f"# Benchmarks\n\n{START}\n{END}\n\n## Log (dated, newest last)\n")
    args = ["--page", str(page), "--results", str(results), "--plot", str(tmp_path / "img" / "benchmarks.png")]

    assert main([*args, "--check"]) == 1
    assert main(args) == 0
    assert main([*args, "--check"]) == 0
    assert "](img/benchmarks.png)" in page.read_text()  # linked relative to the page
    _write(results, "compare-purchases-1000x10.json", _compare(date="2026-11-02", commit="bbbbbbb"))
    assert main([*args, "--check"]) == 1
    assert "stale" in capsys.readouterr().err


# ----- the figures a page quotes --------------------------------------------------------------------------------------
def quoting_page() -> str:
    """The one place that knows which pages quote the benchmarks: README.md (its headline figures) and the site's
    benchmarks page."""
    pages = (summary.PROJECT_ROOT / "README.md", summary.PROJECT_ROOT / "docs" / "benchmarks" / "index.md")
    return "\n".join(page.read_text() for page in pages)


#: figure -> the summary's row and ratio it quotes (workload, (events, keys), platform over which peer)
FROM_THE_SUMMARY = {
    # "at 1e7 events x 1e5 users the platform runs at 0.92x plain Spark (...; 0.65x before its outputs moved to
    # delta-rs and its snapshots off the batch's path) and ran at 1.99x Kafka Streams; at 1e6 x 1e4 it ran at
    # 0.50x plain Spark before those changes (not measured since)"; 0.65x is the size's newest saved result
    "1.99x": ("sessions", (10_000_000, 100_000), "kafka_streams"),
    "0.65x": ("sessions", (10_000_000, 100_000), "plain_spark"),
    "0.50x": ("sessions", (1_000_000, 10_000), "plain_spark"),
    # "The joins are where the platform is furthest from plain Spark: enrichment at 0.61x at 1e7 x 1e6 (1.02x
    # Kafka Streams; ...), payments 0.51x at 1e7 + 1e7 (...)"
    "0.61x": ("enrichment", (10_000_000, 1_000_000), "plain_spark"),
    "1.02x": ("enrichment", (10_000_000, 1_000_000), "kafka_streams"),
    "0.51x": ("payments", (20_000_000, 10_000_000), "plain_spark"),
    # README's headline figures: "throughput, 1e7 purchases of 1e5 users | 0.83x plain Spark, 0.66x Kafka Streams",
    # "1e7 temperature readings (hopping windows) | 0.84x plain Spark, 1.22x Kafka Streams"
    "0.83x": ("purchases", (10_000_000, 100_000), "plain_spark"),
    "0.66x": ("purchases", (10_000_000, 100_000), "kafka_streams"),
    "0.84x": ("temperatures", (10_000_000, 1_000), "plain_spark"),
    "1.22x": ("temperatures", (10_000_000, 1_000), "kafka_streams"),
}
#: figures the page quotes that no saved result gives (the summary cannot show them), and why
NOT_IN_THE_SUMMARY = {
    "0.44x": "README's restore headline: a READY spare's restore of 1e7 keys against Kafka Streams' replay "
    "(bench/state_scale.py, 2026-12-02), a result the summary does not read",
    "0.92x": "sessions 1e7 x 1e5 against plain Spark, two rounds of 2026-11-29 (BENCHMARKS.md 'Sessions vs plain "
    "Spark after the batch changes', run with --results /tmp/sessres2): not in bench/results, whose newest for the "
    "size is 2026-11-28's 0.65x",
    "0.73x": "enrichment 1e6 x 1e5 against plain Spark, 2026-12-03 (BENCHMARKS.md 'Where the joins' task time "
    "goes'): not in bench/results, whose newest for the size is 2026-11-29's 0.64x",
    "0.49x": "payments 1e6 against plain Spark, 2026-12-03 (run with --results /tmp/pay): not in bench/results, "
    "whose newest for the size is 2026-12-01's 0.47x",
    "1.6x": "payments 1e6 against Kafka Streams: the summary's 1.63x, quoted to one decimal",
    "1.0x": "bench/input_cost.py (parsing and classification per batch against a plain from_json): no saved result",
    "2.9x": "bench/input_cost.py, an earlier version: no saved result",
    "5.5x": "bench/input_cost.py, an earlier version: no saved result",
    "16.5x": "bench/input_cost.py, an earlier version: no saved result",
}


def test_every_ratio_the_page_quotes_is_the_summarys_or_listed_as_not_from_it():
    """README.md's headline figures and the site's benchmarks page. Checked against the summary: README's
    throughput rows (0.83x, 0.66x, 0.84x, 1.22x, 0.61x, 1.02x, 0.51x); the page's sessions sentence ("the platform runs at
    0.92x plain Spark ... 0.65x before ... 1.99x Kafka Streams; at 1e6 x 1e4 it ran at 0.50x plain Spark") for
    1.99x, 0.65x and 0.50x, and the joins sentence ("enrichment at 0.61x at 1e7 x 1e6 (1.02x Kafka Streams; 0.73x
    at 1e6, 2026-12-03), payments 0.51x at 1e7 + 1e7 (0.49x at 1e6, where it ran at 1.6x Kafka Streams)") for
    0.61x, 1.02x and 0.51x. NOT_IN_THE_SUMMARY lists, with the reason, the figures no saved result gives: 0.92x,
    0.73x, 0.49x, 1.6x (1.63x rounded) and the input-cost figures 1.0x, 2.9x, 5.5x, 16.5x. A new figure on the
    page fails here until it is either the summary's (FROM_THE_SUMMARY) or listed with why not."""
    quoted = quoted_figures(quoting_page())
    unaccounted = quoted - FROM_THE_SUMMARY.keys() - NOT_IN_THE_SUMMARY.keys()
    assert unaccounted == set(), f"figures quoted that the summary does not give: {sorted(unaccounted)}"

    results, _ = load(RESULTS_DIR)
    newest = {(r.workload, r.size): r for r in select_newest(results) if r.kind == "compare"}
    block = current_block(BENCHMARKS.read_text())
    wrong = {}
    for figure, (workload, size, peer) in FROM_THE_SUMMARY.items():
        if figure not in quoted:
            continue  # the page no longer quotes it: nothing to hold it to
        shown = fmt_ratio(throughput_ratios(newest[workload, size])[peer])
        row = next(
            line for line in block.splitlines() if re.match(rf"\| {workload} \| {size[0]:,} x {size[1]:,} ", line)
        )
        if shown != figure or f"**{shown}**" not in row:
            wrong[figure] = f"the summary's {workload} {size} against {peer} is {shown}"
    assert wrong == {}, f"the page quotes figures the newest results do not give: {wrong}"
