"""A keyed aggregate in an ``in_memory`` store (``StoreSpec(kind="in_memory")``;
``streamstate.primitives.InMemoryAggregate`` in Spark's in-memory state store), the reference job
``purchase_counts_in_memory`` (purchase_counts' declaration as it is) end to end on the real broker, Spark
and Delta:

* on adversarial input (users created and closed in one batch, closes of unknown users, duplicates,
  out-of-order times, amounts past the declared type) its outputs equal the plain-Python reference and its
  dead letters do not depend on the batching, in one batch and in batches of 40 records;
* its state lives in Spark's in-memory state store (the checkpoint holds that provider's delta files, no
  RocksDB), a restart loads it back from the checkpoint, and a lost checkpoint restores it from the
  changelog; the state audit reads it;
* the Kafka Streams app with ``Stores.inMemoryKeyValueStore`` computes the same counts (its changelog's
  compacted view): test_same_input_same_outputs.py, ``purchase_counts_in_memory``;
* a declaration that cannot run in such a store is refused, naming the job and the field.

The processor itself, every aggregate kind whatever the batching, is in test_keyed_aggregate.py.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_jobs.driver.run import run
from spark_jobs.io.dead_letter import dead_letter_topic
from spark_jobs.io.kafka_topics import ensure_topic
from spark_jobs.operations.state_audit.checkpoint_state import audit_checkpoint
from spark_jobs.reference.generators import purchases
from spark_jobs.reference.jobs.purchase_counts import COUNTS
from spark_jobs.registry import JobSpecError, StoreSpec, get_job
from spark_jobs.testing import JobHarness
from tests.helpers import delta_purchase_counts
from tests.spark_jobs.test_dead_letter import read_with_headers

PARTITIONS = 2


def _spec(name: str, topic: str):
    return dataclasses.replace(get_job("purchase_counts_in_memory"), name=name, source_topic=topic, output_table=name)


def _state_files(checkpoint: str) -> set[str]:
    """The suffixes of the files in the checkpoint's state directory (``delta``/``snapshot``: Spark's
    in-memory store; ``changelog``/``zip``/``sst``: RocksDB)."""
    return {p.suffix for p in (Path(checkpoint) / "state").rglob("*") if p.is_file() and p.suffix != ".crc"}


@pytest.mark.integration
def test_an_in_memory_store_gives_purchase_counts_answers_whatever_the_batching_and_across_restarts(
    spark, kafka_broker, settings, unique
):
    events = list(purchases.adversarial(240, users=12, seed=11))
    valid = [e for e in events if purchases.is_valid(e)]
    want = purchases.expected_counts(valid)
    topic = f"in-memory-{unique}"
    ensure_topic(settings.kafka, topic, PARTITIONS)
    purchases.produce(settings.kafka, topic, events)

    letters = {}
    for cut in (None, 40):
        spec = _spec(f"mem_{unique}_{cut or 'all'}", topic)
        report = run(spec, settings.replace(max_offsets_per_trigger=cut), available_now=True, spark=spark)
        assert report.error is None and report.input_rows == len(events)
        assert delta_purchase_counts(spark, report.output) == want, f"maxOffsetsPerTrigger={cut}"
        letters[cut] = sorted(
            (int(d["headers"]["source.partition"]), int(d["headers"]["source.offset"]), d["headers"]["reason"])
            for d in read_with_headers(settings.kafka_bootstrap_servers, dead_letter_topic(spec.application_id))
        )
        # Spark's in-memory store kept the state: its delta files, no RocksDB file
        assert ".delta" in _state_files(report.checkpoint) and not _state_files(report.checkpoint) & {
            ".changelog",
            ".zip",
            ".sst",
        }
    assert len(letters[None]) == len(events) - len(valid) and letters[40] == letters[None]
    # the input holds what the test is for: closes, users closed before they bought, rejected records
    assert any(e["type"] == "account_closed" for e in valid) and sum(n for n, _ in want.values()) < len(valid)

    # the audit reads the store (one row per live user)
    audited = audit_checkpoint(spark, settings, spec, f"audit-{unique}")
    assert [r for r in audited if r.error] == []
    assert sum(r.rows for r in audited) == len(want)

    # a restart loads the map from the checkpoint; a lost checkpoint restores it from the changelog
    first, second, rest = events[:100], events[100:160], events[160:]
    spec = _spec(f"mem_{unique}_restarts", f"in-memory-restarts-{unique}")
    with JobHarness(settings=settings, spark=spark) as harness:
        harness.run(spec, first)
        resumed = harness.run(spec, second)
        assert not resumed.report.restores
        shutil.rmtree(resumed.report.checkpoint)
        restored = harness.run(spec, rest)
    so_far = purchases.expected_counts([e for e in first + second if purchases.is_valid(e)])
    assert restored.report.restores[COUNTS.store].keys == len(so_far)
    assert {r["user_id"]: (r["purchases"], r["amount_spent"]) for r in restored.outputs} == want


def test_an_in_memory_store_and_its_declarations_are_checked():
    with pytest.raises(JobSpecError, match="store 's': ttl_ms must be positive and is for key_value stores"):
        StoreSpec("s", kind="in_memory", ttl_ms=1000)  # Kafka Streams' in-memory store has no TTL either
    spec = get_job("purchase_counts_in_memory")
    COUNTS.check(spec)
    assert spec.stores[0].kind == "in_memory" and spec.entrypoint.endswith("purchase_counts:COUNTS")

    class Counter:  # a Python processor keeping the declaration's store (transformWithState: RocksDB only)
        changes = COUNTS.store_changes

    with pytest.raises(
        JobSpecError, match="job purchase_counts_in_memory: an in_memory store runs the primitive's Java processor only"
    ):
        COUNTS.build(SimpleNamespace(spec=spec, query_conf={}), processor=Counter)


@pytest.mark.integration
def test_the_state_api_serves_an_in_memory_store_like_a_key_value_one(settings, kafka_broker, tmp_path):
    """Its changelog and snapshots are a key-value store's: the state API lists the store with its kind and
    answers a key (here from the snapshot: the job never ran)."""
    import json

    from fastapi.testclient import TestClient
    from streamstate.state_api.app import create_app

    from spark_jobs.layout import JobLayout
    from spark_jobs.state.snapshots import SnapshotStore

    settings = settings.replace(data_dir=tmp_path)  # a lake of its own, on the suite's broker
    spec = get_job("purchase_counts_in_memory")
    value = {"purchases": 3, "amount_spent": "12.50", "last_purchase_at": "2026-11-01T09:00:00.000Z"}
    SnapshotStore.of(JobLayout.of(spec, settings), COUNTS.store).write(
        {b"u7": json.dumps(value).encode()}, 0, {spec.source_topic: {0: 3}}, {0: 3}
    )
    client = TestClient(create_app(settings))
    try:
        (listed,) = [job for job in client.get("/jobs").json()["jobs"] if job["job"] == spec.name]
        assert [(s["store"], s["kind"]) for s in listed["stores"]] == [(COUNTS.store, "in_memory")]
        assert client.get(f"/jobs/{spec.name}/stores/{COUNTS.store}").json()["kind"] == "in_memory"
        answer = client.get(f"/jobs/{spec.name}/stores/{COUNTS.store}/keys/u7").json()
        assert (answer["found"], answer["value"], answer["source"]) == (True, value, "standby")
    finally:
        client.app.state.service.close()
