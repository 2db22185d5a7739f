"""bench/compare.py's arithmetic and its BENCHMARKS.md section (pure logic; the benchmark itself is not a test)."""

from __future__ import annotations

import dataclasses

from bench.compare import (
    SECTION,
    Round,
    SizeResult,
    keep_rounds,
    load_results,
    plot_throughput,
    ratios,
    report,
    where_the_restore_goes,
    where_the_time_goes,
    write_section,
)


def _rounds() -> dict[str, list[Round]]:
    full = {"seconds": 10.0, "records": 1000, "peak_bytes": 1}
    return {
        "kafka_streams": [
            Round(100.0, 1, 50, {"full replay": full}),
            Round(120.0, 1, 50, {"full replay": {**full, "seconds": 14.0}}),
        ],
        "plain_spark": [Round(200.0, 1), Round(250.0, 1)],
        "platform": [
            Round(
                400.0,
                1,
                80,
                {"full replay": {**full, "seconds": 6.0}, "snapshot + tail": {**full, "seconds": 1.2}},
                {"state": 300.0, "outputs": 50.0},
            ),
            Round(
                500.0,
                1,
                80,
                {"full replay": {**full, "seconds": 8.0}, "snapshot + tail": {**full, "seconds": 1.2}},
                {"state": 360.0, "outputs": 60.0},
            ),
        ],
    }


def test_ratios_compare_medians_against_the_goals():
    lines = ratios(_rounds(), events=1_000_000)
    # medians: platform 1e6/450=2222/s (median of 2500 and 2000 = 2250), Kafka Streams (10000+8333)/2, plain (5000+4000)/2
    assert lines[0] == "- Throughput, platform / Kafka Streams: **0.25x** (goal: at least 1.0x)"
    assert lines[1].startswith("- Throughput, platform / plain Spark: **0.50x**") and "cost 50%" in lines[1]
    assert lines[2] == "- Restore, platform snapshot + tail / Kafka Streams full replay: **0.10x** (goal: at most 0.2x)"
    assert lines[3] == "- Restore, platform full replay / Kafka Streams full replay: 0.58x"
    assert ratios({"platform": _rounds()["platform"]}, 1_000_000) == []  # nothing to compare against


def test_where_the_time_goes_splits_the_platform_run():
    (line,) = where_the_time_goes(_rounds())
    assert line.endswith("state 330.0, outputs 55.0, everything else 65.0")
    # plain Spark's micro-batches beside the platform's batch phases, when its run reported them
    rounds = _rounds()
    rounds["plain_spark"] = [Round(200.0, 1, phases={"batches": 150.0}), Round(250.0, 1, phases={"batches": 170.0})]
    _, plain = where_the_time_goes(rounds)
    assert plain == (
        "- Where plain Spark's run time goes (median seconds): its micro-batches 160.0 (the platform's: 385.0), "
        "everything else 65.0"
    )
    # the snapshots' thread runs beside the batches: named apart, in neither sum
    for r, background in zip(rounds["platform"], (40.0, 60.0), strict=True):
        r.phases["snapshot_background"] = background
    line, plain = where_the_time_goes(rounds)
    assert line.endswith("state 330.0, outputs 55.0, everything else 65.0; snapshot_background 50.0 beside the batches")
    assert "(the platform's: 385.0)" in plain


def test_where_the_restore_goes_splits_snapshot_and_tail():
    rounds = _rounds()
    assert where_the_restore_goes(rounds) == []  # older results carry no split
    for n, r in enumerate(rounds["platform"]):
        r.restores["snapshot + tail"] = {
            **r.restores["snapshot + tail"],
            "snapshot_seconds": 0.2 + n * 0.2,
            "snapshot_rows": 90_000,
        }
    (line,) = where_the_restore_goes(rounds)
    assert line.endswith("reading the snapshot (90,000 rows) 0.30, replaying the changelog tail 0.90")


