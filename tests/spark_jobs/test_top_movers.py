"""Jobs that feed jobs: the seeds' two-stage top movers, streaming. ``stock_price_changes`` writes each closed
day to its one-partition upsert topic in the transaction of its batch's markers; ``top_movers`` reads that
topic as a table and ranks each day's changes (:class:`spark_jobs.primitives.TopN`). Both held to the
plain-Python reference (:mod:`spark_jobs.reference.generators.ticks`), which the batch step ``daily_top_movers``
(tests/spark_jobs/test_batch_jobs.py) and the Kafka Streams twin (tests/bench/test_kafka_streams_peer.py) are
held to as well; the table's own semantics (updates, tombstones, ties, refused records, any cut of the input,
1 or 3 partitions, a lost checkpoint) against :mod:`spark_jobs.reference.generators.upserts`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil

import pytest

from bench.answers import latest_per_key
from spark_jobs.io.kafka_topics import ensure_topic, partition_offsets
from spark_jobs.layout import JobLayout, output_topic_name
from spark_jobs.reference.generators import ticks, upserts
from spark_jobs.registry import JobSpecError, get_job
from spark_jobs.testing import JobHarness
from spark_jobs.versions import read_rows

pytestmark = pytest.mark.integration

TICKS = ticks.generate(days=3)


def _stages(unique: str):
    one = dataclasses.replace(
        get_job("stock_price_changes"),
        name=f"changes_{unique}",
        source_topic=f"ticks-{unique}",
        output_table=f"changes_{unique}",
        output_topic=f"daily-{unique}",
    )
    two = dataclasses.replace(
        get_job("top_movers"),
        name=f"movers_{unique}",
        source_topic=output_topic_name(one.output_topic, one.version),
        output_table=f"movers_{unique}",
    )
    return one, two


def _ranking(outputs) -> dict[tuple[int, int], tuple[str, float, int]]:
    return {
        (int(r["window_start"].timestamp() * 1000), r["rank"]): (r["symbol"], r["change"], r["ticks"]) for r in outputs
    }


def _published_row(key, value: bytes) -> dict:
    """A record of a ranking's upsert topic as an output row: the key names the day and rank, the value
    holds them too (a timestamp in JSON: ISO-8601)."""
    row = json.loads(value)
    assert json.loads(key) == {"window_start": row["window_start"], "rank": row["rank"]}
    return {**row, "window_start": dt.datetime.fromisoformat(row["window_start"].replace("Z", "+00:00"))}


def _reference_movers(events) -> dict[tuple[int, int], tuple[str, float, int]]:
    daily = ticks.daily_changes(events)
    days = sorted({start for _, start in daily})
    return {
        (day, rank): (symbol, change, daily[(symbol, day)][1])
        for day in days
        for rank, (symbol, change) in enumerate(ticks.top_movers(daily, day), start=1)
    }


def test_stage_two_ranks_what_stage_one_publishes_as_the_days_close(settings, kafka_broker, spark, unique):
    one, two = _stages(unique)
    harness = JobHarness(settings=settings, spark=spark)
    first_half, rest = TICKS[: len(TICKS) // 2], TICKS[len(TICKS) // 2 :]
    harness.run(one, first_half)
    early = harness.run(two, [])
    harness.run(one, rest)
    cut = JobHarness(settings=settings.replace(max_offsets_per_trigger=7), spark=spark)
    final = cut.run(two, [])

    want = _reference_movers(TICKS)
    assert len(want) == 30 and len({day for day, _ in want}) == 3
    assert _ranking(final.outputs) == want
    assert set(_ranking(early.outputs)) < set(want), "a day is ranked once stage 1 has closed it"
    topic = JobLayout.of(one, settings).output_topic
    assert len(partition_offsets(settings.kafka, topic)) == 1, "stage 1's upsert topic has one partition"
    assert not final.dead_letters


def test_a_table_is_ranked_by_its_rows_latest_values_whatever_the_cut(settings, kafka_broker, spark, unique):
    """Updates that drop a leader out of the top, tombstones, rows deleted and brought back, tied and missing
    scores, refused records, over 3 partitions cut into micro-batches of 25: the ranking is the reference's
    (whose order is the rows' offsets, not the batches or the partitions), and after a lost checkpoint
    (restored from the changelog) the run goes on as if nothing had happened. The ranking also goes to the
    job's upsert topic, whose compacted view is the same ranking. (One partition: the two-stage test above.)"""
    partitions, cut = 3, 25
    _, two = _stages(unique)
    spec = dataclasses.replace(
        two, source_topic=f"table-{unique}", source_partitions=partitions, output_topic=f"ranking-{unique}"
    )
    ensure_topic(settings.kafka, spec.source_topic, partitions)
    records = upserts.adversarial(count=150)
    halves = records[:100], records[100:]
    harness = JobHarness(settings=settings.replace(max_offsets_per_trigger=cut), spark=spark)

    upserts.produce(settings.kafka, spec.source_topic, halves[0])
    first = harness.run(spec, [])
    assert _ranking(first.outputs) == upserts.top_n(halves[0])
    shutil.rmtree(first.report.checkpoint)
    upserts.produce(settings.kafka, spec.source_topic, halves[1])
    second = harness.run(spec, [])

    assert second.report.restores["day-members"].keys > 0
    assert _ranking(second.outputs) == upserts.top_n(records)
    published = latest_per_key(settings.kafka, JobLayout.of(spec, settings).output_topic)
    assert _ranking([_published_row(key, value) for key, value in published.items()]) == upserts.top_n(records)
    reasons = {}
    for letter in second.dead_letters:
        reasons[letter.reason] = reasons.get(letter.reason, 0) + 1
    assert reasons == upserts.refused(records) == {"wrong_key": 2, "missing_key": 2, "undecodable": 1}


def test_a_top_n_is_declared_and_checked():
    from spark_jobs.reference.jobs.top_movers import TOP_MOVERS

    spec = get_job("top_movers")
    TOP_MOVERS.check(spec)
    with pytest.raises(JobSpecError, match="job top_movers: key_field 'rank'"):
        TOP_MOVERS.check(dataclasses.replace(spec, key_field="rank", output_key=()))
    with pytest.raises(JobSpecError, match="n: rank at least one"):
        dataclasses.replace(TOP_MOVERS, n=0).check(spec)
    with pytest.raises(JobSpecError, match="ties.window_end: a tie is broken by fields the outputs show"):
        dataclasses.replace(TOP_MOVERS, ties=("window_end",)).check(spec)


def test_the_readme_shows_the_whole_declaration_of_the_job():
    from pathlib import Path

    import spark_jobs.reference.jobs.top_movers as job
    from tests.helpers import docs_page

    page = docs_page("writing-jobs/top-n.md")
    source = Path(job.__file__).read_text()
    for start in ("DAILY_CHANGE_SCHEMA = T.StructType(", "TOP_MOVERS = TopN("):
        declaration = page[page.index(start) :]
        declaration = declaration[: declaration.index("\n)\n") + 3]
        assert declaration in source, start
    spec, one = get_job("top_movers"), get_job("stock_price_changes")
    assert spec.source_topic == output_topic_name(one.output_topic, one.version)
    assert f'source_topic="{spec.source_topic}"' in page and one.output_partitions == 1


@pytest.mark.faults
def test_either_stage_killed_9_mid_batch_leaves_the_top_movers_equal_to_the_reference(private_stack, spark):
    """kill -9 of stage 1 after its Delta write, before its markers: its batch's records are never committed,
    so stage 2 (reading committed) sees none of them; kill -9 of stage 2 at the same point with its checkpoint
    lost: the restart restores an empty store, removes the rows its killed batch wrote, replays, and the top
    movers equal the reference."""
    from spark_jobs.driver.run import run
    from spark_jobs.reference.generators.producer import produce_keyed
    from tests.faults.test_driver_kills import Kill, kill_at

    stack = private_stack
    one, two = get_job("stock_price_changes"), get_job("top_movers")
    ensure_topic(stack.kafka, one.source_topic, one.source_partitions)
    produce_keyed(stack.kafka, one.source_topic, TICKS, one.key_field)

    kill_at(stack, one, Kill("between_outputs_and_markers", 1), "stage-one-kill.log")
    published = JobLayout.of(one, stack).output_topic
    assert latest_per_key(stack.kafka, published) == {}, "a batch without markers published results"
    assert run(one, stack, available_now=True, spark=spark).error is None
    assert len(latest_per_key(stack.kafka, published)) == 3 * 24

    stopped = kill_at(stack, two, Kill("between_outputs_and_markers", 1, lose_checkpoint=True), "stage-two-kill.log")
    assert stopped["lifecycle_state"] == "RUNNING"
    report = run(two, stack, available_now=True, spark=spark)
    assert report.error is None
    assert _ranking(read_rows(report.output)) == _reference_movers(TICKS)
