"""Out-of-order votes on the real stack: the latest vote by event time wins (the seeds' voter5 case)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from spark_jobs.driver.context import JobContext
from spark_jobs.driver.run import run
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import votes
from spark_jobs.registry import get_job
from spark_jobs.state.changelog_reader import read_changelog

pytestmark = pytest.mark.integration

STORE = "latest-votes"


@pytest.fixture
def job(unique):
    spec = get_job("vote_counts")
    return dataclasses.replace(
        spec, name=f"votes_{unique}", source_topic=f"votes-{unique}", output_table=f"votes_{unique}"
    )


def _vote(n: int, voter: str, candidate: str, second: int) -> dict:
    return {
        "event_id": f"e-{n:03d}",
        "type": "vote",
        "voter_id": voter,
        "candidate": candidate,
        "event_time": f"2026-11-01T09:00:{second:02d}.000Z",
    }


def _outputs(spark, settings, job):
    path = str(settings.lake / job.output_table_dir)
    latest = {r.voter_id: r.candidate for r in spark.read.format("delta").load(path).collect()}
    counts = {r.candidate: r.votes for r in spark.read.format("delta").load(f"{path}_counts").collect()}
    return latest, counts


def _changelog_state(settings, job) -> dict[str, str]:
    topic = JobContext(None, job, settings).stores.handle(STORE).changelog.name
    state = read_changelog(settings.kafka_bootstrap_servers, topic).state
    return {k.decode(): json.loads(v)["candidate"] for k, v in state.items()}


def test_voter5_latest_vote_by_event_time_wins_across_batches(spark, kafka_broker, settings, job):
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    # voter5 votes red at :10, changes to blue at :20; the blue vote arrives first, red in a later batch.
    votes.produce(bootstrap, job.source_topic, [_vote(2, "voter5", "blue", 20), _vote(3, "voter6", "red", 15)])
    run(job, settings, available_now=True, spark=spark)
    votes.produce(bootstrap, job.source_topic, [_vote(1, "voter5", "red", 10), _vote(4, "voter6", "green", 30)])
    run(job, settings, available_now=True, spark=spark)

    latest, counts = _outputs(spark, settings, job)
    assert latest == {"voter5": "blue", "voter6": "green"}
    assert counts == {"blue": 1, "green": 1}
    # The versioned store kept voter5's history, oldest first.
    topic = JobContext(None, job, settings).stores.handle(STORE).changelog.name
    value = json.loads(read_changelog(bootstrap, topic).state[b"voter5"])
    assert [(v["candidate"], v["event_id"]) for v in value["history"]] == [("red", "e-001"), ("blue", "e-002")]


def test_shuffled_votes_equal_an_independent_computation_and_survive_a_lost_checkpoint(
    spark, kafka_broker, settings, job
):
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    events = list(votes.generate(voters=150, seed=8))
    half = len(events) // 2
    votes.produce(bootstrap, job.source_topic, events[:half])
    run(job, settings, available_now=True, spark=spark)

    # Lose the checkpoint between the halves: the store is rebuilt from its changelog.
    shutil.rmtree(JobContext(spark, job, settings).layout.checkpoint)
    votes.produce(bootstrap, job.source_topic, events[half:])
    report = run(job, settings, available_now=True, spark=spark)
    assert report.restores[STORE].keys > 0
    assert report.input_rows == len(events) - half

    want = {voter: e["candidate"] for voter, e in votes.latest_votes(events).items()}
    latest, counts = _outputs(spark, settings, job)
    assert latest == want
    assert counts == votes.expected_counts(events)
    assert _changelog_state(settings, job) == want