def test_the_section_is_replaced_and_other_sections_stay(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    out.write_text(
        f"# Benchmarks\n\n## Restore time\n\nkept\n\n{SECTION} (old)\n\nold figures\n\n## State query latency\n\nkept too\n"
    )
    write_section(f"{SECTION} (new)\n\nnew figures", out)
    text = out.read_text()
    assert "old figures" not in text and text.count(SECTION) == 1 and "new figures" in text
    assert "## Restore time\n\nkept" in text and "## State query latency\n\nkept too" in text


def _size(events: int, keys: int, workload: str = "purchases") -> SizeResult:
    return SizeResult(
        workload,
        events,
        keys,
        "2026-11-23",
        "abc1234",
        f"bench/compare.py --events {events} --keys {keys}",
        "x86_64, 2 cores",
        12,
        2,
        _rounds(),
    )


def test_sizes_are_saved_and_the_report_is_built_from_every_saved_size(tmp_path):
    _size(10_000_000, 100_000).save(tmp_path)
    _size(1_000_000, 1_000, "pulses").save(tmp_path)
    _size(1_000_000, 100_000).save(tmp_path)
    _size(1_000_000, 100_000).save(tmp_path)  # measured again: replaces, not adds
    results = load_results(tmp_path)
    assert [(r.workload, r.events, r.keys) for r in results] == [
        ("purchases", 1_000_000, 100_000),
        ("purchases", 10_000_000, 100_000),
        ("pulses", 1_000_000, 1_000),
    ]
    assert results[0].rounds["platform"][1].phases == {"state": 360.0, "outputs": 60.0}  # rounds survive JSON

    text = report(results, "plot.png")
    summary = [line for line in text.splitlines() if line.startswith("| purchases | 1,000,000 x 100,000 users |")]
    # medians: Kafka Streams 9,167/s, plain Spark 4,500/s, platform 2,250/s; snapshot + tail 1.2 s vs 12 s
    assert summary == [
        "| purchases | 1,000,000 x 100,000 users | 9,167 | 4,500 | 2,250 | 0.25x | 0.50x | 0.10x | 2 | 2026-11-23, abc1234 |"
    ]
    assert text.count("### ") == 3 and "### purchases: 10,000,000 events, 100,000 users" in text
    assert "### pulses: 1,000,000 events, 1,000 patients" in text and "plain Spark (window() count, append)" in text
    assert "![events/s per peer and size](bench/results/plot.png)" in text

    plot_throughput(results, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 10_000


def test_rounds_are_kept_after_each_round_without_replacing_a_fuller_stored_result(tmp_path):
    out = tmp_path / "BENCHMARKS.md"
    stored = _size(1_000_000, 100_000)  # two rounds, from an earlier invocation
    stored.save(tmp_path)
    first = {peer: runs[:1] for peer, runs in _rounds().items()}
    again = dataclasses.replace(stored, commit="new1234", rounds=first)
    # One round of a re-measurement does not replace two stored rounds ...
    assert not keep_rounds(again, repeats=3, directory=tmp_path, out=out)
    assert SizeResult.load(tmp_path / stored.path_name).commit == "abc1234" and not out.exists()
    # ... its second round does, and the report is rebuilt from it.
    assert keep_rounds(dataclasses.replace(again, rounds=_rounds()), repeats=3, directory=tmp_path, out=out)
    assert SizeResult.load(tmp_path / stored.path_name).commit == "new1234" and "new1234" in out.read_text()
    # A new size is kept from its first round on (a run cut short keeps what it finished).
    new = dataclasses.replace(_size(10_000_000, 100_000), rounds=first)
    assert keep_rounds(new, repeats=3, directory=tmp_path, out=out)
    assert "| purchases | 10,000,000 x 100,000 users |" in out.read_text() and "| 1 | 2026-11-23" in out.read_text()
    # A run asked for fewer rounds than stored replaces it when it has them all.
    assert keep_rounds(
        dataclasses.replace(stored, commit="two0000", rounds=first), repeats=1, directory=tmp_path, out=out
    )
    assert SizeResult.load(tmp_path / stored.path_name).round_count == 1


def test_peers_answers_must_agree_key_by_key_where_they_mean_the_same():
    import pytest

    from bench.answers import AnswersDiffer, Scope, check_agree

    platform = {"u1": (2, 3), "u2": (1, 1)}  # u3 closed its account: deleted
    kafka_streams = dict(platform)
    plain_spark = {**platform, "u3": (4, 4)}  # cannot delete: compared where no account closed
    kept = Scope(lambda user: user != "u3")
    compared = check_agree(
        {"platform": platform, "kafka_streams": kafka_streams, "plain_spark": plain_spark}, {"plain_spark": kept}
    )
    assert compared == {"platform": 2, "kafka_streams": 2, "plain_spark": 2}
    with pytest.raises(AnswersDiffer, match=r"plain_spark and platform differ on 1 of 3 keys: 'u3': platform None vs"):
        check_agree({"platform": platform, "plain_spark": plain_spark})
    differ = r"kafka_streams and platform differ on 1 of 2 keys: 'u2': platform \(1, 1\) vs \(1, 2\)"
    with pytest.raises(AnswersDiffer, match=differ):
        check_agree({"platform": platform, "kafka_streams": {**platform, "u2": (1, 2)}})
    # a peer that closes fewer windows is compared on its own (and must have some)
    assert check_agree({"platform": platform, "plain_spark": {"u1": (2, 3)}}, {"plain_spark": Scope(only_its_own=True)})
    with pytest.raises(AnswersDiffer, match="no key to compare"):
        check_agree({"platform": platform, "plain_spark": {}}, {"plain_spark": Scope(only_its_own=True)})


def test_window_averages_agree_within_their_last_bits_only():
    import pytest

    from bench.answers import AnswersDiffer, check_agree, temperature_window

    # 64 readings summed in two orders: their averages straddle the 6th decimal's rounding boundary
    platform = {("s093", 0): temperature_window(64, 15.5328125000001, 14.9, 16.3)}
    plain_spark = {("s093", 0): temperature_window(64, 15.5328124999999, 14.9, 16.3)}
    assert check_agree({"platform": platform, "plain_spark": plain_spark}) == {"platform": 1, "plain_spark": 1}
    with pytest.raises(AnswersDiffer, match="differ on 1 of 1 keys"):
        check_agree({"platform": platform, "plain_spark": {("s093", 0): temperature_window(64, 15.5329, 14.9, 16.3)}})
