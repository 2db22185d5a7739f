"""A damaged checkpoint is recognised, moved aside, and the job restores from snapshot + changelog."""

from __future__ import annotations

import dataclasses
import json
import shutil
import types
from pathlib import Path

import pytest

from spark_jobs.driver.context import JobContext
from spark_jobs.driver.run import run, set_aside_new_query_leftovers
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.reference.generators import purchases
from spark_jobs.registry import get_job
from spark_jobs.state.checkpoint_health import RESTORE_RECORD, checkpoint_problem, new_query_leftovers, quarantine
from spark_jobs.state.fencing import GENERATION_SPAN
from tests.helpers import delta_purchase_counts, expected_purchase_counts

OFFSETS = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"t":{"0":5}}\n'


def _checkpoint(root: Path, batches: int = 2, commits: int = 2, state: bool = True) -> Path:
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "metadata").write_text('{"id":"3b0c"}\n')
    for b in range(batches):
        (root / "offsets" / str(b)).write_text(OFFSETS)
    for b in range(commits):
        (root / "commits" / str(b)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    if state:
        (root / "state" / "0" / "0").mkdir(parents=True)
        (root / "state" / "0" / "0" / "2.changelog").write_bytes(b"x")
    return root


def test_a_sound_or_fresh_checkpoint_has_no_problem(tmp_path):
    assert checkpoint_problem(tmp_path / "never-started") is None
    assert checkpoint_problem(_checkpoint(tmp_path / "ok")) is None
    assert checkpoint_problem(_checkpoint(tmp_path / "running", batches=3, commits=2)) is None  # batch 2 in flight


def test_a_restored_start_whose_first_batch_never_committed_must_restore_again(tmp_path):
    """The driver restored state, planned batch 0 (offsets/0) and died before committing it: resuming
    would re-run batch 0 without the restored state (found by the driver-kill fault test: counts lost)."""
    died = _checkpoint(tmp_path / "died", batches=1, commits=0, state=False)
    (died / RESTORE_RECORD).parent.mkdir()
    (died / RESTORE_RECORD).write_text('{"counts": {"batch_id": 7}}')
    assert "first batch never committed" in checkpoint_problem(died)
    committed = _checkpoint(tmp_path / "committed", batches=1, commits=1)
    (committed / RESTORE_RECORD).parent.mkdir()
    (committed / RESTORE_RECORD).write_text('{"counts": {"batch_id": 7}}')
    assert checkpoint_problem(committed) is None  # once a batch committed, Spark's own state holds it
    assert checkpoint_problem(_checkpoint(tmp_path / "fresh-died", batches=1, commits=0, state=False)) is None


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda c: (c / "offsets" / "1").write_text("\x00\x00garbage"), "not a Spark log entry"),
        (lambda c: (c / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0\n{"t":{"0":5}}\n'), "not JSON"),
        (lambda c: (c / "commits" / "1").write_text(""), "not a Spark log entry"),
        (lambda c: (c / "metadata").unlink(), "metadata unreadable"),
        (lambda c: (c / "offsets" / "1").unlink(), "commit 1 has no offset log entry"),
    ],
)
def test_damage_is_named(tmp_path, damage, reason):
    checkpoint = _checkpoint(tmp_path / "cp")
    damage(checkpoint)
    assert reason in checkpoint_problem(checkpoint)


def test_a_start_killed_while_writing_its_first_offsets_is_a_problem(tmp_path):
    """Spark writes a log entry to a temporary file and renames it: a kill between the two leaves a
    checkpoint with no entry but a file in offsets/, over which Spark refuses to start a new query
    (found by the supervise DAG test killing a driver as its dead-letter query started)."""
    checkpoint = tmp_path / "dead-letter"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / ".0.8c1e9f.tmp").write_text("v1\n")
    assert "no offset log entry but files in offsets" in checkpoint_problem(checkpoint, stateful=False)
    (checkpoint / "offsets" / ".0.8c1e9f.tmp").unlink()
    assert checkpoint_problem(checkpoint, stateful=False) is None  # an empty directory is a fresh start


def test_committed_batches_without_state_files_are_a_problem_for_stateful_jobs(tmp_path):
    checkpoint = _checkpoint(tmp_path / "cp", state=False)
    assert "no state store files" in checkpoint_problem(checkpoint)
    assert checkpoint_problem(checkpoint, stateful=False) is None


def test_quarantine_moves_the_checkpoint_aside(tmp_path):
    checkpoint = _checkpoint(tmp_path / "app-v1")
    moved = quarantine(checkpoint)
    assert not checkpoint.exists() and moved.name.startswith("app-v1.corrupt-") and (moved / "metadata").exists()


def test_leftovers_that_would_stop_a_new_query_are_set_aside_and_the_restore_record_stays(tmp_path):
    """Spark refuses to start a query with no offset log over anything in offsets/, state/ or commits/,
    even an empty directory (what a move in object storage left behind in CI)."""
    checkpoint = tmp_path / "app-v1"
    (checkpoint / "state" / "0").mkdir(parents=True)
    (checkpoint / "offsets").mkdir()
    (checkpoint / RESTORE_RECORD).parent.mkdir()
    (checkpoint / RESTORE_RECORD).write_text('{"counts": {"batch_id": 7}}')
    assert new_query_leftovers(checkpoint) == ["state/0"]
    assert (
        new_query_leftovers(tmp_path / "never-ran") == []
        and new_query_leftovers(_checkpoint(tmp_path / "resumes")) == []
    )

    context = types.SimpleNamespace(
        layout=types.SimpleNamespace(checkpoint=checkpoint), spec=types.SimpleNamespace(application_id="app-v1")
    )
    set_aside_new_query_leftovers(context)
    assert new_query_leftovers(checkpoint) == [] and (checkpoint / RESTORE_RECORD).exists()
    (moved,) = [p for p in tmp_path.iterdir() if p.name.startswith("app-v1.corrupt-")]
    assert (moved / "state" / "0").is_dir() and not (checkpoint / "state").exists()


def _tear_latest_offsets(checkpoint: Path) -> None:  # e.g. a disk-full crash mid-write
    latest = max(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    (checkpoint / "offsets" / str(latest)).write_bytes(b"\x00torn write")


def _delete_state_files(checkpoint: Path) -> None:  # e.g. a cleanup script or a lost volume
    shutil.rmtree(checkpoint / "state")


def _kill_while_writing_first_offsets(checkpoint: Path) -> None:  # Spark's temporary file, never renamed
    for log_dir in ("offsets", "commits"):
        shutil.rmtree(checkpoint / log_dir)
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / ".0.8c1e9f.tmp").write_text("v1\n")


@pytest.mark.integration
@pytest.mark.faults
@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_tear_latest_offsets, "not a Spark log entry"),
        (_delete_state_files, "no state store files"),
        (_kill_while_writing_first_offsets, "no offset log entry but files in offsets, state"),
    ],
)
def test_a_corrupt_checkpoint_is_quarantined_and_state_restored(spark, kafka_broker, settings, unique, damage, reason):
    job = dataclasses.replace(
        get_job("purchase_counts"),
        name=f"corrupt_{unique}",
        source_topic=f"corrupt-{unique}",
        output_table=f"corrupt_{unique}",
    )
    bootstrap = settings.kafka_bootstrap_servers
    ensure_topic(bootstrap, job.source_topic, job.source_partitions)
    rounds = [list(purchases.generate(600, users=80, seed=s)) for s in (71, 72, 73)]
    for events in rounds[:2]:
        purchases.produce(bootstrap, job.source_topic, events)
        run(job, settings, available_now=True, spark=spark)

    checkpoint = JobContext(spark, job, settings).layout.checkpoint.path
    damage(checkpoint)
    purchases.produce(bootstrap, job.source_topic, rounds[2])
    report = run(job, settings, available_now=True, spark=spark)

    assert reason in report.quarantined_checkpoint["reason"]
    assert Path(report.quarantined_checkpoint["path"]).exists()
    # the last complete batch in the changelog: the second driver's (generation 2) Spark batch 1
    assert report.restores["counts"].batch_id == 2 * GENERATION_SPAN + 1
    assert report.input_rows == len(rounds[2])
    assert delta_purchase_counts(spark, report.output) == expected_purchase_counts(rounds[0] + rounds[1] + rounds[2])
    assert (
        json.loads((checkpoint / "streamstate" / "restore.json").read_text())["counts"]["batch_id"]
        == 2 * GENERATION_SPAN + 1
    )
